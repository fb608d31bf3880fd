"""The per-GPU memory model (granndis_hpc/memory_model/) and `--mode auto` over shard sets (the commands
`preprocess plan` and `build --hops auto`: tests/unit/test_memory_model_cli.py).

The activation formula is checked byte for byte against what autograd saves (SavedBytes), running the
real models with a gather that does what engine/views.View.gather_fn does (static halo features at
layer 0, an autograd halo exchange after it; here a loopback exchange: the rows sent come back as the
halo).  Row counts from shard arrays are checked against the real planner.  The engine on several
ranks (halos from other GPUs and servers) is checked in tests/mpi/test_memory_model_mpi.py."""
import dataclasses
import json
import re

import numpy as np
import pytest
import torch

from granndis_hpc import memory_model as mm
from granndis_hpc.memory_model.estimate import rank_halo_bytes
from granndis_hpc.engine.exchange import halo_exchange
from granndis_hpc.engine.epoch import SavedBytes
from granndis_hpc.nn import PassSettings
from granndis_hpc.nn.graph import LayerGraph
from granndis_hpc.nn.models import build_model


# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,norm", [("sage", False), ("sage", True), ("gcn", False), ("gcn", True),
                                       ("ressage", False)])
@pytest.mark.parametrize("features,hidden", [(40, 16), (8, 16)])
def test_parameter_count_matches_the_models(name, norm, features, hidden):
    model = build_model(name, features, hidden, 5, 4, norm=norm)
    spec = mm.ModelSpec(name, features, hidden, 5, 4, norm=norm)
    assert spec.parameters() == sum(p.numel() for p in model.parameters())
    assert [tuple(w) for w in spec.widths()] == [(c.in_features, c.out_features) for c in model.convs]


def _loopback(send, send_counts, recv_counts, phase="halo"):
    return send.clone()


def _random_plan(rng, layers, n_own=120, features=24, hidden=16, classes=5):
    """A rank's rows sorted by hop (0..layers), the prefix rule of the planner, and a halo per layer
    that is the loopback of `n_send` own rows active at that layer."""
    hop = np.sort(rng.integers(0, layers + 1, n_own))
    hop[: n_own // 4] = 0
    graphs, layer_rows, send_idx = [], [], []
    halo_rows_full = n_own  # the static halo: every own row once (loopback of the full send list)
    for l in range(layers):
        n_in = int(np.searchsorted(hop, layers - l, side="right"))
        n_dst = int(np.searchsorted(hop, layers - 1 - l, side="right"))
        n_send = int(rng.integers(1, n_in + 1))
        idx = np.sort(rng.choice(n_in, n_send, replace=False))
        n_src = n_in + n_send
        deg = rng.integers(0, 6, n_dst)
        ip = np.zeros(n_dst + 1, dtype=np.int64)
        np.cumsum(deg, out=ip[1:])
        ix = rng.integers(0, n_src, int(ip[-1]))
        graphs.append(LayerGraph(n_dst, n_src, ip, ix, rng.integers(1, 9, n_dst).astype(np.float32),
                                 rng.integers(1, 9, n_src).astype(np.float32)))
        layer_rows.append(mm.LayerRows(n_own_in=n_in, n_halo=n_send, n_dst=n_dst, nnz=int(ip[-1]), n_send=n_send))
        send_idx.append(torch.as_tensor(idx))
    n_inner = layer_rows[-1].n_dst
    view = mm.ViewRows("server", n_own, halo_rows_full, halo_rows_full, tuple(layer_rows))
    world_l = mm.LayerRows(n_inner, 0, n_inner, 0)
    world = mm.ViewRows("world", n_inner, 0, 0, tuple([world_l] * layers))
    n_train = max(1, n_inner // 2)
    rows = mm.RankRows(rank=0, features=features, num_classes=classes, n_inner=n_inner, n_train=n_train,
                       layers=layers, k=layers, world=world, server=view)
    return rows, graphs, send_idx


def _measured_saved_bytes(model, rows, graphs, send_idx, rng, settings=None):
    """What the trainer's step saves, with View.gather_fn's structure."""
    feats = torch.as_tensor(rng.standard_normal((rows.server.n_own, rows.features)).astype(np.float32))
    x0 = feats[: graphs[0].n_src - rows.server.layers[0].n_halo]
    static_halo = feats.clone()  # the static halo features (exchanged once at set-up)

    def gather(l, h):
        if l == 0 and h is x0:
            halo = static_halo.index_select(0, send_idx[0])
        else:
            n = len(send_idx[l])
            halo = halo_exchange(h, send_idx[l], [n], [n], _loopback)
        return torch.cat([h, halo], dim=0)

    labels = torch.as_tensor(rng.integers(0, rows.num_classes, rows.n_inner))
    train_rows = torch.arange(rows.n_train)
    target = labels[train_rows]  # the trainer indexes the labels before the step
    saved = SavedBytes()
    model.train()
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        logits = model(x0, graphs, gather, settings=settings)[: rows.n_inner]
        loss = torch.nn.functional.cross_entropy(logits[train_rows], target, reduction="sum") / 7.0
    loss.backward()
    return saved.total


@pytest.mark.parametrize("name,norm,dropout,ckpt", [
    ("sage", False, 0.5, False), ("sage", True, 0.0, False), ("sage", True, 0.3, False),
    ("gcn", False, 0.5, False), ("gcn", True, 0.0, False),
    ("ressage", False, 0.5, False), ("ressage", False, 0.0, False), ("ressage", False, 0.5, True)])
@pytest.mark.parametrize("features", [24, 8])  # projected first (F > hidden) and aggregated first
def test_activation_formula_equals_saved_tensor_bytes(name, norm, dropout, ckpt, features):
    rng = np.random.default_rng(features + len(name))
    layers = 4
    rows, graphs, send_idx = _random_plan(rng, layers, features=features)
    torch.manual_seed(0)
    model = build_model(name, features, 16, rows.num_classes, layers, dropout=dropout, norm=norm)
    measured = _measured_saved_bytes(model, rows, graphs, send_idx, rng, PassSettings(checkpoint_activations=ckpt))
    spec = mm.ModelSpec(name, features, 16, rows.num_classes, layers, dropout, norm, ckpt)
    assert mm.activation_layers(rows, spec, device="cpu")["saved"] == measured


def test_checkpointing_and_cuda_masks_save_less():
    rows, _, _ = _random_plan(np.random.default_rng(1), 4)
    plain = mm.ModelSpec("ressage", 24, 16, 5, 4, 0.5)
    ckpt = mm.ModelSpec("ressage", 24, 16, 5, 4, 0.5, checkpoint_activations=True)
    a, b = mm.activation_layers(rows, plain), mm.activation_layers(rows, ckpt)
    assert b["saved"] < a["saved"] and b["recompute"] > 0 and a["recompute"] == 0
    assert mm.activation_layers(rows, plain, device="cuda")["saved"] < a["saved"]  # bool masks


def test_estimate_breakdown_and_bad_input():
    rows, _, _ = _random_plan(np.random.default_rng(2), 3)
    spec = mm.ModelSpec("sage", 24, 16, 5, 3)
    est = mm.estimate(rows, spec)
    assert est["total"] == sum(est["breakdown"].values())
    resident = mm.estimate(rows, dataclasses.replace(spec, resident=True))
    b = resident["breakdown"]
    assert resident["total"] == sum(b.values())
    device_parts = {"features", "graph", "parameters", "gradients", "optimizer", "activations", "halo_buffers",
                    "step_transient"}
    # A resident estimate on a CPU device (preprocess plan --device cpu) adds the process, its shard slice
    # and the heap's holes (memory_model/host.py); without it, or on a GPU, the tensors alone.
    assert set(b) == device_parts | {"runtime", "shard_slice", "allocator"}
    assert set(est["breakdown"]) == device_parts == set(mm.estimate(rows, dataclasses.replace(spec, resident=True),
                                                                     device="cuda")["breakdown"])
    assert all(est["breakdown"][k] == b[k] for k in device_parts)
    assert b["runtime"] == (256 + 80) << 20
    step = b["activations"] + b["halo_buffers"] + b["step_transient"]
    assert b["allocator"] == int(1.5 * step)
    own, nnz, world_nnz = rows.server.n_own, rows.server.layers[0].nnz, rows.world.layers[0].nnz
    assert b["shard_slice"] == own * (39 + 4) + nnz * 8 + (rows.n_inner + 1) * 8 + world_nnz * 12
    # A co-batch view: the sampler's server index and the next co-batch over its rows; the slice is the world
    # view's (fb's rows: a co-batch's rows are the sample's, not the file's).
    cob = dataclasses.replace(rows, server=dataclasses.replace(rows.server, name="cobatch"))
    c = mm.estimate(cob, dataclasses.replace(spec, resident=True))["breakdown"]
    v = rows.server
    index = (v.n_own + v.n_halo) * (24 * 4 + 32) + v.layers[0].nnz * 15
    nxt = (v.n_own + v.n_halo) * 25 * 4 + v.n_send * 8 + sum(
        (lr.n_dst + 1) * 8 + lr.nnz * 8 + (lr.n_dst + lr.n_src) * 4 + (lr.n_send + lr.n_halo) * 8 for lr in v.layers)
    assert c["cobatch_host"] == index + nxt
    assert c["shard_slice"] == rows.world.n_own * 43 + world_nnz * 8 + (rows.n_inner + 1) * 8 + world_nnz * 12
    # Layers 1..2 exchange (n_send + n_halo) rows at width 16; the buffer share is at most the largest.
    biggest = max((lr.n_send + lr.n_halo) * 16 * 4 for lr in rows.server.layers[1:])
    assert 0 < b["halo_buffers"] <= biggest
    assert b["optimizer"] == 2 * b["parameters"] == 2 * spec.parameters() * 4
    assert b["features"] >= (rows.server.n_own + rows.server.n_halo) * 24 * 4
    assert est["step_peak"] >= est["activation_saved"] - spec.parameters() * 4 - 10 ** 5
    wider = mm.estimate(rows, mm.ModelSpec("sage", 24, 64, 5, 3))
    assert wider["breakdown"]["activations"] > b["activations"]
    with pytest.raises(mm.MemoryModelError, match="outside 0..L"):
        mm.estimate(mm.RankRows(**{**rows.__dict__, "k": 4}), spec)
    with pytest.raises(mm.MemoryModelError, match="unknown model"):
        mm.ModelSpec("gatv9", 4, 4, 2, 2)
    broken = rows.server.layers[1].__class__(**{**rows.server.layers[1].__dict__, "n_own_in": 1})
    bad = mm.RankRows(**{**rows.__dict__, "server": mm.ViewRows(
        "server", rows.server.n_own, rows.server.n_halo, rows.server.n_send,
        (rows.server.layers[0], broken, rows.server.layers[2]))})
    with pytest.raises(mm.MemoryModelError, match="next layer's own rows"):
        mm.estimate(bad, spec)


# ---------------------------------------------------------------------------------------------------
def _opt(mode, peak, k=0, batches=1):
    return mm.Option(mode=mode, k=k, batches=batches, peak=peak)


def test_choose_follows_granndis_order():
    opts = [_opt("fb", 10), _opt("flx", 40, k=1), _opt("flx", 60, k=2), _opt("flx", 90, k=3),
            _opt("eas", 30), _opt("cob", 8, batches=2), _opt("cob", 5, batches=8)]
    assert mm.choose(opts, 100).choice.label == "flx k=3"
    d = mm.choose(opts, 70)
    assert d.choice.label == "flx k=2" and [o.label for o in d.rejected] == ["flx k=3"]
    assert mm.choose(opts, 39).choice.mode == "eas"  # no full preload fits: FLX on the EAS set
    assert mm.choose(opts, 9).choice.label == "cob batches=2"  # then the largest co-batch that fits
    assert mm.choose([o for o in opts if o.mode != "cob"], 29).choice.mode == "fb"  # fb only as a last resort
    none = mm.choose(opts, 4)
    assert none.choice is None and "5 B" in none.reason and "cob batches=8" in none.reason
    assert "--memory-per-gpu 1MiB" in none.reason  # whole MiB, rounded up: a budget that fits
    assert json.loads(json.dumps(d.to_dict()))["choice"]["k"] == 2


# ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_graph():
    from granndis_hpc.preprocess.sources import load

    return load("synthetic", vertices=1500, avg_degree=8.0, features=12, classes=4, seed=1)


@pytest.fixture(scope="module")
def small_shards(small_graph, tmp_path_factory):
    from mpi4py import MPI

    from granndis_hpc.preprocess.build.pipeline import build_shards

    out = tmp_path_factory.mktemp("mm") / "full3"
    build_shards(small_graph, out, servers=2, gpus_per_server=2, layers=3, partitioner="metis", comm=MPI.COMM_SELF)
    return out


def test_row_counts_equal_the_planners(small_shards):
    """server_view_rows (own/halo/dst/edges/sent per layer) against graph/planner.py on the same slices."""
    from granndis_hpc import shards
    from granndis_hpc.engine import views
    from granndis_hpc.graph import planner

    manifest, servers = mm.read_shard_set(small_shards)
    for s in range(2):
        slices = [shards.read_rank_slice(small_shards, manifest, s, g) for g in range(2)]
        tables = []
        for sl in slices:
            rows = views.server_rows(sl, exact_degrees=True)
            tables.append((rows, planner.build_halo(2, rows.is_own, rows.own_pos, rows.peer, rows.key, rows.src_hop)))
        for k in (1, 2, 3):
            for g, sl in enumerate(slices):
                mine = mm.server_view_rows(servers[s], g, k)
                rows, (table, sources) = tables[g]
                peer_table = tables[1 - g][1][0]
                asked = peer_table.peer == g  # what the other GPU asks of this one
                send_pos = peer_table.key[asked]
                send_counts = np.array([0, 0]); send_counts[1 - g] = send_pos.size
                plan = planner.build_plan(rows.hop, rows.indptr, sources, table, send_pos, send_counts, k)
                for lp, lr in zip(plan.layers, mine.layers):
                    assert (lr.n_own_in, lr.n_halo, lr.n_dst, lr.nnz, lr.n_send) == (
                        lp.n_own_in, int(lp.recv_counts.sum()), lp.n_dst, int(lp.indptr[-1]), int(lp.send_counts.sum()))


def test_world_rows_and_inter_server_bytes(small_shards):
    manifest, servers = mm.read_shard_set(small_shards)
    rows = mm.shard_rows(servers, 3, 0, 12, 4)
    assert sum(r.n_inner for r in rows) == 1500
    # Every halo row some rank reads is sent by its owner: send and receive totals agree.
    assert sum(r.world.n_send for r in rows) == sum(r.world.n_halo for r in rows)
    m = mm.ModelSpec("sage", 12, 16, 4, 3, halo_route="direct")
    fb = mm.inter_server_bytes(rows, m, 2)
    inter = sum(r.world.inter_halo for r in rows)
    assert inter > 0 and fb["halo"] == 2 * inter * 16 * 4 * 2  # layers 1 and 2, forward + backward
    # --halo-route per-server: a row crosses once per server that reads it (the union of its ranks' reads).
    once = 0
    for s in servers:
        reads = [np.asarray(g.w_src_global_id)[np.asarray(g.w_src_rank) // 2 != s.server] for g in s.gpus]
        once += np.unique(np.concatenate(reads)).size
    routed = mm.ModelSpec("sage", 12, 16, 4, 3)
    assert routed.halo_route == "per-server" and 0 < once < inter
    assert mm.inter_server_bytes(rows, routed, 2)["halo"] == 2 * once * 16 * 4 * 2
    # What a rank does not relay itself reaches it from a relay of its server: the intra bytes grow by that.
    direct, per_server = (np.array([rank_halo_bytes(r, spec) for r in rows]) for spec in (m, routed))
    assert per_server[:, 1].sum() - direct[:, 1].sum() == 2 * (inter - once) * 16 * 4 * 2
    assert fb["gradient"] == 2 * 1 * m.parameters() * 4
    flx = mm.inter_server_bytes(mm.shard_rows(servers, 3, 3, 12, 4), m, 2)
    assert flx["halo"] == 0 and flx["gradient"] == fb["gradient"]


@pytest.fixture(scope="module")
def eas_shards(small_graph, tmp_path_factory):
    from mpi4py import MPI

    from granndis_hpc.preprocess.build.pipeline import build_shards

    out = tmp_path_factory.mktemp("mm") / "eas"
    build_shards(small_graph, out, servers=2, gpus_per_server=2, layers=3, preload="eas", hops=1, fanout=2,
                 partitioner="metis", comm=MPI.COMM_SELF)
    return out


def test_mode_auto_entry_point_over_shard_sets(small_shards, eas_shards):
    """choose_shard_sets: what `--mode auto` calls with the shard sets it is given."""
    big = mm.choose_shard_sets([str(small_shards), str(eas_shards)], "sage", 16, 3, 1 << 40, batches=(2, 4))
    assert big.choice.label == "flx k=3" and big.choice.source == str(small_shards) and not big.rejected
    none = mm.choose_shard_sets([str(small_shards), str(eas_shards)], "sage", 16, 3, 1, batches=(2, 4))
    every = none.rejected
    # flx k=1 holds more than fb for no fewer inter-server bytes here (fb caches its layer-0 halo): dropped
    # as dominated, and said.
    assert {o.label for o in every} == {"fb", "fb payload=partial", "fb payload=smaller", "flx k=2", "flx k=3",
                                        "eas", "cob batches=2", "cob batches=4"}
    assert "not considered: flx k=1 (dominated by fb" in none.reason
    flx = {e["rank"]: e["total"] for e in mm.estimate_shard_set(str(small_shards), "sage", 16)}
    eas = {e["rank"]: e["total"] for e in mm.estimate_shard_set(str(eas_shards), "sage", 16)}
    assert max(eas.values()) < max(flx.values())  # EAS keeps fewer external rows than a 3-hop preload
    by = {o.label: o.peak for o in every}
    assert by["eas"] == max(eas.values()) and by["flx k=3"] == max(flx.values())
    for budget in sorted(by.values()):
        d = mm.choose_shard_sets([str(small_shards), str(eas_shards)], "sage", 16, 3, budget, batches=(2, 4))
        want = next(o for o in sorted(every, key=mm.preference) if o.peak <= budget)
        assert d.choice.label == want.label and d.choice.peak <= budget
        assert all(o.peak > budget for o in d.rejected)
    with pytest.raises(mm.MemoryModelError, match="cannot run k = 4"):
        mm.estimate_shard_set(str(small_shards), "sage", 16, layers=4, k=4)


def test_plan_reuses_a_saturated_expansion_without_changing_the_estimate(small_graph):
    """Deep models: once the k-hop expansion stops growing, deeper builds are reused; the estimate of
    k = 8 must be the one a fresh 8-hop build gives."""
    from mpi4py import MPI

    from granndis_hpc.preprocess.plan import command as plan

    cfg = plan.PlanConfig(servers=2, gpus_per_server=2, layers=8, hidden=16, partitioner="metis", eas=False)
    many = plan.plan_options(MPI.COMM_SELF, small_graph, plan.dataclasses.replace(cfg, ks=[5, 6, 7, 8]))["options"]
    one = plan.plan_options(MPI.COMM_SELF, small_graph, plan.dataclasses.replace(cfg, ks=[8]))["options"]
    assert [o.to_dict() for o in many if o.k == 8] == [o.to_dict() for o in one]


def test_plan_counts_equal_the_written_shards(small_graph, small_shards, tmp_path):
    """plan (build_server without features, never written) and the shard set on disk give the same
    estimate: same partition, same rows, same world view."""
    from mpi4py import MPI

    from granndis_hpc.preprocess.plan import command as plan
    from granndis_hpc.preprocess.build.pipeline import build_shards

    two = tmp_path / "full2"
    build_shards(small_graph, two, servers=2, gpus_per_server=2, layers=3, hops=2, partitioner="metis",
                 comm=MPI.COMM_SELF)
    cfg = plan.PlanConfig(servers=2, gpus_per_server=2, layers=3, hidden=16, partitioner="metis", eas=False,
                          device="cpu", ks=[0, 2, 3])
    got = {o.label: o for o in plan.plan_options(MPI.COMM_SELF, small_graph, cfg)["options"]}
    for label, path, k in (("flx k=2", two, 2), ("flx k=3", small_shards, 3), ("fb", small_shards, 0)):
        ests = mm.estimate_shard_set(str(path), "sage", 16, 3, k=k, resident=True)  # plan's on a CPU: resident
        worst = max(ests, key=lambda e: e["total"])
        assert got[label].peak == worst["total"] and got[label].breakdown == worst["breakdown"], label


def test_a_dominated_option_is_not_chosen_and_the_order_is_stated_as_applied():
    """flx k=1 (more memory than fb, same inter-server bytes) is not preferred over fb, and the stated
    order is the one applied."""
    fb = mm.Option(mode="fb", peak=26, inter_server_bytes={"halo": 100, "grad": 10})
    k1 = mm.Option(mode="flx", k=1, peak=33, inter_server_bytes={"halo": 100, "grad": 10})
    cob = mm.Option(mode="cob", batches=2, peak=30, inter_server_bytes={"halo": 0, "grad": 10})
    d = mm.choose([fb, k1, cob], 36)
    assert d.choice.label == "cob batches=2"  # k=1 dropped: cob is GraNNDis' next choice
    assert "not considered: flx k=1 (dominated by fb" in d.reason
    assert "flx with the largest k, then EAS, then cob with the fewest co-batches, then fb" in d.reason
    assert mm.choose([fb, k1], 36).choice.label == "fb"


def test_mode_auto_considers_only_sets_of_one_dataset_that_fit_the_job(small_graph, small_shards, tmp_path):
    """`--shards citeseer-2x2,cora-2x2-eas` is refused (sets of two datasets), and a 4x1 set is left out
    of a 2x2 job's choice instead of being picked, then refused."""
    from mpi4py import MPI

    from granndis_hpc.preprocess.build.pipeline import build_shards
    from tests.unit.test_shards import build, make_graph

    other = tmp_path / "4x1"
    build_shards(small_graph, other, servers=4, gpus_per_server=1, layers=3, partitioner="metis", comm=MPI.COMM_SELF)
    d = mm.choose_shard_sets([str(other), str(small_shards)], "sage", 16, 3, 1 << 40, batches=(2,), job=(2, 2))
    assert d.choice.source == str(small_shards) and f"{other} is built for 4 servers x 1 GPUs" in d.reason
    with pytest.raises(mm.MemoryModelError, match="none of the shard sets can run this job"):
        mm.choose_shard_sets([str(other)], "sage", 16, 3, 1 << 40, job=(2, 2))
    foreign = tmp_path / "toy"
    build(make_graph(), foreign, layers=3)
    with pytest.raises(mm.MemoryModelError, match="sets of different datasets"):
        mm.choose_shard_sets([str(foreign), str(small_shards)], "sage", 16, 3, 1 << 40, job=(2, 2))


# ---------------------------------------------------------------------------------------------------
# A registered model (with a constructor option of its own) is estimated by its own entry;
# plan on a set and --mode auto on that set rank the same options the same way.
@pytest.fixture
def recipe_model():
    from tests import recipe_model

    recipe_model.register()
    yield recipe_model
    recipe_model.unregister()


@pytest.mark.parametrize("widen", [1, 3])
@pytest.mark.parametrize("features", [24, 8])
def test_a_registered_models_estimate_equals_saved_tensor_bytes(recipe_model, widen, features):
    rng = np.random.default_rng(features + widen)
    rows, graphs, send_idx = _random_plan(rng, 4, features=features)
    model = build_model(recipe_model.NAME, features, 16, rows.num_classes, 4, widen=widen)
    spec = mm.ModelSpec(recipe_model.NAME, features, 16, rows.num_classes, 4, options={"widen": widen})
    assert spec.parameters() == sum(p.numel() for p in model.parameters())
    assert mm.activation_layers(rows, spec)["saved"] == _measured_saved_bytes(model, rows, graphs, send_idx, rng)
    with pytest.raises(mm.MemoryModelError, match="no option 'heads'"):
        mm.ModelSpec(recipe_model.NAME, features, 16, 5, 4, options={"heads": 2})


@pytest.mark.parametrize("model,options", [("sage", ()), ("recipe-meanmlp", ("widen=2",))])
def test_plan_of_a_set_and_auto_on_it_estimate_and_choose_alike(recipe_model, small_graph, small_shards, eas_shards,
                                                                  model, options):
    """`plan --hops 3` (the 3-hop build and the EAS build, never written) and --mode auto on those two
    sets written to disk: the same options, estimates and reasons, so the same choice at every budget."""
    from mpi4py import MPI

    from granndis_hpc.registry import model_options
    from granndis_hpc.preprocess.plan import command as plan

    cfg = plan.PlanConfig(servers=2, gpus_per_server=2, layers=3, model=model, hidden=16, partitioner="metis",
                          device="cpu", hops=3, eas_hops=1, fanout=2, cob_batches=(2, 4), model_options=options)
    planned = plan.plan_options(MPI.COMM_SELF, small_graph, cfg)
    sets = [str(small_shards), str(eas_shards)]
    # plan --device cpu estimates a rank's resident memory (ModelSpec.resident), so auto's side asks for it.
    kw = dict(batches=(2, 4), options=tuple(model_options(model, options).items()), resident=True)
    every = mm.choose_shard_sets(sets, model, 16, 3, 1, **kw).rejected
    table = plan.format_table(planned["options"], cfg, None)
    assert "flx k=3 [--hops 3]" in table and "cob batches=2 [--preload eas]" in table

    def same(o):
        return o.label, o.peak, o.rows_per_gpu, o.inter_server_bytes

    kept, _ = mm.drop_dominated(planned["options"])
    assert sorted(map(same, kept), key=str) == sorted(map(same, every), key=str)
    for budget in sorted({o.peak for o in every}):
        a, b = mm.choose(planned["options"], budget), mm.choose_shard_sets(sets, model, 16, 3, budget, **kw)
        # The same reasons but for the names of the sets ("[--hops 3]" planned, the set's path in auto); plan's
        # command adds the note on refused payloads as auto does.
        assert same(a.choice) == same(b.choice)
        assert re.sub(r" \[[^\]]*\]", "", a.reason + mm.refusal_note(planned["model"])) == \
            re.sub(r" \[[^\]]*\]", "", b.reason)

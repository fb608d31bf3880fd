"""The partial payload options beyond fb's (memory_model/payload.py) against real runs (mpirun -n 4, 2
servers x 2 ranks): flx with k < L on Cora, R-GCN on the typed test graph, and --inductive fb and flx on a
synthetic graph (which train on the train-induced graph).  For each, the inter- and intra-server halo bytes of one
epoch in the ledger equal what `preprocess plan` (the build's arrays) and --mode auto's model of the
shard set predict; an inductive run with partials trains the parameters of the run with rows; and --mode
auto, choosing flx with a payload, trains it with both train options, as summary.json records."""
import json
import os
import shutil

import pytest
from mpi4py import MPI

from tests.mpi.conftest import (RANKS_PER_SERVER, TEST_ROW_BLOCK_ROWS, build_sets_on_rank0, make_trainer, on_rank0,
                                shared_tmpdir)

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
HIDDEN = 16


def _predicted(graph, shards, model, hidden, k, route, inductive=False):
    """Rank 0: label -> (inter-server, intra-server) halo bytes of one epoch of fb (k = 0) or flx k with
    each payload, from the plan and from the shard set, which must agree."""
    from granndis_hpc import memory_model as mm
    from granndis_hpc.preprocess.plan import command as plan

    cfg = plan.PlanConfig(servers=WORLD.size // RANKS_PER_SERVER, gpus_per_server=RANKS_PER_SERVER, layers=3,
                          hidden=hidden, dropout=0.0, partitioner="metis", seed=0, row_block_rows=TEST_ROW_BLOCK_ROWS,
                          eas=False, device="cpu", ks=[k], halo_route=route, model=model, inductive=inductive)
    planned = {o.label: o for o in plan.plan_options(MPI.COMM_SELF, graph, cfg)["options"]}
    manifest, servers = mm.read_shard_set(shards)
    m = mm.with_payloads(mm.model_for(manifest, model, hidden, 3, dropout=0.0, halo_route=route, inductive=inductive),
                         types=getattr(graph, "types", None))
    s = mm.set_arrays(shards, manifest, servers, inductive)
    s.ks, s.sample_cobatches = [k], False
    mine = {o.label: o for o in mm.options(mm.row_groups(s, 3, m, mm.Sampling()), m, cfg.servers)}
    name = "fb" if k == 0 else f"flx k={k}"
    labels = {name, f"{name} payload=partial", f"{name} payload=smaller"}
    assert labels <= set(planned) and labels <= set(mine), (set(planned), set(mine))
    out = {}
    for label in labels:
        assert planned[label].inter_server_bytes == mine[label].inter_server_bytes, label
        assert (planned[label].work.intra_bytes == mine[label].work.intra_bytes).all(), label
        out[label.split("payload=")[-1] if "payload=" in label else "rows"] = (
            mine[label].inter_server_bytes["halo"], int(mine[label].work.intra_bytes.sum()))
    return out


def _measured(make):
    """payload -> (inter, intra) halo bytes of one epoch of the trainer make(payload) builds, summed over ranks."""
    out = {}
    for payload in ("rows", "partial", "smaller"):
        trainer = make(payload)
        try:
            trainer.train_epoch()
            got = WORLD.allgather((trainer.ledger.bytes("inter", "halo"), trainer.ledger.bytes("intra", "halo")))
        finally:
            trainer.close()
        out[payload] = tuple(sum(g[i] for g in got) for i in (0, 1))
    return out


def _check(predicted, measured, where):
    """On every rank (rank 0 holds the prediction): the measured bytes equal it."""
    def wrong():
        bad = [(p, got, predicted[p]) for p, got in measured.items() if got != predicted[p]]
        if predicted["partial"][0] == predicted["rows"][0]:  # the payloads must change the bytes
            bad.append(("partial = rows", predicted["partial"], predicted["rows"]))
        return bad
    assert not WORLD.bcast(wrong() if WORLD.rank == 0 else None), where


def test_flx_payload_bytes_equal_the_ledgers(cora, cora_shapes):
    """flx k=1 on the default route (fb's payload tests cover both routes: the world layers' pairs are the
    same code)."""
    route = "per-server"
    predicted = on_rank0(lambda: _predicted(cora, cora_shapes[2], "sage", HIDDEN, 1, route))
    measured = _measured(lambda p: make_trainer(cora_shapes[2], "flx", "sage", 3, hidden=HIDDEN, halo_payload=p,
                                                preloaded_layers=1, no_overlap=True, halo_route=route))
    _check(predicted, measured, f"flx k=1 {route}")


@pytest.fixture(scope="module")
def typed():
    from tests.hetero_graphs import typed_graph

    return typed_graph()


def test_rgcn_payload_bytes_equal_the_ledgers(typed):
    shards = build_sets_on_rank0(typed, {"t": {"layers": 3}}, prefix="granndis-typed-options-")["t"]
    predicted = on_rank0(lambda: _predicted(typed, shards, "rgcn", 8, 0, "per-server"))
    measured = _measured(lambda p: make_trainer(shards, "fb", "rgcn", 3, hidden=8, halo_payload=p, no_overlap=True))
    _check(predicted, measured, "rgcn fb")


@pytest.fixture(scope="module")
def half_train():
    """A synthetic graph half of whose vertices train (Cora's 140 training vertices have no edge between
    the two servers: nothing to send)."""
    from granndis_hpc.preprocess.sources import load

    return load("synthetic", vertices=1500, avg_degree=8.0, features=8, classes=4, seed=1, train_frac=0.5)


@pytest.fixture(scope="module")
def inductive_set(half_train):
    return build_sets_on_rank0(half_train, {"i": {"layers": 3, "inductive": True}},
                               prefix="granndis-ind-options-")["i"]


@pytest.mark.parametrize("k", [0, 1])
def test_inductive_payload_bytes_equal_the_ledgers(half_train, inductive_set, k):
    mode, extra = ("fb", {}) if k == 0 else ("flx", {"preloaded_layers": k})
    predicted = on_rank0(lambda: _predicted(half_train, inductive_set, "sage", HIDDEN, k, "per-server",
                                            inductive=True))
    measured = _measured(lambda p: make_trainer(inductive_set, mode, "sage", 3, hidden=HIDDEN, halo_payload=p,
                                                inductive=True, no_overlap=True, **extra))
    _check(predicted, measured, f"inductive {mode}")


def test_inductive_partials_train_as_rows(inductive_set):
    """The train-induced world view sends the partials (layers 1, 2), and training equals rows' (flx k=1;
    fb's inductive partials are checked by their bytes above)."""
    def run(payload):
        trainer = make_trainer(inductive_set, "flx", "sage", 3, epochs=2, dropout=0.5, seed=3, inductive=True,
                               halo_payload=payload, preloaded_layers=1)
        try:
            trainer.run()
            view = trainer.induced.views["train"]
            used = [bool(u.any()) for u in view.payload.use] if view.payload is not None else []
            return {k: v.detach().clone() for k, v in trainer.model.named_parameters()}, trainer.evaluate(), used
        finally:
            trainer.close()
    (want, scores, _), (got, got_scores, used) = run("rows"), run("partial")
    assert used == [False, True, True]
    err = max((want[k] - got[k]).abs().max().item() / max(1.0, want[k].abs().max().item()) for k in want)
    assert err < 1e-4 and scores == got_scores, err


def test_auto_trains_the_flx_payload_it_chooses(monkeypatch):
    """--mode auto on a 2-hop set priced with a slow inter-server link: flx k=2 with partials at its one
    world layer has the fewest bytes and is chosen; the run trains flx with --preloaded-layers 2 and the
    payload, summary.json records both, and the ledger's halo bytes are the predicted ones."""
    from granndis_hpc import memory_model as mm
    from granndis_hpc.preprocess.sources import load

    def graph():
        return load("synthetic", vertices=1500, avg_degree=8.0, features=8, classes=4, seed=1)

    shards = build_sets_on_rank0(graph, {"h2": {"layers": 3, "preload": "full", "hops": 2}},
                                 prefix="granndis-payload-auto-flx-")["h2"]
    out = os.path.join(shared_tmpdir("granndis-payload-auto-run-"), "run")
    decide = mm.ShardSetOptions.decide
    slow = mm.Rates(inter_Bps=1e3, intra_Bps=1e9, row_s=1e-12, edge_s=1e-12)
    monkeypatch.setattr(mm.ShardSetOptions, "decide", lambda self, rates_for=None: decide(self, lambda m, degree: slow))
    trainer = make_trainer(shards, "auto", "sage", 3, hidden=HIDDEN, memory_per_gpu="64GiB", no_overlap=True,
                           auto_modes="exact", out=out)
    try:
        choice, cfg = trainer.mode.decision["choice"], trainer.cfg
        assert (choice["mode"], choice["k"]) == ("flx", 2) and choice["payload"] != "rows", trainer.mode.decision
        assert choice["train_options"] == {"preloaded_layers": 2, "halo_payload": choice["payload"]}
        assert (cfg.mode, cfg.preloaded_layers, cfg.halo_payload) == ("flx", 2, choice["payload"])
        trainer.run()
        got = sum(WORLD.allgather(trainer.ledger.bytes("inter", "halo")))
    finally:
        trainer.close()
    WORLD.barrier()
    if WORLD.rank == 0:
        with open(os.path.join(out, "summary.json")) as f:
            plan = json.load(f)["plan"]
        shutil.rmtree(os.path.dirname(shards), ignore_errors=True)
        shutil.rmtree(os.path.dirname(out), ignore_errors=True)
        assert plan["halo_payload"] == choice["payload"] and plan["preloaded_layers"] == 2
        assert plan["auto"]["choice"]["label"] == choice["label"]
    assert got == choice["inter_server_bytes"]["halo"]  # one epoch, as predicted

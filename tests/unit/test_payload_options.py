"""The partial payloads beyond fb with rows in the byte model (memory_model/payload.py): flx with k < L
(its world layers), R-GCN (one partial row per remote destination, out wide) and --inductive runs (on
the train-induced graph), as options of --mode auto and `preprocess plan`, against counts computed here
with NumPy from the graph and the shard set's partition; and where they are not offered, the reason."""
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from granndis_hpc import memory_model as mm
from tests.unit.test_payload_model import _owner, _want

HIDDEN, CLASSES, FEATURES = 16, 4, 12


def _build(graph, out, **kw):
    from mpi4py import MPI

    from granndis_hpc.preprocess.build.pipeline import build_shards

    build_shards(graph, out, servers=2, gpus_per_server=2, layers=3, partitioner="metis", comm=MPI.COMM_SELF, **kw)
    return out


@pytest.fixture(scope="module")
def graph():
    from granndis_hpc.preprocess.sources import load

    return load("synthetic", vertices=1500, avg_degree=8.0, features=FEATURES, classes=CLASSES, seed=1)


@pytest.fixture(scope="module")
def sets(graph, tmp_path_factory):
    base = tmp_path_factory.mktemp("payload-options")
    return {"full": _build(graph, base / "full3"), "inductive": _build(graph, base / "ind3", inductive=True),
            "h2": _build(graph, base / "h2", hops=2)}


def _options(path, m, inductive=False):
    manifest, servers = mm.read_shard_set(str(path))
    s = mm.set_arrays(str(path), manifest, servers, inductive)
    s.sample_cobatches = False
    return {o.label: o for o in mm.options(mm.row_groups(s, 3, m, mm.Sampling()), m, 2)}


# Layers 0: 12 -> 16 (messages 12, reads the input features: rows exchanged once), 1: 16 -> 16 (16),
# 2: 16 -> 4 (4).  flx with k preloaded layers exchanges between servers at layers k..2 only.
WORLD_LAYERS = {0: [(HIDDEN, HIDDEN), (HIDDEN, CLASSES)], 1: [(HIDDEN, HIDDEN), (HIDDEN, CLASSES)],
                2: [(HIDDEN, CLASSES)]}


@pytest.mark.parametrize("route", ["direct", "per-server"])
def test_flx_payloads_bytes(graph, sets, route):
    m = mm.with_payloads(mm.ModelSpec("sage", FEATURES, HIDDEN, CLASSES, 3, halo_route=route))
    got = _options(sets["full"], m)
    blocking = _options(sets["full"], replace(m, overlap=()))  # --no-overlap
    owner = _owner(sets["full"])
    for k in (1, 2):
        want = _want(graph, owner, WORLD_LAYERS[k], route)
        for payload in ("rows", "partial", "smaller"):
            o = got[f"flx k={k}" + (f" payload={payload}" if payload != "rows" else "")]
            assert (o.mode, o.k, o.payload) == ("flx", k, payload)
            assert o.inter_server_bytes["halo"] == want[payload], (k, payload, route)
            assert o.inter_server_bytes["gradient"] == got["fb"].inter_server_bytes["gradient"]
        if route == "direct":  # partials replace rows between servers only: the intra-server bytes stay
            assert got[f"flx k={k} payload=partial"].work.intra_bytes.sum() == got[f"flx k={k}"].work.intra_bytes.sum()
        assert want["smaller"] <= min(want["rows"], want["partial"])
        # rounds: each exchanging world layer one world round (forward and backward), its rows relayed inside
        # the server on the per-server route; blocking, one that sends partials a second world round for
        # them (with partial, every one; smaller, those where they are fewer bytes); overlapped (the
        # default), the partials travel beside the rows' round
        n = len(WORLD_LAYERS[k])
        relay = 2 * n if route == "per-server" else 0
        for payload, world in (("rows", 2 * n), ("partial", 4 * n)):
            label = f"flx k={k}" + (f" payload={payload}" if payload != "rows" else "")
            o, b = got[label], blocking[label]
            assert (b.work.world_rounds, b.work.relay_rounds, b.work.server_rounds) == (world, relay, 2 * (k - 1))
            assert (o.work.world_rounds, o.work.relay_rounds, o.work.server_rounds) == (2 * n, relay, 2 * (k - 1))
        assert 2 * n <= blocking[f"flx k={k} payload=smaller"].work.world_rounds <= 4 * n
        assert got[f"flx k={k} payload=smaller"].work.world_rounds == 2 * n
    assert (blocking["fb payload=partial"].work.world_rounds, blocking["fb"].work.world_rounds) == (8, 4)
    assert got["fb payload=partial"].work.world_rounds == got["fb"].work.world_rounds == 4
    assert got["flx k=1 payload=smaller"].train_options() == {"preloaded_layers": 1, "halo_payload": "smaller"}
    assert "flx k=3" in got and not any(label.startswith("flx k=3 payload") for label in got)  # k = L: no world layer
    # flx k=1's world layers are fb's exchanging ones: the same bytes
    assert got["flx k=1 payload=smaller"].inter_server_bytes == got["fb payload=smaller"].inter_server_bytes


def test_inductive_payloads_count_the_train_induced_graph(graph, sets):
    """An --inductive run trains on the graph induced by the training vertices: its fb and flx payload
    options are counted there (edges between training vertices only), with the full graph's partition."""
    m = mm.with_payloads(mm.ModelSpec("sage", FEATURES, HIDDEN, CLASSES, 3, halo_route="direct", inductive=True))
    assert m.message_widths and not m.payload_refusal
    got = _options(sets["inductive"], m, inductive=True)
    train = np.asarray(graph.train_mask, dtype=bool)
    dst = np.repeat(np.arange(graph.num_vertices), np.diff(graph.indptr))
    keep = train[dst] & train[graph.indices]
    induced = SimpleNamespace(indptr=np.concatenate([[0], np.cumsum(np.bincount(dst[keep],
                                                                                 minlength=graph.num_vertices))]),
                              indices=np.asarray(graph.indices)[keep])
    owner = _owner(sets["inductive"])
    for label, k in (("fb", 0), ("flx k=1", 1), ("flx k=2", 2)):
        want = _want(induced, owner, WORLD_LAYERS[k], "direct")
        for payload in ("rows", "partial", "smaller"):
            o = got[label + (f" payload={payload}" if payload != "rows" else "")]
            assert o.inter_server_bytes["halo"] == want[payload], (label, payload)
    assert _want(induced, owner, WORLD_LAYERS[0], "direct")["rows"] < _want(graph, owner, WORLD_LAYERS[0],
                                                                             "direct")["rows"]


def test_rgcn_partials_are_out_wide(tmp_path):
    """R-GCN sends one partial row per remote destination row, at the layer's output width (its relation
    means projected before they are sent); built with the graph's types, which the estimate needs."""
    from tests.hetero_graphs import typed_graph

    typed = typed_graph()
    path = _build(typed, tmp_path / "typed3")
    manifest, _ = mm.read_shard_set(str(path))
    base = mm.model_for(manifest, "rgcn", 8, 3, halo_route="direct")
    untyped = mm.with_payloads(base)
    assert untyped.message_widths == () and "vertex types" in untyped.payload_refusal
    m = mm.with_payloads(base, types=typed.types)
    classes = int(typed.num_classes)
    assert m.message_widths == (8, 8, classes) and not m.payload_refusal
    got = _options(path, m)
    owner = _owner(path)
    for label, k in (("fb", 0), ("flx k=1", 1), ("flx k=2", 2)):
        # layer 1: 8 -> 8 (a partial row 8 wide: a tie, rows kept), layer 2: 8 -> classes
        widths = [(8, 8), (8, classes)][max(k, 1) - 1:]
        want = _want(typed, owner, widths, "direct")
        for payload in ("rows", "partial", "smaller"):
            o = got[label + (f" payload={payload}" if payload != "rows" else "")]
            assert o.inter_server_bytes["halo"] == want[payload], (label, payload)
        assert want["smaller"] < want["rows"]
    # memory: a payload's structures (per relation) come on top of the rows option's
    assert got["fb payload=partial"].peak > got["fb"].peak


@pytest.mark.parametrize("change,words", [(dict(name="gat"), "weighted sum"), (dict(precision="bf16"), "float32"),
                                          (dict(input_dropout=0.2), "--input-dropout")])
def test_refused_payloads_are_not_offered_and_the_reason_says_why(sets, change, words):
    kw = dict(change)
    name, dropout = kw.pop("name", "sage"), kw.pop("input_dropout", 0.0)
    rates = mm.Rates(inter_Bps=1e3, intra_Bps=1e9, row_s=1e-12, edge_s=1e-12)
    d = mm.choose_shard_sets([str(sets["full"])], name, HIDDEN, 3, 1 << 40, rates_for=lambda m, degree: rates,
                             exact_only=True, input_dropout=dropout, **kw)
    assert all(o.payload == "rows" for o in d.options)
    assert "no partial payloads offered" in d.reason and words in d.reason
    assert "--halo-payload rows" not in d.reason


def test_auto_prices_the_flx_payloads(sets):
    """On a slow link the option of the fewest inter-server bytes wins: on a 2-hop set, flx k=2 sending
    partials at its one world layer (where they are the fewer bytes on both server pairs)."""
    rates = mm.Rates(inter_Bps=1e3, intra_Bps=1e9, row_s=1e-12, edge_s=1e-12)
    d = mm.choose_shard_sets([str(sets["h2"])], "sage", HIDDEN, 3, 1 << 40, rates_for=lambda m, degree: rates,
                             exact_only=True)
    c = d.choice
    assert (c.mode, c.k) == ("flx", 2) and c.payload in ("partial", "smaller"), d.reason  # (equal bytes here)
    assert c.to_dict()["train_options"] == {"preloaded_layers": 2, "halo_payload": c.payload}
    assert c.inter_server_bytes["halo"] == min(o.inter_server_bytes["halo"] for o in d.options)
    assert c.inter_server_bytes["halo"] < next(o for o in d.options if o.label == "flx k=2").inter_server_bytes["halo"]


def test_plan_says_why_no_payload_is_offered(tmp_path, capsys):
    """`preprocess plan` of a model whose layers are no weighted sum: rows only, and the line says why."""
    from tests.unit.test_memory_model_cli import _plan

    rc, res = _plan(tmp_path, "--model", "gat", "--no-eas")
    assert rc == 0 and all(o["payload"] == "rows" for o in res["options"])
    assert "no partial payloads offered: --halo-payload partial needs layers whose aggregation is a weighted sum" \
        in capsys.readouterr().out

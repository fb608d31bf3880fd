"""Partial aggregates instead of halo rows (--halo-payload, engine/partial.py) for R-GCN on the typed test
graph (tests/hetero_graphs.py: papers, authors, fields; five relations; mpirun -n 4).

R-GCN's neighbour term sum_r mean_{u in N_r(v)} x_u W_r is linear in the source rows, so a server sends
a remote destination row one partial row, out wide: the sum over relations of its own rows' relation
means (coefficient 1 / deg_r(v)) projected by W_r.  Exact: fb with 'partial' and 'smaller' gives the
logits, the accuracies and, after training with dropout, the parameters of fb with rows, on 2x2 and 4x1,
blocking (--no-overlap) and overlapped (both against rows, blocking); with an input projection (layer 0's
rows then travel every pass) layer 0 sends partials too; in flx with k = 2 < L the last layer sends
them (against flx with rows).  Bytes: the ledger's inter- and intra-server halo bytes of one epoch equal
counts computed here from the graph and the partition with NumPy, the choice of 'smaller' made here."""
import pytest
from mpi4py import MPI

from tests.hetero_graphs import typed_graph
from tests.mpi.conftest import build_sets_on_rank0, make_trainer
from tests.mpi.test_halo_payload import _check_equal, _measure_payloads, _pair_counts, _server_pairs, _trained

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
LAYERS, HIDDEN, EPOCHS = 3, 8, 2


@pytest.fixture(scope="module")
def typed():
    return typed_graph()


@pytest.fixture(scope="module")
def typed_shapes(typed):
    """Full 3-hop sets of the typed graph for 2x2 and 4x1, keyed by ranks per server."""
    specs = {rps: {"servers": WORLD.size // rps, "gpus_per_server": rps, "layers": LAYERS, "preload": "full"}
             for rps in (2, 1)}
    return build_sets_on_rank0(typed, specs, prefix="granndis-typed-payload-")


def _run(shards, payload, rps, no_overlap, options=("num_bases=2",), k=None):
    mode, extra = ("fb", {}) if k is None else ("flx", {"preloaded_layers": k})
    trainer = make_trainer(shards, mode, "rgcn", LAYERS, hidden=HIDDEN, epochs=EPOCHS, dropout=0.5, seed=3,
                           halo_payload=payload, ranks_per_server=rps, no_overlap=no_overlap,
                           model_option=list(options), eval_every=1, **extra)
    return _trained(trainer)


# (ranks per server, payload, model options, flx's preloaded layers or None for fb): layer 0 reads the
# input features (exchanged at set-up) and sends rows, unless the model projects them first (option
# project); flx's preloaded layers exchange rows inside the server.
CASES = [(2, "partial", ("num_bases=2",), None), (2, "smaller", ("num_bases=2",), None),
         (1, "partial", ("num_bases=2",), None), (2, "partial", ("project=8",), None),
         (2, "partial", ("num_bases=2",), 2)]


@pytest.mark.parametrize("rps,payload,options,k", CASES)
def test_rgcn_partial_aggregates_equal_rows(typed_shapes, rps, payload, options, k):
    reference, _ = _run(typed_shapes[rps], "rows", rps, True, options, k)
    runs = [(no_overlap, *_run(typed_shapes[rps], payload, rps, no_overlap, options, k))
            for no_overlap in (True, False)]
    if WORLD.rank != 0:
        return
    for no_overlap, got, used in runs:
        where = (f"rgcn {options}, {payload}, {rps} ranks per server, k={k}, "
                 f"{'blocking' if no_overlap else 'overlapped'}")
        if payload == "partial":
            first = k or 0  # the layers before it run on the preload (flx) or read the input features
            assert used == [layer >= first and (layer > 0 or "project=8" in options) for layer in range(3)], where
        else:
            assert any(used), where
        _check_equal(reference, got, where)


def test_rgcn_ledger_bytes_equal_the_partition_count(typed, typed_shapes):
    runs = [(p, True) for p in ("rows", "partial", "smaller")] + [("smaller", False)]
    measured, owner, server = _measure_payloads(
        runs, lambda payload, no_overlap: make_trainer(typed_shapes[2], "fb", "rgcn", LAYERS, hidden=HIDDEN,
                                                       halo_payload=payload, no_overlap=no_overlap,
                                                       halo_route="direct"))
    rows, partials, _ = _pair_counts(typed, owner, server)
    across = server[:, None] != server[None, :]  # [reader, source]
    pairs = _server_pairs(rows, partials, server)
    # Layers 1 (8 -> 8) and 2 (8 -> 4 classes): rows at the input width, a partial row at the output width
    # (R-GCN projects each relation's mean before it is sent); forward and backward, float32.
    classes = int(typed.num_classes)
    widths = [(HIDDEN, HIDDEN), (HIDDEN, classes)]
    expected = {payload: 2 * 4 * sum(pick(r * w_in, p * w_out) for w_in, w_out in widths for r, p in pairs)
                for payload, pick in (("rows", lambda r, p: r), ("partial", lambda r, p: p), ("smaller", min))}
    for run, (inter, intra) in measured.items():
        assert inter == expected[run[0]], (run, inter, expected)
        assert intra == sum(int(rows[~across].sum()) * w_in for w_in, _ in widths) * 2 * 4, run
    assert expected["smaller"] < expected["rows"]

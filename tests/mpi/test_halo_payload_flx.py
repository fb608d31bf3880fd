"""Partial aggregates (--halo-payload, engine/partial.py) in Flexible Preloading with k < L on real Cora
(mpirun -n 4, 2x2): the first k layers run on the server's preload (rows inside the server), the other
L - k on the world view, whose exchanges between servers send partials as fb's do.

Exact: flx with 'partial' and 'smaller' gives the logits, the accuracies and, after training with
dropout, the parameters of flx with rows, for k = 1 and 2, blocking (--no-overlap) and overlapped.
Bytes: the ledger's inter-server halo bytes of one epoch equal counts computed here from the graph and
the partition with NumPy for the world view's layers only (the preloaded layers send nothing between
servers), the choice of 'smaller' made here; the intra-server bytes are those of rows.  Refused where
no layer runs on the world view (k = L) and in the other modes."""
import pytest
from mpi4py import MPI

from tests.mpi.conftest import make_trainer
from tests.mpi.test_halo_payload import _check_equal, _measure_payloads, _pair_counts, _server_pairs, _trained

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
EPOCHS, HIDDEN = 2, 16


def _run(shards, payload, k, no_overlap):
    trainer = make_trainer(shards, "flx", "sage", 3, epochs=EPOCHS, dropout=0.5, seed=3, halo_payload=payload,
                           preloaded_layers=k, ranks_per_server=2, no_overlap=no_overlap)
    return _trained(trainer)


@pytest.mark.parametrize("k,payload", [(1, "partial"), (1, "smaller"), (2, "partial")])
def test_flx_partial_aggregates_equal_rows(cora_shapes, k, payload):
    reference, _ = _run(cora_shapes[2], "rows", k, True)
    runs = [(no_overlap, *_run(cora_shapes[2], payload, k, no_overlap)) for no_overlap in (True, False)]
    if WORLD.rank != 0:
        return
    for no_overlap, got, used in runs:
        where = f"flx k={k}, {payload}, {'blocking' if no_overlap else 'overlapped'}"
        if payload == "partial":  # the world view's layers (after the k preloaded ones) send partials
            assert used == [layer >= k for layer in range(3)], where
        else:
            assert any(used[k:]) and not any(used[:k]), where
        _check_equal(reference, got, where)


def test_flx_ledger_bytes_equal_the_partition_count(cora, cora_shapes):
    k = 1
    measured, owner, server = _measure_payloads(
        [("rows", True), ("partial", True), ("smaller", True), ("smaller", False)],
        lambda payload, no_overlap: make_trainer(cora_shapes[2], "flx", "sage", 3, hidden=HIDDEN,
                                                 halo_payload=payload, preloaded_layers=k,
                                                 no_overlap=no_overlap, halo_route="direct"))
    rows, partials, _ = _pair_counts(cora, owner, server)
    pairs = _server_pairs(rows, partials, server)
    # The world view runs layers 1 (16 -> 16, messages 16) and 2 (16 -> 7, messages 7); forward and
    # backward, float32.  Layer 0 runs on the preload: no inter-server bytes.
    widths = [(HIDDEN, HIDDEN), (HIDDEN, 7)]
    expected = {payload: 2 * 4 * sum(pick(r * w_in, p * w_msg) for w_in, w_msg in widths for r, p in pairs)
                for payload, pick in (("rows", lambda r, p: r), ("partial", lambda r, p: p), ("smaller", min))}
    for run, (inter, intra) in measured.items():
        assert inter == expected[run[0]], (run, inter, expected)
        assert intra == measured["rows", True][1], run  # partials only between servers
    assert expected["smaller"] < expected["rows"]


@pytest.mark.parametrize("mode,extra,words", [("flx", {"preloaded_layers": 3}, "--preloaded-layers below"),
                                              ("eas", {}, "--mode fb")])
def test_refused_without_world_layers(cora_shards, mode, extra, words):
    shards = cora_shards[("eas", 3) if mode == "eas" else ("full", 3)]
    with pytest.raises(Exception, match=words):
        make_trainer(shards, mode, "sage", 3, halo_payload="smaller", no_overlap=True, **extra)

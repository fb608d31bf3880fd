"""Partial aggregates instead of halo rows (--halo-payload, engine/partial.py) on real Cora (mpirun -n 4).

Exact: fb with partial aggregates ('partial', 'smaller') gives the logits, the accuracies and, after
training with dropout, the parameters of fb with rows, on 2x2, 1x4 and 4x1 (float32 rounding only: the
same weighted sums in another order), for GraphSAGE (mean), GCN, GIN (sum) and ResSAGE+ (whose layer 0
exchanges rows every pass, so it sends partials too), with the exchanges blocking (--no-overlap) and
overlapped (the default; every exchange then posted, the overlapped run also equal to the blocking one).
Bytes: the ledger's inter- and intra-server halo bytes of one epoch equal counts computed here from the
graph and the partition with NumPy, for each payload, the per-server-pair choice of 'smaller' made here
independently, blocking and overlapped."""
import numpy as np
import pytest
from mpi4py import MPI

from tests.mpi.conftest import logits_then_training, make_trainer

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
EPOCHS, HIDDEN = 2, 16


def _run(shards, payload, rps, model="sage", route="direct", no_overlap=True):
    """Logits before training, parameters after EPOCHS with dropout and the evaluation's accuracies."""
    trainer = make_trainer(shards, "fb", model, 3, epochs=EPOCHS, dropout=0.5, seed=3, halo_payload=payload,
                           ranks_per_server=rps, no_overlap=no_overlap, halo_route=route)
    (logits, params, scores), used = _trained(trainer)
    return logits, params, scores, used


def _trained(trainer):
    """(logits before training, parameters after it, scores) and which world layers sent partials; closes
    the trainer."""
    try:
        logits, params, scores = logits_then_training(trainer)
        used = [bool(u.any()) for u in trainer.world_view.payload.use] if trainer.world_view.payload else []
        return (logits, params, scores), used
    finally:
        trainer.close()


# GraphSAGE on every shape with both payloads, and on 2x2 on the per-server route (rows relayed, partials
# direct); the other kinds of weighted sum on 2x2 with partials.  Each payload runs blocking (--no-overlap)
# and overlapped (the default); both are compared with rows, and the overlapped run with the blocking one.
CASES = [("sage", 2, ("partial", "smaller"), "direct"), ("sage", 2, ("partial", "smaller"), "per-server"),
         ("sage", 4, ("partial",), "direct"), ("sage", 1, ("partial", "smaller"), "direct"),
         ("gcn", 2, ("partial",), "direct"), ("gin", 2, ("partial",), "direct"), ("ressage", 2, ("partial",), "direct")]


def _check_equal(reference, got, where):
    """Rank 0: logits, parameters after training and scores of `got` equal `reference`'s (rounding only)."""
    logits_r, params_r, scores_r = reference
    logits_p, params_p, scores_p = got
    assert np.abs(logits_r - logits_p).max() < 1e-5 * max(1.0, np.abs(logits_r).max()), where
    moved = max(params_r[k].abs().max().item() for k in params_r)
    assert moved > 0
    # Adam divides a float32 rounding residue of a near-zero gradient by its own small scale: 1e-4
    # relative (a wrong edge or coefficient moves the updates by up to lr = 1e-2 a step).
    err = max((params_r[k] - params_p[k]).abs().max().item() / max(1.0, params_r[k].abs().max().item())
              for k in params_r)
    assert err < 1e-4, f"{where}: parameters differ by {err:.3e}"
    assert scores_r == scores_p, where


@pytest.mark.parametrize("model,rps,payloads,route", CASES)
def test_partial_aggregates_equal_rows(cora_shapes, model, rps, payloads, route):
    *rows_run, _ = _run(cora_shapes[rps], "rows", rps, model, route)
    for payload in payloads:
        runs = [(no_overlap, _run(cora_shapes[rps], payload, rps, model, route, no_overlap))
                for no_overlap in (True, False)]
        if WORLD.rank != 0:
            continue
        for no_overlap, (*got, used) in runs:
            where = f"{model}, {payload}, {rps} ranks per server, {route}, {'blocking' if no_overlap else 'overlapped'}"
            if payload == "partial":  # layers 1, 2 (and ResSAGE+'s 0) send partials, where there are servers to
                assert used == ([model == "ressage", True, True] if rps < WORLD.size else [False] * 3), where
            _check_equal(rows_run, got, where)
            if not no_overlap:  # and the same as the blocking run with the same payload
                assert used == runs[0][1][3], where
                _check_equal(runs[0][1][:3], got, where)


def _traced(fn):
    """fn()'s exchange trace events (cluster/trace.py), recorded on this rank for the call only."""
    from granndis_hpc.cluster import trace

    saved, trace.EVENTS = trace.EVENTS, []
    try:
        fn()
        return list(trace.EVENTS)
    finally:
        trace.EVENTS = saved


def _measure_payloads(runs, make, check=None):
    """One traced epoch per (payload, no_overlap) run of the trainer make(payload, no_overlap) builds,
    check(trainer, events, payload, no_overlap) after it where given: the runs' summed (inter, intra)
    halo bytes, each vertex's owning rank and each rank's server."""
    measured = {}
    for payload, no_overlap in runs:
        trainer = make(payload, no_overlap)
        try:
            events = _traced(trainer.train_epoch)
            if check is not None:
                check(trainer, events, payload, no_overlap)
            got = WORLD.allgather((trainer.ledger.bytes("inter", "halo"), trainer.ledger.bytes("intra", "halo")))
            owner_parts = WORLD.allgather(trainer.slice.global_id[: trainer.slice.n_inner])
            server = np.array([trainer.topo.server_of(r) for r in range(WORLD.size)])
        finally:
            trainer.close()
        measured[payload, no_overlap] = tuple(sum(g[i] for g in got) for i in (0, 1))
    owner = np.empty(sum(p.size for p in owner_parts), dtype=np.int64)
    for rank, gids in enumerate(owner_parts):
        owner[gids] = rank
    return measured, owner, server


def _pair_counts(cora, owner, server):
    """[reader, source] rank pairs: (distinct rows the source sends the reader, distinct rows of the
    reader with an in-edge from the source's rows), and [reading server, source] the distinct rows the
    source sends a server (the per-server route)."""
    P = int(owner.max()) + 1
    dst = np.repeat(np.arange(owner.size), np.diff(cora.indptr))
    src = cora.indices.astype(np.int64)
    reader, source = owner[dst], owner[src]
    remote = reader != source
    rows, partials = np.zeros((P, P), np.int64), np.zeros((P, P), np.int64)
    for counts, vertex in ((rows, src), (partials, dst)):
        pairs = np.unique(np.stack([reader[remote], source[remote], vertex[remote]], 1), axis=0)
        np.add.at(counts, (pairs[:, 0], pairs[:, 1]), 1)
    once = np.zeros((int(server.max()) + 1, P), np.int64)
    pairs = np.unique(np.stack([server[reader[remote]], source[remote], src[remote]], 1), axis=0)
    np.add.at(once, (pairs[:, 0], pairs[:, 1]), 1)
    return rows, partials, once



def _server_pairs(rows, partials, server, once=None):
    """Per ordered server pair (s sends, t reads): the rows that cross (once per reading rank from the
    [reader, source] counts, or once per reading server from `once` where given) and the partial rows."""
    pairs = []
    for s in np.unique(server):
        for t in np.unique(server):
            if s != t:
                reading = (server[:, None] == t) & (server[None, :] == s)
                crossing = rows[reading].sum() if once is None else once[t, server == s].sum()
                pairs.append((int(crossing), int(partials[reading].sum())))
    return pairs

@pytest.mark.parametrize("route", ["direct", "per-server"])
def test_ledger_bytes_equal_the_partition_count(cora, cora_shapes, route):
    # Blocking (--no-overlap) each payload, and overlapped (the default) those that send partials.
    runs = [(p, True) for p in ("rows", "partial", "smaller")] + [(p, False) for p in ("partial", "smaller")]

    def posted_every_exchange(trainer, events, payload, no_overlap):
        if not no_overlap:  # every exchange was posted: layers 1 and 2 post their rows, and the partials
            n_used = sum(bool(u.any()) for u in trainer.world_view.payload.use)
            steps = sum(e[0] == "step_start" for e in events)
            posts = [sum(e[0] == "post_" + d for e in events) for d in ("fwd", "bwd")]
            assert steps > 0 and not any(e[0].startswith("block_") for e in events)
            assert posts[0] == posts[1] == (2 + n_used) * steps, (payload, n_used, steps, posts)

    measured, owner, server = _measure_payloads(
        runs, lambda payload, no_overlap: make_trainer(cora_shapes[2], "fb", "sage", 3, hidden=HIDDEN,
                                                       halo_payload=payload, no_overlap=no_overlap,
                                                       halo_route=route),
        posted_every_exchange)
    rows, partials, once = _pair_counts(cora, owner, server)
    across = server[:, None] != server[None, :]  # [reader, source]
    # Per ordered server pair (s sends, t reads): the rows that cross (once per reading rank on the direct
    # route, once per reading server on the per-server one) and the partial rows.
    pairs = _server_pairs(rows, partials, server, once if route == "per-server" else None)
    # Layer 0 reads the input features (their halo exchanged once at set-up); layer 1 is 16 -> 16 wide
    # (messages 16), layer 2 16 -> 7 (messages 7); forward and backward, float32.
    widths = [(HIDDEN, HIDDEN), (HIDDEN, 7)]
    expected = {payload: 2 * 4 * sum(pick(r * w_in, p * w_msg) for w_in, w_msg in widths for r, p in pairs)
                for payload, pick in (("rows", lambda r, p: r), ("partial", lambda r, p: p), ("smaller", min))}
    for payload, no_overlap in measured:
        assert measured[payload, no_overlap][0] == expected[payload], (payload, no_overlap)
    intra = sum(int(rows[~across].sum()) * w_in for w_in, _ in widths) * 2 * 4  # same-server rows
    if route == "direct":
        assert all(measured[run][1] == intra for run in measured)
    else:  # the rows that no longer cross are forwarded inside the server; with partials only, none are
        assert measured["partial", True][1] == measured["partial", False][1] == intra < measured["rows", True][1]
        assert measured["smaller", True][1] == measured["smaller", False][1]
    assert expected["smaller"] <= min(expected["rows"], expected["partial"])

"""The per-server halo route (--halo-route per-server, engine/halo_route.py) on real Cora (mpirun -n 4).

Exact: fb and flx with k < L give the same logits (bit for bit: the route delivers the same rows), the
same accuracies and, after training with dropout, the same parameters as the direct route on 2x2, 1x4
and 4x1, blocking and overlapped.  (The topology has servers of equal size only, so no uneven shape.)
Bytes: the ledger's inter- and intra-server halo bytes of one epoch equal counts computed here from the
partition with NumPy, and the route's inter-server bytes are below the direct route's."""
import numpy as np
import pytest
from mpi4py import MPI

from tests.mpi.conftest import logits_then_training, make_trainer

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
EPOCHS, HIDDEN = 4, 16


def _run(shards, route, rps, mode="fb", **extra):
    """Logits before training, parameters after EPOCHS with dropout and the evaluation's accuracies."""
    trainer = make_trainer(shards, mode, "sage", 3, epochs=EPOCHS, dropout=0.5, seed=3, halo_route=route,
                           ranks_per_server=rps, eval_every=1, **extra)
    try:
        return logits_then_training(trainer)
    finally:
        trainer.close()


@pytest.mark.parametrize("mode,extra", [("fb", {}), ("fb", {"no_overlap": True}), ("flx", {"preloaded_layers": 1})])
def test_per_server_route_equals_direct_on_every_shape(cora_shapes, mode, extra):
    for rps in (2, 4, 1):
        logits_d, params_d, scores_d = _run(cora_shapes[rps], "direct", rps, mode, **extra)
        logits_s, params_s, scores_s = _run(cora_shapes[rps], "per-server", rps, mode, **extra)
        if WORLD.rank == 0:
            assert np.array_equal(logits_d, logits_s), f"{rps} ranks per server: logits differ"
            moved = max((params_d[k]).abs().max().item() for k in params_d)
            assert moved > 0
            err = max((params_d[k] - params_s[k]).abs().max().item() for k in params_d)
            # The route adds a server's gradients of a shared row before the owner adds the servers':
            # another order of the same sums, so float32 rounding only.
            assert err < 1e-6, f"{rps} ranks per server: parameters differ by {err:.3e}"
            assert scores_d == scores_s


def _expected_rows(cora, owner, server_of_rank):
    """Halo rows of one layer's forward, from the graph and the partition: {route: (inter, intra)}."""
    dst = np.repeat(np.arange(owner.size), np.diff(cora.indptr))
    src = cora.indices.astype(np.int64)
    reader, source_rank = owner[dst], owner[src]
    pairs = np.unique(np.stack([reader, src], 1)[reader != source_rank], axis=0)  # (reading rank, vertex)
    reader_server, source_server = server_of_rank[pairs[:, 0]], server_of_rank[owner[pairs[:, 1]]]
    across = reader_server != source_server
    direct_inter, same_server = int(across.sum()), int((~across).sum())
    per_server = np.unique(np.stack([reader_server[across], pairs[across, 1]], 1), axis=0)
    # Each row crossing once per server reaches one of its readers there, which forwards it to the others.
    return {"direct": (direct_inter, same_server),
            "per-server": (per_server.shape[0], same_server + direct_inter - per_server.shape[0])}


def test_ledger_bytes_equal_the_partition_count(cora, cora_shapes):
    measured = {}
    for route in ("direct", "per-server"):
        trainer = make_trainer(cora_shapes[2], "fb", "sage", 3, hidden=HIDDEN, halo_route=route)
        try:
            trainer.train_epoch()
            got = WORLD.allgather((trainer.ledger.bytes("inter", "halo"), trainer.ledger.bytes("intra", "halo")))
            owner_parts = WORLD.allgather(trainer.slice.global_id[: trainer.slice.n_inner])
            server_of_rank = np.array([trainer.topo.server_of(r) for r in range(WORLD.size)])
            if route == "per-server":  # the rows each rank relays: the engine's plan against the memory model's
                plan = trainer.world_view._routes[1].plan
                relayed = WORLD.allgather(int(plan.recv_counts[server_of_rank != trainer.topo.server].sum()))
        finally:
            trainer.close()
        measured[route] = tuple(sum(g[i] for g in got) for i in (0, 1))
    owner = np.empty(sum(p.size for p in owner_parts), dtype=np.int64)
    for rank, gids in enumerate(owner_parts):
        owner[gids] = rank
    rows = _expected_rows(cora, owner, server_of_rank)
    # Layers 1 and 2 exchange HIDDEN-wide float32 rows, forward and backward (layer 0's input features
    # were exchanged once at set-up).
    per_row = 2 * 2 * HIDDEN * 4
    for route in ("direct", "per-server"):
        assert measured[route] == (rows[route][0] * per_row, rows[route][1] * per_row), route
    # The memory model counts, per rank, the rows it relays by the route's rule (memory_model/arrays.py).
    from granndis_hpc import memory_model as mm
    _, servers = mm.read_shard_set(cora_shapes[2])
    assert [r.world.inter_once for r in mm.shard_rows(servers, 3, 0, 1433, 7)] == relayed
    # Cora's 2x2 partition has vertices read by both ranks of the other server: the route sends fewer bytes.
    assert rows["per-server"][0] < rows["direct"][0]
    assert measured["per-server"][0] < measured["direct"][0]

"""collective_errors and Group under `mpirun -n 4`: an exception on one rank becomes the same
ClusterError on every rank (naming the failing rank and the phase), and the ranks stay in step;
success costs one allgather.  Also through a Topology (as the engine calls it) and a server group."""
import numpy as np
import pytest
from mpi4py import MPI

from granndis_hpc.cluster import as_group, collective_errors, init_topology

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
RANK, P = WORLD.Get_rank(), WORLD.Get_size()


def _outcome(fn):
    """(type name, message) of what fn raised on this rank, gathered after every rank finished."""
    try:
        fn()
        return None
    except Exception as exc:  # noqa: BLE001 - compared across ranks below
        return type(exc).__name__, str(exc), getattr(exc, "collective", None), type(exc.__cause__).__name__


def test_one_failing_rank_gives_every_rank_the_same_error():
    group = as_group(None)

    def block():
        with group.errors("loading the dataset"):
            if RANK == 2:
                raise FileNotFoundError("ind.cora.x missing")

    mine = _outcome(block)
    everyone = WORLD.allgather(mine[:3])
    want = ("ClusterError", "rank 2: loading the dataset: FileNotFoundError: ind.cora.x missing", True)
    assert everyone == [want] * P
    assert mine[3] == ("FileNotFoundError" if RANK == 2 else "NoneType")  # the cause where it happened


def test_several_failing_ranks_are_all_named():
    def block():
        with collective_errors(WORLD, "partitioning"):
            if RANK % 2:
                raise ValueError("no vertices")

    everyone = WORLD.allgather(_outcome(block)[:2])
    assert everyone == [("ClusterError", "ranks 1,3: partitioning: ValueError: no vertices")] * P


def test_success_returns_normally_everywhere_and_collectives_still_line_up():
    group = as_group(WORLD)
    with group.errors("summing"):
        value = RANK + 1
    assert group.allgather_object(value) == list(range(1, P + 1))
    np.testing.assert_array_equal(group.allreduce_max(np.array([RANK, -RANK])), [P - 1, 0])
    local = np.arange(RANK + 1, dtype=np.int64)
    assert group.allgatherv(local, list(range(1, P + 1))).tolist() == [i for r in range(P) for i in range(r + 1)]


def test_through_a_topology_and_its_server_group():
    topo = init_topology(ranks_per_server=2, device="cpu", intra_transport="mpi")
    try:
        def world_block():
            with collective_errors(topo, "reading the shards"):
                if topo.rank == 3:
                    raise OSError("server-0001.h5 truncated")

        world = topo.allgather_object(_outcome(world_block)[:2])
        assert world == [("ClusterError", "rank 3: reading the shards: OSError: server-0001.h5 truncated")] * P

        def server_block():  # only the failing rank's server hears of it
            with collective_errors(topo.server_comm, "sampling"):
                if topo.rank == 1:
                    raise RuntimeError("empty co-batch")

        outcome = _outcome(server_block)
        got = topo.allgather_object(outcome and outcome[:3])
        server_of = [r // 2 for r in range(P)]
        for r, outcome in enumerate(got):
            if server_of[r] == 0:
                assert outcome == ("ClusterError", "rank 1: sampling: RuntimeError: empty co-batch", False)
            else:
                assert outcome is None
    finally:
        topo.close()

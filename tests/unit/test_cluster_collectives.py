"""collective_errors and Group on one process (the MPI suite checks several ranks): the failing
rank and phase are named, success costs one allgather and nothing else, a one-rank Group can let the
original exception through."""
import numpy as np
import pytest
from mpi4py import MPI

from granndis_hpc.cluster import ClusterError, Group, as_group, collective_errors
from granndis_hpc.cluster.topology import _resolve_ranks_per_server


class CountingComm:
    """Forwards to a real communicator and records every call (what a block costs)."""

    def __init__(self, comm):
        self.comm, self.calls = comm, []

    def __getattr__(self, name):
        attr = getattr(self.comm, name)
        if callable(attr):
            def call(*args, **kwargs):
                self.calls.append(name)
                return attr(*args, **kwargs)
            return call
        return attr


class Holder:
    def __init__(self, comm):
        self.mpi_comm = comm


def test_success_costs_one_allgather_and_nothing_else():
    counting = CountingComm(MPI.COMM_SELF)
    with collective_errors(Holder(counting), "reading"):
        value = 41 + 1
    assert value == 42
    assert [c for c in counting.calls if c != "Get_size"] == ["allgather"]


def test_an_error_names_rank_and_phase_and_keeps_the_cause():
    with pytest.raises(ClusterError, match=r"rank 0: reading the shards: ValueError: bad row") as info:
        with collective_errors(MPI.COMM_SELF, "reading the shards"):
            raise ValueError("bad row")
    assert isinstance(info.value.__cause__, ValueError)
    assert info.value.collective is (MPI.COMM_WORLD.Get_size() == 1)


def test_exceptions_outside_catch_are_not_agreed_on():
    with pytest.raises(KeyError):
        with collective_errors(MPI.COMM_SELF, "phase", catch=(ValueError,)):
            raise KeyError("mine only")


def test_one_rank_group_passes_the_original_exception_through():
    group = as_group(MPI.COMM_SELF)
    assert as_group(group) is group and (group.rank, group.size) == (0, 1)
    with pytest.raises(OSError, match="disk"):
        with group.errors("writing"):
            raise OSError("disk")
    with pytest.raises(ClusterError, match="rank 0: writing: OSError: disk"):
        with group.errors("writing", passthrough_alone=False):
            raise OSError("disk")


def test_group_collectives_on_one_rank():
    group = Group(MPI.COMM_SELF)
    assert group.allgather_object({"a": 1}) == [{"a": 1}]
    assert group.gather_object(3) == [3] and group.bcast_object("x") == "x"
    np.testing.assert_array_equal(group.allreduce_max(np.array([1, -1, 5], np.int32)), [1, -1, 5])
    np.testing.assert_array_equal(group.allgatherv(np.arange(4), [4]), np.arange(4))
    assert group.c_handle_address() == MPI._addressof(MPI.COMM_SELF)
    group.barrier()


def test_ranks_per_server_messages():
    _, zero = _resolve_ranks_per_server(0, 4)
    assert "at least 1 rank" in zero and "multiple of 0" not in zero
    _, uneven = _resolve_ranks_per_server(2, 3)
    assert "start 4 ranks (2 servers of 2)" in uneven and "1, 3 ranks per server" in uneven
    assert "rounded" not in uneven
    assert _resolve_ranks_per_server(2, 4) == (2, None)

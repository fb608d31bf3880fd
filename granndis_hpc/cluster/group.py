"""A communicator for code that has no Topology: the offline preprocessing stage.

`preprocess` runs on any number of ranks (P may differ from S x G and may be 1) and needs neither
servers nor torch groups, only a few collectives over the ranks it was given.  It goes through this
wrapper, so that `cluster/` stays the only package that imports mpi4py (docs/design.md §3):

    group = as_group(comm)            # None = MPI.COMM_WORLD; an mpi4py communicator; a Group
    with group.errors("partitioning"):
        ...                           # an exception on any rank -> the same error on every rank
    parts = group.bcast_object(parts)

The method names are Topology's (allgather_object, gather_object, bcast_object, barrier), without the
`group=` argument: a Group *is* one group.
"""
from __future__ import annotations

import contextlib
import time

import numpy as np
from .errors import collective_errors, mpi


_PIECE = 1 << 30


class Group:
    """One MPI communicator (not owned: the caller's communicator is neither duplicated nor freed)."""

    def __init__(self, comm=None):
        self.mpi_comm = mpi().COMM_WORLD if comm is None else comm
        self.rank = self.mpi_comm.Get_rank()
        self.size = self.mpi_comm.Get_size()

    def errors(self, phase: str, catch=(Exception,), *, passthrough_alone: bool = True):
        """`collective_errors` over this group.  By default a one-rank group lets the block's exception
        through unchanged: nobody waits for it, and an in-process caller (a test, a notebook) gets the
        precise type (ShardError, OSError) instead of a wrapper."""
        return collective_errors(self, phase, catch, passthrough_alone=passthrough_alone)

    def allgather_object(self, obj) -> list:
        return self.mpi_comm.allgather(obj)

    def gather_object(self, obj, root: int = 0):
        """Objects of every rank, on `root` (a list there, None elsewhere)."""
        return self.mpi_comm.gather(obj, root=root)

    def bcast_object(self, obj, root: int = 0):
        return self.mpi_comm.bcast(obj, root=root)

    def barrier(self) -> None:
        self.mpi_comm.Barrier()

    def idle_barrier(self, poll_s: float = 0.002) -> None:
        """A barrier that sleeps while it waits (a non-blocking barrier polled every `poll_s`), for
        ranks that wait while one rank works alone (METIS, a file write): Open MPI's blocking
        collectives spin, which on an oversubscribed node takes the CPU from the rank doing the work
        and is counted as CPU time (measured: 0.3 s per waiting rank per METIS GPU split, 8 ranks on
        2 cores).  One rank: returns at once."""
        if self.size == 1:
            return
        req = self.mpi_comm.Ibarrier()
        while not req.Test():
            time.sleep(poll_s)

    def allreduce_max(self, local: np.ndarray) -> np.ndarray:
        """Element-wise maximum of a numeric array over the ranks (a new array; same shape everywhere)."""
        return self._allreduce(local, mpi().MAX)

    def allreduce_sum(self, local: np.ndarray) -> np.ndarray:
        """Element-wise sum of a numeric array over the ranks."""
        return self._allreduce(local, mpi().SUM)

    def allreduce_min(self, local: np.ndarray) -> np.ndarray:
        """Element-wise minimum of a numeric array over the ranks."""
        return self._allreduce(local, mpi().MIN)

    def _allreduce(self, local, op) -> np.ndarray:
        local = np.ascontiguousarray(local)
        out = np.empty_like(local)
        self.mpi_comm.Allreduce(local, out, op=op)
        return out

    def allgatherv(self, local: np.ndarray, counts) -> np.ndarray:
        """Concatenation of every rank's 1-D int64 array, rank order; counts[r] = len on rank r."""
        local = np.ascontiguousarray(local, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        displs = np.zeros_like(counts)
        np.cumsum(counts[:-1], out=displs[1:])
        out = np.empty(int(counts.sum()), dtype=np.int64)
        self.mpi_comm.Allgatherv(local, [out, counts, displs, mpi().INT64_T])
        return out

    def _row_type(self, a: np.ndarray):
        """An MPI datatype of one row of `a` (contiguous bytes), so counts stay in rows (int32 safe)."""
        row = int(a.itemsize * (int(np.prod(a.shape[1:])) if a.ndim > 1 else 1))
        t = mpi().BYTE.Create_contiguous(max(row, 1))
        t.Commit()
        return t

    def alltoallv(self, send: np.ndarray, send_counts) -> np.ndarray:
        """Personalised exchange of rows: `send` is ordered by destination rank, send_counts[r] rows go
        to rank r; returns the rows received, ordered by source rank (any dtype, any row shape; every
        rank must pass the same dtype and row shape)."""
        send = np.ascontiguousarray(send)
        sc = np.ascontiguousarray(send_counts, dtype=np.int64)
        rc = np.empty_like(sc)
        self.mpi_comm.Alltoall(sc, rc)
        out = np.empty((int(rc.sum()),) + send.shape[1:], dtype=send.dtype)
        sd = np.zeros_like(sc)
        np.cumsum(sc[:-1], out=sd[1:])
        rd = np.zeros_like(rc)
        np.cumsum(rc[:-1], out=rd[1:])
        t = self._row_type(send)
        try:
            self.mpi_comm.Alltoallv([send.reshape(-1).view(np.uint8) if send.size else np.zeros(1, np.uint8),
                                     sc.astype(np.int32), sd.astype(np.int32), t],
                                    [out.reshape(-1).view(np.uint8) if out.size else np.zeros(1, np.uint8),
                                     rc.astype(np.int32), rd.astype(np.int32), t])
        finally:
            t.Free()
        return out

    def allgatherv_rows(self, local: np.ndarray, counts) -> np.ndarray:
        """Concatenation of every rank's rows (any dtype and row shape, the same on every rank), rank
        order; counts[r] = rows on rank r."""
        local = np.ascontiguousarray(local)
        counts = np.asarray(counts, dtype=np.int64)
        displs = np.zeros_like(counts)
        np.cumsum(counts[:-1], out=displs[1:])
        out = np.empty((int(counts.sum()),) + local.shape[1:], dtype=local.dtype)
        t = self._row_type(local)
        try:
            self.mpi_comm.Allgatherv([local.reshape(-1).view(np.uint8) if local.size else np.zeros(1, np.uint8),
                                      int(local.shape[0]), t],
                                     [out.reshape(-1).view(np.uint8) if out.size else np.zeros(1, np.uint8),
                                      counts.astype(np.int32), displs.astype(np.int32), t])
        finally:
            t.Free()
        return out

    def stream_to(self, local: np.ndarray, consume, root: int = 0) -> None:
        """Hand every rank's array to `consume(array)` on `root`, one rank after another in rank order
        (root holds one rank's array at a time: a sequential fold, e.g. a hash, in bounded memory)."""
        for r in range(self.size):
            if r == root:
                if self.rank == root:
                    consume(local)
                continue
            if self.rank == r:
                self.mpi_comm.send((local.dtype.str, local.shape), dest=root, tag=7)
                raw = np.ascontiguousarray(local).reshape(-1).view(np.uint8)
                for lo in range(0, raw.shape[0], _PIECE):  # int32 counts: messages of at most 1 GiB
                    self.mpi_comm.Send([raw[lo:lo + _PIECE], mpi().BYTE], dest=root, tag=8)
            elif self.rank == root:
                dtype, shape = self.mpi_comm.recv(source=r, tag=7)
                buf = np.empty(shape, dtype=np.dtype(dtype))
                raw = buf.reshape(-1).view(np.uint8)
                for lo in range(0, raw.shape[0], _PIECE):
                    self.mpi_comm.Recv([raw[lo:lo + _PIECE], mpi().BYTE], source=r, tag=8)
                consume(buf)

    @contextlib.contextmanager
    def subgroups(self, color: int):
        """Collective: the Group of the ranks that pass the same `color` (ranks in this group's order),
        for work that disjoint sets of ranks do at the same time (each server's GPU split,
        preprocess/partition/twolevel.py).  Its communicator is freed when the block ends (collective over the
        subgroup: every rank of it must leave the block)."""
        sub = self.mpi_comm.Split(int(color), self.rank)
        try:
            yield Group(sub)
        finally:
            sub.Free()

    def c_handle_address(self) -> int:
        """Address of the C `MPI_Comm` handle, for libraries called through ctypes that take an
        `MPI_Comm *` (ParMETIS_V3_PartKway's last argument)."""
        return mpi()._addressof(self.mpi_comm)

    def abort(self, code: int = 1) -> None:
        """Terminate every rank of the job (for an error only this rank saw; peers may be blocked)."""
        self.mpi_comm.Abort(code)


def as_group(comm=None) -> Group:
    """A Group over `comm`: None (MPI.COMM_WORLD), an mpi4py communicator, or a Group (returned as is)."""
    return comm if isinstance(comm, Group) else Group(comm)


def self_group() -> Group:
    """This process alone (mpi().COMM_SELF): serial tools and tests that call collective preprocess code."""
    return Group(mpi().COMM_SELF)

"""The non-blocking hierarchical all-reduce of one flat bucket (Communicator.reduce_flat_start)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from mpi4py import MPI

from .accounting import allreduce_bytes_model
from .pending import MPIProgress, np_view

# Dtypes MPI can sum; the leaders' all-reduce always goes through MPI.
REDUCIBLE = {torch.float32: MPI.FLOAT, torch.float64: MPI.DOUBLE,
             torch.int32: MPI.INT32_T, torch.int64: MPI.INT64_T}


class PendingReduce:
    """One bucket's hierarchical all-reduce in flight (Communicator.reduce_flat_start).

    Stages: (1) reduce to the server's leader (gloo/NCCL async_op; with MPI, the non-leaders Isend their
    bucket and the leader sums the G-1 it receives in local-rank order); (2) on leaders, the sum among
    them: on 2 servers a pairwise exchange (Isend/Irecv; a + b is b + a exactly, so both leaders hold the
    same bits, and each sends B bytes, the ring model's 2(S-1)/S B), driven by the progress thread; on
    more servers a blocking MPI all-reduce in wait(); (3) broadcast from the leader, in wait().  Not
    MPI's non-blocking collectives: Open MPI's (libnbc) were measured 3-15x slower than blocking ones
    here (MPI_Ireduce of 93 kB inside a server: 1.4 s against MPI_Reduce's 0.1 s).  Every rank posts its
    buckets in the same order (the caller's), so the messages match."""

    _REDUCE_TAG, _LEADERS_TAG = 18, 19

    def __init__(self, comm, flat: torch.Tensor, phase: str):
        topo = comm.topo
        self.comm, self.flat, self.phase = comm, flat, phase
        self._torch = comm.intra_transport in ("gloo", "nccl")
        self._leader = int(topo.rank_table[topo.server, 0])
        self._host = None       # host view (CPU) or copy (GPU) of the bucket for the MPI stages
        self._stage1 = None     # torch Work, or MPIProgress of the Isend/Irecv to the leader
        self._received = None   # leader, MPI: the G-1 buckets of its server's other ranks
        self._stage2 = None     # (MPIProgress, the other leader's bucket) on 2 servers, else False
        model = allreduce_bytes_model(flat.numel(), flat.element_size(), topo.servers, topo.ranks_per_server,
                                      topo.server, topo.local_rank)
        comm.ledger.add("intra", phase, model["intra"])
        comm.ledger.add("inter", phase, model["inter"])
        if topo.ranks_per_server > 1:
            with comm._timed("intra", phase, sync=False):
                if self._torch:
                    self._stage1 = dist.reduce(flat, dst=self._leader, op=dist.ReduceOp.SUM,
                                               group=topo.intra_group, async_op=True)
                else:
                    self._stage1 = self._post_to_leader()
        self.poll()

    def _mpi_type(self):
        return REDUCIBLE[self.flat.dtype]

    def _host_flat(self) -> torch.Tensor:
        if self._host is None:
            self._host = self.flat.cpu() if self.flat.is_cuda else self.flat
        return self._host

    def _post_to_leader(self):
        topo, p2p, n = self.comm.topo, self.comm._p2p, self.flat.numel()
        mates = topo.server_ranks().tolist()
        host = self._host_flat()
        if topo.is_leader:
            self._received = torch.empty((len(mates) - 1, n), dtype=self.flat.dtype)
            requests = [p2p.Irecv([np_view(self._received[i]), n, self._mpi_type()], source=src, tag=self._REDUCE_TAG)
                        for i, src in enumerate(mates[1:])]
        else:
            requests = [p2p.Isend([np_view(host), n, self._mpi_type()], dest=self._leader, tag=self._REDUCE_TAG)]
        return MPIProgress(requests, progress=True)

    def _stage1_done(self) -> bool:
        if self._stage1 is None:
            return True
        return self._stage1.is_completed() if self._torch else self._stage1.test()

    def poll(self) -> None:
        """Start the leaders' stage once the reduce to the leader has completed (cheap when not)."""
        if self._stage2 is None and self._stage1_done():
            self._start_stage2()

    def _start_stage2(self) -> None:
        comm, topo = self.comm, self.comm.topo
        with comm._timed("intra", self.phase):
            self._finish_stage1()
        if topo.servers == 2 and topo.is_leader:
            with comm._timed("inter", self.phase, sync=False):
                host = self._host_flat() if not self.flat.is_cuda else self.flat.cpu()
                self._host = host
                other = torch.empty_like(host)
                peer = int(topo.rank_table[1 - topo.server, 0])
                p2p, n = comm._p2p, host.numel()
                requests = [p2p.Irecv([np_view(other), n, self._mpi_type()], source=peer, tag=self._LEADERS_TAG),
                            p2p.Isend([np_view(host), n, self._mpi_type()], dest=peer, tag=self._LEADERS_TAG)]
                self._stage2 = (MPIProgress(requests, progress=True), other)
        else:
            self._stage2 = False

    def _finish_stage1(self) -> None:
        if self._stage1 is None:
            return
        if self._torch:
            self._stage1.wait()
        else:
            self._stage1.wait()
            if self._received is not None:  # leader: its bucket + the others', in local-rank order
                host = self._host_flat()
                for row in self._received:
                    host.add_(row)
                if self.flat.is_cuda:
                    self.flat.copy_(host)
                self._received = None
        self._stage1 = None

    def wait(self) -> torch.Tensor:
        """Complete every stage; returns the bucket holding the sum over all ranks."""
        comm, topo = self.comm, self.comm.topo
        if self._stage2 is None:
            self._start_stage2()
        if self._stage2:
            with comm._timed("inter", self.phase):
                waiter, other = self._stage2
                waiter.wait()
                self._host.add_(other)
                if self.flat.is_cuda:
                    self.flat.copy_(self._host)
        elif topo.servers > 2 and topo.is_leader:
            with comm._timed("inter", self.phase):
                comm._mpi_in_host(self.flat, lambda buf: topo.leader_comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
                                  write_back=True)
        if topo.ranks_per_server > 1:
            with comm._timed("intra", self.phase):
                if self._torch:
                    dist.broadcast(self.flat, src=self._leader, group=topo.intra_group)
                else:
                    comm._mpi_in_host(self.flat, lambda buf: topo.server_comm.Bcast(buf, root=0),
                                      write_back=not topo.is_leader)
        return self.flat

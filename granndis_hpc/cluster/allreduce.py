"""The non-blocking hierarchical all-reduce of one flat bucket (Communicator.reduce_flat_start)."""
from __future__ import annotations

import itertools
import threading
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from . import trace
from .accounting import allreduce_bytes_model, ring_chunk_sizes
from .pending import MPIProgress, np_view
from .staging import wait_event

# Dtypes MPI can sum; the leaders' all-reduce always goes through MPI.
REDUCIBLE = {torch.float32: MPI.FLOAT, torch.float64: MPI.DOUBLE,
             torch.int32: MPI.INT32_T, torch.int64: MPI.INT64_T}


class PendingReduce:
    """One bucket's hierarchical all-reduce in flight (Communicator.reduce_flat_start).

    Stages: (1) reduce to the server's leader (gloo/NCCL async_op; with MPI, the non-leaders Isend their
    bucket and the leader sums the G-1 it receives in local-rank order); (2) on leaders, the sum among
    them: on 2 servers a pairwise exchange (Isend/Irecv; a + b is b + a exactly, so both leaders hold the
    same bits, and each sends B bytes, the ring model's 2(S-1)/S B), driven by the caller's poll(); on
    more servers a ring all-reduce (reduce-scatter, then all-gather, of S chunks: LeadersRing) run by a
    helper thread, so it too travels while the caller computes; (3) broadcast from the leader, in
    wait().  The MPI stages have no progress thread: the caller's poll() (GradientSync calls it from every
    parameter's gradient hook, so during the whole backward) runs MPI_Testall, which is what moves them,
    and wait() completes them on the calling thread.  A polling thread per bucket competed with the
    backward for the 2 cores 4 ranks share and, on models whose gradients fit one bucket, was started at
    the backward's last hook with nothing left to overlap.  Not MPI's non-blocking
    collectives: Open MPI's (libnbc) were measured 3-15x slower than
    blocking ones here (MPI_Ireduce of 93 kB inside a server: 1.4 s against MPI_Reduce's 0.1 s).  Every
    rank posts its buckets in the same order (the caller's) and a bucket's leaders' stage starts only
    after the previous bucket's has (`after`), so the messages match whatever the timing."""

    _REDUCE_TAG, _LEADERS_TAG = 18, 19

    def __init__(self, comm, flat: torch.Tensor, phase: str, after: "PendingReduce | None" = None):
        topo = comm.topo
        self.comm, self.flat, self.phase = comm, flat, phase
        self._torch = comm.intra_transport in ("gloo", "nccl")
        self._leader = int(topo.rank_table[topo.server, 0])
        self._host: Any = None  # host view (CPU) or staged copy (GPU) of the bucket for the MPI stages
        self._lease = None      # GPU: the pool buffer of the staged copy (cluster/staging.py)
        self._ready = None      # GPU: the event of the staged copy's completion
        self._staging = comm._staging
        self._stage1 = None     # torch Work, or MPIProgress of the Isend/Irecv to the leader
        self._received = None   # leader, MPI: the G-1 buckets of its server's other ranks
        self._stage2: Any = None  # (MPIProgress, the other leader's bucket) on 2 servers, a LeadersRing on
        #                         more (leaders, with MPI_THREAD_MULTIPLE), else False (nothing, or blocking)
        # The bucket posted before this one: its leaders' stage starts first.
        self._after: Optional[PendingReduce] = after
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
        """The bucket in host memory: itself on the CPU; on a GPU a copy queued now on the staging side
        stream (complete once self._ready has completed: MPI posts of it are deferred until then)."""
        if self._host is None:
            if self._staging.copies:
                self._lease, self._host, self._ready = self._staging.to_host(self.flat)
            else:
                self._host = self.flat
        return self._host

    def _send_when_ready(self, post):
        """MPIProgress of sends of the staged bucket: posted once its copy has completed."""
        if self._ready is None:
            return MPIProgress(post(), progress=False)
        return MPIProgress([], progress=False, deferred=(self._ready, post))

    def _post_to_leader(self):
        topo, p2p, n = self.comm.topo, self.comm._p2p, self.flat.numel()
        mates = topo.server_ranks().tolist()
        host = self._host_flat()
        if topo.is_leader:
            self._received = torch.empty((len(mates) - 1, n), dtype=self.flat.dtype)
            requests = [p2p.Irecv([np_view(self._received[i]), n, self._mpi_type()], source=src, tag=self._REDUCE_TAG)
                        for i, src in enumerate(mates[1:])]
            return MPIProgress(requests, progress=False)
        return self._send_when_ready(lambda: [p2p.Isend([np_view(host), n, self._mpi_type()], dest=self._leader,
                                                        tag=self._REDUCE_TAG)])

    def _stage1_done(self) -> bool:
        if self._stage1 is None:
            return True
        if self._torch:
            return self._stage1.is_completed()
        # The leader sums into its staged copy: that copy too must be complete.
        return self._stage1.test() and (self._ready is None or self._ready.query())

    def poll(self) -> None:
        """Move the bucket on (MPI_Testall of the stage in flight: MPI progresses only inside MPI calls);
        start the leaders' stage once the reduce to the leader has completed and the previous bucket's
        leaders' stage has started.  Cheap when nothing is left but waiting."""
        if self._stage2 is None:
            if self._stage1_done() and (self._after is None or self._after._stage2 is not None):
                self._start_stage2()
        elif self._stage2 and not isinstance(self._stage2, LeadersRing):
            self._stage2[0].test()

    def leaders_done(self) -> bool:
        """True once this rank has nothing left of the leaders' stage but waiting for it (a started
        pairwise exchange or ring that has completed, or no such stage on this rank)."""
        if self._stage2 is None:
            return False
        if isinstance(self._stage2, LeadersRing):
            return self._stage2.done()
        return not self._stage2 or self._stage2[0].test()

    def _start_stage2(self) -> None:
        comm, topo = self.comm, self.comm.topo
        if self._after is not None and self._after._stage2 is None:
            self._after._start_stage2()  # keep the leaders' messages in posting order
        self._after = None
        with comm._timed("intra", self.phase):
            self._finish_stage1()
        # On a GPU the leader's host copy already holds its server's sum with the MPI transport (stage 1
        # summed there); with gloo/NCCL the sum is on the device and is staged now.
        if topo.servers == 2 and topo.is_leader:
            with comm._timed("inter", self.phase, sync=False):
                host = self._host_flat()
                other = torch.empty(host.shape, dtype=host.dtype)
                peer = int(topo.rank_table[1 - topo.server, 0])
                p2p, nbytes = comm._p2p, host.numel() * host.element_size()
                # In pieces below the transports' eager limit, as the world exchange's blocks (layout.py
                # message_pieces); the same tag, so they match in posting order, the same on both leaders.
                recvs = comm._post_pieces(p2p.Irecv, np_view(other).view(np.uint8), 0, nbytes, peer,
                                          self._LEADERS_TAG)
                waiter = self._send_when_ready(lambda: comm._post_pieces(p2p.Isend, np_view(host).view(np.uint8), 0,
                                                                         nbytes, peer, self._LEADERS_TAG))
                waiter._requests[:0] = recvs
                self._stage2 = (waiter, other)
                trace.mark("grad_leaders_post", host.numel())
        elif topo.servers > 2 and topo.is_leader and MPI.Query_thread() == MPI.THREAD_MULTIPLE:
            with comm._timed("inter", self.phase, sync=False):
                self._stage2 = LeadersRing(topo.leader_comm, self._host_flat(), REDUCIBLE[self.flat.dtype],
                                           tag=comm.next_ring_tag(), ready=self._ready)
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
                wait_event(self._ready)
                for row in self._received:
                    host.add_(row)
                if self._staging.copies:
                    self._staging.to_device(host, into=self.flat)
                self._received = None
        self._stage1 = None

    def wait(self) -> torch.Tensor:
        """Complete every stage; returns the bucket holding the sum over all ranks."""
        comm, topo = self.comm, self.comm.topo
        if self._stage2 is None:
            self._start_stage2()
        if isinstance(self._stage2, LeadersRing):
            with comm._timed("inter", self.phase):
                self._stage2.wait()
                if self._staging.copies:
                    self._staging.to_device(self._host, into=self.flat)
        elif self._stage2:
            with comm._timed("inter", self.phase):
                waiter, other = self._stage2
                trace.mark("grad_leaders_wait_start", self.flat.numel())
                waiter.wait()
                trace.mark("grad_leaders_wait_end", self.flat.numel())
                self._host.add_(other)
                if self._staging.copies:
                    self._staging.to_device(self._host, into=self.flat)
        elif topo.servers > 2 and topo.is_leader:  # no MPI_THREAD_MULTIPLE: the blocking all-reduce
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
        self._staging.release(self._lease)
        self._lease = None
        return self.flat


# Tags of the leaders' ring: one per bucket in flight (the leaders start their buckets' rings in the same
# order, so the k-th ring has the same tag everywhere), cycling through a range no other message on the
# leaders' communicator uses.
RING_TAG_BASE, RING_TAGS = 1000, 4096


class LeadersRing:
    """The ring all-reduce (sum) of one host bucket among the S > 2 servers' leaders, in a helper thread.

    The bucket is cut into S chunks (accounting.ring_chunk_sizes, the ledger's ring model). Reduce-scatter:
    in step t = 0..S-2 leader r sends chunk r-t to leader r+1 and adds chunk r-t-1, received from r-1, into
    its own; after S-1 steps leader r holds the full sum of chunk r+1.  All-gather: in step t leader r
    sends chunk r+1-t and copies chunk r-t from r-1.  Each chunk's sum is computed once, on one leader,
    and copied to the others, so every leader holds the same bits (what a blocking MPI all-reduce does
    not promise); leader r sends every chunk but r+1 and every chunk but r+2, which is the ledger's
    `allreduce_bytes_model`.  Blocking MPI_Sendrecv in the thread (MPI_THREAD_MULTIPLE; the caller checks):
    its messages progress while the caller computes, unlike MPI's non-blocking collectives here.  Whole
    chunks, not message pieces (layout.message_pieces): a leader sends to r+1 and receives from r-1, so
    with S > 2 no pair of leaders sends to each other at once and no rendezvous waits behind the other
    direction's data."""

    def __init__(self, leaders: MPI.Comm, host: torch.Tensor, mpi_type: MPI.Datatype, tag: int, ready=None):
        self._error: Optional[BaseException] = None
        self._buf, self._ready = host, ready  # ready: the staged copy's event (GPU)
        self._thread = threading.Thread(target=self._run, args=(leaders, mpi_type, tag),
                                        name="granndis-leaders-ring", daemon=True)
        self._thread.start()

    def _run(self, leaders, mpi_type, tag) -> None:
        try:
            wait_event(self._ready)
            s, r = leaders.Get_size(), leaders.Get_rank()
            sizes = ring_chunk_sizes(self._buf.numel(), s)
            starts = list(itertools.accumulate([0] + sizes))
            chunk = [self._buf[starts[c]:starts[c + 1]] for c in range(s)]
            scratch = torch.empty(max(sizes), dtype=self._buf.dtype)
            right, left = (r + 1) % s, (r - 1) % s
            for step in range(s - 1):  # reduce-scatter
                out, into = chunk[(r - step) % s], chunk[(r - step - 1) % s]
                got = scratch[:into.numel()]
                leaders.Sendrecv([np_view(out), out.numel(), mpi_type], dest=right, sendtag=tag,
                                 recvbuf=[np_view(got), got.numel(), mpi_type], source=left, recvtag=tag)
                into.add_(got)
            for step in range(s - 1):  # all-gather: the owner's bits, copied
                out, into = chunk[(r + 1 - step) % s], chunk[(r - step) % s]
                leaders.Sendrecv([np_view(out), out.numel(), mpi_type], dest=right, sendtag=tag,
                                 recvbuf=[np_view(into), into.numel(), mpi_type], source=left, recvtag=tag)
        except BaseException as exc:  # re-raised by wait() on the calling thread
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error

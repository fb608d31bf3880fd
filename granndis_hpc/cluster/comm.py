"""Communication primitives with exact byte/time accounting.

* `intra_exchange`: variable-sized row blocks among the ranks of one server
  (gloo/NCCL `all_to_all_single` with splits, or MPI `Alltoallv` on the server communicator).
* `world_exchange`: the same over the whole job; same-server blocks go through the intra transport,
  other blocks through MPI point-to-point (only the non-empty pairs, non-blocking, CPU-staged from
  a GPU), overlapped with the intra part.
* `allreduce_`: hierarchical all-reduce over flat buckets (reduce in the server, MPI all-reduce
  among leaders, broadcast in the server).

All exchanges move rows as raw bytes, so every dtype works (bool, bfloat16, ...), and rows of
width 0 or empty blocks need no special case from the caller.  Every rank of the group taking part
must call the primitive with the same trailing shape and dtype; the caller knows the counts (no
count exchange inside).  `validate=True` (or env GRANNDIS_CHECK_COMM=1) adds a count exchange that
checks each rank's send counts against its peers' receive counts and raises a clear error on a
mismatch: use it while developing a new exchange plan.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from .accounting import allreduce_bytes_model
from .errors import ClusterError, agree
from .layout import block_rows, check_counts, offsets_of
from .ledger import Ledger
from .topology import Topology

ENV_CHECK_COMM = "GRANNDIS_CHECK_COMM"
DEFAULT_BUCKET_BYTES = 25 << 20
# Dtypes MPI can sum; the leaders' all-reduce always goes through MPI.
_REDUCIBLE = {torch.float32: MPI.FLOAT, torch.float64: MPI.DOUBLE,
              torch.int32: MPI.INT32_T, torch.int64: MPI.INT64_T}
_P2P_TAG = 17


class Communicator:
    """Owns the transports of one process; one per process (per Topology)."""

    def __init__(self, topo: Topology, ledger: Ledger, intra_transport: str = "auto",
                 validate: bool | None = None):
        transport = topo.intra_transport if intra_transport == "auto" else intra_transport
        if transport not in ("gloo", "nccl", "mpi"):
            raise ClusterError(f"intra_transport must be auto, gloo, nccl or mpi, got {intra_transport!r}")
        if transport in ("gloo", "nccl") and transport != topo.intra_transport:
            raise ClusterError(f"intra_transport={transport} but the topology was built with "
                               f"{topo.intra_transport}; pass intra_transport={transport!r} to init_topology")
        self.topo = topo
        self.ledger = ledger
        self.intra_transport = transport
        self.validate = (os.environ.get(ENV_CHECK_COMM, "") not in ("", "0")) if validate is None else validate
        self._cuda = topo.device.type == "cuda"
        # A private duplicate of the world for point-to-point traffic: our tags cannot match
        # messages of any other library or of the caller.
        self._p2p = topo.world.Dup()
        self._row_types: dict[int, MPI.Datatype] = {}

    def close(self) -> None:
        for t in self._row_types.values():
            t.Free()
        self._row_types.clear()
        if self._p2p is not None:
            self._p2p.Free()
            self._p2p = None

    # ----------------------------------------------------------------- intra-server exchange
    def intra_exchange(self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int],
                       phase: str = "halo") -> torch.Tensor:
        """Rows of `send` grouped by destination LOCAL rank -> rows grouped by source local rank.

        send: [sum(send_counts), *rest]; returns [sum(recv_counts), *rest] on topo.device.
        A rank's block to itself (if any) is copied locally and not counted as traffic.
        """
        return self.intra_exchange_start(send, send_counts, recv_counts, phase, progress=False).wait()

    def intra_exchange_start(self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int],
                             phase: str = "halo", progress: bool = True) -> "PendingExchange":
        """`intra_exchange` posted without waiting: the returned PendingExchange's wait() gives the rows.

        The caller may compute while the rows travel (gloo/NCCL `async_op=True`, MPI `Ialltoallv`); `send`
        must not be modified before wait().  Bytes are ledgered when posted, seconds of posting and of
        waiting as they are spent (so the ledger's seconds are the communication time not hidden).
        """
        g, me = self.topo.ranks_per_server, self.topo.local_rank
        sc = check_counts(send_counts, g, "send_counts")
        rc = check_counts(recv_counts, g, "recv_counts")
        rest, row_bytes = self._check_send(send, sc)
        if self.validate:
            self._validate_counts(self.topo.server_comm, sc, rc, row_bytes, "local rank")
        if row_bytes == 0:  # nothing to move (every rank passes the same row shape)
            return PendingExchange.done(torch.empty((int(rc.sum()), *rest), dtype=send.dtype, device=self.topo.device))
        with self._timed("intra", phase, sync=False):
            finish = self._intra_bytes_start(_byte_rows(send, row_bytes), sc, rc, progress)
        self.ledger.add("intra", phase, (int(sc.sum()) - int(sc[me])) * row_bytes)

        def wait():
            with self._timed("intra", phase):
                return _typed_rows(finish(), send.dtype, rest)
        return PendingExchange(wait)

    def _intra_bytes(self, send_bytes: torch.Tensor, sc: np.ndarray, rc: np.ndarray) -> torch.Tensor:
        """The intra-server all-to-all on [rows, row_bytes] uint8 tensors."""
        return self._intra_bytes_start(send_bytes, sc, rc, progress=False)()

    def _intra_bytes_start(self, send_bytes: torch.Tensor, sc: np.ndarray, rc: np.ndarray, progress: bool):
        """Post the intra-server all-to-all on [rows, row_bytes] uint8 tensors; returns finish() -> rows."""
        g = self.topo.ranks_per_server
        row_bytes = send_bytes.shape[1]
        n_out = int(rc.sum())
        if g == 1:  # a server of one rank: only the block to itself
            out = send_bytes.clone()
            return lambda: out
        if self.intra_transport in ("gloo", "nccl"):
            out = torch.empty((n_out, row_bytes), dtype=torch.uint8, device=send_bytes.device)
            # gloo runs the work on its own threads, NCCL on its own stream: both progress without us;
            # work.wait() makes the current CUDA stream wait for NCCL's (no host synchronisation).
            work = dist.all_to_all_single(out, send_bytes, rc.tolist(), sc.tolist(), group=self.topo.intra_group,
                                          async_op=True)

            def finish_torch():
                work.wait()
                return out
            return finish_torch
        # MPI on the server's ranks, staged through host memory on a GPU.  Blocking: Alltoallv, as before
        # overlap existed.  Non-blocking: Isend/Irecv of the non-empty blocks on the private p2p
        # communicator -- not MPI_Ialltoallv: Open MPI's non-blocking collectives (libnbc) were measured
        # 3-15x slower than the blocking ones and than point-to-point on the oversubscribed machine.
        host_send = send_bytes.cpu() if send_bytes.is_cuda else send_bytes
        host_out = torch.empty((n_out, row_bytes), dtype=torch.uint8, pin_memory=self._cuda)
        rtype = self._row_type(row_bytes)
        s_off, r_off = offsets_of(sc), offsets_of(rc)
        if not progress:
            self.topo.server_comm.Alltoallv([_np(host_send), (sc.tolist(), s_off.tolist()), rtype],
                                            [_np(host_out), (rc.tolist(), r_off.tolist()), rtype])
            out = host_out.to(send_bytes.device, non_blocking=True) if self._cuda else host_out
            return lambda: out
        me, mates = self.topo.local_rank, self.topo.server_ranks()
        host_out[int(r_off[me]):int(r_off[me] + rc[me])] = host_send[int(s_off[me]):int(s_off[me] + sc[me])]
        others = np.array([j for j in range(g) if j != me], dtype=np.int64)
        to_send, to_recv = others[sc[others] > 0], others[rc[others] > 0]
        requests = self._post_p2p(_np(host_send), _np(host_out), sc, rc, s_off, r_off, mates[to_send],
                                  to_send, mates[to_recv], to_recv, rtype)
        waiter = _MPIProgress(requests, progress)  # mpi4py's requests keep their buffers alive

        def finish_mpi():
            waiter.wait()
            return host_out.to(send_bytes.device, non_blocking=True) if self._cuda else host_out
        return finish_mpi

    def _post_p2p(self, send_buf, recv_buf, sc, rc, s_off, r_off, send_ranks, send_blocks, recv_ranks,
                  recv_blocks, rtype, tag=None):
        """Irecv then Isend of row blocks: block b of send_blocks goes to global rank send_ranks[b]."""
        tag = _P2P_TAG if tag is None else tag
        requests = []
        for src, j in zip(np.asarray(recv_ranks).tolist(), np.asarray(recv_blocks).tolist()):
            off, n = int(r_off[j]), int(rc[j])
            requests.append(self._p2p.Irecv([recv_buf[off:off + n], n, rtype], source=src, tag=tag))
        for dst, j in zip(np.asarray(send_ranks).tolist(), np.asarray(send_blocks).tolist()):
            off, n = int(s_off[j]), int(sc[j])
            requests.append(self._p2p.Isend([send_buf[off:off + n], n, rtype], dest=dst, tag=tag))
        return requests

    # ----------------------------------------------------------------- world exchange
    def world_exchange(self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int],
                       phase: str = "halo") -> torch.Tensor:
        """Rows of `send` grouped by destination GLOBAL rank -> rows grouped by source global rank.

        Same-server blocks use the intra transport; blocks between servers use MPI Isend/Irecv for
        the non-empty pairs only (posted first, completed after the intra part, so they overlap
        and no order of calls can deadlock).  Ledger: intra and inter bytes counted separately.
        """
        return self.world_exchange_start(send, send_counts, recv_counts, phase, progress=False).wait()

    def world_exchange_start(self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int],
                             phase: str = "halo", progress: bool = True) -> "PendingExchange":
        """`world_exchange` posted without waiting (see intra_exchange_start): the inter-server Isend/Irecv
        and the intra-server all-to-all are in flight when this returns; wait() completes both.

        progress=True: a helper thread polls the MPI requests (MPI_Testall every millisecond, sleeping in
        between) so that the messages move while the caller computes -- Open MPI's TCP transport moves a
        large message only inside MPI calls (measured: a 300 MB Isend posted before 2 s of compute still
        needed 0.9 s in Wait; polled, 0 s, and the compute ran as fast as without it).
        """
        topo = self.topo
        p = topo.world_size
        sc = check_counts(send_counts, p, "send_counts")
        rc = check_counts(recv_counts, p, "recv_counts")
        rest, row_bytes = self._check_send(send, sc)
        if self.validate:
            self._validate_counts(self._p2p, sc, rc, row_bytes, "rank")
        out = torch.empty((int(rc.sum()), *rest), dtype=send.dtype, device=topo.device)
        if row_bytes == 0:
            return PendingExchange.done(out)
        send_bytes = _byte_rows(send, row_bytes)
        out_bytes = _byte_rows(out, row_bytes)
        s_off, r_off = offsets_of(sc), offsets_of(rc)

        mates = topo.server_ranks()                       # same-server ranks, by local rank
        others = np.flatnonzero(topo._server_of != topo.server)
        to_send = others[sc[others] > 0]
        to_recv = others[rc[others] > 0]

        with self._timed("inter", phase, sync=False):
            requests, staged_recv = self._post_inter(send_bytes, out_bytes, sc, rc, s_off, r_off,
                                                     to_send, to_recv, row_bytes)
            waiter = _MPIProgress(requests, progress)
        with self._timed("intra", phase, sync=False):
            intra_in = block_rows(s_off, sc, mates)
            finish_intra = self._intra_bytes_start(send_bytes[intra_in], sc[mates], rc[mates], progress)
        self.ledger.add("intra", phase, (int(sc[mates].sum()) - int(sc[topo.rank])) * row_bytes)
        self.ledger.add("inter", phase, int(sc[others].sum()) * row_bytes)

        def wait():
            with self._timed("intra", phase):
                out_bytes[block_rows(r_off, rc, mates)] = finish_intra()
            with self._timed("inter", phase):
                waiter.wait()
                if staged_recv is not None:  # GPU: host staging -> device rows of the inter blocks
                    host, rows = staged_recv
                    out_bytes[rows] = host.to(out_bytes.device, non_blocking=True)
            return out  # out_bytes is a view of out
        return PendingExchange(wait)

    def _post_inter(self, send_bytes, out_bytes, sc, rc, s_off, r_off, to_send, to_recv, row_bytes):
        """Post Irecv then Isend for the inter-server blocks; returns (requests, GPU staging or None)."""
        rtype = self._row_type(row_bytes)
        requests = []
        staged_recv = None
        if self._cuda:
            # Compact host buffers holding only the inter-server blocks.
            recv_rows = block_rows(r_off, rc, to_recv)
            host_recv = torch.empty((int(rc[to_recv].sum()), row_bytes), dtype=torch.uint8, pin_memory=True)
            host_send = send_bytes[block_rows(s_off, sc, to_send)].cpu()
            recv_buf, recv_off = _np(host_recv), offsets_of(rc[to_recv])
            send_buf, send_off = _np(host_send), offsets_of(sc[to_send])
            staged_recv = (host_recv, recv_rows)
        else:
            recv_buf, recv_off = _np(out_bytes), r_off[to_recv]
            send_buf, send_off = _np(send_bytes), s_off[to_send]
        for src, off in zip(to_recv.tolist(), np.asarray(recv_off).tolist()):
            n = int(rc[src])
            requests.append(self._p2p.Irecv([recv_buf[off:off + n], n, rtype], source=src, tag=_P2P_TAG))
        for dst, off in zip(to_send.tolist(), np.asarray(send_off).tolist()):
            n = int(sc[dst])
            requests.append(self._p2p.Isend([send_buf[off:off + n], n, rtype], dest=dst, tag=_P2P_TAG))
        return requests, staged_recv

    # ----------------------------------------------------------------- all-reduce
    def allreduce_(self, tensors: Sequence[torch.Tensor], phase: str = "gradient", average: bool = False,
                   bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        """In-place sum (or mean with average=True) of `tensors` over all ranks, hierarchically.

        Tensors are packed into flat buckets of at most `bucket_bytes` (a larger tensor is a bucket
        of its own, never split), one dtype per bucket, in the given order on every rank.
        """
        tensors = list(tensors)
        if bucket_bytes <= 0:
            raise ClusterError(f"bucket_bytes must be positive, got {bucket_bytes}")
        for i, t in enumerate(tensors):
            if t.dtype not in _REDUCIBLE:
                raise ClusterError(f"allreduce_: tensor {i} has dtype {t.dtype}; supported dtypes are "
                                   f"{sorted(str(d) for d in _REDUCIBLE)} (cast before reducing)")
            if t.device != self.topo.device:
                raise ClusterError(f"allreduce_: tensor {i} is on {t.device}, expected {self.topo.device}")
            if average and not t.is_floating_point():
                raise ClusterError(f"allreduce_: average=True needs floating-point tensors, tensor {i} is {t.dtype}")
        with torch.no_grad():  # parameters may be passed directly; in-place ops must not be traced
            self._allreduce_buckets(tensors, phase, average, bucket_bytes)

    def _allreduce_buckets(self, tensors, phase, average, bucket_bytes) -> None:
        for bucket in plan_buckets([t.numel() * t.element_size() for t in tensors],
                                   [t.dtype for t in tensors], bucket_bytes):
            members = [tensors[i] for i in bucket]
            if sum(t.numel() for t in members) == 0:
                continue
            aliased = len(members) == 1 and members[0].is_contiguous()
            # One tensor: reduce it in place; several: pack into one flat buffer (one call per bucket).
            flat = members[0].view(-1) if aliased else torch.cat([t.reshape(-1) for t in members])
            self._reduce_flat(flat, phase)
            if average:
                flat.div_(self.topo.world_size)
            if not aliased:
                for t, piece in zip(members, flat.split([t.numel() for t in members])):
                    t.copy_(piece.view_as(t))

    def _reduce_flat(self, flat: torch.Tensor, phase: str) -> None:
        topo = self.topo
        model = allreduce_bytes_model(flat.numel(), flat.element_size(), topo.servers,
                                      topo.ranks_per_server, topo.server, topo.local_rank)
        leader = int(topo.rank_table[topo.server, 0])
        use_torch = self.intra_transport in ("gloo", "nccl")
        if topo.ranks_per_server > 1:
            with self._timed("intra", phase):
                if use_torch:
                    dist.reduce(flat, dst=leader, op=dist.ReduceOp.SUM, group=topo.intra_group)
                else:
                    self._mpi_in_host(flat, lambda buf: topo.server_comm.Reduce(
                        MPI.IN_PLACE if topo.is_leader else buf, buf if topo.is_leader else None,
                        op=MPI.SUM, root=0), write_back=topo.is_leader)
        if topo.servers > 1 and topo.is_leader:
            with self._timed("inter", phase):
                self._mpi_in_host(flat, lambda buf: topo.leader_comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
                                  write_back=True)
        if topo.ranks_per_server > 1:
            with self._timed("intra", phase):
                if use_torch:
                    dist.broadcast(flat, src=leader, group=topo.intra_group)
                else:
                    self._mpi_in_host(flat, lambda buf: topo.server_comm.Bcast(buf, root=0),
                                      write_back=not topo.is_leader)
        self.ledger.add("intra", phase, model["intra"])
        self.ledger.add("inter", phase, model["inter"])

    def reduce_flat_start(self, flat: torch.Tensor, phase: str = "gradient") -> "PendingReduce":
        """The hierarchical all-reduce (sum) of one flat bucket, as `_reduce_flat`, started without waiting:
        the reduce to the leader is posted now, the leaders' all-reduce as soon as poll() or wait() finds
        it complete (so it travels while the caller computes), the broadcast in wait().  Same ledger
        bytes as `_reduce_flat`."""
        return PendingReduce(self, flat, phase)

    def _mpi_in_host(self, flat: torch.Tensor, op, write_back: bool) -> None:
        """Run an MPI call on a host view of `flat` (a copy when it lives on a GPU)."""
        if not flat.is_cuda:
            op(_np(flat))
            return
        host = flat.cpu()
        op(_np(host))
        if write_back:
            flat.copy_(host)

    def allreduce_scalar(self, values, op: str = "sum"):
        """Reduce a float/int or a small NumPy array over MPI world (not ledgered: bookkeeping)."""
        ops = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
        if op not in ops:
            raise ClusterError(f"allreduce_scalar op must be one of {sorted(ops)}, got {op!r}")
        arr = np.asarray(values)
        kind = np.float64 if arr.dtype.kind in "fc" else np.int64
        buf = np.array(arr, dtype=kind, copy=True, ndmin=1)
        self._p2p.Allreduce(MPI.IN_PLACE, buf, op=ops[op])
        if arr.ndim == 0:
            return float(buf[0]) if kind is np.float64 else int(buf[0])
        return buf.reshape(arr.shape)

    # ----------------------------------------------------------------- helpers
    def _check_send(self, send: torch.Tensor, sc: np.ndarray):
        if not isinstance(send, torch.Tensor) or send.dim() < 1:
            raise ClusterError(f"send must be a tensor with a row dimension, got {type(send).__name__} "
                               f"of shape {getattr(send, 'shape', None)}")
        if send.shape[0] != int(sc.sum()):
            raise ClusterError(f"send has {send.shape[0]} rows but send_counts add up to {int(sc.sum())}")
        if send.device != self.topo.device:
            raise ClusterError(f"send is on {send.device}, but this rank's device is {self.topo.device}")
        rest = tuple(send.shape[1:])
        return rest, int(np.prod(rest, dtype=np.int64)) * send.element_size()

    def _validate_counts(self, comm, sc, rc, row_bytes, label) -> None:
        """Debug check: what each peer will send me must equal what I expect to receive."""
        mine = np.stack([sc, np.full_like(sc, row_bytes)], axis=1)
        theirs = np.empty_like(mine)
        comm.Alltoall(mine, theirs)
        bad_count = np.flatnonzero(theirs[:, 0] != rc)
        bad_width = np.flatnonzero((theirs[:, 1] != row_bytes) & ((theirs[:, 0] > 0) | (rc > 0)))
        problems = [f"{label} {j} sends {theirs[j, 0]} rows but recv_counts[{j}]={rc[j]}" for j in bad_count]
        problems += [f"{label} {j} sends rows of {theirs[j, 1]} bytes, this rank's are {row_bytes}"
                     for j in bad_width]
        agree(comm, not problems, "; ".join(problems[:5]))

    def _row_type(self, row_bytes: int) -> MPI.Datatype:
        """A committed MPI datatype of one row, so MPI counts are rows (no 2 GiB byte-count limit)."""
        t = self._row_types.get(row_bytes)
        if t is None:
            t = MPI.BYTE.Create_contiguous(row_bytes).Commit()
            self._row_types[row_bytes] = t
        return t

    def _timed(self, link: str, phase: str, sync: bool = True):
        """Time a communication call.  sync=False for posting a non-blocking one: synchronising the GPU
        there would stall the host until queued kernels finish, which is what overlap avoids (NCCL and
        the staging copies order themselves on the streams)."""
        return _TimedSync(self.ledger, link, phase, self._cuda and sync)


class PendingExchange:
    """An exchange in flight.  wait() completes it (once) and returns the received rows; every rank that
    posted must wait, in the order it posted (collectives of one group complete in order)."""

    __slots__ = ("_finish", "_rows")

    def __init__(self, finish):
        self._finish, self._rows = finish, None

    @classmethod
    def done(cls, rows: torch.Tensor) -> "PendingExchange":
        pending = cls(None)
        pending._rows = rows
        return pending

    def wait(self) -> torch.Tensor:
        if self._finish is not None:
            finish, self._finish = self._finish, None
            self._rows = finish()
        return self._rows


# Seconds between two MPI_Testall of the progress thread: short against a message's transfer time
# (0.1 s for 1 MB at 100 Mbit/s), long enough that the polling costs no measurable compute.
PROGRESS_POLL_S = 0.001


class _MPIProgress:
    """Completion of MPI requests, optionally driven by a helper thread while the caller computes.

    Open MPI progresses non-blocking point-to-point and collectives only inside MPI calls (no
    asynchronous progress on TCP), so without the thread the messages would wait for wait().  The
    thread polls (MPI_Testall, then a short sleep) only until the caller needs the result: wait() stops
    it and completes the requests with MPI_Waitall on the calling thread, which reacts to every message
    at once -- a sleeping poller would add a wake-up per protocol round (measured on the oversubscribed
    2-core machine: the gradient all-reduce's rounds took 0.5 s longer when a poller completed them).
    The thread needs MPI_THREAD_MULTIPLE (mpi4py's default); with a lower thread level it is not started
    and the requests complete in wait() as before.  Only one thread touches the requests at a time."""

    def __init__(self, requests, progress: bool):
        self._requests = list(requests)
        self._thread, self._stop = None, False
        if progress and self._requests and MPI.Query_thread() == MPI.THREAD_MULTIPLE:
            self._thread = threading.Thread(target=self._poll, name="granndis-mpi-progress", daemon=True)
            self._thread.start()

    def _poll(self) -> None:
        while not self._stop and not MPI.Request.Testall(self._requests):
            time.sleep(PROGRESS_POLL_S)

    def test(self) -> bool:
        """True when every request has completed (MPI_Testall; only while no thread polls them)."""
        if self._thread is not None:
            if self._thread.is_alive():
                return False
            self._thread.join()
            self._thread = None
        return bool(MPI.Request.Testall(self._requests))

    def wait(self) -> None:
        if self._thread is not None:
            self._stop = True
            self._thread.join()
            self._thread = None
        MPI.Request.Waitall(self._requests)  # completed requests are MPI_REQUEST_NULL: returns at once


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

    def __init__(self, comm: Communicator, flat: torch.Tensor, phase: str):
        topo = comm.topo
        self.comm, self.flat, self.phase = comm, flat, phase
        self._torch = comm.intra_transport in ("gloo", "nccl")
        self._leader = int(topo.rank_table[topo.server, 0])
        self._host = None       # host view (CPU) or copy (GPU) of the bucket for the MPI stages
        self._stage1 = None     # torch Work, or _MPIProgress of the Isend/Irecv to the leader
        self._received = None   # leader, MPI: the G-1 buckets of its server's other ranks
        self._stage2 = None     # (_MPIProgress, the other leader's bucket) on 2 servers, else False
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
        return _REDUCIBLE[self.flat.dtype]

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
            requests = [p2p.Irecv([_np(self._received[i]), n, self._mpi_type()], source=src, tag=self._REDUCE_TAG)
                        for i, src in enumerate(mates[1:])]
        else:
            requests = [p2p.Isend([_np(host), n, self._mpi_type()], dest=self._leader, tag=self._REDUCE_TAG)]
        return _MPIProgress(requests, progress=True)

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
                requests = [p2p.Irecv([_np(other), n, self._mpi_type()], source=peer, tag=self._LEADERS_TAG),
                            p2p.Isend([_np(host), n, self._mpi_type()], dest=peer, tag=self._LEADERS_TAG)]
                self._stage2 = (_MPIProgress(requests, progress=True), other)
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


class _TimedSync:
    """ledger.timed that synchronises CUDA first, so kernels are charged to the right call."""

    def __init__(self, ledger: Ledger, link: str, phase: str, cuda: bool):
        self._inner = ledger.timed(link, phase)
        self._cuda = cuda

    def __enter__(self):
        if self._cuda:
            torch.cuda.synchronize()
        return self._inner.__enter__()

    def __exit__(self, *exc):
        if self._cuda:
            torch.cuda.synchronize()
        return self._inner.__exit__(*exc)


def plan_buckets(nbytes: Sequence[int], dtypes: Sequence, bucket_bytes: int) -> list[list[int]]:
    """Indices of tensors per bucket: consecutive tensors of one dtype while they fit in bucket_bytes.

    The order depends only on the sizes and dtypes, which are the same on every rank.
    """
    buckets: list[list[int]] = []
    open_of: dict = {}          # dtype -> (bucket index, bytes so far)
    for i, (n, dt) in enumerate(zip(nbytes, dtypes)):
        current = open_of.get(dt)
        if current is not None and current[1] + n <= bucket_bytes:
            buckets[current[0]].append(i)
            open_of[dt] = (current[0], current[1] + n)
        else:
            buckets.append([i])
            open_of[dt] = (len(buckets) - 1, n)
    return buckets


def _byte_rows(t: torch.Tensor, row_bytes: int) -> torch.Tensor:
    """A [rows, row_bytes] uint8 view of a tensor's rows (contiguous copy if needed)."""
    rows = t.shape[0]
    if rows == 0:  # empty tensors may carry zero strides that dtype views reject
        return torch.empty((0, row_bytes), dtype=torch.uint8, device=t.device)
    flat = t.contiguous().view(rows, row_bytes // t.element_size())
    return flat if t.dtype == torch.uint8 else flat.view(torch.uint8)


def _typed_rows(byte_rows: torch.Tensor, dtype: torch.dtype, rest: tuple) -> torch.Tensor:
    """Inverse of _byte_rows: [rows, row_bytes] uint8 -> [rows, *rest] of dtype (a view)."""
    typed = byte_rows if dtype == torch.uint8 else byte_rows.view(dtype)
    return typed.reshape(byte_rows.shape[0], *rest)


def _np(t: torch.Tensor) -> np.ndarray:
    """NumPy view of a CPU tensor's memory (uint8 or a reducible dtype)."""
    return t.detach().numpy()

"""Communication primitives with exact byte/time accounting.

* `intra_exchange`: variable-sized row blocks among the ranks of one server
  (gloo/NCCL `all_to_all_single` with splits, or MPI `Alltoallv` on the server communicator).
* `world_exchange`: the same over the whole job; same-server blocks go through the intra transport,
  other blocks through MPI point-to-point (only the non-empty pairs, non-blocking, CPU-staged from
  a GPU, in messages under the TCP eager limit: layout.message_pieces), overlapped with the intra part.
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
from typing import Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from .accounting import allreduce_bytes_model
from .allreduce import REDUCIBLE, PendingReduce
from .errors import ClusterError, agree, collective_errors
from .exchange_group import ExchangeGroup, local_group
from .layout import block_rows, check_counts, message_pieces, offsets_of, piece_bytes_setting, plan_buckets
from .ledger import Ledger
from .pending import MPIProgress, PendingExchange, TimedSync, byte_rows, check_poll_setting, np_view, typed_rows
from .staging import HostStaging, wait_event
from .topology import Topology

ENV_CHECK_COMM = "GRANNDIS_CHECK_COMM"
ENV_PIECE_BYTES = "GRANNDIS_MESSAGE_PIECE_BYTES"
DEFAULT_BUCKET_BYTES = 25 << 20
_P2P_TAG = 17


class Communicator:
    """Owns the transports of one process; one per process (per Topology)."""

    def __init__(self, topo: Topology, ledger: Ledger, intra_transport: str = "auto",
                 validate: bool | None = None, host_staging: bool = False):
        transport = topo.intra_transport if intra_transport == "auto" else intra_transport
        if transport not in ("gloo", "nccl", "mpi"):
            raise ClusterError(f"intra_transport must be auto, gloo, nccl or mpi, got {intra_transport!r}")
        if transport in ("gloo", "nccl") and transport != topo.intra_transport:
            raise ClusterError(f"intra_transport={transport} but the topology was built with "
                               f"{topo.intra_transport}; pass intra_transport={transport!r} to init_topology")
        check_poll_setting(topo.world)
        with collective_errors(topo.world, "", catch=(ValueError,)):  # the same one line on every rank
            # the largest message between servers (layout.MESSAGE_PIECE_BYTES)
            self.piece_bytes = piece_bytes_setting(os.environ.get(ENV_PIECE_BYTES, ""))
        self.topo, self.ledger = topo, ledger
        self.intra_transport = transport
        self.validate = (os.environ.get(ENV_CHECK_COMM, "") not in ("", "0")) if validate is None else validate
        self._cuda = topo.device.type == "cuda"
        # Pinned, reused host buffers and side-stream copies for what MPI moves from a GPU (staging.py);
        # host_staging (--host-staging) runs the same logic on the CPU.
        self._staging = HostStaging(topo.device, emulate=host_staging)
        self._p2p = topo.world.Dup()  # private point-to-point traffic: no other library's messages match
        self._row_types: dict[int, MPI.Datatype] = {}
        self._ring_tags = 0  # leaders' rings started (allreduce.LeadersRing): the next one's tag

    def next_ring_tag(self) -> int:
        """The tag of the next leaders' ring (every leader starts its rings in the same order)."""
        from .allreduce import RING_TAG_BASE, RING_TAGS
        tag, self._ring_tags = RING_TAG_BASE + self._ring_tags % RING_TAGS, self._ring_tags + 1
        return tag

    def close(self) -> None:
        for t in self._row_types.values():
            t.Free()
        self._row_types.clear()
        if self._p2p is not None:
            self._p2p.Free()
            self._p2p = None

    def group(self, name: str, wire_dtype: Optional[torch.dtype] = None, route: str = "direct") -> ExchangeGroup:
        """The exchange group `name` ("world", "server" or "none") over this communicator's transports,
        its training halo travelling in `wire_dtype`, the world's on `route` (cluster/exchange_group.py)."""
        topo = self.topo
        if name == "world":
            group = ExchangeGroup("world", topo.world_size, self.world_exchange, self.world_exchange_start,
                                  lambda counts: topo.exchange_counts(counts, group="world"), ("intra", "inter"))
            group = group.with_route(route, self.group("server"), topo._server_of, topo._local_of, topo.rank)
        elif name == "server":
            group = ExchangeGroup("server", topo.ranks_per_server, self.intra_exchange, self.intra_exchange_start,
                                  lambda counts: topo.exchange_counts(counts, group="server"), ("intra",))
        elif name == "none":
            group = local_group()
        else:
            raise ClusterError(f"exchange group must be world, server or none, got {name!r}")
        return group.with_wire(wire_dtype)

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
            finish = self._intra_bytes_start(byte_rows(send, row_bytes), sc, rc, progress)
        self.ledger.add("intra", phase, (int(sc.sum()) - int(sc[me])) * row_bytes)

        def wait():
            with self._timed("intra", phase):
                return typed_rows(finish(), send.dtype, rest)
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
        st = self._staging
        if st.copies:  # the send rows staged on the side stream, `ready` once copied (staging.py)
            send_lease, host_send, ready = st.to_host(send_bytes)
            out_lease = st.pool.acquire((n_out, row_bytes))
            host_out = out_lease.rows
        else:
            send_lease, out_lease, ready = None, None, None
            host_send, host_out = send_bytes, torch.empty((n_out, row_bytes), dtype=torch.uint8)

        def to_device():
            if not st.copies:
                return host_out
            out = st.to_device(host_out)
            st.release(send_lease, out_lease)
            return out
        rtype = self._row_type(row_bytes)
        s_off, r_off = offsets_of(sc), offsets_of(rc)
        if not progress:
            wait_event(ready)
            self.topo.server_comm.Alltoallv([np_view(host_send), (sc.tolist(), s_off.tolist()), rtype],
                                            [np_view(host_out), (rc.tolist(), r_off.tolist()), rtype])
            out = to_device()
            return lambda: out
        me, mates = self.topo.local_rank, self.topo.server_ranks()
        others = np.array([j for j in range(g) if j != me], dtype=np.int64)
        to_send, to_recv = others[sc[others] > 0], others[rc[others] > 0]
        none = np.zeros(0, dtype=np.int64)
        requests = self._post_p2p(np_view(host_send), np_view(host_out), sc, rc, s_off, r_off, none, none,
                                  mates[to_recv], to_recv, rtype)

        def post_sends():  # once the send rows are on the host
            host_out[int(r_off[me]):int(r_off[me] + rc[me])] = host_send[int(s_off[me]):int(s_off[me] + sc[me])]
            return self._post_p2p(np_view(host_send), np_view(host_out), sc, rc, s_off, r_off, mates[to_send],
                                  to_send, none, none, rtype)
        if ready is None:
            requests, deferred = requests + post_sends(), None
        else:
            deferred = (ready, post_sends)
        waiter = MPIProgress(requests, progress, deferred)  # mpi4py's requests keep their buffers alive

        def finish_mpi():
            waiter.wait()
            return to_device()
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

        progress=True: a helper thread polls the MPI requests (MPI_Testall, sleeping 1 ms backing off to
        4 ms in between, cluster/pending.py) so that the messages move while the caller computes -- Open MPI's TCP
        transport moves a
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
        send_bytes = byte_rows(send, row_bytes)
        out_bytes = byte_rows(out, row_bytes)
        s_off, r_off = offsets_of(sc), offsets_of(rc)

        mates = topo.server_ranks()                       # same-server ranks, by local rank
        others = np.flatnonzero(topo._server_of != topo.server)
        to_send = others[sc[others] > 0]
        to_recv = others[rc[others] > 0]

        with self._timed("inter", phase, sync=False):
            requests, deferred, staged = self._post_inter(send_bytes, out_bytes, sc, rc, s_off, r_off,
                                                          to_send, to_recv, row_bytes)
            waiter = MPIProgress(requests, progress, deferred)
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
                if staged is not None:  # GPU: host staging -> device rows of the inter blocks
                    recv_lease, rows, send_lease = staged
                    out_bytes[rows] = self._staging.to_device(recv_lease.rows)
                    self._staging.release(recv_lease, send_lease)
            return out  # out_bytes is a view of out
        return PendingExchange(wait)

    def _post_inter(self, send_bytes, out_bytes, sc, rc, s_off, r_off, to_send, to_recv, row_bytes):
        """Post Irecv (and Isend) for the inter-server blocks; returns (requests, deferred sends or None,
        host staging or None).  Staged from a GPU, the sends are deferred until their copy has completed
        (MPIProgress posts them) and the receives land in a pooled host buffer."""
        requests = []
        staged, ready = None, None
        st = self._staging
        if st.copies:
            # Compact host buffers holding only the inter-server blocks.
            recv_rows = block_rows(r_off, rc, to_recv)
            recv_lease = st.pool.acquire((int(rc[to_recv].sum()), row_bytes))
            send_lease, host_send, ready = st.to_host(send_bytes[block_rows(s_off, sc, to_send)])
            recv_buf, recv_off = np_view(recv_lease.rows), offsets_of(rc[to_recv])
            send_buf, send_off = np_view(host_send), offsets_of(sc[to_send])
            staged = (recv_lease, recv_rows, send_lease)
        else:
            recv_buf, recv_off = np_view(out_bytes), r_off[to_recv]
            send_buf, send_off = np_view(send_bytes), s_off[to_send]
        # Each block in messages of at most MESSAGE_PIECE_BYTES bytes (under the TCP eager limit, so that
        # the two directions between a pair of ranks travel at once; layout.py), in order, one tag: the
        # receiver posts the same pieces of the same block, so they match in posting order.
        recv_flat, send_flat = np.reshape(recv_buf, -1, copy=False), np.reshape(send_buf, -1, copy=False)
        for src, off in zip(to_recv.tolist(), np.asarray(recv_off).tolist()):
            requests += self._post_pieces(self._p2p.Irecv, recv_flat, off * row_bytes, int(rc[src]) * row_bytes,
                                          src)

        def post_sends():
            sends = []
            for dst, off in zip(to_send.tolist(), np.asarray(send_off).tolist()):
                sends += self._post_pieces(self._p2p.Isend, send_flat, off * row_bytes,
                                           int(sc[dst]) * row_bytes, dst)
            return sends
        if ready is None:
            return requests + post_sends(), None, staged
        return requests, (ready, post_sends), staged

    def _post_pieces(self, post, flat, start: int, nbytes: int, peer: int, tag: int = _P2P_TAG) -> list:
        """Irecv or Isend (`post`) of flat[start:start + nbytes] (uint8) with `peer` as message_pieces: the
        world exchange's blocks and the 2-server leaders' gradient buckets (allreduce.py)."""
        return [post([flat[start + a:start + b], b - a, MPI.BYTE], peer, tag)
                for a, b in message_pieces(nbytes, 1, self.piece_bytes)]

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
            if t.dtype not in REDUCIBLE:
                raise ClusterError(f"allreduce_: tensor {i} has dtype {t.dtype}; supported dtypes are "
                                   f"{sorted(str(d) for d in REDUCIBLE)} (cast before reducing)")
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
        leaders = topo.leader_comm  # a communicator on the leaders (None elsewhere)
        if topo.servers > 1 and leaders is not None:
            with self._timed("inter", phase):
                self._mpi_in_host(flat, lambda buf: leaders.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
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

    def reduce_flat_start(self, flat: torch.Tensor, phase: str = "gradient",
                          after: "PendingReduce | None" = None) -> "PendingReduce":
        """The hierarchical all-reduce (sum) of one flat bucket, as `_reduce_flat`, started without waiting:
        the reduce to the leader is posted now, the leaders' all-reduce as soon as poll() or wait() finds
        it complete (so it travels while the caller computes), the broadcast in wait().  Same ledger
        bytes as `_reduce_flat`.  `after`: the bucket posted just before (its leaders' stage starts
        first, so the leaders' messages pair up in the same order on every leader)."""
        return PendingReduce(self, flat, phase, after)

    def _mpi_in_host(self, flat: torch.Tensor, op, write_back: bool) -> None:
        """Run an MPI call on a host view of `flat` (a staged copy when it lives on a GPU: the host waits
        for the copy out, a blocking MPI call needs the rows; the copy back is queued)."""
        st = self._staging
        if not st.copies:
            op(np_view(flat))
            return
        lease, host, ready = st.to_host(flat)
        wait_event(ready)
        op(np_view(host))
        if write_back:
            st.to_device(host, into=flat)
        st.release(lease)

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
        """Time a communication call: host wall time on the CPU, CUDA events on a GPU (never a device
        synchronisation: NCCL and the staging copies order themselves on the streams).  `sync` is kept
        for the callers' documentation of which calls wait (True) and which post (False)."""
        return TimedSync(self.ledger, link, phase, self._cuda)

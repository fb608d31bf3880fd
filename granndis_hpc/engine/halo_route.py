"""The per-server route of the world group's halo (--halo-route per-server): each row crosses servers
once per receiving server.

The direct route sends a halo row once per (sending rank, receiving rank): when several ranks of a
server read the same remote vertex it crosses the slow link several times.  The per-server route, for
every sending rank s and every other server B:

1. (world exchange) s sends each row that any rank of B reads from it ONCE, to one of the ranks of B
   that read it (the "relay"; shared rows are spread over their readers in turn, so each rank of B
   receives a disjoint part).  Blocks between ranks of one server go directly, as on the direct route.
2. (intra-server exchange) each relay forwards the rows it received to the other ranks of its server
   that read them;
3. every rank assembles its halo in the direct route's order (HaloTable order), bit for bit the rows
   the direct route delivers.

The backward runs it in reverse: a rank returns the gradients of forwarded rows to their relay over the
intra-server transport, the relay adds them to its own (the server's summed gradient of the row) and
sends each row's sum back across servers once; the owner adds them into its rows' gradients.  The sums
are those of the direct route in another order of addition (exact arithmetic, float rounding aside).

The plan (which rows, which relay, forwarding and assembly indices) is built once per view and layer
plan at set-up: two count exchanges and two exchanges of integers (`plan_server_route`, collective over
the world).  Its bytes are what the ledger charges: stage 1's between servers to "inter", stage 1's
within a server and stage 2 to "intra" (`route_bytes` computes the same from the plan).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from granndis_hpc.engine.exchange import scatter_add_rows, send_index_tensor

HALO_ROUTES = ("direct", "per-server")


def _offsets(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


@dataclass
class ServerRoutePlan:
    """One rank's part of a per-server route (host arrays; see the module docstring)."""

    send_index: np.ndarray  # own rows of stage 1, grouped by destination rank
    send_counts: np.ndarray  # [world] stage-1 rows to each rank
    recv_counts: np.ndarray  # [world] stage-1 rows from each rank
    fwd_index: np.ndarray  # stage-1 rows this rank forwards, grouped by receiving local rank
    fwd_send_counts: np.ndarray  # [ranks per server]
    fwd_recv_counts: np.ndarray  # [ranks per server] forwarded rows from each relay
    assemble: np.ndarray  # halo row i = cat(stage-1 rows, forwarded rows)[assemble[i]]

    @property
    def n_stage1(self) -> int:
        return int(self.recv_counts.sum())


def choose_relays(send_index, send_counts, peer_server, my_server, row_ids):
    """Stage 1 of the sender: for each position of the direct send index (rows grouped by destination
    rank), the relay rank its row goes to, or -1 for a destination on this server (sent directly).
    A row's readers on one server, by rank, take turns by its global id: the reader number
    id mod (readers) relays it -- a rule of the row alone, which the memory model counts from the
    partition (memory_model/arrays.py server_inter_once) without planning."""
    dest = np.repeat(np.arange(len(send_counts)), send_counts)
    relay = np.full(dest.size, -1, dtype=np.int64)
    rpos = np.flatnonzero(peer_server[dest] != my_server)
    if rpos.size == 0:
        return relay
    rs, rv, rd = peer_server[dest[rpos]], send_index[rpos], dest[rpos]
    order = np.lexsort((rd, rv, rs))
    rs, rv, rd = rs[order], rv[order], rd[order]
    new = np.ones(rs.size, dtype=bool)
    new[1:] = (rs[1:] != rs[:-1]) | (rv[1:] != rv[:-1])
    start = np.flatnonzero(new)
    size = np.diff(np.append(start, rs.size))
    group_relay = rd[start + np.asarray(row_ids, dtype=np.int64)[rv[start]] % size]
    relay[rpos[order]] = group_relay[np.cumsum(new) - 1]
    return relay


def plan_server_route(send_index, send_counts, recv_counts, peer_server, peer_local, me: int, row_ids,
                      world_counts: Callable, world_exchange: Callable, relay_counts: Callable,
                      relay_exchange: Callable, device) -> ServerRoutePlan:
    """Plan this rank's part of the per-server route of a direct plan (send_index/send_counts/recv_counts
    over the world's ranks).  Collective over the world: every rank calls it for the same plans in the
    same order.  peer_server/peer_local: server and local rank of every world rank; row_ids: the global
    ids of the own rows (choose_relays)."""
    send_index = np.asarray(send_index, dtype=np.int64)
    send_counts, recv_counts = np.asarray(send_counts, np.int64), np.asarray(recv_counts, np.int64)
    peer_server, peer_local = np.asarray(peer_server, np.int64), np.asarray(peer_local, np.int64)
    P, my_server = send_counts.size, int(peer_server[me])
    relay = choose_relays(send_index, send_counts, peer_server, my_server, row_ids)
    remote = relay >= 0
    # Stage-1 blocks: the direct ones as they are; one entry per (relay, row), ordered by row.
    dest = np.repeat(np.arange(P), send_counts)
    pairs = np.unique(np.stack([relay[remote], send_index[remote]], axis=1), axis=0).reshape(-1, 2)
    dest1 = np.concatenate([dest[~remote], pairs[:, 0]])
    order = np.argsort(dest1, kind="stable")
    send1 = np.concatenate([send_index[~remote], pairs[:, 1]])[order]
    send1_counts = np.bincount(dest1, minlength=P).astype(np.int64)
    # Where each remote position's row sits in its relay's block (what its reader must ask for).
    where = np.empty(order.size, dtype=np.int64)
    where[order] = np.arange(order.size)
    n_direct = int((~remote).sum())
    pair_index = where[n_direct:] - _offsets(send1_counts)[pairs[:, 0]]
    meta = np.full((send_index.size, 2), -1, dtype=np.int64)
    if pairs.size:
        found = np.searchsorted(pairs[:, 0] * (send_index.max() + 1) + pairs[:, 1],
                                relay[remote] * (send_index.max() + 1) + send_index[remote])
        meta[remote] = np.stack([relay[remote], pair_index[found]], axis=1)
    # Receivers: which relay (and which of its stage-1 rows) holds each halo row.
    recv1_counts = np.asarray(world_counts(send1_counts.tolist()), dtype=np.int64)
    got = world_exchange(torch.as_tensor(meta, device=device), send_counts.tolist(), recv_counts.tolist(),
                         phase="setup").cpu().numpy().reshape(-1, 2)
    src = np.repeat(np.arange(P), recv_counts)
    off1, roff = _offsets(recv1_counts), _offsets(recv_counts)
    assemble = np.empty(src.size, dtype=np.int64)
    direct = peer_server[src] == my_server
    assemble[direct] = off1[src[direct]] + np.flatnonzero(direct) - roff[src[direct]]
    mine = ~direct & (got[:, 0] == me)
    assemble[mine] = off1[src[mine]] + got[mine, 1]
    ask = np.flatnonzero(~direct & (got[:, 0] != me))
    if np.any(peer_server[got[ask, 0]] != my_server):
        raise RuntimeError("per-server halo route: a sender named a relay on another server (the ranks "
                           "disagree on the topology)")
    ask = ask[np.argsort(peer_local[got[ask, 0]], kind="stable")]
    n_local = int((peer_server == my_server).sum())
    ask_counts = np.bincount(peer_local[got[ask, 0]], minlength=n_local).astype(np.int64)
    fwd_counts = np.asarray(relay_counts(ask_counts.tolist()), dtype=np.int64)
    requests = torch.as_tensor(np.stack([src[ask], got[ask, 1]], axis=1).reshape(-1, 2), device=device)
    asked = relay_exchange(requests, ask_counts.tolist(), fwd_counts.tolist(), phase="setup").cpu().numpy()
    asked = asked.reshape(-1, 2)
    assemble[ask] = int(recv1_counts.sum()) + np.arange(ask.size)
    return ServerRoutePlan(send1, send1_counts, recv1_counts, off1[asked[:, 0]] + asked[:, 1], fwd_counts,
                           ask_counts, assemble)


def route_bytes(plan: ServerRoutePlan, peer_server, me: int, row_bytes: int) -> dict:
    """This rank's bytes sent by one forward of the route: {"inter", "intra"} (what the ledger charges)."""
    peer_server = np.asarray(peer_server)
    other = peer_server != peer_server[me]
    same = ~other
    same[me] = False
    inter = int(plan.send_counts[other].sum())
    intra = int(plan.send_counts[same].sum()) + int(plan.fwd_send_counts.sum())
    return {"inter": inter * row_bytes, "intra": intra * row_bytes}


def _sum_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b, in float32 for half-width rows (gradients on a narrow wire), in the rows' dtype after."""
    if a.dtype in (torch.float16, torch.bfloat16):
        return (a.float() + b.float()).to(a.dtype)
    return a + b


class _Chained:
    """A pending stage-1 exchange whose wait() also runs what follows it."""

    __slots__ = ("_pending", "_then")

    def __init__(self, pending, then):
        self._pending, self._then = pending, then

    def wait(self):
        return self._then(self._pending.wait())


class ServerRoute:
    """A ServerRoutePlan on the device, bound to the world group's and the server group's exchanges of
    one phase: the four methods of engine/exchange.DirectRoute.  The overlapped form posts stage 1 and
    runs stage 2 (intra-server, blocking) when the halo is waited for; its backward runs stage 2 at once
    and posts stage 1."""

    def __init__(self, plan: ServerRoutePlan, device, world, relay):
        self.plan, self.world, self.relay = plan, world, relay
        as_t = (lambda a: torch.as_tensor(np.asarray(a, dtype=np.int64), device=device))
        self.send_index, self.assemble = as_t(plan.send_index), as_t(plan.assemble)
        self.fwd_index = send_index_tensor(plan.fwd_index, device)  # scatter rounds built on the host
        self.s1, self.r1 = plan.send_counts.tolist(), plan.recv_counts.tolist()
        self.fs, self.fr = plan.fwd_send_counts.tolist(), plan.fwd_recv_counts.tolist()
        self.n1, self.n_halo = plan.n_stage1, int(plan.assemble.size)
        self._phase: Optional[str] = None

    def bind(self, phase: str) -> "ServerRoute":
        """The same route whose exchanges are ledgered under `phase`."""
        bound = object.__new__(ServerRoute)
        bound.__dict__.update(self.__dict__)
        bound._phase = phase
        return bound

    def _share(self, stage1: torch.Tensor) -> torch.Tensor:
        forwarded = self.relay.exchange(stage1.index_select(0, self.fwd_index).contiguous(), self.fs, self.fr,
                                        phase=self._phase)
        return torch.cat([stage1, forwarded]).index_select(0, self.assemble)

    def _gather_back(self, grad: torch.Tensor) -> torch.Tensor:
        buf = grad.new_zeros((self.n1 + int(sum(self.fr)),) + tuple(grad.shape[1:]))
        buf.index_copy_(0, self.assemble, grad)
        back = self.relay.exchange(buf[self.n1:].contiguous(), self.fr, self.fs, phase=self._phase)
        return _sum_rows(buf[: self.n1], scatter_add_rows(self.fwd_index, back, self.n1)).contiguous()

    def forward(self, rows):
        return self._share(self.world.exchange(rows, self.s1, self.r1, phase=self._phase))

    def backward(self, grad):
        return self.world.exchange(self._gather_back(grad), self.r1, self.s1, phase=self._phase)

    def start(self, rows):
        return _Chained(self.world.start(rows, self.s1, self.r1, phase=self._phase), self._share)

    def start_backward(self, grad):
        return self.world.start(self._gather_back(grad), self.r1, self.s1, phase=self._phase)


def route_view(plan, group, device, row_ids):
    """(per-layer ServerRoutes, the full plan's ServerRoute) of a view's plan on `group`, or (None, None)
    where the group's route is direct.  Collective over the group: every rank plans the same views.
    row_ids: global ids of the view's own rows (the relays' turns; positions where there are none)."""
    if not group.per_server:
        return None, None
    row_ids = np.arange(plan.num_own, dtype=np.int64) if row_ids is None else np.asarray(row_ids, np.int64)

    def make(send_index, send_counts, recv_counts):
        return ServerRoute(plan_server_route(send_index, send_counts, recv_counts, group.peer_server,
                                             group.peer_local, group.me, row_ids, group.counts, group.exchange,
                                             group.relay.counts, group.relay.exchange, device),
                           device, group, group.relay)
    made, layers = {}, []  # layers sharing one LayerPlan share one route
    for lp in plan.layers:
        if id(lp) not in made:
            made[id(lp)] = make(lp.send_index, lp.send_counts, lp.recv_counts)
        layers.append(made[id(lp)])
    full_counts = plan.halo.counts()
    same = next((route for lp, route in zip(plan.layers, layers)
                 if np.array_equal(lp.send_index, plan.full_send_index)
                 and np.array_equal(lp.send_counts, plan.full_send_counts)
                 and np.array_equal(lp.recv_counts, full_counts)), None)
    return layers, same or make(plan.full_send_index, plan.full_send_counts, full_counts)

"""Autograd-aware halo exchange: the forward sends own rows to the peers that read them, the backward
returns the gradients of received rows to their owners, who add them to their own rows' gradients.

Every rank runs the same layers in the same order, forward and backward, so the collective calls
inside line up on all ranks (a rank with nothing to send still takes part with empty blocks).

Two forms:
- `halo_exchange`: blocking (the rows are there when it returns; backward likewise) -- `--no-overlap`;
- `halo_exchange_start`: posts the exchange and returns the own rows with the halo still in flight
  (nn/rows.PendingRows); the layer runner aggregates the edges whose sources it holds, then waits and adds
  the halo edges.  Its backward runs in reverse: the halo's gradients are posted back as soon as they
  are known, the own rows' gradients are computed while they travel, and the owner waits only when
  it must add them (two autograd nodes, _Post and _Wait; the autograd engine runs the later-created
  node first among those ready, so the local branch's backward falls between them).

`halo_exchange_post` posts from the rows a layer sends before its other rows exist (boundary-first
pipelining: nn/runner.py computes those rows first); `halo_exchange_start` is it with all own rows.

`wire_dtype` (--halo-dtype): halo rows and their gradients travel in that dtype (bfloat16/float16:
half the bytes) and are widened to the rows' dtype on arrival.  None: as they are (exact).

Each form takes a route (`routed_exchange`, `routed_post`): `DirectRoute`, one exchange over the group,
or the world group's per-server route (engine/halo_route.py, --halo-route), which sends each row
across servers once per receiving server and shares it there.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np
import torch

from granndis_hpc.cluster import trace
from granndis_hpc.nn.rows import PendingRows

# exchange_fn(send_rows, send_counts, recv_counts) -> received rows; a Communicator method bound to
# the right peers (intra-server or world) and ledger phase.
ExchangeFn = Callable[[torch.Tensor, Sequence[int], Sequence[int]], torch.Tensor]
# start_fn(send_rows, send_counts, recv_counts) -> an object whose wait() returns the received rows
# (cluster.comm.PendingExchange).
StartFn = Callable[[torch.Tensor, Sequence[int], Sequence[int]], object]


def _to_wire(t: torch.Tensor, wire_dtype: Optional[torch.dtype]) -> torch.Tensor:
    return (t if wire_dtype is None or t.dtype == wire_dtype else t.to(wire_dtype)).contiguous()


def _from_wire(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)


def _rounds(index: torch.Tensor) -> list:
    """Positions of `index` split into rounds without a repeated value: round r holds the r-th occurrence
    (in position order) of every value.  Built once per send index (kept on the tensor: the plans' send
    indices live as long as their view)."""
    cached = getattr(index, "_granndis_rounds", None)
    if cached is None:
        order = torch.sort(index, stable=True).indices
        ordered = index[order]
        pos = torch.arange(index.numel(), device=index.device)
        start = torch.ones_like(ordered, dtype=torch.bool)
        start[1:] = ordered[1:] != ordered[:-1]
        occurrence = pos - torch.cummax(torch.where(start, pos, torch.zeros_like(pos)), 0).values
        n_rounds = int(occurrence.max()) + 1 if index.numel() else 0
        cached = [torch.sort(order[occurrence == r]).values for r in range(n_rounds)]
        index._granndis_rounds = cached
    return cached


def send_index_tensor(send_index, device, put=None) -> torch.Tensor:
    """A plan's send index (host array) on `device`, its scatter rounds built on the host now (the
    views' send indices: no device value is read back in the backward, cob's per-step views included).
    put(array): how a host array goes to the device (cob's loader stream), default torch.as_tensor."""
    put = put or (lambda a: torch.as_tensor(a, device=device))
    host = np.asarray(send_index, dtype=np.int64)
    index = put(host)
    order = np.argsort(host, kind="stable")
    ordered = host[order]
    pos = np.arange(host.size)
    start = np.ones(host.size, dtype=bool)
    start[1:] = ordered[1:] != ordered[:-1]
    occurrence = pos - np.maximum.accumulate(np.where(start, pos, 0)) if host.size else pos
    n_rounds = int(occurrence.max()) + 1 if host.size else 0
    index._granndis_rounds = [put(np.sort(order[occurrence == r])) for r in range(n_rounds)]
    return index


def scatter_add_rows(index: torch.Tensor, rows: torch.Tensor, num_rows: int) -> torch.Tensor:
    """out[index[j]] += rows[j] into zeros [num_rows, ...], deterministic on every device.

    A row sent to several peers appears several times in a send index, and index_add_ with repeated
    indices sums them with atomics on CUDA, in an order that varies from run to run (so a resumed run
    would not repeat the bits).  Here each round adds one occurrence of each row (no repeated index
    inside an index_add_ call), rounds in position order: the same sums, in the order the CPU's
    index_add_ makes them (positions ascending), so the CPU's bits are unchanged.  A round per peer a
    row goes to at most, not a loop over rows."""
    out = rows.new_zeros((num_rows,) + tuple(rows.shape[1:]))
    for positions in _rounds(index):
        out.index_add_(0, index[positions], rows[positions])
    return out

class DirectRoute:
    """The direct route of an exchange group: each peer's block goes straight to it, one exchange each
    way (`exchange_fn` blocking, `start_fn` posted).  The per-server route of the world group
    (engine/halo_route.py) has the same four methods; the autograd nodes below run either."""

    __slots__ = ("send_counts", "recv_counts", "exchange_fn", "start_fn", "n_halo")

    def __init__(self, send_counts, recv_counts, exchange_fn: Optional[ExchangeFn] = None,
                 start_fn: Optional[StartFn] = None):
        self.send_counts, self.recv_counts = list(send_counts), list(recv_counts)
        self.exchange_fn, self.start_fn = exchange_fn, start_fn
        self.n_halo = int(sum(self.recv_counts))

    def forward(self, rows):
        return self.exchange_fn(rows, self.send_counts, self.recv_counts)

    def backward(self, grad):  # the reverse exchange: what we received, we send back
        return self.exchange_fn(grad, self.recv_counts, self.send_counts)

    def start(self, rows):
        return self.start_fn(rows, self.send_counts, self.recv_counts)

    def start_backward(self, grad):
        return self.start_fn(grad, self.recv_counts, self.send_counts)


class _HaloExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, send_index, route, wire_dtype):
        ctx.route, ctx.wire_dtype = route, wire_dtype
        ctx.save_for_backward(send_index)
        ctx.num_rows = h.shape[0]
        trace.mark("block_fwd_start")
        rows = _from_wire(route.forward(_to_wire(h.index_select(0, send_index), wire_dtype)), h.dtype)
        trace.mark("block_fwd_end")
        return rows

    @staticmethod
    def backward(ctx, grad_recv):
        (send_index,) = ctx.saved_tensors
        trace.mark("block_bwd_start")
        grad_send = _from_wire(ctx.route.backward(_to_wire(grad_recv, ctx.wire_dtype)), grad_recv.dtype)
        trace.mark("block_bwd_end")
        return scatter_add_rows(send_index, grad_send, ctx.num_rows), None, None, None


def routed_exchange(h: torch.Tensor, send_index: torch.Tensor, route, wire_dtype: Optional[torch.dtype] = None):
    """Rows of `h` at `send_index` travel by `route` (DirectRoute, or halo_route.ServerRoute); returns the
    halo rows the route delivers.  Differentiable wrt `h`."""
    if h.requires_grad:
        return _HaloExchange.apply(h, send_index, route, wire_dtype)
    return _from_wire(route.forward(_to_wire(h.index_select(0, send_index), wire_dtype)), h.dtype)


def halo_exchange(h: torch.Tensor, send_index: torch.Tensor, send_counts: Sequence[int],
                  recv_counts: Sequence[int], exchange_fn: ExchangeFn,
                  wire_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Rows of `h` at `send_index` go to the peers (grouped by peer, `send_counts` each); returns the
    rows received (grouped by source peer, `recv_counts` each).  Differentiable wrt `h`."""
    return routed_exchange(h, send_index, DirectRoute(send_counts, recv_counts, exchange_fn), wire_dtype)


class _InFlight:
    """What the two nodes of one overlapped exchange share: the route and the two pending exchanges."""

    __slots__ = ("send_index", "route", "wire_dtype", "dtype", "num_rows", "forward", "backward", "trace_id")

    def __init__(self, h, send_index, route, wire_dtype):
        self.send_index, self.route = send_index, route
        self.wire_dtype, self.dtype, self.num_rows = wire_dtype, h.dtype, h.shape[0]
        self.forward = self.backward = None
        self.trace_id = trace.new_id()  # GRANNDIS_EXCHANGE_TRACE (cluster/trace.py); -1 when off

    def post(self, rows, direction):
        pending = self.route.start(rows) if direction == "fwd" else self.route.start_backward(rows)
        trace.mark("post_" + direction, self.trace_id)
        return pending

    def wait(self, pending, direction):
        trace.mark("wait_start_" + direction, self.trace_id)
        rows = _from_wire(pending.wait(), self.dtype)
        trace.mark("wait_end_" + direction, self.trace_id)
        return rows


class _Post(torch.autograd.Function):
    """Forward: post the own rows' exchange; returns an empty token that orders _Wait after it.
    Backward: wait for the halo gradients _Wait posted and add them to the rows that were sent."""

    @staticmethod
    def forward(ctx, h, state: _InFlight):
        ctx.state = state
        state.forward = state.post(_to_wire(h.index_select(0, state.send_index), state.wire_dtype), "fwd")
        return h.new_empty(0)

    @staticmethod
    def backward(ctx, _grad_token):
        state = ctx.state
        grad_send = state.wait(state.backward, "bwd")
        state.backward = None
        return scatter_add_rows(state.send_index, grad_send, state.num_rows), None


class _Wait(torch.autograd.Function):
    """Forward: wait for the halo rows, widened.  Backward: post their gradients back to the owners."""

    @staticmethod
    def forward(ctx, _token, state: _InFlight):
        ctx.state = state
        rows = state.wait(state.forward, "fwd")
        state.forward = None
        return rows

    @staticmethod
    def backward(ctx, grad_halo):
        state = ctx.state
        state.backward = state.post(_to_wire(grad_halo, state.wire_dtype), "bwd")
        return grad_halo.new_zeros(0), None


class PostedHalo:
    """An exchange posted from the rows it sends (halo_exchange_post); ``rows(h)`` pairs it with the
    layer's own rows h once they are complete."""

    __slots__ = ("_state", "_token", "n_halo")

    def __init__(self, state: _InFlight, token):
        self._state, self._token, self.n_halo = state, token, int(state.route.n_halo)

    def rows(self, h: torch.Tensor) -> PendingRows:
        state, token = self._state, self._token
        if token is not None:
            return PendingRows(h, lambda: _Wait.apply(token, state), self.n_halo)
        return PendingRows(h, lambda: state.wait(state.forward, "fwd"), self.n_halo)


def routed_post(rows: torch.Tensor, send_index: torch.Tensor, route,
                wire_dtype: Optional[torch.dtype] = None) -> PostedHalo:
    """Post the exchange of the rows `rows[send_index]` by `route` (DirectRoute or halo_route.ServerRoute).

    `rows` may be all of a layer's own rows or only those it sends (boundary-first pipelining: the
    model computes them first, posts, then computes the others); the backward adds the returned
    gradients to `rows`."""
    state = _InFlight(rows, send_index, route, wire_dtype)
    if rows.requires_grad:
        return PostedHalo(state, _Post.apply(rows, state))
    state.forward = state.post(_to_wire(rows.index_select(0, send_index), wire_dtype), "fwd")
    return PostedHalo(state, None)


def halo_exchange_post(rows: torch.Tensor, send_index: torch.Tensor, send_counts: Sequence[int],
                       recv_counts: Sequence[int], start_fn: StartFn,
                       wire_dtype: Optional[torch.dtype] = None) -> PostedHalo:
    """routed_post over the direct route: the rows go to the peers grouped by peer, `send_counts` each."""
    return routed_post(rows, send_index, DirectRoute(send_counts, recv_counts, start_fn=start_fn), wire_dtype)


def halo_exchange_start(h: torch.Tensor, send_index: torch.Tensor, send_counts: Sequence[int],
                        recv_counts: Sequence[int], start_fn: StartFn,
                        wire_dtype: Optional[torch.dtype] = None) -> PendingRows:
    """Post the exchange of `halo_exchange` and return PendingRows(own = h, halo in flight)."""
    return halo_exchange_post(h, send_index, send_counts, recv_counts, start_fn, wire_dtype).rows(h)

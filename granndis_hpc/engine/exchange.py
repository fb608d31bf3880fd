"""Autograd-aware halo exchange: the forward sends own rows to the peers that read them, the backward
returns the gradients of received rows to their owners, who add them to their own rows' gradients.

Every rank runs the same layers in the same order, forward and backward, so the collective calls
inside line up on all ranks (a rank with nothing to send still takes part with empty blocks)."""
from __future__ import annotations

from typing import Callable, Sequence

import torch

# exchange_fn(send_rows, send_counts, recv_counts) -> received rows; a Communicator method bound to
# the right peers (intra-server or world) and ledger phase.
ExchangeFn = Callable[[torch.Tensor, Sequence[int], Sequence[int]], torch.Tensor]


class _HaloExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, send_index, send_counts, recv_counts, exchange_fn):
        ctx.exchange_fn = exchange_fn
        ctx.send_counts, ctx.recv_counts = send_counts, recv_counts
        ctx.save_for_backward(send_index)
        ctx.num_rows = h.shape[0]
        return exchange_fn(h.index_select(0, send_index).contiguous(), send_counts, recv_counts)

    @staticmethod
    def backward(ctx, grad_recv):
        (send_index,) = ctx.saved_tensors
        # The reverse exchange: what we received, we send back; what we sent, we receive.
        grad_send = ctx.exchange_fn(grad_recv.contiguous(), ctx.recv_counts, ctx.send_counts)
        grad_h = grad_recv.new_zeros((ctx.num_rows,) + tuple(grad_recv.shape[1:]))
        grad_h.index_add_(0, send_index, grad_send)
        return grad_h, None, None, None, None


def halo_exchange(h: torch.Tensor, send_index: torch.Tensor, send_counts: Sequence[int],
                  recv_counts: Sequence[int], exchange_fn: ExchangeFn) -> torch.Tensor:
    """Rows of `h` at `send_index` go to the peers (grouped by peer, `send_counts` each); returns the
    rows received (grouped by source peer, `recv_counts` each).  Differentiable wrt `h`."""
    if h.requires_grad:
        return _HaloExchange.apply(h, send_index, list(send_counts), list(recv_counts), exchange_fn)
    return exchange_fn(h.index_select(0, send_index).contiguous(), list(send_counts), list(recv_counts))

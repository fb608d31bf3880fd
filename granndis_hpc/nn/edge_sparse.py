"""Attention-weighted sums over a fixed edge list as sparse products, for GATConv.attend.

``weighted_sum(w, x, edges)`` is, for every head h, sum_e w[e, h] x[cols[e], h] into row rows[e]: the
same value as gathering x[cols] and index-adding w x[cols], without the per-edge tensors [E, H, C]
(the gathered rows, the messages and their gradients), which on a graph of many edges per vertex are
both most of the attention's time and most of what it saves for the backward.  The forward is a CSR
product per head; the backward gives x's gradient by the transposed CSR product (its structure cached
with the edges) and w's by a per-head dot product at the edges.  Only the edge weights and x are
saved.
"""
from __future__ import annotations

import torch

from .cpu_kernels import csr_matmul
from .sparse import INT32_INDEX_LIMIT, _csr


class EdgeCSR:
    """Edges rows[e] <- cols[e] of a [n_dst, n_src] part, rows sorted (CSR order): the row pointer, and
    the order and row pointer of the same edges sorted by source (the transposed product's)."""

    def __init__(self, rows: torch.Tensor, cols: torch.Tensor, n_dst: int, n_src: int):
        if rows.numel() and bool((rows[1:] < rows[:-1]).any()):
            raise ValueError("EdgeCSR: the edges must be sorted by destination row (CSR order)")
        self.rows, self.cols, self.n_dst, self.n_src = rows, cols, int(n_dst), int(n_src)
        self.by_source = torch.argsort(cols, stable=True)
        # The products' indices, int32 where they fit (as nn/sparse.py's matrices: no copy per product).
        narrow = torch.int32 if max(self.n_dst, self.n_src, rows.numel()) <= INT32_INDEX_LIMIT else torch.int64
        self.indptr, self.cols_csr = _pointer(rows, self.n_dst).to(narrow), cols.to(narrow)
        self.indptr_t, self.rows_t = _pointer(cols, self.n_src).to(narrow), rows.index_select(0,
                                                                                              self.by_source).to(narrow)


# Edges per chunk of the attention weights' gradient: a transient of _CHUNK x H C values, a few MiB.
_CHUNK = 1 << 14


def _pointer(index: torch.Tensor, n: int) -> torch.Tensor:
    counts = torch.bincount(index, minlength=n)
    return torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])


def _product(indptr, index, values, shape, h):
    return csr_matmul(_csr(indptr, index, values, shape), h)


class _WeightedSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, x, edges: EdgeCSR):
        ctx.edges = edges
        ctx.save_for_backward(w, x)
        xs = x.to(w.dtype).permute(1, 0, 2).contiguous()  # [H, n_src, C]: each head's rows contiguous
        shape = (edges.n_dst, edges.n_src)
        return torch.stack([_product(edges.indptr, edges.cols_csr, w[:, h].contiguous(), shape, xs[h])
                            for h in range(w.shape[1])], 1)

    @staticmethod
    def backward(ctx, grad):
        w, x = ctx.saved_tensors
        e, heads = ctx.edges, w.shape[1]
        grad = grad.to(w.dtype)
        grad_w = grad_x = None
        if ctx.needs_input_grad[0]:
            # A gather, as torch.sparse.sampled_addmm's CPU kernel gave wrong values on some parts of a
            # distributed graph; all heads at once over a chunk of edges (a transient [chunk, H C], not
            # [E, H, C]), read from x and grad as they are (no per-head copies).
            width = heads * x.shape[2]  # not -1: a part may have no rows
            xf, gf = x.to(w.dtype).reshape(x.shape[0], width), grad.reshape(grad.shape[0], width)
            grad_w = w.new_empty(w.shape)
            for a in range(0, w.shape[0], _CHUNK):
                rows, cols = e.rows[a:a + _CHUNK], e.cols[a:a + _CHUNK]
                grad_w[a:a + _CHUNK] = (gf.index_select(0, rows).mul_(xf.index_select(0, cols))
                                        .view(-1, heads, x.shape[2]).sum(-1))
        if ctx.needs_input_grad[1]:
            w_t = w.index_select(0, e.by_source)
            grad_x = torch.stack([_product(e.indptr_t, e.rows_t, w_t[:, h].contiguous(), (e.n_src, e.n_dst),
                                           grad[:, h].contiguous()) for h in range(heads)], 1).to(x.dtype)
        return grad_w, grad_x, None


def weighted_sum(w: torch.Tensor, x: torch.Tensor, edges: EdgeCSR) -> torch.Tensor:
    """[n_dst, H, C]: per head the sum over each row's edges of w[e, h] x[cols[e], h] (w [E, H], x
    [n_src, H, C]), in w's dtype (float32 under --precision bf16: CPU sparse kernels have no bfloat16)."""
    with torch.autocast(x.device.type, enabled=False):
        return _WeightedSum.apply(w, x, edges)

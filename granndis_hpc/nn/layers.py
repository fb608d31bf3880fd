"""Graph convolutions over a ``LayerGraph``: GraphSAGE (mean) and GCN (Kipf, symmetric normalisation).

Both take the source rows ``h_src`` [n_src, in] and return destination rows [n_dst, out].  The
destination rows are the first n_dst source rows, so a vertex's own representation is h_src[:n_dst].

``h_src`` may also be ``PendingRows`` (the halo still in flight, see nn/graph.py): the convs then compute
everything the own rows allow before they wait for it.  With ``split`` (a RowSplit) they return
SplitRows: the rows the next exchange sends first, the others on demand (boundary-first pipelining).

Aggregation is linear, so W (A h) == A (W h): each conv aggregates at the narrower of its two widths
(project first when out < in, e.g. Cora's 1433 features -> 16 hidden), which cuts the sparse work.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from granndis_hpc.units import FLOAT32_BYTES as F32

from .graph import LayerGraph, PendingRows, RowSplit, SplitRows, aggregate


def _aggregate_at_narrower_width(graph: LayerGraph, h_src, lin: nn.Linear, kind: str, split=None):
    """lin(aggregate(h_src)) computed in whichever order moves fewer numbers through the sparse matmul.

    h_src may be PendingRows (halo in flight): lin runs on the own rows now and on the halo on arrival.
    At equal widths it then projects first too when the own source rows are no more than the destination
    rows (fb's world layers: they are the same rows): the sparse work is the same, and aggregating first
    would leave the projection of all n_dst rows after the wait (and, in the backward, its gradient
    before the halo rows' gradients can be sent back); projected first, only the halo rows' projection
    waits.  With more own source rows (a preload's expansion) projecting them would add work.
    split (a RowSplit): the result is SplitRows, its first rows computed first (nn/graph.aggregate_split)."""
    pending = isinstance(h_src, PendingRows)
    if lin.out_features < lin.in_features or (pending and lin.out_features == lin.in_features
                                              and h_src.own.shape[0] <= graph.n_dst):
        projected = h_src.map(lin) if isinstance(h_src, PendingRows) else lin(h_src)
        return aggregate(graph, projected, kind, split=split)
    return _rowwise(lin, aggregate(graph, h_src, kind, split=split))


def _rowwise(fn, out):
    """fn on a conv's output rows, a tensor or SplitRows (first rows now, the rest on demand)."""
    return out.map(fn) if isinstance(out, SplitRows) else fn(out)


def _own_rows(h_src, n_dst: int) -> torch.Tensor:
    """The destination rows' own representation: the first n_dst source rows (own rows of PendingRows)."""
    return (h_src.own if isinstance(h_src, PendingRows) else h_src)[:n_dst]


class SAGEConv(nn.Module):
    """out_v = W_self h_v + W_neigh (sum_{u in N(v)} h_u) / max(d_v, 1) + b   (GraphSAGE-mean)."""

    # For the memory model (nn/models.py ModelEstimate): the source rows get two gradients in the
    # backward (lin_self's slice and the aggregation); the aggregation adds no self-loop entries.
    source_grad_paths = 2
    self_loops = False

    @staticmethod
    def parameter_count(win: int, wout: int) -> int:
        return 2 * win * wout + wout

    @staticmethod
    def saved_bytes(n_src: int, n_dst: int, win: int, wout: int, input_grad: bool) -> tuple:
        """(bytes autograd saves, of which allocated before the step: the weights).  lin_self saves the
        source rows' storage (h_src[:n_dst] is a slice of it) and, when its input needs a gradient, its
        weight; lin_neigh saves h_src again (projected first, out < in: the same storage, counted once)
        or the [n_dst, win] aggregate."""
        weight = win * wout * F32 if input_grad else 0
        saved = n_src * win * F32 + weight + (weight if wout < win else n_dst * win * F32 + weight)
        return saved, 2 * weight

    @staticmethod
    def split_saved(n_dst: int, win: int, wout: int) -> int:
        """Boundary-first (split): lin_self reads the own rows by index_select, first and rest, and
        saves those [n_dst, win] copies instead of a slice of the source rows' storage."""
        return n_dst * win * F32

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.lin_self = nn.Linear(in_features, out_features, bias=bias)
        self.lin_neigh = nn.Linear(in_features, out_features, bias=False)

    def forward(self, h_src: torch.Tensor, graph: LayerGraph, split: Optional[RowSplit] = None):
        """split: return SplitRows (the rows split.first computed first, the rest on demand)."""
        own = _own_rows(h_src, graph.n_dst)
        if split is None:
            return self.lin_self(own) + _aggregate_at_narrower_width(graph, h_src, self.lin_neigh, "mean")
        first = self.lin_self(own.index_select(0, split.first))  # before the aggregation waits for the halo
        neigh = _aggregate_at_narrower_width(graph, h_src, self.lin_neigh, "mean", split)
        return SplitRows(split, first + neigh.first,
                         lambda: self.lin_self(own.index_select(0, split.rest)) + neigh.rest())

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}"


class GCNConv(nn.Module):
    """out_v = W (h_v/(d_v+1) + sum_{u in N(v)} h_u / sqrt((d_u+1)(d_v+1))) + b   (Kipf & Welling)."""

    source_grad_paths = 1  # one Linear: the source rows get one gradient
    self_loops = True  # the cached adjacency holds the n_dst self-loop entries

    @staticmethod
    def parameter_count(win: int, wout: int) -> int:
        return win * wout + wout

    @staticmethod
    def saved_bytes(n_src: int, n_dst: int, win: int, wout: int, input_grad: bool) -> tuple:
        """One Linear, before the aggregation (out < in: it saves the [n_src, win] source rows) or after
        it (the [n_dst, win] aggregate); its weight when its input needs a gradient."""
        weight = win * wout * F32 if input_grad else 0
        return (n_src * win * F32 if wout < win else n_dst * win * F32) + weight, weight

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.lin = nn.Linear(in_features, out_features, bias=False)
        # The bias is added after aggregation (as in Kipf's GCN), so it is a separate parameter.
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, h_src: torch.Tensor, graph: LayerGraph, split: Optional[RowSplit] = None):
        """split: return SplitRows (the rows split.first computed first, the rest on demand)."""
        out = _aggregate_at_narrower_width(graph, h_src, self.lin, "gcn", split)
        return out if self.bias is None else _rowwise(lambda t: t + self.bias, out)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"

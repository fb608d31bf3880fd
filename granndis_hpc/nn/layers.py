"""Graph convolutions over a ``LayerGraph``: GraphSAGE (mean) and GCN (Kipf, symmetric normalisation).

Both take the source rows ``h_src`` [n_src, in] and return destination rows [n_dst, out].  The
destination rows are the first n_dst source rows, so a vertex's own representation is h_src[:n_dst].

``h_src`` may also be ``PendingRows`` (the halo still in flight, see nn/graph.py): the convs then compute
everything the own rows allow before they wait for it.

Aggregation is linear, so W (A h) == A (W h): each conv aggregates at the narrower of its two widths
(project first when out < in, e.g. Cora's 1433 features -> 16 hidden), which cuts the sparse work.
"""
from __future__ import annotations

import torch
from torch import nn

from .graph import LayerGraph, PendingRows, aggregate


def _aggregate_at_narrower_width(graph: LayerGraph, h_src, lin: nn.Linear, kind: str) -> torch.Tensor:
    """lin(aggregate(h_src)) computed in whichever order moves fewer numbers through the sparse matmul.

    h_src may be PendingRows (halo in flight): lin runs on the own rows now and on the halo on arrival."""
    if lin.out_features < lin.in_features:
        projected = h_src.map(lin) if isinstance(h_src, PendingRows) else lin(h_src)
        return aggregate(graph, projected, kind)
    return lin(aggregate(graph, h_src, kind))


def _own_rows(h_src, n_dst: int) -> torch.Tensor:
    """The destination rows' own representation: the first n_dst source rows (own rows of PendingRows)."""
    return (h_src.own if isinstance(h_src, PendingRows) else h_src)[:n_dst]


class SAGEConv(nn.Module):
    """out_v = W_self h_v + W_neigh (sum_{u in N(v)} h_u) / max(d_v, 1) + b   (GraphSAGE-mean)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.lin_self = nn.Linear(in_features, out_features, bias=bias)
        self.lin_neigh = nn.Linear(in_features, out_features, bias=False)

    def forward(self, h_src: torch.Tensor, graph: LayerGraph) -> torch.Tensor:
        return self.lin_self(_own_rows(h_src, graph.n_dst)) + _aggregate_at_narrower_width(graph, h_src, self.lin_neigh, "mean")

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}"


class GCNConv(nn.Module):
    """out_v = W (h_v/(d_v+1) + sum_{u in N(v)} h_u / sqrt((d_u+1)(d_v+1))) + b   (Kipf & Welling)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.lin = nn.Linear(in_features, out_features, bias=False)
        # The bias is added after aggregation (as in Kipf's GCN), so it is a separate parameter.
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, h_src: torch.Tensor, graph: LayerGraph) -> torch.Tensor:
        out = _aggregate_at_narrower_width(graph, h_src, self.lin, "gcn")
        return out + self.bias if self.bias is not None else out

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"

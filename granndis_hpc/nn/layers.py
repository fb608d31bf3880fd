"""Graph convolutions over a ``LayerGraph``: GraphSAGE (mean) and GCN (Kipf, symmetric normalisation).

Both follow the layer contract (nn/contract.py): source rows [n_src, in] -> destination rows [n_dst, out],
the destination rows being the first n_dst source rows.  Their aggregation is one sparse product, so
any part of the edges (own or halo sources, a subset of destination rows) is a product of the same
cached matrix's part, and the parts sum to the whole.

Aggregation is linear, so W (A h) == A (W h): each conv aggregates at the narrower of its two widths
(project first when out < in, e.g. Cora's 1433 features -> 16 hidden), which cuts the sparse work.
"""
from __future__ import annotations

import torch
from torch import nn

from .contract import Layer, LayerCall
from .graph import GraphPart, aggregate


def project_first(lin: nn.Linear, call: LayerCall) -> bool:
    """Aggregate lin(h) rather than h: when lin narrows, and at equal widths when the sources are split
    (the halo in flight) and the own source rows are no more than the destination rows (fb's world
    layers: they are the same rows): the sparse work is the same, and aggregating first would leave the
    projection of all n_dst rows after the wait (and, in the backward, its gradient before the halo
    rows' gradients can be sent back); projected first, only the halo rows' projection waits.  With
    more own source rows (a preload's expansion) projecting them would add work."""
    if lin.out_features < lin.in_features:
        return True
    return (call.split_sources and lin.out_features == lin.in_features
            and call.n_own <= call.graph.n_dst)


class SAGEConv(Layer):
    """out_v = W_self h_v + W_neigh (sum_{u in N(v)} h_u) / max(d_v, 1) + b   (GraphSAGE-mean)."""

    splits_rows = True
    kind = "mean"

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.lin_self = nn.Linear(in_features, out_features, bias=bias)
        self.lin_neigh = nn.Linear(in_features, out_features, bias=False)

    def message(self, h: torch.Tensor, call: LayerCall):
        return self.lin_neigh(h) if project_first(self.lin_neigh, call) else h

    def aggregate_part(self, part: GraphPart, m, call: LayerCall):
        return aggregate(part, m, self.kind)

    def update(self, h_dst, aggregated, call: LayerCall):
        neigh = aggregated if project_first(self.lin_neigh, call) else self.lin_neigh(aggregated)
        return self.lin_self(h_dst) + neigh

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}"


class GCNConv(Layer):
    """out_v = W (h_v/(d_v+1) + sum_{u in N(v)} h_u / sqrt((d_u+1)(d_v+1))) + b   (Kipf & Welling)."""

    splits_rows = True
    reads_dst = False  # the own row is the aggregation's self-loop: update reads only the aggregate

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.lin = nn.Linear(in_features, out_features, bias=False)
        # The bias is added after aggregation (as in Kipf's GCN), so it is a separate parameter.
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def message(self, h: torch.Tensor, call: LayerCall):
        return self.lin(h) if project_first(self.lin, call) else h

    def aggregate_part(self, part: GraphPart, m, call: LayerCall):
        return aggregate(part, m, "gcn")

    def update(self, h_dst, aggregated, call: LayerCall):
        out = aggregated if project_first(self.lin, call) else self.lin(aggregated)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"

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


def undrawn_linear(in_features: int, out_features: int, bias: bool = True) -> nn.Linear:
    """An nn.Linear whose parameters are allocated (on the default device) but not drawn: the layer's
    reset_parameters draws them, so that construction and reset_parameters consume torch's generator
    alike and a given seed gives the same parameters both ways."""
    return nn.Linear(in_features, out_features, bias=bias, device="meta").to_empty(device=torch.empty(0).device)


def project_first(lin: nn.Linear, call: LayerCall) -> bool:
    """Aggregate lin(h) rather than h: when lin narrows, and at equal widths when the sources are split
    (the halo in flight) and the own source rows are no more than the destination rows (fb's world
    layers: they are the same rows): the sparse work is the same, and aggregating first would leave the
    projection of all n_dst rows after the wait (and, in the backward, its gradient before the halo
    rows' gradients can be sent back); projected first, only the halo rows' projection waits.  With
    more own source rows (a preload's expansion) projecting them would add work."""
    if lin.out_features < lin.in_features:
        return True
    return (call.n_own is not None and lin.out_features == lin.in_features  # the sources split
            and call.n_own <= call.graph.n_dst)


class SAGEConv(Layer):
    r"""GraphSAGE with mean aggregation (Hamilton et al. 2017), as PyG's ``SAGEConv(aggr="mean")``:

        out_v = W_self h_v + b + W_neigh (sum_{u in N(v)} h_u) / max(d_v, 1)

    N(v): v's in-neighbours, d_v their number; a row without any aggregates 0.  W_neigh is applied
    before the mean where that is narrower (project_first).

    Args:
        in_features: input width.
        out_features: output width.
        bias: learn the additive bias b (it is ``lin_self.bias``).

    PyG's ``root_weight`` and ``normalize`` are not offered: the parameter names (``lin_self``,
    ``lin_neigh``; tests/dense_reference.py and nn/pyg.py read them) and the sizes the memory model
    declares for this layer (memory_model/stacks.py SAGE_BYTES) are those of the layer above.

    Parameters: lin_self.(weight [out, in], bias [out]), lin_neigh.weight [out, in] (PyG's lin_r and
    lin_l), drawn by nn.Linear's initialisation in that order.

    Shapes: source rows [n_src, in] (destination rows their first n_dst) -> [n_dst, out].
    """

    splits_rows = True
    kind = "mean"
    weighted_sum = "mean"

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.lin_self = undrawn_linear(in_features, out_features, bias=bias)
        self.lin_neigh = undrawn_linear(in_features, out_features, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Redraw the parameters as the constructor draws them (nn.Linear's initialisation)."""
        self.lin_self.reset_parameters()
        self.lin_neigh.reset_parameters()

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
    r"""Graph convolution (Kipf & Welling 2017), as PyG's ``GCNConv`` (self loops, symmetric normalisation):

        out_v = W (h_v / d'_v + sum_{u in N(v), u != v} h_u / sqrt(d'_u d'_v)) + b

    d' = a vertex's degree (LayerGraph dst_degree, src_degree) less its stored self loops, + 1: one loop
    of weight 1 per vertex, as PyG's add_remaining_self_loops.  W is applied before the sum where that
    is narrower (project_first); the bias after it.

    Args:
        in_features: input width.
        out_features: output width.
        bias: learn the additive bias b.

    PyG's ``improved``, ``cached``, ``add_self_loops`` and ``normalize`` are not offered: the
    normalisation is the aggregation kind "gcn" of nn/graph.py, which the engine's exactness tests and
    the memory model (memory_model/stacks.py GCN_BYTES) cover as it is.

    Parameters: lin.weight [out, in] (nn.Linear's initialisation), bias [out] (zeros).

    Shapes: source rows [n_src, in] (destination rows their first n_dst) -> [n_dst, out].
    """

    splits_rows = True
    weighted_sum = "gcn"
    reads_dst = False  # the own row is the aggregation's self-loop: update reads only the aggregate

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.lin = undrawn_linear(in_features, out_features, bias=False)
        # The bias is added after aggregation (as in Kipf's GCN), so it is a separate parameter.
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Redraw the parameters as the constructor draws them: nn.Linear's for lin, zeros for the bias."""
        self.lin.reset_parameters()
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def message(self, h: torch.Tensor, call: LayerCall):
        return self.lin(h) if project_first(self.lin, call) else h

    def aggregate_part(self, part: GraphPart, m, call: LayerCall):
        return aggregate(part, m, "gcn")

    def update(self, h_dst, aggregated, call: LayerCall):
        out = aggregated if project_first(self.lin, call) else self.lin(aggregated)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"

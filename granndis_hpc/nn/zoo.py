"""The models over nn/edge_layers.py: GAT, GIN, SAGE-sum and SAGE-max (registered in granndis_hpc/registry.py).

Same engine contract as nn/models.py (``forward(x, graphs, gather, dropout)``, dropout before gather,
input dropout on layer 0's gathered source rows, PendingRows accepted for the overlap):

    h = input_dropout(x);  for l: h = conv_l(gather(l, h));  between convs: [LayerNorm] -> act -> dropout

act is ELU for GAT (as published), ReLU for the others.  GAT's hidden convs have `heads` heads of
--hidden features each, concatenated (``concat=false``: averaged, width --hidden); its last conv has
`out_heads` heads averaged into the classes.  Attention dropout (`attn_dropout`) is keyed by the edge's
(destination, source) global ids (nn/edge_layers.py EdgeDropout), so it is the same on every shape.

Parameter names (tests/dense_reference.py reads them):
  gat:               convs.{l}.(lin.weight, att_src, att_dst, bias)
  gin:               convs.{l}.(eps, lin1.weight, lin1.bias, lin2.weight, lin2.bias)
  sage-sum/sage-max: convs.{l}.(lin_self.weight, lin_self.bias, lin_neigh.weight)
  norms.{l}.(weight, bias) for l < L-1 when norm=True
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .dropout import RowDropout
from .edge_layers import EdgeDropout, GATConv, GINConv, SAGEMaxConv, SAGESumConv
from .graph import LayerGraph
from .models import GNN, Gather


class EdgeGNN(GNN):
    """L convs of one kind (nn/edge_layers.py) with [LayerNorm] -> act -> dropout between them."""

    input_dropout_rows = "sources"
    accepts_pending_rows = True

    def __init__(self, name: str, convs: List[nn.Module], widths: List[int], dropout: float, norm: bool,
                 activation=F.relu, attn_dropout: float = 0.0):
        super().__init__()
        self.name, self.num_layers, self.dropout = name, len(convs), dropout
        self.attn_dropout, self.activation, self.use_norm = float(attn_dropout), activation, norm
        self.conv_in_widths = widths[:-1]
        self.convs = nn.ModuleList(convs)
        self.norms = nn.ModuleList(nn.LayerNorm(w) for w in widths[1:-1]) if norm else None

    @property
    def edge_keyed_dropout(self) -> bool:
        """Attention dropout keys edges by their source rows' global ids: the engine gives its training
        graphs those ids (``graph.source_ids``, engine/views.py attach_source_ids)."""
        return self.attn_dropout > 0

    def _dropout_for_pass(self, dropout: Optional[RowDropout]) -> Optional[RowDropout]:
        if self.training and self.attn_dropout > 0 and self.dropout == 0.0 and self.input_dropout == 0.0:
            return RowDropout(int(torch.randint(0, 2 ** 62, ())), 0) if dropout is None else dropout
        return super()._dropout_for_pass(dropout)

    def forward(self, x: torch.Tensor, graphs: Sequence[LayerGraph], gather: Optional[Gather] = None,
                dropout: Optional[RowDropout] = None) -> torch.Tensor:
        self._check_graphs(graphs)
        dropout = self._dropout_for_pass(dropout)
        h = x
        for layer, (conv, graph) in enumerate(zip(self.convs, graphs)):
            if layer > 0:
                if self.norms is not None:
                    h = self.norms[layer - 1](h)
                h = self._drop(dropout, layer, self.activation(h))
            h = self._gather(gather, layer, h, graph)
            if layer == 0:
                h = self._drop_input(dropout, h)
            attention = EdgeDropout(dropout, layer, self.attn_dropout, graph) \
                if dropout is not None and self.attn_dropout > 0 else None
            h = conv(h, graph, attention)
        return h


def _widths(in_features, hidden, num_classes, layers):
    return [in_features] + [hidden] * (layers - 1) + [num_classes]


def gat_widths(in_features, hidden, num_classes, layers, heads, concat) -> List[int]:
    """Input width of every conv, then the output width."""
    return [in_features] + [hidden * heads if concat else hidden] * (layers - 1) + [num_classes]


def _check_positive(model: str, **values):
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"--model-option {name}={value}: model {model!r} needs {name} >= 1")


def build_gat(in_features, hidden, num_classes, layers, dropout, norm, heads=8, out_heads=1, concat=True,
              attn_dropout=0.0, negative_slope=0.2):
    _check_positive("gat", heads=heads, out_heads=out_heads)
    if not 0.0 <= attn_dropout < 1.0:
        raise ValueError(f"--model-option attn_dropout={attn_dropout}: must be in [0, 1)")
    widths = gat_widths(in_features, hidden, num_classes, layers, heads, concat)
    convs = [GATConv(widths[l], hidden, heads, concat, negative_slope, attn_dropout) for l in range(layers - 1)]
    convs.append(GATConv(widths[-2], num_classes, out_heads, False, negative_slope, attn_dropout))
    return EdgeGNN("gat", convs, widths, dropout, norm, F.elu, attn_dropout)


def build_gin(in_features, hidden, num_classes, layers, dropout, norm, eps=0.0):
    widths = _widths(in_features, hidden, num_classes, layers)
    return EdgeGNN("gin", [GINConv(widths[l], widths[l + 1], eps) for l in range(layers)], widths, dropout, norm)


def build_sage_sum(in_features, hidden, num_classes, layers, dropout, norm):
    widths = _widths(in_features, hidden, num_classes, layers)
    return EdgeGNN("sage-sum", [SAGESumConv(widths[l], widths[l + 1]) for l in range(layers)], widths, dropout, norm)


def build_sage_max(in_features, hidden, num_classes, layers, dropout, norm):
    widths = _widths(in_features, hidden, num_classes, layers)
    return EdgeGNN("sage-max", [SAGEMaxConv(widths[l], widths[l + 1]) for l in range(layers)], widths, dropout, norm)

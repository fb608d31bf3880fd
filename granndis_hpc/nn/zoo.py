"""The models over nn/edge_layers.py: GAT, GIN, SAGE-sum and SAGE-max (registered in granndis_hpc/registry.py).

Stacks of nn/models.py's kind, run by the layer runner (nn/runner.py): dropout before gather,
input dropout on layer 0's gathered source rows, the halo overlapped with the own-source parts:

    h = input_dropout(x);  for l: h = conv_l(gather(l, h));  between convs: [LayerNorm] -> act -> dropout
    then the per-vertex Linear layers (--linear-layers), after the same [LayerNorm] -> act -> dropout

act is ELU for GAT (as published), ReLU for the others.  GAT's hidden convs have `heads` heads of
--hidden features each, concatenated (``concat=false``: averaged, width --hidden); its last conv has
`out_heads` heads averaged into the classes.  Attention dropout (`attn_dropout`) is keyed by the edge's
(destination, source) global ids (nn/edge_layers.py EdgeDropout), so it is the same on every shape.

Parameter names (tests/dense_reference.py reads them):
  gat:               convs.{l}.(lin.weight, att_src, att_dst, bias)
  gin:               convs.{l}.(eps, lin1.weight, lin1.bias, lin2.weight, lin2.bias)
  sage-sum/sage-max: convs.{l}.(lin_self.weight, lin_self.bias, lin_neigh.weight)
  norms.{l}.(weight, bias) for l < L-1 when norm=True, linears.{j}.(weight, bias)
"""
from __future__ import annotations

import dataclasses
from typing import List

import torch.nn.functional as F
from torch import nn

from .contract import ModelContract
from .edge_layers import GATConv, GINConv, SAGEMaxConv, SAGESumConv
from .models import GNN, _conv_count


class EdgeGNN(GNN):
    """Convs (nn/contract.py layers) with [LayerNorm] -> act -> dropout between them, then the per-vertex
    Linear layers.  widths: the input width of every layer (convs, then linears) and the output width."""

    contract = ModelContract(input_dropout_rows="sources")

    def __init__(self, name: str, convs: List[nn.Module], widths: List[int], dropout: float, norm: bool,
                 activation=F.relu, attn_dropout: float = 0.0):
        super().__init__()
        self.name, self.num_layers, self.dropout = name, len(convs), dropout
        self.attn_dropout, self.activation, self.use_norm = float(attn_dropout), activation, norm
        self.conv_in_widths = widths[: len(convs)]
        self.convs = nn.ModuleList(convs)
        self.widths = list(widths)
        self.norms = nn.ModuleList(nn.LayerNorm(w) for w in widths[1:-1]) if norm else None
        # Created last: without linear layers the parameters are drawn exactly as before they existed.
        self.linears = nn.ModuleList(nn.Linear(widths[i], widths[i + 1]) for i in range(len(convs), len(widths) - 1))
        if self.attn_dropout > 0 and self.contract.source_ids == "none":
            # Attention dropout keys edges by their source rows' global ids: the engine gives the training
            # graphs those ids (``graph.source_ids``, engine/views.py attach_source_ids).
            self.contract = dataclasses.replace(self.contract, source_ids="training")


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
              attn_dropout=0.0, negative_slope=0.2, linear_layers=0):
    """The last conv averages `out_heads` heads into the classes; with linear layers (the last N layers
    per-vertex Linear) every conv is a hidden one and the last Linear gives the classes."""
    _check_positive("gat", heads=heads, out_heads=out_heads)
    if not 0.0 <= attn_dropout < 1.0:
        raise ValueError(f"--model-option attn_dropout={attn_dropout}: must be in [0, 1)")
    convs_n = _conv_count(layers, linear_layers)
    widths = gat_widths(in_features, hidden, num_classes, layers, heads, concat)
    hidden_convs = convs_n - 1 if convs_n == layers else convs_n
    convs = [GATConv(widths[l], hidden, heads, concat, negative_slope, attn_dropout) for l in range(hidden_convs)]
    if convs_n == layers:
        convs.append(GATConv(widths[-2], num_classes, out_heads, False, negative_slope, attn_dropout))
    return EdgeGNN("gat", convs, widths, dropout, norm, F.elu, attn_dropout)


def _stack(name, conv, in_features, hidden, num_classes, layers, dropout, norm, linear_layers, **kw):
    widths = _widths(in_features, hidden, num_classes, layers)
    convs = [conv(widths[l], widths[l + 1], **kw) for l in range(_conv_count(layers, linear_layers))]
    return EdgeGNN(name, convs, widths, dropout, norm)


def build_gin(in_features, hidden, num_classes, layers, dropout, norm, eps=0.0, linear_layers=0):
    return _stack("gin", GINConv, in_features, hidden, num_classes, layers, dropout, norm, linear_layers, eps=eps)


def build_sage_sum(in_features, hidden, num_classes, layers, dropout, norm, linear_layers=0):
    return _stack("sage-sum", SAGESumConv, in_features, hidden, num_classes, layers, dropout, norm, linear_layers)


def build_sage_max(in_features, hidden, num_classes, layers, dropout, norm, linear_layers=0):
    return _stack("sage-max", SAGEMaxConv, in_features, hidden, num_classes, layers, dropout, norm, linear_layers)

"""The relational models over nn/hetero_layers.py: R-GCN and R-GAT (registered in granndis_hpc/registry.py
with ``typed=True``: their builders take the graph's ``types``, a GraphTypes).

Stacks of nn/zoo.py's EdgeGNN kind, run by the layer runner (nn/runner.py), every conv split into
own and halo parts so the halo exchange overlaps:

    h = input_dropout(x);  for l: h = conv_l(gather(l, h));  between convs: [LayerNorm] -> act -> dropout
    then the per-vertex Linear layers (--linear-layers), after the same [LayerNorm] -> act -> dropout

rgcn: RGCNConv (mean per relation, a root weight, optional bases: option ``num_bases``, 0 = none), act
ReLU, as PyG's R-GCN example.  rgat: RGATConv (a GATConv per relation without self loops, summed into
each destination type), act LeakyReLU (slope 0.01), as MLPerf's R-GAT reference; its hidden convs have
``heads`` heads of --hidden features each, concatenated, and its last conv ``out_heads`` heads averaged
into the classes.  MLPerf's reference (hidden 512, 4 heads of 128, then a Linear classifier) is
``--hidden 128 --model-option heads=4 --linear-layers 1``.  Attention dropout (``attn_dropout``) is keyed
by the edge's global ids, as gat's.

Both read each edge's relation from the global ids of their rows, so their contract declares
``source_ids="all"``: the engine attaches ``graph.source_ids`` to every layer graph it hands them.

Parameter names (tests/hetero_reference.py reads them):
  rgcn: convs.{l}.(weight [R or B, in, out], comp [R, B] with bases, root [in, out], bias [out])
  rgat: convs.{l}.rel.{r}.(lin.weight, att_src, att_dst, bias)
  norms.{l}.(weight, bias) for l < L-1 when norm=True, linears.{j}.(weight, bias),
  embeddings.{type} [count, in_features] for each type of option ``embed``,
  inputs.{type}.(weight [project, type width], bias [project]) with the input projection (option ``project``)

The input projection: where the vertex types' feature widths differ (graph/hetero.py ``widths``; the
rows arrive as a TypedRows, graph/typed_features.py: one block per type at its own width), each type gets
a Linear from its own width to a common one (option ``project``, default --hidden), applied to its
block before layer 0, as GraphStorm's input encoders (rows given as one matrix, zero-padded to the
widest, are read at each row's own columns); option ``project`` > 0 adds it where the widths are one
too.  Layer 0's rows are then the projected ones, so the model's contract declares ``input_projection``:
its layer-0 halo rows are exchanged every step (they change with the Linears), not taken from the
features exchanged once at set-up.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from granndis_hpc.graph.hetero import GraphTypes
from granndis_hpc.graph.typed_features import TypedRows

from .contract import ModelContract
from .hetero_layers import RGATConv, RGCNConv, TypeTables, source_ids
from .models import _conv_count, reset_modules
from .zoo import EdgeGNN, _check_positive, _widths, gat_widths


class HeteroGNN(EdgeGNN):
    """EdgeGNN over relational convs; ``types`` is the graph's GraphTypes.

    ``embed``: vertex types whose input rows are learnable, one row per vertex (``embeddings.<type>``
    [count, in_features], N(0, 1) as torch's nn.Embedding), in place of their stored or derived features.
    The rows are looked up for the own rows of layer 0 by their global ids, before the exchange, so a
    halo row is its owner's row (exchanged every step, as any layer's rows: exact in fb and flx) and a
    preloaded row is looked up where it is held; the tables are parameters like the others (replicated,
    their gradients all-reduced)."""

    # forward below hands the stack to the runner as GNN.forward does (keyed, PendingRows accepted).
    contract = ModelContract(input_dropout_rows="sources", source_ids="all")

    def __init__(self, name: str, convs: List[nn.Module], widths: List[int], dropout: float, norm: bool,
                 types: GraphTypes, activation=F.relu, attn_dropout: float = 0.0, embed: str = "",
                 input_widths: Optional[Sequence[int]] = None):
        super().__init__(name, convs, widths, dropout, norm, activation, attn_dropout)
        self.types, self.tables = types, TypeTables(types)
        # The per-type input projection (module docstring), drawn after the stack: without it the
        # parameters are drawn exactly as before it existed.
        self.inputs = nn.ModuleDict({t: nn.Linear(int(w), widths[0])
                                     for t, w in zip(types.names, input_widths or ())})
        if len(self.inputs):
            self.contract = dataclasses.replace(self.contract, input_projection=True, first_layer_prefix="inputs.")
        embedded = [t.strip() for t in str(embed).split(",") if t.strip()]
        for t in embedded:
            if t not in types.names:
                raise ValueError(f"--model-option embed={embed}: {t!r} is not a vertex type of the graph "
                                 f"({', '.join(types.names)})")
        # Created last: without embeddings the parameters are drawn exactly as before they existed.
        self.embeddings = nn.ParameterDict({t: nn.Parameter(torch.randn(types.count(t), widths[0]))
                                            for t in embedded})

    def forward(self, x, graphs, gather=None, dropout=None, settings=None):
        if isinstance(x, TypedRows) and not len(self.inputs):
            raise ValueError(f"{self.name}: the input rows are held at their types' own widths, but the model "
                             f"has no input projection to read them (--model-option project)")
        if len(self.inputs):
            x = self.projected(x, graphs[0])
        if len(self.embeddings):
            x = self.embedded(x, graphs[0])
        return super().forward(x, graphs, gather, dropout, settings)

    def projected(self, x, graph) -> torch.Tensor:
        """Layer 0's own rows through their type's input Linear, each from its type's own columns: x is a
        TypedRows (graph/typed_features.py: one block per type at its own width, where the types' widths
        differ) or a matrix [rows, F] (a set of one width, or rows zero-padded to the widest)."""
        # The parameters' dtype (float32; a bf16 run's autocast output is widened back, as the runner rounds)
        dtype = next(iter(self.inputs.values())).weight.dtype
        if isinstance(x, TypedRows):
            if len(x.blocks) != len(self.inputs):
                raise ValueError(f"{self.name}: the input rows hold {len(x.blocks)} vertex types, the model "
                                 f"projects {len(self.inputs)}")
            out = x.blocks[0].new_zeros((len(x), self.widths[0]), dtype=dtype)
            for t, linear in enumerate(self.inputs.values()):
                # Block t holds type t's rows in row order: the rows where row_type is t, ascending.
                rows = torch.nonzero(x.row_type == t).squeeze(1)
                out = out.index_put((rows,), linear(x.blocks[t]).to(dtype))
            return out
        ids = source_ids(graph)[: x.shape[0]]
        kind = self.tables.vertex_type(ids)
        out = x.new_zeros((x.shape[0], self.widths[0]), dtype=dtype)
        for t, linear in enumerate(self.inputs.values()):
            rows = torch.nonzero(kind == t).squeeze(1)
            out = out.index_put((rows,), linear(x.index_select(0, rows)[:, : linear.in_features]).to(out.dtype))
        return out

    def embedded(self, x: torch.Tensor, graph) -> torch.Tensor:
        """Layer 0's own rows with the embedded types' rows replaced by their embeddings."""
        ids = source_ids(graph)[: x.shape[0]]
        kind = self.tables.vertex_type(ids)
        for name, table in self.embeddings.items():
            rows = torch.nonzero(kind == self.types.index(name)).squeeze(1)
            lo, _ = self.types.id_range(name)
            x = x.index_put((rows,), table.index_select(0, ids.index_select(0, rows) - lo).to(x.dtype))
        return x

    def reset_parameters(self) -> None:
        """GNN.reset_parameters, the embedding tables (option embed) redrawn from N(0, 1) last, as built."""
        reset_modules(self, {nn.ParameterDict: _reset_tables})


def _reset_tables(tables: nn.ParameterDict) -> None:
    for table in tables.values():
        nn.init.normal_(table)


def input_widths(model: str, in_features: int, hidden: int, project: int,
                 types: GraphTypes) -> Tuple[int, Optional[List[int]]]:
    """(layer 0's input width, each type's feature width the projection reads; None: no projection)."""
    if project < 0:
        raise ValueError(f"model {model!r}: --model-option project={project} must be >= 0 (0: --hidden where the "
                         f"types' widths differ)")
    if not project and not types.typed_widths:
        return in_features, None
    return int(project or hidden), types.width_of(in_features)


def projects_input(name: str, options: dict, types: Optional[GraphTypes]) -> bool:
    """Whether model `name` with these constructor options projects its input on a set of these types (a
    model that takes option ``project``: where it is > 0 or the types' widths differ), as its contract
    will say (``input_projection``): what the engine plans its views by before it builds the model."""
    from granndis_hpc import registry

    if types is None or name not in registry.MODELS or "project" not in registry.model_options(name):
        return False
    return bool(int(options.get("project", 0) or 0)) or types.typed_widths


def _check_types(model: str, types) -> TypeTables:
    if not isinstance(types, GraphTypes):
        raise ValueError(f"model {model!r} needs the graph's types (a GraphTypes), got {type(types).__name__}")
    return TypeTables(types)


def build_rgcn(in_features, hidden, num_classes, layers, dropout, norm, num_bases=0, linear_layers=0, embed="",
               project=0, *, types: GraphTypes):
    if num_bases < 0:
        raise ValueError(f"--model-option num_bases={num_bases}: must be >= 0 (0: a weight per relation)")
    tables = _check_types("rgcn", types)
    in_features, read = input_widths("rgcn", in_features, hidden, project, types)
    widths = _widths(in_features, hidden, num_classes, layers)
    R = tables.num_relations
    convs = [RGCNConv(widths[l], widths[l + 1], R, num_bases or None, types=tables)
             for l in range(_conv_count(layers, linear_layers))]
    return HeteroGNN("rgcn", convs, widths, dropout, norm, types, embed=embed, input_widths=read)


def build_rgat(in_features, hidden, num_classes, layers, dropout, norm, heads=4, out_heads=1, attn_dropout=0.0,
               linear_layers=0, embed="", project=0, *, types: GraphTypes):
    """The last conv averages `out_heads` heads into the classes; with linear layers every conv is a
    hidden one and the last Linear gives the classes (as MLPerf's reference)."""
    _check_positive("rgat", heads=heads, out_heads=out_heads)
    if not 0.0 <= attn_dropout < 1.0:
        raise ValueError(f"--model-option attn_dropout={attn_dropout}: must be in [0, 1)")
    tables = _check_types("rgat", types)
    in_features, read = input_widths("rgat", in_features, hidden, project, types)
    R = tables.num_relations
    convs_n = _conv_count(layers, linear_layers)
    widths = gat_widths(in_features, hidden, num_classes, layers, heads, True)
    hidden_convs = convs_n - 1 if convs_n == layers else convs_n
    conv = functools.partial(RGATConv, num_relations=R, attn_dropout=attn_dropout, types=tables)
    convs = [conv(widths[l], hidden, heads=heads, concat=True) for l in range(hidden_convs)]
    if convs_n == layers:
        convs.append(conv(widths[-2], num_classes, heads=out_heads, concat=False))
    return HeteroGNN("rgat", convs, widths, dropout, norm, types, functools.partial(F.leaky_relu, negative_slope=0.01),
                     attn_dropout, embed=embed, input_widths=read)

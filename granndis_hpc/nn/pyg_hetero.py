"""The `pyg-hetero` model: a user's PyG convolutions made heterogeneous, as PyG's
``to_hetero(model, metadata, aggr="sum")`` or ``HeteroConv({relation: conv}, aggr="sum")`` make them.

``--model pyg-hetero --model-option module=MODULE --model-option factory=NAME`` calls the factory exactly
as ``--model pyg`` does (nn/pyg.py: ``MODULE.NAME(in_features, hidden, out_features, layers)`` returns one
convolution per message-passing layer) and, on a heterogeneous shard set (graph/hetero.py), gives every
relation its own copy of each layer's conv: a deep copy, then ``reset_parameters()``, layer by layer and
within a layer in the order of the set's relations, so each relation's weights are drawn independently
and, under ``torch.manual_seed``, deterministically (as to_hetero does).  A layer's output at a vertex
of type t is the sum over the relations into t of that relation's conv, its bias included:

    out_v = sum_{r: dst(r) = type(v)} conv_r((x_src, x_dst), edges of r into v)

A vertex type that no relation leads into gets 0 (no bias): PyG's HeteroConv leaves such a type out of
its output, so a following layer there has no rows for it; here its rows are zeros.  Between layers the
stack is pyg's: [LayerNorm (--norm)] -> ReLU -> dropout (--dropout), then --linear-layers Linear layers.

Each relation's conv sees the layer's block through ``relation_graphs`` (nn/hetero_layers.py), called on
the whole block as a PyGLayer (nn/pyg.py; the runner waits for the halo first).  A conv that takes a
(source rows, destination rows) pair gets the source rows and only its destination type's rows, with
the relation's edges re-indexed to them, as HeteroConv hands it ``(x_dict[src], x_dict[dst])``.  A conv
that adds self loops runs on all destination rows instead (row i is source row i: a loop joins a vertex
to itself), and a conv that takes one set of rows gets the source rows; their destination type's rows
are kept.  Refused, with the reason: what pyg refuses (nn/pyg.py ``refusal``), GCNConv (no two-type form,
and its normalisation needs each relation's degrees of the halo rows), and on a relation between two
types a conv that takes no pair or adds self loops (in PyG's HeteroConv the first fails, the second
joins unrelated vertices).

Parameter names: convs.{l}.rel.{r}.conv.* (the PyG conv's own names; r indexes the set's relations),
norms.{l}.(weight, bias) with --norm, linears.{j}.(weight, bias).
"""
from __future__ import annotations

import copy
import weakref
from typing import List, Optional

import torch
from torch import nn

from granndis_hpc.graph.hetero import GraphTypes, Relation

from .contract import Layer
from .graph import LayerGraph
from .hetero_layers import TypeTables, relation_graphs
from .hetero_models import HeteroGNN, _check_types, input_widths
from .pyg import PyGLayer, refusal, stack_widths, user_convs

NAME = "pyg-hetero"


def hetero_refusal(conv: nn.Module, relation: Relation) -> Optional[str]:
    """Why `conv` cannot serve `relation` of a heterogeneous graph exactly (None: it can)."""
    name = type(conv).__name__
    problem = refusal(conv)
    if problem:
        return problem
    if name == "GCNConv":
        return ("GCNConv has no form for two vertex types, and its normalisation needs each relation's degrees "
                "of the halo rows, which a rank does not hold; use GraphConv, SAGEConv or "
                "GATConv(add_self_loops=False)")
    if relation.src == relation.dst:
        return None
    if not PyGLayer(conv).pair:
        return (f"{name} takes one set of rows, not a (source, destination) pair, so it cannot serve relation "
                f"{relation} between two types (nor can it in PyG's HeteroConv); use a conv that takes pairs "
                f"(SAGEConv, GraphConv, GATConv(add_self_loops=False))")
    if getattr(conv, "add_self_loops", False):
        return (f"{name}(add_self_loops=True) would join vertices of two types over relation {relation}; give "
                f"add_self_loops=False, as PyG's heterogeneous examples do")
    return None


def relation_copy(conv: nn.Module) -> nn.Module:
    """A relation's own conv: a deep copy with freshly drawn parameters (to_hetero's copy)."""
    mine = copy.deepcopy(conv)
    if hasattr(mine, "reset_parameters"):
        mine.reset_parameters()
    return mine


# Per relation graph: its destination type's rows and its edges re-indexed to them, built once (the engine
# reuses a layer's graph every epoch, and relation_graphs caches them with it).  Weak keys.
_TYPE_ROWS: "weakref.WeakKeyDictionary[LayerGraph, tuple]" = weakref.WeakKeyDictionary()


def type_rows(rel_graph: LayerGraph, dst_type: torch.Tensor, t: int):
    """(rows [k]: the destination rows of type t, edge_index [2, E_r] with destinations as positions in
    rows) of a relation graph into type t."""
    if rel_graph not in _TYPE_ROWS:
        rows = torch.nonzero(dst_type == t).squeeze(1)
        position = torch.full((rel_graph.n_dst,), -1, dtype=torch.int64, device=rows.device)
        position[rows] = torch.arange(rows.numel(), device=rows.device)
        _TYPE_ROWS[rel_graph] = (rows, torch.stack([rel_graph.indices, position[rel_graph.edge_rows()]]))
    return _TYPE_ROWS[rel_graph]


class PyGHeteroLayer(Layer):
    """One layer of a user's conv over every relation, summed into each destination type (not split:
    called on the whole block, nn/contract.py)."""

    splits_sources = False
    splits_rows = False

    def __init__(self, conv: nn.Module, types):
        super().__init__()
        self.tables = types if isinstance(types, TypeTables) else TypeTables(types)
        relations = self.tables.types.relations
        for relation in relations:
            problem = hetero_refusal(conv, relation)
            if problem:
                raise ValueError(f"--model {NAME}: {problem}")
        self.rel = nn.ModuleList(PyGLayer(relation_copy(conv), NAME) for _ in relations)
        self.dst_types = [self.tables.types.index(relation.dst) for relation in relations]
        # Convs that add self loops see all destination rows, where row i is source row i.
        self.restricted = [layer.pair and not getattr(layer.conv, "add_self_loops", False) for layer in self.rel]

    def forward(self, h_src: torch.Tensor, graph: LayerGraph, attention=None) -> torch.Tensor:
        per_relation = relation_graphs(graph, self.tables)
        out = None
        for layer, rel_graph, t, restricted in zip(self.rel, per_relation.graphs, self.dst_types, self.restricted):
            rows, index = type_rows(rel_graph, per_relation.dst_type, t)
            if restricted:
                y = layer.conv((h_src, h_src[rows]), index)
            else:
                y = layer(h_src, rel_graph)[rows]
            out = y.new_zeros((graph.n_dst, y.shape[1])) if out is None else out
            out = out.index_add(0, rows, y)
        return out

    def extra_repr(self) -> str:
        return f"relations={len(self.rel)}"


def build_pyg_hetero(in_features, hidden, num_classes, layers, dropout, norm, module="", factory="build",
                     linear_layers=0, project=0, *, types: GraphTypes):
    """The `pyg-hetero` model: MODULE.FACTORY's convs, one copy per relation of `types` in every layer (the
    factory gets the projection's width as its input width where there is one, nn/hetero_models.py)."""
    tables = _check_types(NAME, types)
    in_features, read = input_widths(NAME, in_features, hidden, project, types)
    convs: List[nn.Module] = user_convs(NAME, in_features, hidden, num_classes, layers, module, factory,
                                        linear_layers)
    # Widths from the factory's own convs (a lazy conv is materialised there), before the copies are made.
    widths = stack_widths(NAME, [PyGLayer(c, NAME) for c in convs], in_features, hidden, num_classes,
                          linear_layers)
    return HeteroGNN(NAME, [PyGHeteroLayer(c, tables) for c in convs], widths, dropout, norm, types,
                     input_widths=read)

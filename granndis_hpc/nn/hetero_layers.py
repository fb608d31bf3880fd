"""Relational convolutions over a heterogeneous graph (graph/hetero.py): R-GCN and R-GAT.

A heterogeneous graph is one graph whose vertex types are id ranges and whose edge's relation is the
pair of its endpoints' types (graph/hetero.py GraphTypes).  A layer reads a relation per edge from the
global ids of its rows: ``graph.source_ids`` (int64 [n_src], set by the engine for a model whose
contract declares ``source_ids="all"``, nn/contract.py; destination rows are the first n_dst source
rows) or, where it is None (a single process over the whole graph), source row i is vertex i.  ``relation_graphs``
splits a
LayerGraph into one LayerGraph per relation (built once per graph and cached with it), so every
relation aggregates with the machinery of nn/graph.py: own and halo parts for the overlapped halo
exchange, row-restricted parts for boundary-first pipelining, the same on every cluster shape.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from granndis_hpc.graph.hetero import GraphTypes

from .contract import RELATION_MEAN, Layer, LayerCall
from .edge_layers import GATConv
from .edge_sparse import EdgeCSR
from .graph import GraphPart, LayerGraph, aggregate


class TypeTables:
    """A GraphTypes as the tensors the layers read: the types' upper id bounds [T], the relation table
    [T, T] (-1: no relation) and each relation's destination type [R], made once per device."""

    def __init__(self, types: GraphTypes):
        self.types = types
        self.num_types, self.num_relations = types.num_types, types.num_relations
        table = types.relation_table()
        self.key = (types.offsets, tuple(table.ravel().tolist()))
        self._arrays = (np.asarray(types.offsets[1:], dtype=np.int64), table,
                        np.asarray([types.index(rel.dst) for rel in types.relations], dtype=np.int64))
        self._on: Dict[Any, tuple] = {}

    def on(self, device):
        """(upper bounds, relation table, destination type of each relation) on `device`."""
        device = torch.device(device)
        if device not in self._on:
            self._on[device] = tuple(torch.from_numpy(a).to(device) for a in self._arrays)
        return self._on[device]

    def vertex_type(self, ids: torch.Tensor) -> torch.Tensor:
        """int64 type index of each global id."""
        upper = self.on(ids.device)[0]
        return torch.searchsorted(upper, ids.to(torch.int64), right=True)


@dataclass(eq=False)
class RelationGraphs:
    """A LayerGraph seen per relation: ``graphs[r]`` holds only relation r's edges (same rows, n_own and
    source_ids), ``src_type`` [n_src] the source rows' types, ``dst_type`` [n_dst] the destination rows',
    ``edge_relation`` [nnz] each edge's
    relation in the graph's CSR order.  ``dst_rows[r]``: the destination rows of relation r's destination
    type (sorted), and ``compact[r]`` relation r's edges over those rows only (its destination row i is
    row dst_rows[r][i]; the same sources): a relation's aggregate is held for its own type's rows, not for
    every row (R-GCN's means: a fraction of R times the rows)."""

    graphs: List[LayerGraph]
    src_type: torch.Tensor
    dst_type: torch.Tensor
    edge_relation: torch.Tensor
    dst_rows: List[torch.Tensor]
    compact: List[LayerGraph]


# Per graph and types: its relation views (the engine reuses a layer's graph every epoch).  Weak keys:
# the views go with the graph.
_RELATION_GRAPHS: "weakref.WeakKeyDictionary[LayerGraph, dict]" = weakref.WeakKeyDictionary()


def source_ids(graph: LayerGraph) -> torch.Tensor:
    """The global vertex id of each source row: ``graph.source_ids``, or 0..n_src-1 without them."""
    ids = graph.source_ids
    if ids is None:
        return torch.arange(graph.n_src, device=graph.device)
    return torch.as_tensor(ids, dtype=torch.int64).to(graph.device)


def relation_graphs(graph: LayerGraph, tables: TypeTables) -> RelationGraphs:
    """The graph's RelationGraphs under `tables` (cached: set ``graph.source_ids`` before the first call).

    A relation view's dst_degree is the destination row's in-edge count of that relation in the block:
    the global count in exact modes (a computed row has all its in-edges) and the kept count in sampled
    modes.  Its src_degree is the source row's out-edge count of that relation in the block; the views
    serve the "mean" and "sum" kinds, which do not read it.  A graph with in-edges left out
    (``graph.degrees_from``) has the relation degrees of the graph it was cut from."""
    cache = _RELATION_GRAPHS.setdefault(graph, {})
    if tables.key in cache:
        return cache[tables.key]
    _, table, _ = tables.on(graph.device)
    ids = source_ids(graph)
    if ids.shape != (graph.n_src,):
        raise ValueError(f"relation_graphs: source_ids must have shape ({graph.n_src},), got {tuple(ids.shape)}")
    src_type = tables.vertex_type(ids)
    if graph.n_src and int(src_type.max()) >= tables.num_types:
        raise ValueError(f"relation_graphs: vertex id {int(ids.max())} lies beyond the types' "
                         f"{tables.types.num_vertices} vertices")
    dst_type = src_type[: graph.n_dst]
    rows, cols = graph.edge_rows(), graph.indices
    relation = table[src_type[cols], dst_type[rows]]
    if bool((relation < 0).any()):
        e = int(torch.nonzero(relation < 0)[0])
        names = tables.types.names
        raise ValueError(f"relation_graphs: edge {int(ids[cols[e]])} -> {int(ids[rows[e]])} leads from "
                         f"{names[int(src_type[cols[e]])]!r} to {names[int(dst_type[rows[e]])]!r}, a pair no "
                         f"relation covers")
    graphs, dst_rows, compact = [], [], []
    into = tables.on(graph.device)[2]
    full = None if graph.degrees_from is None else relation_graphs(graph.degrees_from, tables)
    for r in range(tables.num_relations):
        keep = relation == r  # a mask keeps the CSR order: each relation's rows stay sorted
        rows_r, cols_r = rows[keep], cols[keep]
        counts = torch.bincount(rows_r, minlength=graph.n_dst)
        indptr = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
        degree = counts.to(torch.float32) if full is None else full.graphs[r].dst_degree
        src_degree = torch.bincount(cols_r, minlength=graph.n_src).to(torch.float32)
        view = LayerGraph(graph.n_dst, graph.n_src, indptr, cols_r, degree, src_degree, n_own=graph.n_own)
        view.source_ids = graph.source_ids
        graphs.append(view)
        # The same edges over the rows of the relation's destination type (every edge's row is one).
        type_rows = torch.nonzero(dst_type == into[r]).squeeze(1)
        counts_c = counts.index_select(0, type_rows)
        compact.append(LayerGraph(type_rows.shape[0], graph.n_src,
                                  torch.cat([counts_c.new_zeros(1), torch.cumsum(counts_c, 0)]), cols_r,
                                  degree.index_select(0, type_rows), src_degree, n_own=graph.n_own))
        dst_rows.append(type_rows)
    cache[tables.key] = views = RelationGraphs(graphs, src_type, dst_type, relation, dst_rows, compact)
    return views


@dataclass(eq=False)
class TypedRows:
    """A LayerGraph's source rows by vertex type, its sources split into own rows (the first n_own) and
    halo rows: ``own[t]`` the own rows of type t (ascending, so the type's destination rows are its first
    ``n_dst[t]``), ``halo[t]`` the halo rows of type t (indices from n_own), and ``edges[r]`` relation r's
    edges (EdgeCSR: destination index among its destination type's destination rows, source index among
    its source type's own rows) and the same among its source type's halo rows: each relation a bipartite
    graph from its source type's rows to its destination type's rows, split as the engine splits the
    sources (n_own = n_src: every edge in the own part)."""

    own: List[torch.Tensor]
    halo: List[torch.Tensor]
    n_dst: List[int]
    edges: List[Tuple[EdgeCSR, EdgeCSR]]


def typed_rows(graph: LayerGraph, tables: TypeTables, n_own: int) -> TypedRows:
    """The graph's TypedRows for the own/halo split at n_own (cached with the graph, as relation_graphs)."""
    cache = _RELATION_GRAPHS.setdefault(graph, {})
    key = (tables.key, "typed", int(n_own))
    if key in cache:
        return cache[key]
    views = relation_graphs(graph, tables)
    src_type, types = views.src_type, tables.types
    ends = [(types.index(rel.src), types.index(rel.dst)) for rel in types.relations]
    own, halo, n_dst = [], [], []
    pos = torch.empty(graph.n_src, dtype=torch.int64, device=graph.device)  # a row's index among its type's
    for t in range(tables.num_types):
        own.append(torch.nonzero(src_type[:n_own] == t).squeeze(1))
        halo.append(torch.nonzero(src_type[n_own:] == t).squeeze(1))
        pos[own[t]] = torch.arange(own[t].shape[0], device=graph.device)
        pos[n_own + halo[t]] = torch.arange(halo[t].shape[0], device=graph.device)
        n_dst.append(int((views.dst_type == t).sum()))
    edges = []
    for (s, d), g in zip(ends, views.compact):
        rows, cols = g.edge_rows(), g.indices
        mine = cols < n_own
        edges.append((EdgeCSR(rows[mine], pos[cols[mine]], n_dst[d], own[s].shape[0]),
                      EdgeCSR(rows[~mine], pos[cols[~mine]], n_dst[d], halo[s].shape[0])))
    cache[key] = typed = TypedRows(own, halo, n_dst, edges)
    return typed


class _AddRows(torch.autograd.Function):
    """out.index_add(0, index, rows), keeping only the index for the backward: torch's index_add keeps
    `rows` too, which for R-GCN's projections ([rows of a type, out] per relation, the classes wide at the
    last layer) was the largest tensor a layer saved."""

    @staticmethod
    def forward(ctx, out, index, rows):
        ctx.save_for_backward(index)
        return out.index_add(0, index, rows)

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        return grad, None, grad.index_select(0, index)


def add_rows(out: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """out with rows[i] added to row index[i] (a new tensor; autograd keeps only the index)."""
    return _AddRows.apply(out, index, rows)


def _tables(types) -> TypeTables:
    if isinstance(types, TypeTables):
        return types
    if not isinstance(types, GraphTypes):
        raise TypeError(f"types must be a GraphTypes (graph/hetero.py), got {type(types).__name__}")
    return TypeTables(types)


def _glorot(t: torch.Tensor) -> None:
    """PyG's glorot: uniform in +-sqrt(6 / (fan_in + fan_out)) over the last two dimensions."""
    bound = math.sqrt(6.0 / (t.shape[-2] + t.shape[-1]))
    nn.init.uniform_(t, -bound, bound)


class RGCNConv(Layer):
    r"""Relational graph convolution (Schlichtkrull et al. 2018), as PyG's ``RGCNConv(aggr="mean")``:

        out_v = x_v W_root + sum_r mean_{u in N_r(v)} x_u W_r + b,   W_r = sum_b comp[r, b] V_b (bases)

    N_r(v): v's in-neighbours over relation r; a row without any aggregates 0 for that relation.  The
    mean of each relation is taken at the input width for the rows of its destination type only (sparse
    products of the relation views' compact graphs, so the own and halo parts add up), then projected by
    W_r and added to those rows.

    Args:
        in_features: input width.
        out_features: output width.
        num_relations: R, the relations of ``types``.
        num_bases: B, basis decomposition of the R weights (None: one weight per relation).
        bias: learn an additive bias.
        types: the graph's GraphTypes (which relation an edge has).

    Parameters (PyG's names and shapes, so a PyG RGCNConv's state_dict loads): weight [R or B, in, out],
    comp [R, B] (with bases), root [in, out], bias [out].

    Shapes: source rows [n_src, in] (destination rows their first n_dst) -> [n_dst, out].

    Its neighbour term is linear in the source rows, so a server may send a destination row, instead of
    its source rows, the partial row sum_r sum_{its u in N_r(v)} x_u W_r / deg_r(v), out wide
    (Layer.weighted_sum RELATION_MEAN, --halo-payload).
    """

    weighted_sum = RELATION_MEAN

    def __init__(self, in_features: int, out_features: int, num_relations: int, num_bases: Optional[int] = None,
                 bias: bool = True, *, types):
        super().__init__()
        self.tables = _tables(types)
        if num_relations != self.tables.num_relations:
            raise ValueError(f"RGCNConv: num_relations={num_relations} but the types have "
                             f"{self.tables.num_relations} relations")
        if num_bases is not None and num_bases < 1:
            raise ValueError(f"RGCNConv: num_bases must be >= 1 or None, got {num_bases}")
        self.in_features, self.out_features = in_features, out_features
        self.num_relations, self.num_bases = num_relations, num_bases
        self.weight = nn.Parameter(torch.empty(num_bases or num_relations, in_features, out_features))
        self.comp = nn.Parameter(torch.empty(num_relations, num_bases)) if num_bases else None
        self.root = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyG's initialisation, in its order: Glorot for weight, comp (with bases) and root; zero bias."""
        for p in (self.weight, self.comp, self.root):
            if p is not None:
                _glorot(p.data)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def relation_weights(self) -> torch.Tensor:
        """[R, in, out]: the weights, or their basis combination."""
        if self.comp is None:
            return self.weight
        return (self.comp @ self.weight.view(self.num_bases, -1)).view(self.num_relations, self.in_features,
                                                                       self.out_features)

    def aggregate_part(self, part: GraphPart, m, call: LayerCall):
        """[R] means of the part's edges of each relation [rows of its destination type, in]."""
        views = relation_graphs(call.graph, self.tables)
        n_own = None if part.sources is None else part.n_own
        return [aggregate(GraphPart(g, part.sources, n_own), m, "mean") for g in views.compact]

    def combine(self, partials, call: LayerCall):
        return [sum(p[r] for p in partials) if len(partials) > 1 else partials[0][r]
                for r in range(self.num_relations)]

    def update(self, h_dst, aggregated, call: LayerCall):
        weights = self.relation_weights()
        out = h_dst @ self.root
        rows = relation_graphs(call.graph, self.tables).dst_rows
        for r, agg in enumerate(aggregated):
            out = add_rows(out, rows[r], agg @ weights[r])
        return out if self.bias is None else out + self.bias

    def message_width(self) -> int:
        return self.in_features  # the messages are the source rows (the means are taken at input width)

    def partial_width(self) -> int:
        return self.out_features

    def relation_edges(self, graph: LayerGraph):
        """Each in-edge's relation and 1 / (its destination row's in-degree of that relation)."""
        views = relation_graphs(graph, self.tables)
        relation = views.edge_relation
        degree = torch.stack([g.dst_degree for g in views.graphs]) if views.graphs else \
            torch.zeros((0, graph.n_dst), device=graph.device)
        return relation, 1.0 / degree[relation, graph.edge_rows()]

    def project_partials(self, sums, rows, n: int):
        weights = self.relation_weights()
        out = weights.new_zeros((n, self.out_features))
        for r, (z, index) in enumerate(zip(sums, rows)):
            out = add_rows(out, index, z @ weights[r])
        return out

    def extra_repr(self) -> str:
        return (f"{self.in_features}, {self.out_features}, num_relations={self.num_relations}, "
                f"num_bases={self.num_bases}")


class RGATConv(Layer):
    r"""Relational graph attention: a bipartite GATConv (nn/edge_layers.py, exact split softmax, no self
    loops) per relation, from its source type's rows to its destination type's rows, summed into each
    destination type, as PyG's ``HeteroConv({rel: GATConv(in, out, heads, add_self_loops=False)},
    aggr="sum")`` computes it (each GATConv given the tuple (x_src, x_dst) of the two types' rows):

        out_v = sum_{r into type(v)} (GAT_r(v) + b_r)

    GAT_r(v) attends over v's in-neighbours of relation r only (0 without any); a relation's output,
    its bias included, goes only to vertices of its destination type (a type no relation leads into
    gets 0).  The sum over relations is the aggregation of MLPerf's R-GAT reference (PyG HeteroConv's
    default) and of IGB's (DGL HeteroGraphConv's default): a vertex with more kinds of neighbours gets
    more terms, as there.

    A relation projects only its source type's rows (gathered once per type and part, by the graph's
    TypedRows) and keeps its attention sums for its destination type's rows only.  Its destination
    term a_dst . (W h_v) is read from its own projection where source and destination type agree, and
    else as h_v (W^T a_dst), without projecting the destination rows.

    Args:
        in_features: input width.
        out_features: features per head.
        num_relations: R, the relations of ``types``.
        heads, concat, negative_slope, attn_dropout: as GATConv, for every relation.
        types: the graph's GraphTypes.

    Parameters: rel.{r}.(lin.weight [H C, in], att_src [H, C], att_dst [H, C], bias [H C or C]); PyG's
    GATConv has att_src and att_dst as [1, H, C].

    Shapes: source rows [n_src, in] -> [n_dst, H C] (concat) or [n_dst, C].
    """

    reads_dst = False

    def __init__(self, in_features: int, out_features: int, num_relations: int, heads: int = 1,
                 concat: bool = True, negative_slope: float = 0.2, attn_dropout: float = 0.0, *, types):
        super().__init__()
        self.tables = _tables(types)
        if num_relations != self.tables.num_relations:
            raise ValueError(f"RGATConv: num_relations={num_relations} but the types have "
                             f"{self.tables.num_relations} relations")
        self.in_features, self.out_features, self.heads, self.concat = in_features, out_features, heads, concat
        self.num_relations, self.attn_dropout = num_relations, float(attn_dropout)
        self.rel = nn.ModuleList(GATConv(in_features, out_features, heads, concat, negative_slope, attn_dropout,
                                         add_self_loops=False) for _ in range(num_relations))
        names = self.tables.types
        self.ends = [(names.index(rel.src), names.index(rel.dst)) for rel in names.relations]

    @property
    def out_width(self) -> int:
        return self.heads * self.out_features if self.concat else self.out_features

    def message(self, h, call: LayerCall):
        """Each relation's projected rows of its source type and their source attention terms (the own
        rows, or all, first; then the halo rows); with the first, each relation's destination terms."""
        first = call.own_messages is None
        typed = typed_rows(call.graph, self.tables, call.graph.n_src if call.n_own is None else call.n_own)
        index = typed.own if first else typed.halo
        by_type = {s: h.index_select(0, index[s]) for s in sorted({s for s, _ in self.ends})}
        H, C = self.heads, self.out_features
        messages, a_dst = [], []
        for conv, (s, d) in zip(self.rel, self.ends):
            x = conv.lin(by_type[s]).view(-1, H, C)
            messages.append((x, (x * conv.att_src).sum(-1)))
            if not first:
                continue
            n = typed.n_dst[d]
            if s == d:  # the destination rows are the type's first own rows
                a_dst.append((x[:n] * conv.att_dst).sum(-1))
            else:
                h_dst = by_type[d][:n] if d in by_type else h.index_select(0, typed.own[d][:n])
                a_dst.append(h_dst @ (conv.lin.weight.view(H, C, -1) * conv.att_dst.unsqueeze(2)).sum(1).t())
        if first:
            call.state["a_dst"] = a_dst
        return messages

    def aggregate_part(self, part: GraphPart, m, call: LayerCall):
        typed = typed_rows(call.graph, self.tables, part.n_own)
        halo = part.sources == "halo"
        dst_rows = relation_graphs(call.graph, self.tables).dst_rows
        out = []
        for r, (conv, (s, d), (x, a_src)) in enumerate(zip(self.rel, self.ends, m)):
            csr = typed.edges[r][1 if halo else 0]
            rows, cols = csr.rows, csr.cols
            keep = None
            if call.attention is not None:  # the mask of each edge by its rows in the whole graph
                keep = _edge_keep(call.attention, dst_rows[r][rows],
                                  part.n_own + typed.halo[s][cols] if halo else typed.own[s][cols], self.heads)
            out.append(conv.attend(x, a_src, call.state["a_dst"][r], rows, cols, typed.n_dst[d], keep,
                                   call.attention, csr))
        return out

    def combine(self, partials, call: LayerCall):
        return [conv.combine([p[r] for p in partials], call) for r, conv in enumerate(self.rel)]

    def update(self, h_dst, aggregated, call: LayerCall):
        dst_rows = relation_graphs(call.graph, self.tables).dst_rows
        out = None
        for conv, rows, agg in zip(self.rel, dst_rows, aggregated):
            # flatten, not reshape(n, -1): a block may hold no row of the relation's destination type
            flat = (agg.flatten(1) if self.concat else agg.mean(dim=1)) + conv.bias
            if out is None:
                out = flat.new_zeros((call.graph.n_dst, flat.shape[1]))
            out = add_rows(out, rows, flat.to(out.dtype))
        return out

    def extra_repr(self) -> str:
        return (f"{self.in_features}, {self.out_features}, num_relations={self.num_relations}, heads={self.heads}, "
                f"concat={self.concat}, attn_dropout={self.attn_dropout}")


def _edge_keep(attention, rows: torch.Tensor, cols: torch.Tensor, heads: int):
    """The attention dropout mask of edges given by their rows in the whole layer graph, when asked for."""
    return lambda: attention.keep(rows, cols, heads)

"""Convolutions beyond one normalised sparse matrix: GAT (attention), GIN (sum + MLP), SAGE-sum, SAGE-max.

Same contract as nn/layers.py: ``forward(h_src, graph, attention=None)`` takes the source rows ``h_src``
[n_src, in] (or PendingRows: the halo still in flight) and returns the destination rows [n_dst, out];
the destination rows are the first n_dst source rows.

With PendingRows each conv computes what the own rows allow first and waits for the halo only before the
halo edges (the engine's overlap).  Sums are linear, so they split into own + halo products.  A softmax
over a destination's in-edges (GAT) and a maximum (SAGE-max) are combined exactly from the two parts:
the maximum of the part maxima, and the softmax from each part's running maximum, sum of exponentials
and weighted sum, rescaled to the common maximum (only the order of the sums changes).

Attention dropout drops an edge's normalised attention weight per head with a mask that is a function of
(seed, epoch, layer, destination id, source id, head) only (``edge_ids`` into nn/dropout.keep_mask), so
every cluster shape and a single process on the whole graph draw the same masks, like feature dropout.
"""
from __future__ import annotations

import math
import weakref
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .dropout import RowDropout, keep_mask
from .graph import LayerGraph, PendingRows, aggregate

# Odd 64-bit multipliers (as int64) combining a destination and a source id into one edge id that
# keep_mask hashes; distinct (dst, src) pairs of realistic ids never collide.
_EDGE_DST = -7046029254386353131  # 0x9E3779B97F4A7C15
_EDGE_SRC = 0x2545F4914F6CDD1D


def edge_ids(dst_ids: torch.Tensor, src_ids: torch.Tensor) -> torch.Tensor:
    """The int64 id of the edges src_ids[i] -> dst_ids[i] (global vertex ids) that keys their masks."""
    return dst_ids.to(torch.int64) * _EDGE_DST + src_ids.to(torch.int64) * _EDGE_SRC


def attention_key(layer: int) -> int:
    """The dropout-stream layer key of conv `layer`'s attention (feature dropout uses 0..L)."""
    return -1 - int(layer)


class EdgeDropout:
    """Attention dropout of one conv in one pass: `keep(rows, cols, n_own, heads)` for edges given as
    destination rows and source rows (cols < n_own: own rows; the halo part passes cols + n_own)."""

    def __init__(self, dropout: RowDropout, layer: int, p: float, graph: LayerGraph):
        self.dropout, self.layer, self.p, self.graph = dropout, int(layer), float(p), graph

    def _source_ids(self, n_src: int, device) -> torch.Tensor:
        ids = getattr(self.graph, "source_ids", None)
        if ids is not None:
            return ids.to(device)
        n_dst = self.graph.n_dst
        if self.dropout.layer_ids[min(self.layer, len(self.dropout.layer_ids) - 1)] is None:
            return torch.arange(n_src, device=device)  # a single process: rows are vertices 0..n-1
        # No global ids of the halo rows (sampled modes' per-step views): own rows by id, halo rows by
        # position; the masks are then the same for a given shape only.
        n_own = self.graph.n_own if self.graph.n_own is not None else n_dst
        own = self.dropout.ids(self.layer, n_own, device)
        return torch.cat([own, -1 - torch.arange(n_src - n_own, device=device)])

    def keep(self, rows: torch.Tensor, cols: torch.Tensor, heads: int) -> torch.Tensor:
        """Bool keep mask [E, heads] of the edges rows[i] <- cols[i] (indices into the graph's rows)."""
        device = rows.device
        dst = self.dropout.ids(self.layer, self.graph.n_dst, device)
        src = self._source_ids(self.graph.n_src, device)
        return keep_mask(self.dropout.seed, self.dropout.epoch, attention_key(self.layer),
                         edge_ids(dst[rows], src[cols]), heads, self.p)


# Per graph: its edges split into own and halo parts (cached: the engine reuses a layer's graph every
# epoch).  Weak keys: the cache goes with the graph.
_EDGES: "weakref.WeakKeyDictionary[LayerGraph, dict]" = weakref.WeakKeyDictionary()


def split_edges(graph: LayerGraph, n_own: int, self_loops: bool):
    """((rows, cols) of the edges from own source rows (cols < n_own), (rows, cols - n_own) of the halo
    edges).  self_loops: drop stored loops v -> v and give every destination row one loop, in the own
    part (a destination row is an own row), as PyG's GATConv does (add_self_loops)."""
    cache = _EDGES.setdefault(graph, {})
    key = (int(n_own), bool(self_loops))
    if key not in cache:
        rows, cols = graph.edge_rows(), graph.indices
        if self_loops:
            off = cols != rows
            rows, cols = rows[off], cols[off]
        own = cols < n_own
        own_rows, own_cols = rows[own], cols[own]
        if self_loops:
            diag = torch.arange(graph.n_dst, device=graph.device)
            own_rows, own_cols = torch.cat([own_rows, diag]), torch.cat([own_cols, diag])
        cache[key] = ((own_rows, own_cols), (rows[~own], cols[~own] - n_own))
    return cache[key]


def source_parts(h_src):
    """(own rows, a function returning the halo rows, n_own) of a tensor or PendingRows: a conv computes
    what the own rows allow, then calls the function (waiting for a halo in flight), as the convs here do."""
    if isinstance(h_src, PendingRows):
        return h_src.own, h_src.halo, h_src.own.shape[0]
    n = h_src.shape[0]
    return h_src, (lambda: h_src[n:]), n


def _project_aggregate(graph: LayerGraph, h_src, weight: torch.Tensor, kind: str) -> torch.Tensor:
    """aggregate(h_src) @ weight^T in the order that moves fewer numbers through the sparse product
    (a sum is linear: projecting first is exact up to rounding)."""
    if weight.shape[0] < weight.shape[1]:
        project = (lambda t: F.linear(t, weight))
        projected = h_src.map(project) if isinstance(h_src, PendingRows) else project(h_src)
        return aggregate(graph, projected, kind)
    return F.linear(aggregate(graph, h_src, kind), weight)


def _own_dst(h_src, n_dst: int) -> torch.Tensor:
    return (h_src.own if isinstance(h_src, PendingRows) else h_src)[:n_dst]


class SAGESumConv(nn.Module):
    """out_v = W_self h_v + W_neigh sum_{u in N(v)} h_u + b   (GraphSAGE with sum aggregation)."""

    kind = "sum"

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.lin_self = nn.Linear(in_features, out_features)
        self.lin_neigh = nn.Linear(in_features, out_features, bias=False)

    def forward(self, h_src, graph: LayerGraph, attention: Optional[EdgeDropout] = None) -> torch.Tensor:
        own = self.lin_self(_own_dst(h_src, graph.n_dst))  # before the aggregation waits for the halo
        return own + _project_aggregate(graph, h_src, self.lin_neigh.weight, self.kind)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, aggr={self.kind}"


def _edge_max(rows: torch.Tensor, cols: torch.Tensor, h: torch.Tensor, n_dst: int) -> torch.Tensor:
    """Per destination row the elementwise maximum of h[cols] over its edges; -inf where it has none."""
    out = h.new_full((n_dst, h.shape[1]), -math.inf)
    return out.scatter_reduce(0, rows.unsqueeze(1).expand(-1, h.shape[1]), h[cols], "amax", include_self=True)


class SAGEMaxConv(SAGESumConv):
    """out_v = W_self h_v + W_neigh max_{u in N(v)} h_u + b   (elementwise max; 0 without in-edges, as PyG).

    The parameters of SAGESumConv; the maximum does not commute with the projection, so it is taken at
    the input width.  With the halo in flight the own edges' maximum is taken first and combined with
    the halo edges' (exact)."""

    kind = "max"

    def forward(self, h_src, graph: LayerGraph, attention: Optional[EdgeDropout] = None) -> torch.Tensor:
        own, halo, n_own = source_parts(h_src)
        (own_rows, own_cols), (halo_rows, halo_cols) = split_edges(graph, n_own, self_loops=False)
        out = self.lin_self(own[: graph.n_dst])
        m = _edge_max(own_rows, own_cols, own, graph.n_dst)
        m = torch.maximum(m, _edge_max(halo_rows, halo_cols, halo(), graph.n_dst))
        m = torch.where(torch.isinf(m), m.new_zeros(()), m)  # no in-edge: 0
        return out + self.lin_neigh(m)


class GINConv(nn.Module):
    """out_v = MLP((1 + eps) h_v + sum_{u in N(v)} h_u), MLP = Linear -> ReLU -> Linear, eps learnable
    (Xu et al. 2019, GIN-eps).  The first Linear is applied before the sum where that is narrower
    (its weight without the bias is linear, so W((1+eps)h_v + sum h_u) = (1+eps)Wh_v + sum Wh_u)."""

    def __init__(self, in_features: int, out_features: int, eps: float = 0.0):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.eps = nn.Parameter(torch.tensor([float(eps)]))
        self.lin1 = nn.Linear(in_features, out_features)
        self.lin2 = nn.Linear(out_features, out_features)

    def forward(self, h_src, graph: LayerGraph, attention: Optional[EdgeDropout] = None) -> torch.Tensor:
        w = self.lin1.weight
        own = F.linear(_own_dst(h_src, graph.n_dst), w) * (1.0 + self.eps)
        z = own + _project_aggregate(graph, h_src, w, "sum") + self.lin1.bias
        return self.lin2(F.relu(z))

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}"


class GATConv(nn.Module):
    """Graph attention (Velickovic et al. 2018, as PyG's GATConv with add_self_loops):

        x_u = W h_u  [heads, C];  e_vu = LeakyReLU(a_src . x_u + a_dst . x_v)  over u in N(v) + {v};
        alpha_vu = softmax_u(e_vu);  out_v = concat_or_mean_heads(sum_u dropout(alpha_vu) x_u) + b

    The softmax is taken per destination and head with its maximum subtracted (detached: the softmax
    does not depend on it).  With the halo in flight, the own part (own edges and the self loops) gives
    a running maximum m1, sum s1 and weighted sum n1, the halo part m2, s2, n2; then with m = max(m1, m2)
    out = (n1 e^(m1-m) + n2 e^(m2-m)) / (s1 e^(m1-m) + s2 e^(m2-m)), the same value as one pass."""

    def __init__(self, in_features: int, out_features: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, attn_dropout: float = 0.0):
        super().__init__()
        self.in_features, self.out_features, self.heads, self.concat = in_features, out_features, heads, concat
        self.negative_slope, self.attn_dropout = float(negative_slope), float(attn_dropout)
        self.lin = nn.Linear(in_features, heads * out_features, bias=False)
        self.att_src = nn.Parameter(torch.empty(heads, out_features))
        self.att_dst = nn.Parameter(torch.empty(heads, out_features))
        self.bias = nn.Parameter(torch.zeros(heads * out_features if concat else out_features))
        # Glorot, as PyG initialises lin and the attention vectors.
        nn.init.xavier_uniform_(self.lin.weight)
        bound = math.sqrt(6.0 / (heads + out_features))
        nn.init.uniform_(self.att_src, -bound, bound)
        nn.init.uniform_(self.att_dst, -bound, bound)

    @property
    def out_width(self) -> int:
        return self.heads * self.out_features if self.concat else self.out_features

    def _part(self, rows, cols, x, a_src, a_dst, n_dst, attention, col_offset):
        """(running max [n_dst, H], sum of exp [n_dst, H], weighted sum [n_dst, H, C]) of one edge part."""
        H = self.heads
        e = F.leaky_relu(a_src[cols] + a_dst[rows], self.negative_slope)  # [E, H]
        m = e.new_full((n_dst, H), -math.inf).scatter_reduce(
            0, rows.unsqueeze(1).expand(-1, H), e.detach(), "amax", include_self=True)
        w = torch.exp(e - m[rows])
        s = w.new_zeros((n_dst, H)).index_add(0, rows, w)
        if attention is not None:  # the denominator sums the undropped weights
            w = w * (attention.keep(rows, cols + col_offset, H).to(w.dtype) * (1.0 / (1.0 - attention.p)))
        # In the weights' dtype: under --precision bf16 the softmax is float32 (the attention logits read
        # the float32 att_src/att_dst), so the weighted rows are float32 and are summed in float32.
        n = w.new_zeros((n_dst, H, x.shape[2])).index_add(0, rows, w.unsqueeze(2) * x[cols])
        return m, s, n

    def forward(self, h_src, graph: LayerGraph, attention: Optional[EdgeDropout] = None) -> torch.Tensor:
        H, C, n_dst = self.heads, self.out_features, graph.n_dst
        own, halo, n_own = source_parts(h_src)
        (own_rows, own_cols), (halo_rows, halo_cols) = split_edges(graph, n_own, self_loops=True)
        x_own = self.lin(own).view(-1, H, C)
        a_dst = (x_own[:n_dst] * self.att_dst).sum(-1)
        m1, s1, n1 = self._part(own_rows, own_cols, x_own, (x_own * self.att_src).sum(-1), a_dst, n_dst,
                                attention, 0)
        if halo_rows.numel() or isinstance(h_src, PendingRows):
            # (Pending rows: the halo is used even without halo edges, so its backward runs on every rank.)
            x_halo = self.lin(halo()).view(-1, H, C)
            m2, s2, n2 = self._part(halo_rows, halo_cols, x_halo, (x_halo * self.att_src).sum(-1), a_dst, n_dst,
                                    attention, n_own)
            m = torch.maximum(m1, m2)  # finite: every row has its self loop in the own part
            c1, c2 = torch.exp(m1 - m), torch.exp(m2 - m)  # e^-inf = 0: a part without edges
            out = (n1 * c1.unsqueeze(2) + n2 * c2.unsqueeze(2)) / (s1 * c1 + s2 * c2).unsqueeze(2)
        else:
            out = n1 / s1.unsqueeze(2)
        out = out.reshape(n_dst, H * C) if self.concat else out.mean(dim=1)
        return out + self.bias

    def extra_repr(self) -> str:
        return (f"{self.in_features}, {self.out_features}, heads={self.heads}, concat={self.concat}, "
                f"attn_dropout={self.attn_dropout}")

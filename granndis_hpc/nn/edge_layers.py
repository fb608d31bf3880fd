"""Convolutions beyond one normalised sparse matrix: GAT (attention), GIN (sum + MLP), SAGE-sum, SAGE-max.

The layer contract of nn/contract.py: source rows [n_src, in] -> destination rows [n_dst, out], in
parts the layer runner can overlap with the halo exchange (own-source edges first, halo-source edges
on arrival).  Sums are linear, so their parts add up.  A softmax over a destination's in-edges (GAT) and
a maximum (SAGE-max) are combined exactly from the parts: the maximum of the part maxima, and the
softmax from each part's running maximum, sum of exponentials and weighted sum, rescaled to the common
maximum (only the order of the sums changes).

Attention dropout drops an edge's normalised attention weight per head with a mask that is a function of
(seed, epoch, layer, destination id, source id, head) only (``edge_ids`` into nn/dropout.keep_mask), so
every cluster shape and a single process on the whole graph draw the same masks, like feature dropout.
"""
from __future__ import annotations

import math
from typing import ClassVar, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .dropout import RowDropout, keep_mask
from .contract import Layer, LayerCall
from .edge_sparse import weighted_sum
from .graph import GraphPart, LayerGraph, aggregate
from .layers import undrawn_linear

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
        ids = self.graph.source_ids
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


def _edge_max(rows: torch.Tensor, cols: torch.Tensor, h: torch.Tensor, n_dst: int) -> torch.Tensor:
    """Per destination row the elementwise maximum of h[cols] over its edges; -inf where it has none."""
    out = h.new_full((n_dst, h.shape[1]), -math.inf)
    return out.scatter_reduce(0, rows.unsqueeze(1).expand(-1, h.shape[1]), h[cols], "amax", include_self=True)


class SAGESumConv(Layer):
    r"""GraphSAGE with sum aggregation, as PyG's ``SAGEConv(aggr="sum")``:

        out_v = W_self h_v + b + W_neigh sum_{u in N(v)} h_u

    N(v): v's in-neighbours; a row without any aggregates 0.  W_neigh is applied before the sum where
    that is narrower (the sum is linear).

    Args:
        in_features: input width.
        out_features: output width.

    The bias is always learnt, and PyG's ``root_weight`` and ``normalize`` are not offered: the
    parameter names (tests/dense_reference.py reads them) and the sizes the memory model declares
    (memory_model/zoo_stacks.py) are those of this one form.

    Parameters: lin_self.(weight [out, in], bias [out]), lin_neigh.weight [out, in] (PyG's lin_r and
    lin_l), drawn by nn.Linear's initialisation in that order.

    Shapes: source rows [n_src, in] (destination rows their first n_dst) -> [n_dst, out].
    """

    kind = "sum"
    weighted_sum: ClassVar[Optional[str]] = "sum"

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.lin_self = undrawn_linear(in_features, out_features)
        self.lin_neigh = undrawn_linear(in_features, out_features, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Redraw the parameters as the constructor draws them (nn.Linear's initialisation)."""
        self.lin_self.reset_parameters()
        self.lin_neigh.reset_parameters()

    def _projects(self) -> bool:
        return self.out_features < self.in_features

    def message(self, h, call: LayerCall):
        return F.linear(h, self.lin_neigh.weight) if self._projects() else h

    def aggregate_part(self, part: GraphPart, m, call: LayerCall):
        return aggregate(part, m, "sum")

    def update(self, h_dst, aggregated, call: LayerCall):
        neigh = aggregated if self._projects() else F.linear(aggregated, self.lin_neigh.weight)
        return self.lin_self(h_dst) + neigh

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, aggr={self.kind}"


class SAGEMaxConv(SAGESumConv):
    r"""GraphSAGE with max aggregation, as PyG's ``SAGEConv(aggr="max")``:

        out_v = W_self h_v + b + W_neigh max_{u in N(v)} h_u

    The maximum is elementwise over v's in-neighbours; a row without any aggregates 0, as PyG's.  It
    does not commute with the projection, so it is taken at the input width.  The parts' maxima combine
    into the maximum (exact); on the whole graph too the edges come as an own part (all of them) and an
    empty halo part, one code path for both.

    Args:
        in_features: input width.
        out_features: output width.

    Parameters, their initialisation and ``reset_parameters``: SAGESumConv's.

    Shapes: source rows [n_src, in] (destination rows their first n_dst) -> [n_dst, out].
    """

    kind = "max"
    weighted_sum: ClassVar[Optional[str]] = None  # a maximum, not a sum

    def message(self, h, call: LayerCall):
        return h

    def aggregate_part(self, part: GraphPart, m, call: LayerCall):
        rows, cols = part.edges()
        return _edge_max(rows, cols, m, part.n_dst)

    def combine(self, partials: List[torch.Tensor], call: LayerCall):
        m = partials[0]
        for p in partials[1:]:
            m = torch.maximum(m, p)
        return torch.where(torch.isinf(m), m.new_zeros(()), m)  # no in-edge: 0

    def update(self, h_dst, aggregated, call: LayerCall):
        return self.lin_self(h_dst) + self.lin_neigh(aggregated)

    def forward(self, h_src, graph: LayerGraph, attention=None) -> torch.Tensor:
        call = LayerCall(graph, attention, n_own=graph.n_src)
        n = graph.n_src
        parts = [self.aggregate_part(GraphPart(graph, "own", n), h_src, call),
                 self.aggregate_part(GraphPart(graph, "halo", n), h_src[n:], call)]
        return self.update(h_src[: graph.n_dst], self.combine(parts, call), call)


class GINConv(Layer):
    r"""Graph isomorphism network with a learnt eps (Xu et al. 2019, GIN-eps), as PyG's
    ``GINConv(Sequential(Linear(in, out), ReLU(), Linear(out, out)), eps, train_eps=True)``:

        out_v = MLP((1 + eps) h_v + sum_{u in N(v)} h_u),   MLP = Linear -> ReLU -> Linear

    The first Linear is applied before the sum where that is narrower (its weight without the bias is
    linear, so W((1+eps)h_v + sum h_u) = (1+eps)Wh_v + sum Wh_u).

    Args:
        in_features: input width.
        out_features: output width (of both Linears).
        eps: the initial eps (learnt).

    The MLP is this fixed one, not a module of the user's as PyG's ``nn`` argument: the projection
    before the sum and the memory model's declared sizes (memory_model/zoo_stacks.py) need its form.

    Parameters: eps [1] (the initial eps), lin1.(weight [out, in], bias [out]), lin2.(weight [out, out],
    bias [out]), the Linears drawn by nn.Linear's initialisation in that order.

    Shapes: source rows [n_src, in] (destination rows their first n_dst) -> [n_dst, out].
    """

    weighted_sum = "sum"

    def __init__(self, in_features: int, out_features: int, eps: float = 0.0):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.initial_eps = float(eps)
        self.eps = nn.Parameter(torch.empty(1))
        self.lin1 = undrawn_linear(in_features, out_features)
        self.lin2 = undrawn_linear(out_features, out_features)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Redraw the parameters as the constructor draws them: eps back to its initial value, then the
        Linears (nn.Linear's initialisation)."""
        with torch.no_grad():
            self.eps.fill_(self.initial_eps)
        self.lin1.reset_parameters()
        self.lin2.reset_parameters()

    def _projects(self) -> bool:
        return self.out_features < self.in_features

    def message(self, h, call: LayerCall):
        return F.linear(h, self.lin1.weight) if self._projects() else h

    def aggregate_part(self, part: GraphPart, m, call: LayerCall):
        return aggregate(part, m, "sum")

    def update(self, h_dst, aggregated, call: LayerCall):
        w = self.lin1.weight
        own = F.linear(h_dst, w) * (1.0 + self.eps)
        neigh = aggregated if self._projects() else F.linear(aggregated, w)
        return self.lin2(F.relu(own + neigh + self.lin1.bias))

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}"


class GATConv(Layer):
    r"""Graph attention (Velickovic et al. 2018), as PyG's ``GATConv`` (with or without self loops):

        x_u = W h_u  [heads, C];  e_vu = LeakyReLU(a_src . x_u + a_dst . x_v)  over u in N(v) + {v};
        alpha_vu = softmax_u(e_vu);  out_v = concat_or_mean_heads(sum_u dropout(alpha_vu) x_u) + b

    The softmax is taken per destination and head with its maximum subtracted (detached: the softmax
    does not depend on it).  Each part of the edges (own edges with the self loops, halo edges) gives a
    running maximum m_i, sum s_i and weighted sum n_i; with m = max_i m_i,
    out = sum_i n_i e^(m_i-m) / sum_i s_i e^(m_i-m), the same value as one pass.

    Args:
        in_features: input width.
        out_features: C, the features per head.
        heads: H, the attention heads.
        concat: concatenate the heads' outputs ([n_dst, H C]); False: average them ([n_dst, C]).
        negative_slope: the LeakyReLU's slope for negative inputs.
        attn_dropout: the probability of dropping an edge's normalised attention weight in training
            (PyG's ``dropout``), per head, by the mask EdgeDropout draws.
        add_self_loops: a loop per vertex, as PyG's default.  False (as relational GAT uses it per
            relation): only the stored edges; a row without in-edges aggregates 0 and outputs the bias.

    Parameters: lin.weight [H C, in], att_src [H, C], att_dst [H, C] (Glorot, as PyG's; PyG's are
    [1, H, C]), bias [H C] with concat, else [C] (zeros).

    Shapes: source rows [n_src, in] (destination rows their first n_dst) -> [n_dst, H C] (concat) or
    [n_dst, C].
    """

    def __init__(self, in_features: int, out_features: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, attn_dropout: float = 0.0, add_self_loops: bool = True):
        super().__init__()
        self.in_features, self.out_features, self.heads, self.concat = in_features, out_features, heads, concat
        self.add_self_loops = bool(add_self_loops)
        self.negative_slope, self.attn_dropout = float(negative_slope), float(attn_dropout)
        self.lin = undrawn_linear(in_features, heads * out_features, bias=False)
        self.att_src = nn.Parameter(torch.empty(heads, out_features))
        self.att_dst = nn.Parameter(torch.empty(heads, out_features))
        self.bias = nn.Parameter(torch.empty(heads * out_features if concat else out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Redraw the parameters as the constructor draws them: Glorot for lin and the attention vectors
        (as PyG initialises them), zeros for the bias."""
        # nn.Linear's own draw comes first, though Glorot's overwrites it: the generator advances past
        # it, so a given seed gives the parameters (and later draws) that models and their recorded
        # results are built from (nn/models.py: parameters depend only on torch.manual_seed).
        self.lin.reset_parameters()
        nn.init.xavier_uniform_(self.lin.weight)
        bound = math.sqrt(6.0 / (self.heads + self.out_features))
        nn.init.uniform_(self.att_src, -bound, bound)
        nn.init.uniform_(self.att_dst, -bound, bound)
        nn.init.zeros_(self.bias)

    @property
    def out_width(self) -> int:
        return self.heads * self.out_features if self.concat else self.out_features

    def message(self, h, call: LayerCall):
        """(projected rows [n, H, C], their source attention term [n, H])."""
        x = self.lin(h).view(-1, self.heads, self.out_features)
        if call.own_messages is None:  # the own rows come first: the destination term from their rows
            call.state["a_dst"] = (x[: call.graph.n_dst] * self.att_dst).sum(-1)
        return x, (x * self.att_src).sum(-1)

    def aggregate_part(self, part: GraphPart, m, call: LayerCall):
        """(running max [n_dst, H], sum of exp [n_dst, H], weighted sum [n_dst, H, C]) of the part."""
        x, a_src = m
        rows, cols = part.edges(self_loops=self.add_self_loops)
        keep = None
        if call.attention is not None:
            offset = part.n_own if part.sources == "halo" else 0
            keep = lambda: call.attention.keep(rows, cols + offset, self.heads)  # noqa: E731
        return self.attend(x, a_src, call.state["a_dst"], rows, cols, part.n_dst, keep, call.attention)

    def attend(self, x, a_src, a_dst, rows, cols, n_dst: int, keep=None, attention=None, csr=None):
        """(running max, sum of exp, weighted sum) of the edges rows[i] <- cols[i]: x [n_src, H, C] and
        a_src [n_src, H] by source row, a_dst [n_dst, H] by destination row; keep() the edges' attention
        dropout mask [E, H] (attention's p) where attention is given.  csr: the same edges as an EdgeCSR
        (nn/edge_sparse.py), whose sparse products then make the weighted sum."""
        H = self.heads
        e = F.leaky_relu(a_src[cols] + a_dst[rows], self.negative_slope)  # [E, H]
        if csr is not None:  # rows sorted: each row's edges are one segment (-inf and 0 where it has none)
            mx = torch.segment_reduce(e.detach(), "max", offsets=csr.indptr, axis=0, unsafe=True)
        else:
            mx = e.new_full((n_dst, H), -math.inf).scatter_reduce(
                0, rows.unsqueeze(1).expand(-1, H), e.detach(), "amax", include_self=True)
        w = torch.exp(e - mx[rows])
        # A segment sum reads each row's edges in order, as index_add adds them (the same sums); index_add
        # of [E, H] rows on CPU is a small add per edge, many times slower.
        s = (torch.segment_reduce(w, "sum", offsets=csr.indptr, axis=0, unsafe=True) if csr is not None
             else w.new_zeros((n_dst, H)).index_add(0, rows, w))
        if attention is not None:  # the denominator sums the undropped weights
            w = w * (keep().to(w.dtype) * (1.0 / (1.0 - attention.p)))
        # In the weights' dtype: under --precision bf16 the softmax is float32 (the attention logits read
        # the float32 att_src/att_dst), so the weighted rows are float32 and are summed in float32.
        if csr is not None:
            return mx, s, weighted_sum(w, x, csr)
        n = w.new_zeros((n_dst, H, x.shape[2])).index_add(0, rows, w.unsqueeze(2) * x[cols])
        return mx, s, n

    def combine(self, partials, call: LayerCall):
        if len(partials) == 1:
            m1, s1, n1 = partials[0]
            return n1 / self._denominator(s1).unsqueeze(2)
        (m1, s1, n1), (m2, s2, n2) = partials
        m = torch.maximum(m1, m2)  # finite with self loops: every row has its loop in the own part
        if not self.add_self_loops:  # a row without in-edges in both parts: any finite m (its sums are 0)
            m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        c1, c2 = torch.exp(m1 - m), torch.exp(m2 - m)  # e^-inf = 0: a part without edges
        return (n1 * c1.unsqueeze(2) + n2 * c2.unsqueeze(2)) / self._denominator(s1 * c1 + s2 * c2).unsqueeze(2)

    def _denominator(self, s):
        """Without self loops a row may have no in-edge (sum 0): it aggregates 0, as PyG's softmax gives."""
        return s if self.add_self_loops else torch.where(s > 0, s, torch.ones_like(s))

    def update(self, h_dst, aggregated, call: LayerCall):
        out = aggregated.reshape(aggregated.shape[0], -1) if self.concat else aggregated.mean(dim=1)
        return out + self.bias

    def extra_repr(self) -> str:
        return (f"{self.in_features}, {self.out_features}, heads={self.heads}, concat={self.concat}, "
                f"attn_dropout={self.attn_dropout}" + ("" if self.add_self_loops else ", add_self_loops=False"))

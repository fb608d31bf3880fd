"""Memory estimates of the relational models of nn/hetero_models.py (rgcn, rgat).

Their per-relation tensors scale with the graph's relation count R, which the row counts do not hold:
ModelSpec's ``relations`` gives it (the engine and `preprocess plan` pass the shard set's), and without
it DEFAULT_RELATIONS is assumed (the field's benchmark graphs with their reverse relations: ogbn-mag 7,
IGBH 7 to 9).  The relations partition the edges, so per-edge tensors count every edge once.
The byte counts mirror the forward passes of nn/hetero_layers.py.  No torch here.

The per-type input projection (nn/hetero_models.py, where the set's types' widths differ or option
``project`` asks for it; ModelSpec's ``type_widths``): layer 0 reads the projection's width, its Linears'
parameters count, and it saves its output [rows, P] and, where the rows are one matrix (a set of one
width with option ``project``), the own rows it gathers per type [rows, F]; rows held at their own widths
(memory_model/typed_widths.py) are read in place.  Layer 0's halo is then exchanged every step, with a gradient, as
any exchanged layer's (``exchanged``), and no view holds its halo's feature rows (estimate.py).
"""
from __future__ import annotations

from typing import Tuple

from granndis_hpc.units import FLOAT32_BYTES as F32
from granndis_hpc.units import INT64_BYTES as I64

from .host import HEAP_HOLES_RGAT, HEAP_HOLES_RGCN
from .typed_widths import typed
from .zoo_stacks import EdgeEstimate, GATEstimate

DEFAULT_RELATIONS = 8
# Edges per chunk of R-GAT's attention-weight gradient (nn/edge_sparse.py's _CHUNK).
EDGE_CHUNK = 1 << 14


def relations(m) -> int:
    """The relation count of the estimate: ModelSpec's ``relations``, or DEFAULT_RELATIONS."""
    return int(getattr(m, "relations", None) or DEFAULT_RELATIONS)


def projection(m) -> int:
    """The input projection's width (nn/hetero_models.py input_widths): option ``project``, else --hidden
    where the set's types' widths differ; 0: none."""
    project = int(dict(m.options).get("project", 0) or 0)
    widths = getattr(m, "type_widths", None) or ()
    return project or (int(m.hidden) if len(set(widths)) > 1 else 0)


def projection_parameters(m) -> int:
    """The input projection's parameters: a Linear per type from its width (0 without it)."""
    P = projection(m)
    widths = getattr(m, "type_widths", None) or (m.features,)
    return sum((int(w) + 1) * P for w in widths) if P else 0


class ProjectedInput:
    """Mixin of the relational models' estimates: the per-type input projection (module docstring)."""

    def exchanged(self, layer, m=None):
        """Layer 0 reads the projected rows, exchanged every step (with a gradient), where it projects."""
        return super().exchanged(layer, m) or bool(m is not None and projection(m))

    def projects(self, m) -> bool:
        """Whether the model projects its input (then no view holds its halo's feature rows)."""
        return bool(projection(m))

    def all_widths(self, m):
        out = super().all_widths(m)
        P = projection(m)
        if P:
            out[0] = (P, out[0][1])
        return out

    def parameters(self, m):
        return super().parameters(m) + projection_parameters(m)

    def activations(self, rows, m, mask_bytes):
        out = super().activations(rows, m, mask_bytes)
        P = projection(m)
        if P:
            own0 = rows.server.n_own if rows.k > 0 else rows.world.n_own
            # The Linears read the held rows in place where they are at their own widths (a block per type,
            # memory_model/typed_widths.py); rows of one matrix are gathered per type first.
            saved = own0 * ((0 if typed(m) else rows.features) + P) * F32
            out["per_layer"][0] += saved
            out["fresh_per_layer"][0] += saved
        return out


def relation_rows(m) -> float:
    """Per destination row, the relations whose aggregate it holds (those into its type: ModelSpec's
    ``relation_rows``, from the set's types), or every relation when unknown."""
    return float(getattr(m, "relation_rows", None) or relations(m))


class RGCNEstimate(ProjectedInput, EdgeEstimate):
    """R-GCN (option num_bases): the root's input (a slice of the source rows' storage), each relation's
    mean over its destination type's rows [rows, win] (its projection's input; relation_rows of them per
    destination row) and, with bases, the combined weights [R, win, wout]."""

    heap_holes = HEAP_HOLES_RGCN

    def conv_parameters(self, m, layer, win, wout):
        R, B = relations(m), m.option("num_bases")
        return (B or R) * win * wout + (R * B if B else 0) + win * wout + wout

    def conv_saved(self, lr, m, layer, win, wout, input_grad, mask_bytes) -> Tuple[int, int]:
        R, B = relations(m), m.option("num_bases")
        weights = R * win * wout * F32 if input_grad else 0  # each relation's weight, saved by its product
        root = win * wout * F32 if input_grad else 0
        b = lr.n_src * win * F32 + root + int(relation_rows(m) * lr.n_dst) * win * F32 + weights
        pre = root + (0 if B else weights)  # with bases the combined weights are made in the step
        if B:
            b += R * B * F32 + B * win * wout * F32  # the combination's factors (parameters)
            pre += R * B * F32 + B * win * wout * F32
        return b, pre


class RGATEstimate(ProjectedInput, GATEstimate):
    """R-GAT (options heads, out_heads, attn_dropout): a bipartite GAT per relation without self loops.
    The source rows gathered by type (one copy of the [n_src, win] rows, the lins' input); each relation's
    projection of its source type's rows [rows, H C]: relation_rows of them per source row (a symmetrised
    graph has as many relations out of a type as into it); per edge (each counted once, its relation's)
    the edge index, the LeakyReLU input and the exponentials [E, H] (and the dropout mask), no gathered
    rows (the weighted sum is a sparse product per head, nn/edge_sparse.py); per relation, its
    destination type's rows' weighted sum and sum of exponentials."""

    heap_holes = HEAP_HOLES_RGAT

    def all_widths(self, m):
        T = m.layers + m.linear_layers
        w = [projection(m) or m.features] + [m.hidden * m.option("heads")] * (T - 1) + [m.num_classes]
        return [(w[i], w[i + 1]) for i in range(T)]

    def conv_parameters(self, m, layer, win, wout):
        heads, c = self._per_head(m, layer)
        return relations(m) * (win * heads * c + 2 * heads * c + wout)

    def conv_saved(self, lr, m, layer, win, wout, input_grad, mask_bytes):
        R, per_row = relations(m), relation_rows(m)
        heads, c = self._per_head(m, layer)
        hc, edges = heads * c, lr.nnz
        w = R * (win * hc * F32 if input_grad else 0)
        b = lr.n_src * win * F32 + w  # the source rows by type (the lins' input) and the lins' weights
        b += int(per_row * lr.n_src) * hc * F32 + R * 2 * hc * F32  # the relations' projections; a_src, a_dst
        b += 2 * edges * I64 + 2 * edges * heads * F32  # edge index; LeakyReLU's input, exp's result
        if m.option("attn_dropout") > 0:
            b += 2 * edges * heads * F32
        b += int(per_row * lr.n_dst) * (hc + heads) * F32  # per relation: weighted sum, sum of exp
        return b, w + R * 2 * hc * F32

    def edge_transient(self, lr, m, layer, win, wout):
        """One relation at a time (autograd's backward finishes a relation's chain before the next's):
        three [E, H] tensors (the forward's logits, their rows' maxima and difference; the backward's
        weights' gradient, its copy in source order and the exponential's gradient), counted over all
        the layer's edges as the largest relation's share is not known here; the per-head copy of the
        projected rows [H, n_src, C] that the weighted sum's products read; and the backward's chunk of
        gathered rows and output gradients, 2 x [EDGE_CHUNK, H C] (nn/edge_sparse.py)."""
        heads, c = self._per_head(m, layer)
        chunk = min(lr.nnz, EDGE_CHUNK)
        return (3 * lr.nnz * heads + lr.n_src * heads * c + 2 * chunk * heads * c) * F32


RGCN_ESTIMATE = RGCNEstimate()
RGAT_ESTIMATE = RGATEstimate()

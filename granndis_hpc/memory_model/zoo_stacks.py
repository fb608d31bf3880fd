"""Memory estimates of the nn/zoo.py models (registered as their `estimator`, read by granndis_hpc/memory_model).

Besides the per-row tensors of memory_model/stacks.py's estimates, these models keep per-edge tensors for the
backward pass: GAT the attention logits, their exponentials and (with attention dropout) the masks, one
per edge and head, and the gathered source rows of every edge [E, heads, C]; SAGE-max the gathered rows of
every edge [E, width].  E counts one self loop per computed row for GAT.  The byte counts mirror the
forward passes of nn/edge_layers.py (tests/unit/test_zoo_estimates.py measures them with SavedBytes).
No torch here: only the row and edge counts of memory_model.RankRows.
"""
from __future__ import annotations

from typing import Tuple

from granndis_hpc.units import FLOAT32_BYTES as F32
from granndis_hpc.units import INT64_BYTES as I64

from .host import HEAP_HOLES_GAT
from .stacks import SAGE_BYTES, PlainEstimate


class _ConvBytes:
    """What the memory model reads of a conv class (ModelEstimate.conv)."""

    source_grad_paths = 2
    self_loops = False


class EdgeEstimate(PlainEstimate):
    """L convs F -> H ... -> C with [LayerNorm] -> act -> dropout between them (nn/zoo.py EdgeGNN), then
    the per-vertex Linear layers (--linear-layers); layer 0 reads the static halo features (no input
    gradient).  A subclass gives its conv's parameters and saved bytes (conv_parameters, conv_saved) and
    the per-edge tensors it allocates at once (edge_transient)."""

    def __init__(self):
        super().__init__(_ConvBytes)

    def conv_parameters(self, m, layer, win, wout) -> int:
        raise NotImplementedError

    def conv_saved(self, lr, m, layer, win, wout, input_grad, mask_bytes) -> Tuple[int, int]:
        raise NotImplementedError

    def edge_transient(self, lr, m, layer, win, wout) -> int:
        """Bytes the conv allocates per edge beyond what it saves, at once (memory_model step_peak)."""
        return 0

    def parameters(self, m):
        n = sum(self.conv_parameters(m, l, i, o) for l, (i, o) in enumerate(self.widths(m)))
        n += sum(i * o + o for i, o in self.linear_widths(m))
        return n + (sum(2 * i for i, _ in self.all_widths(m)[1:]) if m.norm else 0)


class SAGESumEstimate(EdgeEstimate):
    """SAGE with sum aggregation: SAGEConv's tensors (the sum is the same sparse product)."""

    def conv_parameters(self, m, layer, win, wout):
        return SAGE_BYTES.parameter_count(win, wout)

    def conv_saved(self, lr, m, layer, win, wout, input_grad, mask_bytes):
        return SAGE_BYTES.saved_bytes(lr.n_src, lr.n_dst, win, wout, input_grad)


class GINEstimate(EdgeEstimate):
    """GIN: lin1 before the sum where narrower (saves the source rows) or after it (the [n_dst, win] sum);
    (1 + eps) saves lin1's self term and the one-element factor; ReLU its result, lin2 its input and weight."""

    def conv_parameters(self, m, layer, win, wout):
        return 1 + win * wout + wout + wout * wout + wout

    def conv_saved(self, lr, m, layer, win, wout, input_grad, mask_bytes):
        w1 = win * wout * F32 if input_grad else 0
        b = lr.n_src * win * F32 + w1  # lin1 of the own rows (a slice of the source rows' storage)
        if wout >= win:  # summed first: lin1 saves the [n_dst, win] sum
            b += lr.n_dst * win * F32
        b += lr.n_dst * wout * F32 + F32  # (1 + eps) * lin1(own): both factors
        b += lr.n_dst * wout * F32 + wout * wout * F32  # ReLU's result (lin2's input) and lin2's weight
        return b, w1 + wout * wout * F32


class SAGEMaxEstimate(EdgeEstimate):
    """SAGE-max: the gathered source rows of every edge [E, win], their per-row maximum (own and halo part,
    then combined) and lin_neigh's input, besides lin_self's source rows."""

    def conv_parameters(self, m, layer, win, wout):
        return SAGE_BYTES.parameter_count(win, wout)

    def conv_saved(self, lr, m, layer, win, wout, input_grad, mask_bytes):
        b = lr.n_src * win * F32 + lr.n_dst * win * F32  # lin_self's source rows, lin_neigh's input
        if not input_grad:  # (the static features: the maximum needs no backward)
            return b, 0
        w = win * wout * F32
        # Both parts (own and halo edges): the edge index (cached with the graph) and the gathered rows
        # [E_part, win]; per part the -inf start and the maximum [n_dst, win] (scatter_reduce saves both).
        b += 2 * lr.nnz * I64 + lr.nnz * win * F32 + 4 * lr.n_dst * win * F32
        # where's condition (bool); the weights.
        b += lr.n_dst * win + 2 * w
        # (The cached edge index lives as long as the graph but is in no other term: counted as fresh.)
        return b, 2 * w

    def edge_transient(self, lr, m, layer, win, wout):
        return lr.nnz * win * F32


class GATEstimate(EdgeEstimate):
    """GAT (options heads, out_heads, concat, attn_dropout): per conv with H heads of C features and E =
    in-edges + one self loop per computed row: lin's source rows [n_src, win] and projection [n_src, H C],
    per edge the LeakyReLU input and the exponentials [E, H] (and the dropout mask), the gathered
    projected rows [E, H, C], and the per-row weighted sum and sum of exponentials.  These are the bytes
    of the one-part softmax; a layer whose halo is in flight combines two parts and keeps about two more
    [n_dst, H C] tensors (small beside the per-edge ones: E is n_dst times the mean degree plus one)."""

    heap_holes = HEAP_HOLES_GAT

    def _heads(self, m, layer):
        last = layer == m.layers - 1 and not m.linear_layers  # (else the Linear layers give the classes)
        return (m.option("out_heads") if last else m.option("heads")), last

    def all_widths(self, m):
        hidden = m.hidden * m.option("heads") if m.option("concat") else m.hidden
        T = m.layers + m.linear_layers
        w = [m.features] + [hidden] * (T - 1) + [m.num_classes]
        return [(w[i], w[i + 1]) for i in range(T)]

    def _per_head(self, m, layer):
        heads, last = self._heads(m, layer)
        return heads, (m.num_classes if last else m.hidden)

    def conv_parameters(self, m, layer, win, wout):
        heads, c = self._per_head(m, layer)
        return win * heads * c + 2 * heads * c + wout

    def conv_saved(self, lr, m, layer, win, wout, input_grad, mask_bytes):
        heads, c = self._per_head(m, layer)
        hc = heads * c
        edges = lr.nnz + lr.n_dst
        w = win * hc * F32 if input_grad else 0
        b = lr.n_src * win * F32 + w  # lin: the source rows and its weight
        b += lr.n_src * hc * F32 + 2 * hc * F32  # the projection (both attention products) and a_src, a_dst
        b += 2 * edges * I64  # the edge index (cached with the graph)
        b += 2 * edges * heads * F32  # LeakyReLU's input, exp's result
        if m.option("attn_dropout") > 0:
            b += 2 * edges * heads * F32  # the scaled mask and the dropped weights
        b += 2 * edges * hc * F32  # the gathered projected rows and the messages (index_add keeps its source)
        b += lr.n_dst * hc * F32 + lr.n_dst * heads * F32  # the division's weighted sum and sum of exponentials
        # (The cached edge index lives as long as the graph but is in no other term: counted as fresh.)
        return b, w + 2 * hc * F32

    def edge_transient(self, lr, m, layer, win, wout):
        heads, c = self._per_head(m, layer)
        return (lr.nnz + lr.n_dst) * heads * c * F32  # the messages [E, H, C] before their sum


GAT_ESTIMATE = GATEstimate()
GIN_ESTIMATE = GINEstimate()
SAGE_SUM_ESTIMATE = SAGESumEstimate()
SAGE_MAX_ESTIMATE = SAGEMaxEstimate()

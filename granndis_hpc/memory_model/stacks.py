"""Memory estimates of the layer stacks of nn/models.py (read through the registry entry's `estimator`).

`rows` is a memory_model.RankRows, `m` a memory_model.ModelSpec.  A layer's sizes are declared by a
bytes class (``SAGE_BYTES``, ``GCN_BYTES`` below; a registered model's own, tests/recipe_model.py): the
gradients its source rows get (``source_grad_paths``), whether its adjacency holds self-loop entries
(``self_loops``), ``parameter_count(win, wout)`` and ``saved_bytes(n_src, n_dst, win, wout,
input_grad)`` (what autograd saves).  The stack estimates add what the layer runner keeps between
layers.  The byte counts mirror the forward passes of nn/layers.py and nn/runner.py and are checked
byte for byte against what autograd saves (tests/unit/test_memory_model).  No torch here.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from granndis_hpc.units import FLOAT32_BYTES as F32
from granndis_hpc.units import INT64_BYTES as I64

from .host import HEAP_HOLES_ROWS


def projects_first(n_dst: int, n_own_in: int, win: int, wout: int, split_sources: bool) -> bool:
    """nn/layers.project_first on a layer's counts: its Linear projects the source rows before the
    aggregation where it narrows, and at equal widths where the sources are split (the halo in flight)
    and the own source rows are no more than the destination rows (fb's world layers)."""
    return wout < win or (split_sources and wout == win and n_own_in <= n_dst)


class SAGE_BYTES:
    """SAGEConv: the source rows get two gradients in the backward (lin_self's slice and the
    aggregation); the aggregation adds no self-loop entries."""

    source_grad_paths = 2
    self_loops = False

    @staticmethod
    def parameter_count(win: int, wout: int) -> int:
        return 2 * win * wout + wout

    @staticmethod
    def saved_bytes(n_src: int, n_dst: int, win: int, wout: int, input_grad: bool) -> tuple:
        """(bytes autograd saves, of which allocated before the step: the weights).  lin_self saves the
        source rows' storage (h_src[:n_dst] is a slice of it) and, when its input needs a gradient, its
        weight; lin_neigh saves h_src again (projected first, out < in: the same storage, counted once)
        or the [n_dst, win] aggregate."""
        weight = win * wout * F32 if input_grad else 0
        saved = n_src * win * F32 + weight + (weight if wout < win else n_dst * win * F32 + weight)
        return saved, 2 * weight

    @staticmethod
    def split_saved(n_dst: int, win: int, wout: int) -> int:
        """Boundary-first (split rows): lin_self reads the own rows by index_select, first and rest, and
        saves those [n_dst, win] copies instead of a slice of the source rows' storage."""
        return n_dst * win * F32

    @staticmethod
    def pending_saved(n_dst: int, n_own_in: int, win: int, wout: int) -> int:
        """Overlapped (the halo in flight): at equal widths with no more own source rows than destination
        rows the conv projects first (nn/layers.project_first), so lin_neigh saves the own rows and the
        halo buffer (as many rows as the gathered ones it saved otherwise), not the [n_dst, win] aggregate."""
        return -n_dst * win * F32 if win == wout and projects_first(n_dst, n_own_in, win, wout, True) else 0

    @staticmethod
    def projected_rows(n_src: int, n_dst: int, n_own_in: int, win: int, wout: int, split_sources: bool) -> int:
        """Rows the layer's Linears project: lin_self every computed row; lin_neigh every source row where
        it projects first (the own and the halo rows), else the [n_dst] aggregates."""
        return n_dst + (n_src if projects_first(n_dst, n_own_in, win, wout, split_sources) else n_dst)


class GCN_BYTES:
    """GCNConv: one Linear (the source rows get one gradient); the cached adjacency holds the n_dst
    self-loop entries."""

    source_grad_paths = 1
    self_loops = True

    @staticmethod
    def parameter_count(win: int, wout: int) -> int:
        return win * wout + wout

    @staticmethod
    def saved_bytes(n_src: int, n_dst: int, win: int, wout: int, input_grad: bool) -> tuple:
        """One Linear, before the aggregation (out < in: it saves the [n_src, win] source rows) or after
        it (the [n_dst, win] aggregate); its weight when its input needs a gradient."""
        weight = win * wout * F32 if input_grad else 0
        return (n_src * win * F32 if wout < win else n_dst * win * F32) + weight, weight

    @staticmethod
    def projected_rows(n_src: int, n_dst: int, n_own_in: int, win: int, wout: int, split_sources: bool) -> int:
        """Rows its Linear projects: the source rows where it projects first, else the [n_dst] aggregates."""
        return n_src if projects_first(n_dst, n_own_in, win, wout, split_sources) else n_dst


def between_convs_saved(rows: int, width: int, norm: bool, dropout: float, mask_bytes: int) -> Tuple[int, int]:
    """[LayerNorm] -> ReLU -> dropout between convs: LN saves input, mean, rstd, weight, bias; ReLU its
    result; dropout its mask (a float mask on CPU (input * bernoulli noise), a bool mask on CUDA).
    Returns (saved, of which allocated before the step: LN's weight and bias)."""
    b = pre = 0
    if norm:
        b += rows * width * F32 + 2 * rows * F32 + 2 * width * F32
        pre += 2 * width * F32
    b += rows * width * F32
    if dropout > 0:
        b += rows * width * mask_bytes
    return b, pre


def linear_saved(rows: int, win: int, wout: int, norm: bool, dropout: float, mask_bytes: int) -> Tuple[int, int]:
    """A per-vertex Linear layer after [LayerNorm] -> ReLU -> dropout: what those save, plus the Linear's
    input (the dropout's output, a new storage when p > 0; else ReLU's result, counted already) and its
    weight (a parameter, allocated before the step).  Returns (saved, of which allocated before)."""
    b, pre = between_convs_saved(rows, win, norm, dropout, mask_bytes)
    b += (rows * win * F32 if dropout > 0 else 0) + win * wout * F32
    return b, pre + win * wout * F32


def send_rows(layer_rows, halo_route: str) -> int:
    """The length of a layer's send index on `halo_route`: the per-server route sends a row to each
    other server once (n_send_once, where counted), the direct route to each reading rank."""
    once = getattr(layer_rows, "n_send_once", None)
    return int(once if halo_route == "per-server" and once is not None else layer_rows.n_send)


def gather_saved(layer_rows, exchanged: bool, seen: Optional[set] = None,
                 halo_route: str = "direct") -> Tuple[int, int]:
    """The halo exchange saves its send index (allocated at set-up) when its input needs a gradient.
    seen: the layer rows already counted in this estimate -- layers given the same rows object (the
    world view's, which share one plan and one send index tensor: engine/views.py) save one storage."""
    if seen is not None and exchanged:
        if id(layer_rows) in seen:
            return 0, 0
        seen.add(id(layer_rows))
    n = send_rows(layer_rows, halo_route) * I64 if exchanged else 0
    return n, n


class ModelEstimate:
    """What the memory model needs of a model: conv widths, parameter count, the bytes autograd saves
    per layer, and how its layers use the exchange.  Subclass per model (or reuse one whose forward is
    the same) and pass it as `register_model(..., estimator=...)`."""

    conv = SAGE_BYTES  # the layer's declared sizes: its source_grad_paths, self_loops and byte counts
    # On a CPU device, the C heap's holes the model's step leaves, as a fraction of the step's transient
    # (memory_model/host.py's allocator term, where the measurements are).
    heap_holes = HEAP_HOLES_ROWS

    @property
    def grad_paths(self) -> int:
        """Gradients the backward allocates for a layer's source rows (SAGE: self and aggregation)."""
        return self.conv.source_grad_paths

    @property
    def self_loops(self) -> bool:
        """The cached adjacency holds n_dst self-loop entries (GCN)."""
        return self.conv.self_loops

    def exchanged(self, layer: int, m=None) -> bool:
        """Layer `layer`'s source rows come through the autograd exchange (False: the static halo
        features exchanged once at set-up; then no gradient and no per-epoch halo bytes).  `m`: the
        ModelSpec, where the answer depends on its options (an input projection)."""
        return True

    def split_saved(self, layer_rows, win: int, wout: int) -> int:
        """Bytes a boundary-first layer (split rows) saves beyond the plain order: its declared
        `split_saved`, 0 for a layer that declares none."""
        extra = getattr(self.conv, "split_saved", None)
        return int(extra(layer_rows.n_dst, win, wout)) if extra is not None else 0

    def pending_saved(self, layer_rows, win: int, wout: int) -> int:
        """Bytes an overlapped layer (its halo in flight) saves beyond the plain order, at most 0: its
        declared `pending_saved`, 0 for a layer that declares none."""
        extra = getattr(self.conv, "pending_saved", None)
        return int(extra(layer_rows.n_dst, layer_rows.n_own_in, win, wout)) if extra is not None else 0

    def projected_rows(self, layer_rows, win: int, wout: int, split_sources: bool) -> int:
        """Rows the layer's projections read (the compute model's row units, memory_model/epoch_time.py):
        its declared `projected_rows` (split_sources: the halo in flight), else one per computed row."""
        rows = getattr(self.conv, "projected_rows", None)
        if rows is None:
            return int(layer_rows.n_dst)
        return int(rows(layer_rows.n_src, layer_rows.n_dst, layer_rows.n_own_in, win, wout, split_sources))

    def aggregation_input_grad(self, m, layer: int) -> bool:
        """Does the aggregation's input need a gradient (then the backward builds the transpose)?"""
        win, wout = self.widths(m)[layer]
        return self.exchanged(layer, m) or wout < win  # projected first: lin(h_src) has a gradient

    def widths(self, m) -> List[Tuple[int, int]]:
        raise NotImplementedError

    def linear_widths(self, m) -> List[Tuple[int, int]]:
        """(in, out) widths of the per-vertex Linear layers after the convs (--linear-layers)."""
        return []

    def linear_rows(self, rows) -> int:
        """The rows the per-vertex layers compute: those of the last conv."""
        return rows.training_layers()[-1][1].n_dst

    def parameters(self, m) -> int:
        raise NotImplementedError

    def activations(self, rows, m, mask_bytes: int) -> Dict[str, Any]:
        """{"per_layer", "fresh_per_layer" (without what exists before the step), "head", "head_fresh",
        "recompute" (checkpointing: the largest block's activations, held again in the backward)}."""
        raise NotImplementedError


class PlainEstimate(ModelEstimate):
    """PlainGNN: L convs F -> H ... -> C; layer 0 reads the static halo features (no input gradient)."""

    def __init__(self, conv):
        self.conv = conv

    def exchanged(self, layer, m=None):
        return layer > 0

    def all_widths(self, m):
        """(in, out) of every layer, convs then Linear layers."""
        T = m.layers + m.linear_layers
        w = [m.features] + [m.hidden] * (T - 1) + [m.num_classes]
        return [(w[i], w[i + 1]) for i in range(T)]

    def widths(self, m):
        return self.all_widths(m)[: m.layers]

    def linear_widths(self, m):
        return self.all_widths(m)[m.layers:]

    def conv_saved(self, lr, m, layer, win, wout, input_grad, mask_bytes) -> Tuple[int, int]:
        """(bytes conv `layer` saves, of which allocated before the step): the conv's declared sizes."""
        return self.conv.saved_bytes(lr.n_src, lr.n_dst, win, wout, input_grad=input_grad)

    def parameters(self, m):
        n = sum(self.conv.parameter_count(i, o) for i, o in self.widths(m))
        n += sum(i * o + o for i, o in self.linear_widths(m))
        return n + ((m.layers + m.linear_layers - 1) * 2 * m.hidden if m.norm else 0)

    def activations(self, rows, m, mask_bytes):
        per_layer, fresh, seen = [], [], set()
        for l, ((_, lr), (win, wout)) in enumerate(zip(rows.training_layers(), self.widths(m))):
            parts = [gather_saved(lr, self.exchanged(l, m), seen, m.halo_route),
                     self.conv_saved(lr, m, l, win, wout, self.exchanged(l, m), mask_bytes)]
            if l >= 1:
                parts.append(between_convs_saved(lr.n_own_in, win, m.norm, m.dropout, mask_bytes))
            b, pre = sum(p[0] for p in parts), sum(p[1] for p in parts)
            per_layer.append(b)
            fresh.append(b - pre)
        head = head_pre = 0
        for win, wout in self.linear_widths(m):
            b, pre = linear_saved(self.linear_rows(rows), win, wout, m.norm, m.dropout, mask_bytes)
            head, head_pre = head + b, head_pre + pre
        return {"per_layer": per_layer, "fresh_per_layer": fresh, "head": head, "head_fresh": head - head_pre,
                "recompute": 0}


class ResSAGEEstimate(ModelEstimate):
    """ResSAGE+: encoder F -> H, L SAGE convs H -> H (every one exchanged: the encoder's output has a
    gradient), pre-norm residual blocks, head H -> C."""

    def widths(self, m):
        return [(m.hidden, m.hidden)] * m.layers

    def linear_widths(self, m):
        return [(m.hidden, m.hidden)] * m.linear_layers

    def split_saved(self, layer_rows, win: int, wout: int) -> int:
        """Its blocks do not split rows (nn/runner.py's residual forward has no boundary-first)."""
        return 0

    def parameters(self, m):
        L, H, F_, C, N = m.layers, m.hidden, m.features, m.num_classes, m.linear_layers
        return ((F_ * H + H) + L * SAGE_BYTES.parameter_count(H, H) + (L + N - 1) * 2 * H + 2 * H + (H * C + C)
                + N * (H * H + H))

    def activations(self, rows, m, mask_bytes):
        H = m.hidden
        own0 = rows.server.n_own if rows.k > 0 else rows.world.n_own
        # encoder(x) saves x, a slice of the view's whole feature tensor, which is what its storage
        # holds (allocated at set-up).
        enc = own0 * rows.features * F32
        per_layer, fresh, recompute, seen = [], [], 0, set()
        for l, (_, lr) in enumerate(rows.training_layers()):
            parts = [gather_saved(lr, True, seen, m.halo_route),
                     SAGE_BYTES.saved_bytes(lr.n_src, lr.n_dst, H, H, input_grad=True)]
            if l >= 1:
                parts.append(between_convs_saved(lr.n_own_in, H, True, m.dropout, mask_bytes))
            b, pre = sum(p[0] for p in parts), sum(p[1] for p in parts)
            if l >= 1 and m.checkpoint_activations:
                # A recomputed block saves only its input (the outer hooks see it; measured), and
                # the backward re-runs the block, holding its activations again one block at a time.
                recompute = max(recompute, b - pre)
                b, pre = lr.n_own_in * H * F32, 0
            per_layer.append(b)
            fresh.append(b - pre)
        per_layer[0] += enc
        # The residual per-vertex blocks (--linear-layers): h + Linear(dropout(relu(LayerNorm(h)))),
        # recomputed like the conv blocks under checkpointing.
        blocks = blocks_pre = 0
        for _ in range(m.linear_layers):
            b, pre = linear_saved(self.linear_rows(rows), H, H, True, m.dropout, mask_bytes)
            if m.checkpoint_activations:
                recompute = max(recompute, b - pre)
                b, pre = self.linear_rows(rows) * H * F32, 0
            blocks, blocks_pre = blocks + b, blocks_pre + pre
        head, pre = between_convs_saved(rows.n_inner, H, True, m.dropout, mask_bytes)
        # head saves its input (the dropout output, a new storage when p > 0; else ReLU's result,
        # counted above) and its weight.
        head += (rows.n_inner * H * F32 if m.dropout > 0 else 0) + H * m.num_classes * F32
        return {"per_layer": per_layer, "fresh_per_layer": fresh, "head": head + blocks,
                "head_fresh": head - pre - H * m.num_classes * F32 + blocks - blocks_pre, "recompute": recompute}


SAGE_ESTIMATE = PlainEstimate(SAGE_BYTES)
GCN_ESTIMATE = PlainEstimate(GCN_BYTES)
RESSAGE_ESTIMATE = ResSAGEEstimate()

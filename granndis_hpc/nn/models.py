"""GNN models over per-layer one-hop graphs: GraphSAGE, GCN and ResSAGE+ (DeeperGCN "res+" blocks).

Contract with the engine (docs/design.md §6):
- ``forward(x, graphs, gather)``: ``x`` holds the rank's own rows of layer 0; ``graphs[l]`` is layer l's
  ``LayerGraph``; layer l's n_dst equals layer l+1's number of own rows.
- Before conv l the model calls ``gather(l, h)`` with h = the own rows [n_own, width]; gather returns
  ``cat(h, halo)`` with n_src rows (``gather=None``: identity, single process).  Dropout is applied to h
  *before* gather, so a halo row carries its owner's dropout mask as in single-process training.
- ``forward(..., dropout=RowDropout(seed, epoch, row_ids))`` (nn/dropout.py): the masks are a function of
  (seed, epoch, layer, global row id, column), so every cluster shape draws the masks a single process
  draws on the whole graph (row_ids None: rows are vertices 0..n-1).  Layer l's key is the index of the
  conv the dropped rows feed (ResSAGE's head: L); input dropout is key 0, drawn for layer 0's source rows
  by their global ids (RowDropout(..., source_ids=...)).  ``dropout=None`` in training draws a fresh seed from
  torch's generator for the pass (reproducible under torch.manual_seed, not across shapes).
- ``conv_in_widths[l]`` is the width of the h passed to ``gather(l, h)`` (for halo buffers).
- Parameters depend only on ``torch.manual_seed`` (modules are created in a fixed order).

Parameter names are part of the contract: tests/dense_reference.py reads them to recompute the model.
  sage/gcn: convs.{l}.(lin_self.weight, lin_self.bias, lin_neigh.weight | lin.weight, bias),
            norms.{l}.(weight, bias) for l < L-1 when norm=True, linears.{j}.(weight, bias)
  ressage:  encoder.(weight, bias), convs.{l}.* (SAGEConv), norms.{l-1}.* (before conv l, l >= 1),
            linears.{j}.* (residual per-vertex blocks), out_norm.*, head.(weight, bias)

A per-vertex head (``linear_layers`` = N, --linear-layers): the last N of the L layers are ``nn.Linear``
layers that aggregate nothing, so the model has L - N message-passing layers (``num_layers``, the hops a
full preload needs: the GraNNDis artifact's "3-layer GraphSAGE" is 3 SAGE convolutions and 1 Linear
classifier).  They run on the rows the last conv computes, after the same [LayerNorm] -> ReLU -> dropout
as between convs (dropout key = the layer's index l in 0..L-1).  ResSAGE+'s last N blocks become
h = h + Linear(dropout(relu(LayerNorm(h)))), before its out_norm and head.
"""
from __future__ import annotations

import numbers
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from granndis_hpc import registry
from granndis_hpc.units import FLOAT32_BYTES as F32
from granndis_hpc.units import INT64_BYTES as I64

from .dropout import RowDropout
from .graph import LayerGraph, materialize
from .layers import GCNConv, SAGEConv

# name -> builder(in_features, hidden, num_classes, layers, dropout, norm, **options) -> GNN: the
# dependency-free registry (granndis_hpc/registry.py declares the built-in models by name, so that
# the train parser lists them without importing torch); `register_model` below adds one
# (docs/architecture.md: adding a model is one builder registered here).
MODELS: registry.Registry = registry.MODELS

Gather = Callable[[int, torch.Tensor], torch.Tensor]


class GNN(nn.Module):
    """Base class: the gather/shape bookkeeping shared by every model."""

    name: str
    num_layers: int  # message-passing layers = hops a full preload needs
    conv_in_widths: List[int]  # width of h handed to gather(l, h)
    # Dropout applies between layers; `input_dropout` (set after building, like checkpoint_activations)
    # also drops the raw input features.  Layer 0's halo is the static features exchanged once at set-up,
    # so input dropout is drawn *after* gather, on own and halo rows alike, keyed by their global ids
    # (RowDropout.sources): every rank draws the owner's mask itself and the cached halo stays valid.
    # A model that applies it says to which rows (the trainer refuses --input-dropout otherwise):
    # "sources" = layer 0's gathered source rows (the trainer passes their ids), "own" = the own rows.
    # Recompute each residual block (gather included) in the backward pass instead of keeping its
    # activations.  Every rank recomputes the same blocks in the same order, so the exchanges inside
    # line up; the dropout masks are hashes of their counters (nn/dropout.py), so the recomputed masks
    # are the same by construction.
    checkpoint_activations: bool = False
    dropout: float = 0.0
    input_dropout: float = 0.0
    input_dropout_rows: Optional[str] = None
    # Parameter-name prefix of the layer that reads the input features (--weight-decay-on first).
    first_layer_prefix: str = "convs.0."
    # gather may return PendingRows (the halo still in flight) instead of cat(own, halo): the model hands
    # them to its convs, which aggregate the own rows' edges before waiting (the engine's overlap).  A
    # model that indexes or transforms the gathered rows itself leaves this False and gets tensors.
    accepts_pending_rows: bool = False

    def _dropout_for_pass(self, dropout: Optional[RowDropout]) -> Optional[RowDropout]:
        """The pass's RowDropout; None where nothing is dropped (eval, p = 0: no generator is touched)."""
        if not self.training or (self.dropout == 0.0 and self.input_dropout == 0.0):
            return None
        if dropout is None:  # single-process use without a key: a fresh key per pass
            dropout = RowDropout(int(torch.randint(0, 2 ** 62, ())), 0)
        return dropout

    def _drop(self, dropout: Optional[RowDropout], layer: int, h: torch.Tensor) -> torch.Tensor:
        return h if dropout is None else dropout(layer, h, self.dropout)

    def _drop_input(self, dropout: Optional[RowDropout], x: torch.Tensor) -> torch.Tensor:
        """Input dropout of raw feature rows: layer 0's gathered source rows, or the own rows."""
        if dropout is None:
            return x
        x = materialize(x)  # drawn per source row: needs the halo rows
        if self.input_dropout_rows == "sources":
            return dropout.sources(x, self.input_dropout)
        return dropout(RowDropout.INPUT_LAYER, x, self.input_dropout)

    def _maybe_checkpoint(self, fn, *args):
        if self.checkpoint_activations and self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)

    def _gather(self, gather: Optional[Gather], layer: int, h: torch.Tensor, graph: LayerGraph) -> torch.Tensor:
        if h.shape[0] < graph.n_dst:
            raise ValueError(f"{self.name} layer {layer}: {h.shape[0]} own rows but the layer graph has "
                             f"n_dst={graph.n_dst}; destination rows must be a prefix of the own rows")
        h_src = h if gather is None else gather(layer, h)
        if h_src.shape[0] != graph.n_src:
            how = ("without gather the own rows must be all source rows" if gather is None
                   else "gather must return cat(own rows, halo rows)")
            raise ValueError(f"{self.name} layer {layer}: got {h_src.shape[0]} source rows, the layer graph "
                             f"has n_src={graph.n_src} ({how})")
        return h_src

    def _check_graphs(self, graphs: Sequence[LayerGraph]):
        if len(graphs) != self.num_layers:
            raise ValueError(f"{self.name} has {self.num_layers} message-passing layers but got "
                             f"{len(graphs)} layer graphs; pass one LayerGraph per layer")


class PlainGNN(GNN):
    """L convs, widths in -> hidden ... -> classes; [LayerNorm] -> ReLU -> dropout between convs;
    input dropout on layer 0's gathered source rows."""

    input_dropout_rows = "sources"
    accepts_pending_rows = True

    def __init__(self, name: str, in_features: int, hidden: int, num_classes: int, layers: int,
                 dropout: float, norm: bool, linear_layers: int = 0):
        super().__init__()
        conv_cls = {"sage": SAGEConv, "gcn": GCNConv}[name]
        convs = _conv_count(layers, linear_layers)
        self.name, self.num_layers, self.dropout, self.use_norm = name, convs, dropout, norm
        widths = [in_features] + [hidden] * (layers - 1) + [num_classes]
        self.conv_in_widths = widths[:convs]
        self.convs = nn.ModuleList(conv_cls(widths[i], widths[i + 1]) for i in range(convs))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers - 1)) if norm else None
        # Created last: without a head the parameters are drawn exactly as before the head existed.
        self.linears = nn.ModuleList(nn.Linear(widths[i], widths[i + 1]) for i in range(convs, layers))

    def forward(self, x: torch.Tensor, graphs: Sequence[LayerGraph], gather: Optional[Gather] = None,
                dropout: Optional[RowDropout] = None) -> torch.Tensor:
        self._check_graphs(graphs)
        dropout = self._dropout_for_pass(dropout)
        # Boundary-first pipelining (gather.boundary, engine/views.py): where the next layer's exchange
        # is overlapped, conv l computes the rows that exchange sends first; they are activated and
        # posted (gather.post), and the other rows are computed while they travel.
        boundary = getattr(gather, "boundary", None)
        h, activated = x, True
        for layer, (conv, graph) in enumerate(zip(self.convs, graphs)):
            if not activated:
                h = self._between(dropout, layer, h)
            # One name for the gathered rows: a second one would keep layer l's gathered tensor alive
            # through layer l + 1's gather (measured: +24 % step peak for GCN, tests/mpi/test_memory_model_mpi).
            h = self._gather(gather, layer, h, graph)
            if layer == 0:
                h = self._drop_input(dropout, h)
            split = boundary(layer + 1) if boundary is not None and layer + 1 < self.num_layers else None
            if split is None:
                h, activated = conv(h, graph), False
                continue
            out = conv(h, graph, split=split)
            first = self._between(dropout, layer + 1, out.first, split.first)
            gather.post(layer + 1, first)
            h = split.merge(first, self._between(dropout, layer + 1, out.rest(), split.rest))
            del out, first
            activated = True
        for j, linear in enumerate(self.linears):  # the per-vertex head: the last conv's rows only
            h = linear(self._between(dropout, self.num_layers + j, h))
        return h

    def _between(self, dropout, layer: int, h: torch.Tensor, rows=None) -> torch.Tensor:
        """[LayerNorm] -> ReLU -> dropout before conv `layer`, of its own rows or of the rows `rows`
        of them (all three are row-wise, so rows can be done apart)."""
        if self.norms is not None:
            h = self.norms[layer - 1](h)
        h = F.relu(h)
        if rows is None or dropout is None:
            return self._drop(dropout, layer, h)
        return dropout.at(layer, h, self.dropout, rows)


class ResSAGE(GNN):
    """ResSAGE+ (DeeperGCN "res+" with SAGE convs, Li et al. 2020), trainable at 28-112+ layers.

    h = encoder(input_dropout(x));  h = conv_0(gather(0, h));
    for l in 1..L-1:  z = conv_l(gather(l, dropout(relu(LayerNorm_l(h)))));  h = h[:n_dst] + z
    logits = head(dropout(relu(out_norm(h))))

    Pre-norm residual blocks keep an identity path from every block to the output, so gradients reach
    the early blocks at any depth; PyTorch's default Linear init is enough (tests/unit/test_nn_models.py
    trains 112 layers).  Unlike the GraNNDis artifact, out_norm is its own LayerNorm: the artifact reuses
    block 0's norm for the head, which ties two unrelated normalisations together.
    layers >= 1: layers == 1 is encoder -> conv_0 -> head (no residual block).
    The encoder runs on the own rows before gather, so input dropout drops only own rows here.
    """

    input_dropout_rows = "own"
    first_layer_prefix = "encoder."
    accepts_pending_rows = True

    def __init__(self, in_features: int, hidden: int, num_classes: int, layers: int, dropout: float,
                 linear_layers: int = 0):
        super().__init__()
        convs = _conv_count(layers, linear_layers)
        self.name, self.num_layers, self.dropout = "ressage", convs, dropout
        self.total_layers = layers
        self.conv_in_widths = [hidden] * convs
        self.encoder = nn.Linear(in_features, hidden)
        self.convs = nn.ModuleList(SAGEConv(hidden, hidden) for _ in range(convs))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers - 1))
        self.out_norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, num_classes)
        # Created last: without linear blocks the parameters are drawn exactly as before they existed.
        self.linears = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(convs, layers))

    def forward(self, x: torch.Tensor, graphs: Sequence[LayerGraph], gather: Optional[Gather] = None,
                dropout: Optional[RowDropout] = None) -> torch.Tensor:
        self._check_graphs(graphs)
        dropout = self._dropout_for_pass(dropout)
        h = self.encoder(self._drop_input(dropout, x))
        h = self.convs[0](self._gather(gather, 0, h, graphs[0]), graphs[0])
        for layer in range(1, self.num_layers):
            graph = graphs[layer]

            def block(h, layer=layer, graph=graph):
                z = self._drop(dropout, layer, F.relu(self.norms[layer - 1](h)))
                return h[: graph.n_dst] + self.convs[layer](self._gather(gather, layer, z, graph), graph)
            h = self._maybe_checkpoint(block, h)
        for j, linear in enumerate(self.linears):
            layer = self.num_layers + j

            def linear_block(h, layer=layer, linear=linear):
                return h + linear(self._drop(dropout, layer, F.relu(self.norms[layer - 1](h))))
            h = self._maybe_checkpoint(linear_block, h)
        h = self._drop(dropout, self.total_layers, F.relu(self.out_norm(h)))
        return self.head(h)


def _conv_count(layers: int, linear_layers: int) -> int:
    """Message-passing layers of a model of `layers` layers whose last `linear_layers` are Linear."""
    if not 0 <= int(linear_layers) < int(layers):
        raise ValueError(f"linear_layers must be in [0, layers) = [0, {layers}) (at least one layer aggregates), "
                         f"got {linear_layers!r}")
    return int(layers) - int(linear_layers)


def register_model(name: str, *, estimator: Optional["ModelEstimate"] = None, checkpointable: bool = False,
                   options: Sequence[registry.ModelOption] = (), linear_head: bool = False):
    """Decorator: make `builder(in_features, hidden, num_classes, layers, dropout, norm, **options)`
    buildable by name.  `estimator` (a ModelEstimate) lets --mode auto and `preprocess plan` estimate
    its memory; `checkpointable`: --checkpoint-activations recomputes its blocks; `options`: its extra
    constructor options (--model-option NAME=VALUE, passed to the builder as keywords); `linear_head`:
    the builder takes `linear_layers=N` (--linear-layers, the last N layers per-vertex Linear ones)."""
    def register(builder):
        MODELS.register(name, builder, estimator=estimator, checkpointable=bool(checkpointable),
                        options=tuple(options), linear_head=bool(linear_head))
        return builder
    return register


# The built-in models, declared by name in granndis_hpc/registry.py (lazily: these builders and
# estimates are what it names).
def _sage(in_features, hidden, num_classes, layers, dropout, norm, linear_layers=0):
    return PlainGNN("sage", in_features, hidden, num_classes, layers, dropout, norm, linear_layers)


def _gcn(in_features, hidden, num_classes, layers, dropout, norm, linear_layers=0):
    return PlainGNN("gcn", in_features, hidden, num_classes, layers, dropout, norm, linear_layers)


def _ressage(in_features, hidden, num_classes, layers, dropout, norm, linear_layers=0):
    # LayerNorm in every block anyway
    return ResSAGE(in_features, hidden, num_classes, layers, dropout, linear_layers)


def build_model(name: str, in_features: int, hidden: int, num_classes: int, layers: int,
                dropout: float = 0.5, norm: bool = False, linear_layers: int = 0, **options) -> GNN:
    """Build one of MODELS.  ``norm`` adds LayerNorm between sage/gcn convs; ressage always has LayerNorm.
    ``layers`` counts every layer; the last ``linear_layers`` are per-vertex Linear layers (models whose
    entry has ``linear_head``), so the model aggregates over ``layers - linear_layers`` hops.
    ``options``: the model's extra constructor options (registry.model_options parses them)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {tuple(MODELS)}")
    for arg, value in (("in_features", in_features), ("hidden", hidden), ("num_classes", num_classes),
                       ("layers", layers)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
            raise ValueError(f"build_model: {arg} must be a positive integer, got {value!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"build_model: dropout must be in [0, 1), got {dropout!r}")
    if linear_layers:
        problem = registry.linear_head_problem(name, layers, linear_layers)
        if problem:
            raise ValueError(f"build_model: {problem}")
        options = dict(options, linear_layers=int(linear_layers))
    return MODELS[name](int(in_features), int(hidden), int(num_classes), int(layers), float(dropout), bool(norm),
                        **options)


# ---------------------------------------------------------------------------------------------------
# Memory estimates (granndis_hpc/memory_model reads them through the registry entry's `estimator`).
# `rows` is a memory_model.RankRows, `m` a memory_model.ModelSpec; the byte counts mirror the forward
# passes above and are checked byte for byte against what autograd saves (tests/unit/test_memory_model).
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


def gather_saved(layer_rows, exchanged: bool, seen: Optional[set] = None) -> Tuple[int, int]:
    """The halo exchange saves its send index (allocated at set-up) when its input needs a gradient.
    seen: the layer rows already counted in this estimate -- layers given the same rows object (the
    world view's, which share one plan and one send index tensor: engine/views.py) save one storage."""
    if seen is not None and exchanged:
        if id(layer_rows) in seen:
            return 0, 0
        seen.add(id(layer_rows))
    n = layer_rows.n_send * I64 if exchanged else 0
    return n, n


class ModelEstimate:
    """What the memory model needs of a model: conv widths, parameter count, the bytes autograd saves
    per layer, and how its layers use the exchange.  Subclass per model (or reuse one whose forward is
    the same) and pass it as `register_model(..., estimator=...)`."""

    conv = SAGEConv  # the conv class: its source_grad_paths, self_loops and byte counts

    @property
    def grad_paths(self) -> int:
        """Gradients the backward allocates for a layer's source rows (SAGE: self and aggregation)."""
        return self.conv.source_grad_paths

    @property
    def self_loops(self) -> bool:
        """The cached adjacency holds n_dst self-loop entries (GCN)."""
        return self.conv.self_loops

    def exchanged(self, layer: int) -> bool:
        """Layer `layer`'s source rows come through the autograd exchange (False: the static halo
        features exchanged once at set-up; then no gradient and no per-epoch halo bytes)."""
        return True

    def split_saved(self, layer_rows, win: int, wout: int) -> int:
        """Bytes a boundary-first layer (nn/graph.RowSplit) saves beyond the plain order: its conv's
        `split_saved`, 0 for a conv that declares none."""
        extra = getattr(self.conv, "split_saved", None)
        return int(extra(layer_rows.n_dst, win, wout)) if extra is not None else 0

    def aggregation_input_grad(self, m, layer: int) -> bool:
        """Does the aggregation's input need a gradient (then the backward builds the transpose)?"""
        win, wout = self.widths(m)[layer]
        return self.exchanged(layer) or wout < win  # projected first: lin(h_src) has a gradient

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

    def activations(self, rows, m, mask_bytes: int) -> Dict[str, object]:
        """{"per_layer", "fresh_per_layer" (without what exists before the step), "head", "head_fresh",
        "recompute" (checkpointing: the largest block's activations, held again in the backward)}."""
        raise NotImplementedError


class PlainEstimate(ModelEstimate):
    """PlainGNN: L convs F -> H ... -> C; layer 0 reads the static halo features (no input gradient)."""

    def __init__(self, conv):
        self.conv = conv

    def exchanged(self, layer):
        return layer > 0

    def _all_widths(self, m):
        T = m.layers + m.linear_layers
        w = [m.features] + [m.hidden] * (T - 1) + [m.num_classes]
        return [(w[i], w[i + 1]) for i in range(T)]

    def widths(self, m):
        return self._all_widths(m)[: m.layers]

    def linear_widths(self, m):
        return self._all_widths(m)[m.layers:]

    def parameters(self, m):
        n = sum(self.conv.parameter_count(i, o) for i, o in self.widths(m))
        n += sum(i * o + o for i, o in self.linear_widths(m))
        return n + ((m.layers + m.linear_layers - 1) * 2 * m.hidden if m.norm else 0)

    def activations(self, rows, m, mask_bytes):
        per_layer, fresh, seen = [], [], set()
        for l, ((_, lr), (win, wout)) in enumerate(zip(rows.training_layers(), self.widths(m))):
            parts = [gather_saved(lr, self.exchanged(l), seen),
                     self.conv.saved_bytes(lr.n_src, lr.n_dst, win, wout, input_grad=self.exchanged(l))]
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

    def parameters(self, m):
        L, H, F_, C, N = m.layers, m.hidden, m.features, m.num_classes, m.linear_layers
        return ((F_ * H + H) + L * SAGEConv.parameter_count(H, H) + (L + N - 1) * 2 * H + 2 * H + (H * C + C)
                + N * (H * H + H))

    def activations(self, rows, m, mask_bytes):
        H = m.hidden
        own0 = rows.server.n_own if rows.k > 0 else rows.world.n_own
        # encoder(x) saves x, a slice of the view's whole feature tensor, which is what its storage
        # holds (allocated at set-up).
        enc = own0 * rows.features * F32
        per_layer, fresh, recompute, seen = [], [], 0, set()
        for l, (_, lr) in enumerate(rows.training_layers()):
            parts = [gather_saved(lr, True, seen), SAGEConv.saved_bytes(lr.n_src, lr.n_dst, H, H, input_grad=True)]
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


SAGE_ESTIMATE = PlainEstimate(SAGEConv)
GCN_ESTIMATE = PlainEstimate(GCNConv)
RESSAGE_ESTIMATE = ResSAGEEstimate()

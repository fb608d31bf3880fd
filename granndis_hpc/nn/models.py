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
            norms.{l}.(weight, bias) for l < L-1 when norm=True
  ressage:  encoder.(weight, bias), convs.{l}.* (SAGEConv), norms.{l-1}.* (before conv l, l >= 1),
            out_norm.*, head.(weight, bias)
"""
from __future__ import annotations

import numbers
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from .dropout import RowDropout
from .graph import LayerGraph, materialize
from .layers import GCNConv, SAGEConv

# name -> builder(in_features, hidden, num_classes, layers, dropout, norm) -> GNN; filled by
# `register_model` below (docs/architecture.md: adding a model is one builder registered here).
MODELS: Dict[str, Callable[..., "GNN"]] = {}

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
                 dropout: float, norm: bool):
        super().__init__()
        conv_cls = {"sage": SAGEConv, "gcn": GCNConv}[name]
        self.name, self.num_layers, self.dropout, self.use_norm = name, layers, dropout, norm
        widths = [in_features] + [hidden] * (layers - 1) + [num_classes]
        self.conv_in_widths = widths[:-1]
        self.convs = nn.ModuleList(conv_cls(widths[i], widths[i + 1]) for i in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers - 1)) if norm else None

    def forward(self, x: torch.Tensor, graphs: Sequence[LayerGraph], gather: Optional[Gather] = None,
                dropout: Optional[RowDropout] = None) -> torch.Tensor:
        self._check_graphs(graphs)
        dropout = self._dropout_for_pass(dropout)
        h = x
        for layer, (conv, graph) in enumerate(zip(self.convs, graphs)):
            if layer > 0:
                if self.norms is not None:
                    h = self.norms[layer - 1](h)
                h = self._drop(dropout, layer, F.relu(h))
            # One name for the gathered rows: a second one would keep layer l's gathered tensor alive
            # through layer l + 1's gather (measured: +24 % step peak for GCN, tests/mpi/test_memory_model_mpi).
            h = self._gather(gather, layer, h, graph)
            if layer == 0:
                h = self._drop_input(dropout, h)
            h = conv(h, graph)
        return h


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

    def __init__(self, in_features: int, hidden: int, num_classes: int, layers: int, dropout: float):
        super().__init__()
        self.name, self.num_layers, self.dropout = "ressage", layers, dropout
        self.conv_in_widths = [hidden] * layers
        self.encoder = nn.Linear(in_features, hidden)
        self.convs = nn.ModuleList(SAGEConv(hidden, hidden) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers - 1))
        self.out_norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, num_classes)

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
        h = self._drop(dropout, self.num_layers, F.relu(self.out_norm(h)))
        return self.head(h)


def register_model(name: str):
    """Decorator: make `builder(in_features, hidden, num_classes, layers, dropout, norm)` buildable by name."""
    def register(builder):
        MODELS[name] = builder
        return builder
    return register


@register_model("sage")
def _sage(in_features, hidden, num_classes, layers, dropout, norm):
    return PlainGNN("sage", in_features, hidden, num_classes, layers, dropout, norm)


@register_model("gcn")
def _gcn(in_features, hidden, num_classes, layers, dropout, norm):
    return PlainGNN("gcn", in_features, hidden, num_classes, layers, dropout, norm)


@register_model("ressage")
def _ressage(in_features, hidden, num_classes, layers, dropout, norm):
    return ResSAGE(in_features, hidden, num_classes, layers, dropout)  # LayerNorm in every block anyway


def build_model(name: str, in_features: int, hidden: int, num_classes: int, layers: int,
                dropout: float = 0.5, norm: bool = False) -> GNN:
    """Build one of MODELS.  ``norm`` adds LayerNorm between sage/gcn convs; ressage always has LayerNorm."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {tuple(MODELS)}")
    for arg, value in (("in_features", in_features), ("hidden", hidden), ("num_classes", num_classes),
                       ("layers", layers)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
            raise ValueError(f"build_model: {arg} must be a positive integer, got {value!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"build_model: dropout must be in [0, 1), got {dropout!r}")
    return MODELS[name](int(in_features), int(hidden), int(num_classes), int(layers), float(dropout), bool(norm))

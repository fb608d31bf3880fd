"""GNN models over per-layer one-hop graphs: GraphSAGE, GCN and ResSAGE+ (DeeperGCN "res+" blocks).

Contract with the engine (docs/design.md §6): a model is a stack of layers (nn/contract.py) that
the engine's layer runner runs (engine/runner.py run_stack); it declares its layers and what goes
between them, and ``forward(x, graphs, gather, dropout)`` hands them to the runner:
- ``x`` holds the rank's own rows of layer 0; ``graphs[l]`` is layer l's ``LayerGraph``; layer l's
  n_dst equals layer l+1's number of own rows.
- ``gather(l, h)`` (the engine's; ``None``: identity, single process) turns the own rows [n_own, width]
  into the layer's source rows; the runner drops h *before* gather, so a halo row carries its owner's
  dropout mask as in single-process training.
- ``dropout=RowDropout(seed, epoch, row_ids)`` (nn/dropout.py): the masks are a function of
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
from typing import Callable, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from granndis_hpc import registry

from .dropout import RowDropout
from .graph import LayerGraph
from .layers import GCNConv, SAGEConv

# name -> builder(in_features, hidden, num_classes, layers, dropout, norm, **options) -> GNN: the
# dependency-free registry (granndis_hpc/registry.py declares the built-in models by name, so that
# the train parser lists them without importing torch); `register_model` below adds one
# (docs/architecture.md: adding a model is one builder registered here).
MODELS: registry.Registry = registry.MODELS

Gather = Callable[[int, torch.Tensor], torch.Tensor]


class GNN(nn.Module):
    """Base class: a stack of layers the engine's runner runs (engine/runner.py describes the stacks)."""

    name: str
    num_layers: int  # message-passing layers = hops a full preload needs
    conv_in_widths: List[int]  # width of h handed to gather(l, h)
    # The stack (submodules, set by the subclass): `convs` (the message-passing layers), `norms`
    # (before layer l >= 1: norms[l - 1], or None), `activation`, the per-vertex `linears` after the
    # convs; `residual`: ResSAGE+'s pre-norm blocks with `encoder`, `out_norm` and `head`.
    residual: bool = False
    activation = staticmethod(F.relu)
    attn_dropout: float = 0.0
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
    @property
    def accepts_pending_rows(self) -> bool:
        """gather may return PendingRows (the halo still in flight): the runner overlaps it with the
        layers' own-source parts (layers that cannot split their sources wait for it).  A model with a
        forward of its own gets tensors."""
        return type(self).forward is GNN.forward

    def forward(self, x: torch.Tensor, graphs: Sequence[LayerGraph], gather: Optional[Gather] = None,
                dropout: Optional[RowDropout] = None) -> torch.Tensor:
        # (Imported here: the runner imports this package's layers, whose __init__ imports this module.)
        from granndis_hpc.engine.runner import run_stack
        return run_stack(self, x, graphs, gather, dropout)

    def reset_parameters(self) -> None:
        """Redraw every parameter with its module's own initialisation (each conv's, norm's and Linear's
        ``reset_parameters``), module by module in construction order, so that after
        ``torch.manual_seed(s)`` the model holds the parameters it is built with under seed s."""
        reset_modules(self)


def reset_modules(module: nn.Module, resetters=None) -> None:
    """Call ``reset_parameters`` of each submodule of `module` in registration order (a model registers
    its modules as it builds them); a submodule without one gets ``resetters[type]`` when given, else
    its own submodules are reset (a ModuleList, a wrapper).  TypeError for one that holds parameters
    itself and has no way to redraw them: a partial reset would pass unnoticed."""
    for name, child in module.named_children():
        reset = getattr(child, "reset_parameters", None)
        if callable(reset):
            reset()
        elif resetters and type(child) in resetters:
            resetters[type(child)](child)
        elif next(child.parameters(recurse=False), None) is not None:
            raise TypeError(f"reset_parameters: {name} ({type(child).__name__}) holds parameters and has no "
                            f"reset_parameters")
        else:
            reset_modules(child, resetters)


class PlainGNN(GNN):
    """L convs, widths in -> hidden ... -> classes; [LayerNorm] -> ReLU -> dropout between convs;
    input dropout on layer 0's gathered source rows."""

    input_dropout_rows = "sources"

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
    residual = True

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


def _conv_count(layers: int, linear_layers: int) -> int:
    """Message-passing layers of a model of `layers` layers whose last `linear_layers` are Linear."""
    if not 0 <= int(linear_layers) < int(layers):
        raise ValueError(f"linear_layers must be in [0, layers) = [0, {layers}) (at least one layer aggregates), "
                         f"got {linear_layers!r}")
    return int(layers) - int(linear_layers)


def register_model(name: str, *, estimator=None, checkpointable: bool = False,
                   options: Sequence[registry.ModelOption] = (), linear_head: bool = False, typed: bool = False):
    """Decorator: make `builder(in_features, hidden, num_classes, layers, dropout, norm, **options)`
    buildable by name.  `estimator` (a memory_model.stacks.ModelEstimate) lets --mode auto and `preprocess plan` estimate
    its memory; `checkpointable`: --checkpoint-activations recomputes its blocks; `options`: its extra
    constructor options (--model-option NAME=VALUE, passed to the builder as keywords); `linear_head`:
    the builder takes `linear_layers=N` (--linear-layers, the last N layers per-vertex Linear ones);
    `typed`: the builder takes `types=GraphTypes` (a model of heterogeneous graphs, registry.py)."""
    def register(builder):
        MODELS.register(name, builder, estimator=estimator, checkpointable=bool(checkpointable),
                        options=tuple(options), linear_head=bool(linear_head), typed=bool(typed))
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
                dropout: float = 0.5, norm: bool = False, linear_layers: int = 0, types=None, **options) -> GNN:
    """Build one of MODELS.  ``norm`` adds LayerNorm between sage/gcn convs; ressage always has LayerNorm.
    ``layers`` counts every layer; the last ``linear_layers`` are per-vertex Linear layers (models whose
    entry has ``linear_head``), so the model aggregates over ``layers - linear_layers`` hops.
    ``types``: the graph's GraphTypes (graph/hetero.py), passed to the models whose entry is ``typed``
    (ValueError for those without it) and not to the others.
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
    if registry.typed(name):
        if types is None:
            raise ValueError(f"model {name!r} needs a heterogeneous shard set (vertex and edge types); build one "
                             f"from a heterogeneous source (docs/heterogeneous.md)")
        options = dict(options, types=types)
    return MODELS[name](int(in_features), int(hidden), int(num_classes), int(layers), float(dropout), bool(norm),
                        **options)

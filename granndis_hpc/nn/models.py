"""GNN models over per-layer one-hop graphs: GraphSAGE, GCN and ResSAGE+ (DeeperGCN "res+" blocks).

Contract with the engine (docs/design.md §6): a model is a stack of layers (nn/contract.py) that
the layer runner runs (nn/runner.py run_stack); it declares its layers and what goes between them, and
what the engine may ask of it (``contract``, an nn.contract.ModelContract, checked by ``check_model``
when ``build_model`` builds it), and ``forward(x, graphs, gather, dropout, settings)`` hands them to the
runner:
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
- ``settings`` (nn/contract.py PassSettings): the run's input dropout, activation checkpointing and row
  dtype (None: none of them).
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

from .contract import Layer, ModelContract, PassSettings  # noqa: F401 (ModelContract: for a model's class)
from .dropout import RowDropout
from .graph import LayerGraph
from .layers import GCNConv, SAGEConv
from .runner import run_stack

# name -> builder(in_features, hidden, num_classes, layers, dropout, norm, **options) -> GNN: the
# dependency-free registry (granndis_hpc/registry.py declares the built-in models by name, so that
# the train parser lists them without importing torch); `register_model` below adds one
# (docs/extending.md: adding a model is one builder registered here).
MODELS: registry.Registry = registry.MODELS

Gather = Callable[[int, torch.Tensor], torch.Tensor]


class GNN(nn.Module):
    """Base class: a stack of layers the layer runner runs (nn/runner.py describes the stacks)."""

    name: str
    num_layers: int  # message-passing layers = hops a full preload needs
    conv_in_widths: List[int]  # width of h handed to gather(l, h)
    # The stack (submodules, set by the subclass): `convs` (the message-passing layers), `norms`
    # (before layer l >= 1: norms[l - 1], or None), `activation`, the per-vertex `linears` after the
    # convs; `residual`: ResSAGE+'s pre-norm blocks with `encoder`, `out_norm` and `head`.
    residual: bool = False
    activation = staticmethod(F.relu)
    attn_dropout: float = 0.0
    dropout: float = 0.0
    # What the engine may ask of the model (nn/contract.py ModelContract; a subclass declares its own).
    # Dropout applies between layers; --input-dropout (PassSettings.input_dropout) also drops the raw
    # input features.  Layer 0's halo is the static features exchanged once at set-up, so input dropout is
    # drawn *after* gather, on own and halo rows alike, keyed by their global ids (RowDropout.sources):
    # every rank draws the owner's mask itself and the cached halo stays valid.  A model that applies it
    # says to which rows (contract.input_dropout_rows; the trainer refuses --input-dropout otherwise).
    # --checkpoint-activations (PassSettings.checkpoint_activations) recomputes each residual block
    # (gather included) in the backward pass instead of keeping its activations.  Every rank recomputes
    # the same blocks in the same order, so the exchanges inside line up; the dropout masks are hashes of
    # their counters (nn/dropout.py), so the recomputed masks are the same by construction.
    contract: ModelContract = ModelContract()

    def forward(self, x: torch.Tensor, graphs: Sequence[LayerGraph], gather: Optional[Gather] = None,
                dropout: Optional[RowDropout] = None, settings: Optional[PassSettings] = None) -> torch.Tensor:
        return run_stack(self, x, graphs, gather, dropout, settings)

    def reset_parameters(self) -> None:
        """Redraw every parameter with its module's own initialisation (each conv's, norm's and Linear's
        ``reset_parameters``), module by module in construction order, so that after
        ``torch.manual_seed(s)`` the model holds the parameters it is built with under seed s."""
        reset_modules(self)


def check_model(model, name: str) -> ModelContract:
    """The contract of a model a builder returned, checked: ValueError naming what the builder must fix.
    A GNN whose class has a forward of its own declares its contract in that class (or a subclass of it):
    the one it inherits describes the stack's forward, not its own."""
    where = f"model {name!r}"
    if not isinstance(model, nn.Module):
        raise ValueError(f"{where}: its builder returned {type(model).__name__}, not a torch.nn.Module")
    contract = getattr(model, "contract", None)
    if not isinstance(contract, ModelContract):
        raise ValueError(f"{where}: {type(model).__name__} declares no `contract` (an nn.contract.ModelContract "
                         f"saying what the engine may ask of it); subclass nn.GNN or set one")
    problem = contract.problem()
    if problem:
        raise ValueError(f"{where}: its contract is wrong: {problem}")
    if not isinstance(model, GNN):
        return contract
    cls = type(model)
    forward_by = next(c for c in cls.__mro__ if "forward" in vars(c))
    declared_by = next((c for c in cls.__mro__ if "contract" in vars(c)), GNN)
    if forward_by is not GNN and "contract" not in vars(model) and not issubclass(declared_by, forward_by):
        raise ValueError(f"{where}: {forward_by.__name__} has a forward of its own; declare its `contract` "
                         f"(nn.contract.ModelContract: keyed, pending_rows, ...) in that class")
    if len(model.convs) != model.num_layers or len(model.conv_in_widths) != model.num_layers:
        raise ValueError(f"{where}: num_layers {model.num_layers}, {len(model.convs)} convs and "
                         f"{len(model.conv_in_widths)} conv_in_widths must agree")
    for l, conv in enumerate(model.convs):
        if not isinstance(conv, Layer):
            raise ValueError(f"{where}: convs[{l}] is a {type(conv).__name__}, not a layer of the layer contract "
                             f"(nn.contract.Layer)")
    return contract


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

    contract = ModelContract(input_dropout_rows="sources")

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

    contract = ModelContract(input_dropout_rows="own", first_layer_prefix="encoder.")
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
    buildable by name.  `estimator` (a memory_model.stacks.ModelEstimate) lets --mode auto and `preprocess plan`
    estimate
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
    model = MODELS[name](int(in_features), int(hidden), int(num_classes), int(layers), float(dropout), bool(norm),
                         **options)
    check_model(model, name)
    return model

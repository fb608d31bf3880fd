"""The `pyg` model family: a user's stack of PyTorch Geometric convolutions, run by the layer runner.

``--model pyg --model-option module=MODULE --model-option factory=NAME``: ``MODULE.NAME(in_features,
hidden, out_features, layers)`` returns the stack's convolutions, one per message-passing layer (the
last one giving ``out_features``: the classes, or --hidden when --linear-layers Linear layers follow).
Between them the stack has [LayerNorm (--norm)] -> ReLU -> dropout (--dropout), keyed by vertex id as for
every model.  ``pyg_stack`` builds the same from a list of convs for a registered model of one's own.

A PyG convolution is not split into parts (nn/contract.py): the runner waits for the halo, then calls it
on the layer's whole bipartite block.  ``PyGLayer`` hands it the block as PyG expects: source rows and
destination rows (the first n_dst source rows) as a pair with ``edge_index`` [2, E] (row 0 the source,
row 1 the destination) where the conv takes bipartite input, else the source rows alone (the output's
first n_dst rows are the destination rows: their in-edges are the block's).  What a conv needs beyond
the neighbourhood is supplied: ``GCNConv(normalize=False)`` gets ``edge_weight`` from the global degrees
(the normalisation of the ``gcn`` model, with PyG's add_remaining_self_loops).  Convs that cannot run
partitioned exactly are refused with the reason (``refusal``).
"""
from __future__ import annotations

import importlib
import inspect
import os
import weakref
from typing import List, Optional, Sequence

import torch
from torch import nn

from granndis_hpc import registry

from .contract import Layer
from .graph import LayerGraph
from .zoo import EdgeGNN

# Convs whose output at a vertex depends on more than its in-edges in the layer's block, with the reason.
_MULTI_HOP = ("ChebConv", "SGConv", "SSGConv", "TAGConv", "APPNP", "ARMAConv", "MixHopConv", "DNAConv")
_LOCAL_DEGREES = ("LGConv", "ClusterGCNConv", "FAConv", "GCN2Conv")


def refusal(conv: nn.Module) -> Optional[str]:
    """Why `conv` cannot run partitioned exactly (None: it can)."""
    name = type(conv).__name__
    try:
        from torch_geometric.nn.conv import MessagePassing
    except ImportError:  # (pyg_stack checks the import first)
        MessagePassing = nn.Module
    if not isinstance(conv, MessagePassing):
        return f"{name} is not a torch_geometric message-passing convolution (torch_geometric.nn.MessagePassing)"
    if name == "GCNConv" and getattr(conv, "normalize", False):
        return ("GCNConv(normalize=True) computes the degrees from the edges of the block it is given, which "
                "on a partition lack the halo rows' other edges; use GCNConv(normalize=False): the runner then "
                "supplies edge_weight from the global degrees")
    if getattr(conv, "cached", False):
        return f"{name}(cached=True) keeps the first block's normalisation for every block; use cached=False"
    if name in _MULTI_HOP:
        return f"{name} propagates over several hops inside one layer; a layer here sees one hop (use one conv per hop)"
    if name in _LOCAL_DEGREES:
        return f"{name} normalises with degrees or inputs it computes from its own block, which a partition truncates"
    return None


def _takes_pair(conv: nn.Module) -> bool:
    """The conv accepts (source rows, destination rows): its forward's x is annotated with a pair."""
    try:
        x = inspect.signature(type(conv).forward).parameters.get("x")
    except (TypeError, ValueError):
        return False
    return x is not None and any(word in str(x.annotation) for word in ("Pair", "Tuple", "tuple"))


# Per graph: its edge_index (and GCN's (edge_index, edge_weight)), built once: the engine reuses a
# layer's graph every epoch.  Weak keys: the cache goes with the graph.
_EDGE_INDEX: "weakref.WeakKeyDictionary[LayerGraph, dict]" = weakref.WeakKeyDictionary()


def edge_index(graph: LayerGraph, gcn: bool = False, dtype: torch.dtype = torch.float32):
    """(edge_index [2, E] as PyG orders it: sources in row 0, destinations in row 1, edge_weight or None).
    gcn: the entries of the gcn adjacency (global degrees, one self loop of weight 1 per destination),
    the weights in `dtype`."""
    cache = _EDGE_INDEX.setdefault(graph, {})
    key = (gcn, dtype if gcn else None)
    if key not in cache:
        if gcn:
            rows, cols, vals = graph.coo("gcn", dtype)
            cache[key] = (torch.stack([cols, rows]), vals)
        else:
            cache[key] = (torch.stack([graph.indices, graph.edge_rows()]), None)
    return cache[key]


class PyGLayer(Layer):
    """One PyG convolution as a layer that is not split (nn/contract.py): called on the whole block."""

    splits_sources = False
    splits_rows = False

    def __init__(self, conv: nn.Module, model: str = "pyg"):
        super().__init__()
        problem = refusal(conv)
        if problem:
            raise ValueError(f"--model {model}: {problem}")
        self.conv = conv
        self.gcn = type(conv).__name__ == "GCNConv"
        self.pair = _takes_pair(conv) and not self.gcn

    def forward(self, h_src: torch.Tensor, graph: LayerGraph, attention=None) -> torch.Tensor:
        index, weight = edge_index(graph, gcn=self.gcn, dtype=h_src.dtype)
        if self.gcn:
            return self.conv(h_src, index, weight)[: graph.n_dst]
        if self.pair:
            return self.conv((h_src, h_src[: graph.n_dst]), index)
        return self.conv(h_src, index)[: graph.n_dst]


class ModelCodeError(ValueError):
    """The user's model code cannot be imported or called, or does not give usable convolutions."""


def _said(exc: BaseException) -> str:
    """An exception as one short line: its type and its text with the line breaks folded."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _code_error(what: str, exc: BaseException, model: str = "pyg") -> ModelCodeError:
    return ModelCodeError(f"--model {model}: {what} raised {_said(exc)}; fix it or name other code with "
                          f"--model-option module=... factory=...")


def _run_user_code(what: str, fn, *args, model: str = "pyg"):
    """fn(*args), whatever it raises as ModelCodeError naming `what`.  SystemExit too: user code that
    calls sys.exit would otherwise end the job with that status and nothing said."""
    try:
        return fn(*args)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 -- the user's code may raise anything
        raise _code_error(what, exc, model) from exc


def _out_width(layer: PyGLayer, width: int, index: int = 0, model: str = "pyg") -> int:
    """The conv's output width for `width` input features, from one call on a two-vertex graph (in eval
    mode and without gradients: no parameter and no random generator is touched)."""
    graph = LayerGraph.from_csr(torch.tensor([0, 1, 2]), torch.tensor([1, 0]), 2)
    was_training = layer.training
    layer.eval()
    try:
        with torch.no_grad():
            out = _run_user_code(f"convolution {index} ({type(layer.conv).__name__}) on {width} input features",
                                 layer, torch.zeros(2, width), graph, model=model)
    finally:
        layer.train(was_training)
    if not torch.is_tensor(out) or out.dim() != 2:
        raise ModelCodeError(f"--model {model}: convolution {index} ({type(layer.conv).__name__}) returned "
                             f"{type(out).__name__}, not a [rows, features] tensor")
    return int(out.shape[-1])


def stack_widths(name: str, layers: Sequence[nn.Module], in_features: int, hidden: int, num_classes: int,
                 linear_layers: int = 0) -> List[int]:
    """The input width of every layer (the PyGLayers `layers`, then the Linear ones) and the output width,
    from one call of each conv; ValueError where the last does not give the classes."""
    if not layers:
        raise ValueError(f"--model {name}: the factory returned no convolution")
    widths = [int(in_features)]
    for index, layer in enumerate(layers):
        widths.append(_out_width(layer, widths[-1], index, name))
    widths += [hidden] * (linear_layers - 1) + [num_classes] if linear_layers else []
    if widths[-1] != num_classes:
        raise ValueError(f"--model {name}: the last layer gives {widths[-1]} features, the dataset has "
                         f"{num_classes} classes")
    return widths


def pyg_stack(name: str, convs: Sequence[nn.Module], in_features: int, hidden: int, num_classes: int,
              dropout: float, norm: bool, linear_layers: int = 0):
    """A model (nn/zoo.py EdgeGNN) of the PyG convs, then `linear_layers` per-vertex Linear layers."""
    layers = [PyGLayer(c, name) for c in convs]
    widths = stack_widths(name, layers, in_features, hidden, num_classes, linear_layers)
    return EdgeGNN(name, layers, widths, dropout, norm)


def _beside(module: str) -> str:
    """Where the module's file is, if it lies in the working directory: the `granndis` command (unlike
    `python script.py`) does not search there, so say how to put it on the path of every rank."""
    top = module.split(".")[0]
    if os.path.isfile(top + ".py") or os.path.isfile(os.path.join(top, "__init__.py")):
        return (f" ({os.path.abspath(top)}{'.py' if os.path.isfile(top + '.py') else '/'} is in the working "
                f"directory, which the ranks do not search: run with PYTHONPATH=$PWD, and under mpirun add "
                f"-x PYTHONPATH, under srun --export=ALL)")
    return ""


def _import(module: str, model: str = "pyg"):
    """The user's module, imported; ModelCodeError saying why it cannot be."""
    try:
        registry.module_name(module)
    except ValueError as exc:
        raise ModelCodeError(f"--model {model}: --model-option module={module[:40]}: {exc}") from None
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise ModelCodeError(f"--model {model}: no module named {module!r} can be imported{_beside(module)}; give "
                                 f"--model-option module=NAME of an installed module or one in a directory on "
                                 f"PYTHONPATH") from None
        raise _code_error(f"importing {module}", exc, model) from exc  # a module it imports is missing
    except (Exception, SystemExit) as exc:  # noqa: BLE001 -- the module's own code may raise anything
        raise _code_error(f"importing {module}", exc, model) from exc


def _factory(module: str, factory: str, model: str = "pyg"):
    obj = getattr(_import(module, model), factory, None)
    if not callable(obj):
        raise ModelCodeError(f"--model {model}: module {module!r} has no function {factory!r}"
                             + ("" if obj is None else f" (it is a {type(obj).__name__})")
                             + "; give --model-option factory=NAME of a function in it")
    return obj


def _conv_list(result, where: str, model: str = "pyg") -> List[nn.Module]:
    """The factory's convolutions: a list (or tuple, or nn.ModuleList) of modules."""
    if isinstance(result, nn.ModuleList):
        result = list(result)
    if not isinstance(result, (list, tuple)):
        raise ModelCodeError(f"--model {model}: {where} returned a {type(result).__name__}, not a list of "
                             "torch_geometric convolutions")
    for index, conv in enumerate(result):
        if not isinstance(conv, nn.Module):
            raise ModelCodeError(f"--model {model}: {where} returned a list holding a {type(conv).__name__} at "
                                 f"position {index}, not a torch_geometric convolution")
    return list(result)


def model_factory(module: str, factory: str, model: str = "pyg"):
    """MODULE.FACTORY, imported (torch_geometric too), not called: ValueError or ModelCodeError saying why not."""
    try:
        import torch_geometric  # noqa: F401
    except ImportError:
        raise ValueError(f"--model {model} needs torch_geometric: pip install '.[pyg]' "
                         "(or pip install torch_geometric)") \
            from None
    if not module:
        raise ModelCodeError(f"--model {model} needs --model-option module=MODULE (an importable module whose FACTORY, "
                             "--model-option factory=NAME, returns the convolutions)")
    return _factory(module, factory, model)


def user_convs(model: str, in_features, hidden, num_classes, layers, module, factory, linear_layers) -> List[nn.Module]:
    """MODULE.FACTORY(in_features, hidden, out_features, convs) -> the convolutions, one per message-passing
    layer (`layers` minus `linear_layers`).  Whatever fails in the user's code is a ModelCodeError of one
    line naming `model` (collective_errors reports it)."""
    fn = model_factory(module, factory, model)
    convs_n = layers - linear_layers
    out = hidden if linear_layers else num_classes
    where = f"{module}.{factory}({in_features}, {hidden}, {out}, {convs_n})"
    convs = _conv_list(_run_user_code(where, fn, in_features, hidden, out, convs_n, model=model), where, model)
    if len(convs) != convs_n:
        raise ModelCodeError(f"--model {model}: {where} returned {len(convs)} convolutions for {convs_n} "
                             "message-passing layers (--layers minus --linear-layers)")
    return convs


def build_pyg(in_features, hidden, num_classes, layers, dropout, norm, module="", factory="build",
              linear_layers=0):
    """The `pyg` model: MODULE.FACTORY(in_features, hidden, out_features, convs) -> the convolutions."""
    convs = user_convs("pyg", in_features, hidden, num_classes, layers, module, factory, linear_layers)
    return pyg_stack("pyg", convs, in_features, hidden, num_classes, dropout, norm, linear_layers)

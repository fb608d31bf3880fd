"""The registries of models and modes: names, capabilities and lazy references, importable without
torch, h5py or mpi4py (options/train_groups.py builds the train parser from them; preprocess reads a mode's rules
for `plan` without importing the engine).

An entry is declared by name with the object it stands for written as ``"module:attribute"``; the
object is imported the first time it is needed (``REGISTRY[name]``), so that listing the names, or
reading an entry's capabilities, imports nothing.  Code that has the object at hand registers it
directly (``nn.models.register_model``, ``engine.modes.register``), and an entry registered that way
reads the capabilities it is not given from the object's attributes.  A registry is a mapping from
name to object: ``tuple(MODELS)`` lists the names, ``MODELS[name]`` is the builder, ``MODES[name]``
the mode class, ``MODELS.entry(name)`` the entry with its capabilities.

What an entry carries (docs/extending.md, the recipes):
- a model: ``checkpointable`` (--checkpoint-activations recomputes its blocks), ``estimator`` (its
  memory, for --mode auto and `preprocess plan`: memory_model/stacks.py ModelEstimate), ``options`` (extra
  constructor options, ``--model-option KEY=VALUE``, as ``ModelOption``s), ``linear_head`` (its builder
  takes ``linear_layers``: --linear-layers), ``typed`` (a model of heterogeneous graphs: its builder
  takes the keyword ``types``, the graph's graph/hetero.py GraphTypes, and it runs only on a shard set
  built from a heterogeneous source);
- a mode: its place in auto's preference (``rank``; ``knob``: "k" prefers the largest preloaded depth,
  "batches" the fewest co-batches), ``phrase`` (how the "why" text names it), ``estimate`` (the row
  counts of its options on a shard set: memory_model/mode_estimates.py), ``exact_full_graph`` (an exact
  full-graph mode: dominated options of these are dropped), ``any_depth`` (serves a set built for
  another depth), ``build`` (the `preprocess build` arguments that make its set, for `plan`), and
  ``needs`` (options it requires: config refuses a run without them), ``baseline`` (the mode every
  speedup is measured against: `granndis report` and the link sweep), ``setup_timer`` (a batched mode's
  timing of a co-batch's set-up on a server graph, engine/cobsetup.py: `plan --inter-rate` prices its
  options with it, as --mode auto does).
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Mapping, MutableMapping, Optional, Sequence, Tuple


def _load(target):
    """The object a "module:attribute" reference names (any other value is the object itself)."""
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass
class Entry:
    """One registered name: its object (or a lazy reference to it) and its capabilities."""

    name: str
    target: Any
    attrs: Dict[str, Any] = field(default_factory=dict)
    _loaded: Any = None

    def load(self):
        if self._loaded is None:
            self._loaded = _load(self.target)
        return self._loaded

    def get(self, key: str, default=None):
        """A capability: as declared, else the registered object's attribute (loaded only then)."""
        if key in self.attrs:
            return self.attrs[key]
        if not isinstance(self.target, str):
            return getattr(self.target, key, default)
        return default

    def resolve(self, key: str, default=None):
        """A capability that may be a lazy reference ("module:attribute"), loaded."""
        value = self.get(key, default)
        return _load(value) if value is not None else default


class Registry(MutableMapping):
    """name -> object, with the entries' capabilities (``entry``) readable without loading them."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: Dict[str, Entry] = {}

    def declare(self, name: str, target: str, **attrs) -> None:
        """A lazily loaded entry (``target`` = "module:attribute")."""
        self._entries[name] = Entry(name, target, dict(attrs))

    def register(self, name: str, obj, **attrs) -> None:
        """An entry for an object at hand; keeps the capabilities a lazy declaration of it gave."""
        old = self._entries.get(name)
        # The declared capabilities stay with the object they declare (the lazy entry, or the same
        # object registered again, e.g. its module reloaded).
        same = old is not None and (isinstance(old.target, str) or getattr(old.target, "__qualname__", None)
                                    == getattr(obj, "__qualname__", object()))
        merged = dict(old.attrs) if same else {}
        merged.update({k: v for k, v in attrs.items() if v is not None})
        self._entries[name] = Entry(name, obj, merged, obj)

    def entry(self, name: str) -> Entry:
        if name not in self._entries:
            raise KeyError(f"unknown {self.kind} {name!r}; choose one of {', '.join(self._entries)}")
        return self._entries[name]

    def entries(self) -> Iterator[Entry]:
        return iter(list(self._entries.values()))

    def __getitem__(self, name):
        return self.entry(name).load()

    def __setitem__(self, name, obj):
        self.register(name, obj)

    def __delitem__(self, name):
        del self._entries[name]

    def __iter__(self):
        return iter(list(self._entries))

    def __len__(self):
        return len(self._entries)

    def __contains__(self, name):
        return name in self._entries

    def __repr__(self):
        return f"Registry({self.kind}: {', '.join(self._entries)})"


# ---------------------------------------------------------------------------------------------------
# Models
@dataclass(frozen=True)
class ModelOption:
    """An extra constructor option of a model (``--model-option NAME=VALUE``)."""

    name: str
    type: type
    default: Any
    help: str = ""
    # The value names code to import (a module, a function in it): only the user gives it, never a file
    # that records a model's options (model_code.py).
    names_code: bool = False


def boolean(text: str) -> bool:
    """A model option's truth value from text: true/false, yes/no, on/off, 1/0."""
    value = str(text).strip().lower()
    if value in ("true", "yes", "on", "1"):
        return True
    if value in ("false", "no", "off", "0"):
        return False
    raise ValueError(f"not a truth value: {text!r} (give true or false)")


boolean.__name__ = "bool"


def _int_at_least(low: int, doc: str):
    """A model option's parser: an integer >= low (its name, as option errors show it, says so)."""
    def parse(text: str) -> int:
        value = int(str(text).strip())
        if value < low:
            raise ValueError(f"{value} < {low}")
        return value
    parse.__name__, parse.__doc__ = f"int >= {low}", doc
    return parse


positive_int = _int_at_least(1, "A model option that counts something (heads): an integer >= 1.")
non_negative_int = _int_at_least(0, "A model option that counts something and may be 0 (0: none, e.g. no basis "
                                    "decomposition).")


def probability(text: str) -> float:
    """A model option that is a dropout probability: a float in [0, 1)."""
    value = float(str(text).strip())
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{value} outside [0, 1)")
    return value


probability.__name__ = "float in [0, 1)"


# Python names as the user writes them: absolute dotted module paths and plain identifiers, at most a
# path's length (a value read from a file is echoed in errors).
_PYTHON_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_NAME_CHARS = 255


def module_name(text: str) -> str:
    """A model option that names a module: an absolute dotted path (pkg.mod), no relative import."""
    value = str(text).strip()
    if len(value) > _MAX_NAME_CHARS or not all(_PYTHON_NAME.fullmatch(part) for part in value.split(".")):
        raise ValueError(f"not an absolute module name like pkg.module: {value[:40]!r}")
    return value


module_name.__name__ = "module name"


def python_name(text: str) -> str:
    """A model option that names a function of a module: a Python identifier."""
    value = str(text).strip()
    if len(value) > _MAX_NAME_CHARS or not _PYTHON_NAME.fullmatch(value):
        raise ValueError(f"not a Python identifier: {value[:40]!r}")
    return value


python_name.__name__ = "Python identifier"


def code_options(model: str) -> Tuple[str, ...]:
    """The names of the model's options that name code to import (``names_code``)."""
    return tuple(o.name for o in (MODELS.entry(model).get("options") or ()) if o.names_code)


def model_options(model: str, items: Optional[Sequence[str]] = ()) -> Dict[str, Any]:
    """The model's extra constructor options: its declared defaults, overridden by ``NAME=VALUE`` items.
    ValueError, naming the model's options, for an unknown name or a value of the wrong type."""
    declared: Mapping[str, ModelOption] = {o.name: o for o in (MODELS.entry(model).get("options") or ())}
    out = {name: o.default for name, o in declared.items()}
    for item in items or ():
        name, sep, text = str(item).partition("=")
        name = name.strip().replace("-", "_")
        known = ", ".join(f"{o.name} ({o.type.__name__}, default {o.default!r})" for o in declared.values())
        if not sep or name not in declared:
            raise ValueError(f"--model-option {item!r}: model {model!r} has " + (
                f"the options {known}; give NAME=VALUE" if declared else "no extra constructor options"))
        try:
            out[name] = declared[name].type(text.strip())
        except (TypeError, ValueError):
            raise ValueError(f"--model-option {item!r}: {name} must be of type {declared[name].type.__name__}, "
                             f"got {text.strip()!r}") from None
    return out


def typed(model: str) -> bool:
    """Whether the model needs the graph's vertex and edge types (a heterogeneous shard set); False for a
    name no model is registered under."""
    return model in MODELS and bool(MODELS.entry(model).get("typed", False))


def checkpointable(model: str) -> bool:
    """Whether --checkpoint-activations recomputes anything in this model."""
    return bool(MODELS.entry(model).get("checkpointable", False))


def linear_head_problem(model: str, layers: int, linear_layers: Optional[int]) -> Optional[str]:
    """Why `linear_layers` per-vertex Linear layers at the end of a `layers`-layer `model` cannot be
    built (None: they can, or none are asked for)."""
    if not linear_layers:
        return None
    if not MODELS.entry(model).get("linear_head", False):
        able = [e.name for e in MODELS.entries() if e.get("linear_head")]
        return (f"--linear-layers makes the last layers per-vertex Linear layers, which model {model!r} does not "
                f"build: use one of {', '.join(able)}, or leave --linear-layers out")
    if int(linear_layers) >= int(layers):
        return (f"--linear-layers {linear_layers} leaves no aggregating layer of the {layers} of --layers: "
                f"--layers counts every layer (aggregating + Linear), so give --layers {int(linear_layers) + 1} "
                f"or more, or fewer --linear-layers")
    return None


MODELS = Registry("model")
MODELS.declare("sage", "granndis_hpc.nn.models:_sage", estimator="granndis_hpc.memory_model.stacks:SAGE_ESTIMATE",
               linear_head=True)
MODELS.declare("gcn", "granndis_hpc.nn.models:_gcn", estimator="granndis_hpc.memory_model.stacks:GCN_ESTIMATE",
               linear_head=True)
MODELS.declare("ressage", "granndis_hpc.nn.models:_ressage", checkpointable=True,
               estimator="granndis_hpc.memory_model.stacks:RESSAGE_ESTIMATE", linear_head=True)
MODELS.declare("gat", "granndis_hpc.nn.zoo:build_gat", estimator="granndis_hpc.memory_model.zoo_stacks:GAT_ESTIMATE",
               options=(
    ModelOption("heads", positive_int, 8, "attention heads of every hidden conv (each --hidden wide)"),
    ModelOption("out_heads", positive_int, 1, "attention heads of the last conv, averaged into the classes"),
    ModelOption("concat", boolean, True, "concatenate the hidden convs' heads (false: average them)"),
    ModelOption("attn_dropout", probability, 0.0, "dropout of the normalised attention weights, keyed by edge"),
    ModelOption("negative_slope", float, 0.2, "LeakyReLU slope of the attention logits")), linear_head=True)
MODELS.declare("gin", "granndis_hpc.nn.zoo:build_gin", estimator="granndis_hpc.memory_model.zoo_stacks:GIN_ESTIMATE",
               options=(ModelOption("eps", float, 0.0, "initial value of the learnable eps"),), linear_head=True)
MODELS.declare("sage-sum", "granndis_hpc.nn.zoo:build_sage_sum",
               estimator="granndis_hpc.memory_model.zoo_stacks:SAGE_SUM_ESTIMATE", linear_head=True)
MODELS.declare("sage-max", "granndis_hpc.nn.zoo:build_sage_max",
               estimator="granndis_hpc.memory_model.zoo_stacks:SAGE_MAX_ESTIMATE", linear_head=True)
# The relational models' learnable input of featureless vertex types (nn/hetero_models.py).
EMBED_OPTION = ModelOption("embed", str, "", "vertex types whose input is a learnable embedding per vertex instead "
                           "of their features, comma-separated (e.g. author,institution)")
# Their per-type input projection (nn/hetero_models.py): needed where the vertex types' widths differ.
PROJECT_OPTION = ModelOption("project", non_negative_int, 0, "a Linear per vertex type from its feature width to "
                             "this width before layer 0 (0: --hidden where the types' widths differ, none where "
                             "they do not)")
MODELS.declare("rgcn", "granndis_hpc.nn.hetero_models:build_rgcn", typed=True, linear_head=True,
               estimator="granndis_hpc.memory_model.hetero_stacks:RGCN_ESTIMATE", options=(
    ModelOption("num_bases", non_negative_int, 0, "basis decomposition of the relation weights (0: one per relation)"),
    EMBED_OPTION, PROJECT_OPTION))
MODELS.declare("rgat", "granndis_hpc.nn.hetero_models:build_rgat", typed=True, linear_head=True,
               estimator="granndis_hpc.memory_model.hetero_stacks:RGAT_ESTIMATE", options=(
    ModelOption("heads", positive_int, 4, "attention heads of every hidden conv (each --hidden wide), per relation"),
    ModelOption("out_heads", positive_int, 1, "attention heads of the last conv, averaged into the classes"),
    ModelOption("attn_dropout", probability, 0.0, "dropout of the normalised attention weights, keyed by edge"),
    EMBED_OPTION, PROJECT_OPTION))
MODELS.declare("pyg", "granndis_hpc.nn.pyg:build_pyg", estimator="granndis_hpc.memory_model.pyg_stacks:PYG_ESTIMATE",
               linear_head=True, options=(
    ModelOption("module", module_name, "", "importable module whose factory returns the torch_geometric convolutions",
                names_code=True),
    ModelOption("factory", python_name, "build", "function of module: (in_features, hidden, out_features, layers) -> "
                                                 "convs", names_code=True)))
MODELS.declare("pyg-hetero", "granndis_hpc.nn.pyg_hetero:build_pyg_hetero", typed=True, linear_head=True,
               estimator="granndis_hpc.memory_model.pyg_stacks:PYG_HETERO_ESTIMATE",
               options=tuple(MODELS.entry("pyg").get("options")) + (PROJECT_OPTION,))


# ---------------------------------------------------------------------------------------------------
# Modes
MODES = Registry("mode")
_ESTIMATES = "granndis_hpc.memory_model.mode_estimates"
MODES.declare("fb", "granndis_hpc.engine.modes:FullBatch", rank=3, phrase="fb", exact_full_graph=True, baseline=True,
              any_depth=True, estimate=f"{_ESTIMATES}:full_batch",
              build="--preload full --hops 1   (train --mode fb: the world view only)")
MODES.declare("flx", "granndis_hpc.engine.modes:FlexiblePreload", rank=0, knob="k", train_option="preloaded_layers",
              phrase="flx with the largest k",
              exact_full_graph=True, estimate=f"{_ESTIMATES}:flexible_preload",
              build="--preload full --hops {k}   (train --mode flx)")
MODES.declare("eas", "granndis_hpc.engine.modes:ExpansionAware", rank=1, phrase="EAS",
              estimate=f"{_ESTIMATES}:expansion_aware",
              build="--preload eas --hops {eas_hops} --eas-fanout {fanout}   (train --mode eas)")
MODES.declare("cob", "granndis_hpc.engine.modes:CooperativeBatching", rank=2, knob="batches",
              train_option="batches_per_epoch",
              phrase="cob with the fewest co-batches", estimate=f"{_ESTIMATES}:cooperative_batching",
              setup_timer="granndis_hpc.engine.cobsetup:time_server_graph",
              build="--preload eas --hops {eas_hops} --eas-fanout {fanout}   (train --mode cob --batches-per-epoch "
                    "{batches} --fanout {cob_fanout})")
MODES.declare("mb", "granndis_hpc.engine.modes:PerGpuMiniBatch")
MODES.declare("auto", "granndis_hpc.engine.modes:Automatic", needs=(
    ("memory_per_gpu", "--mode auto chooses the preload that fits a GPU's memory: give --memory-per-gpu SIZE "
                       "(e.g. 40GiB), or choose a mode"),))


def baseline_mode() -> str:
    """The mode whose runs are the baseline of every reported speedup (the entry marked ``baseline``)."""
    names = [e.name for e in MODES.entries() if e.get("baseline")]
    if len(names) != 1:
        raise LookupError(f"exactly one mode must be marked baseline in the registry, found {names}")
    return names[0]


def mode_problem(mode: str, cfg) -> Optional[str]:
    """What a mode needs of the other options and `cfg` lacks (its declared ``needs``), or None."""
    for name, message in MODES.entry(mode).get("needs") or ():
        if getattr(cfg, name, None) is None:
            return message
    return None


def auto_modes() -> Tuple[Entry, ...]:
    """The modes --mode auto and `preprocess plan` estimate, in auto's preference order."""
    return tuple(sorted((e for e in MODES.entries() if e.get("rank") is not None), key=lambda e: e.get("rank")))

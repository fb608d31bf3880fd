"""Options declared once: a dataclass whose fields carry help, choices, defaults and ranges, from which
the command-line parser, the TOML reader and ``--help`` are derived; and the resolved config of a run.

Declaring an option (see :class:`TrainConfig`)::

    epochs: int = option(200, "training epochs", ge=1)

``option(default, help, **rules)`` is ``dataclasses.field`` with the rules in its metadata:
``choices``, ``ge``/``gt``/``le``/``lt`` (ranges), ``check`` (a callable returning a problem or None),
``parse`` (a converter from text, e.g. a size parser), ``flag`` (a flag name other than ``--name``,
e.g. ``--no-eval`` for a bool that defaults to True), ``nargs="+"`` or ``append=True`` for lists,
``metavar``, ``on_resume`` ("keep", "may_change" or "reset", read by cli.resume_config and the checkpoint
fingerprint) and ``fingerprint=False`` (a "keep" option that a checkpoint checks otherwise).
The same rules run three times from that one place: when a command-line word is converted (argparse
``type=``), when a TOML value is read, and in ``__post_init__`` (:func:`validate`), so a TrainConfig
built in code is checked exactly like one parsed from a command line.

Rules for ``--config FILE.toml`` (one place, so every tool behaves the same):

- The file is FLAT: ``key = value`` pairs at top level, no ``[sections]``.  Keys are the field names;
  ``batches-per-epoch`` and ``batches_per_epoch`` mean the same thing.  A value is what the field
  holds: ``--no-eval`` (field ``eval``, default true) is written ``eval = false``.  Flat keys were
  chosen over sections because every option already has exactly one name on the command line, and a
  section would be a second name for the same thing that could disagree with it.
- Precedence: command line > config file > the field's default.
- File values are checked against the field the way the command line's text is checked (type,
  choices, range, ``parse``, lists), so a wrong file is an error before any work starts.  Every
  problem is a :class:`ConfigError` that names the file, the key, what was expected and what was found.
- Unknown keys are errors (a typo must not silently fall back to a default) with close matches.

The resolved config (every option after precedence) is written to ``RUN_DIR/config.json`` so a run can
be reproduced and ``granndis report`` can label it.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import sys
import typing
from dataclasses import MISSING, dataclass
from typing import Any, Dict, List, Optional, Tuple

from granndis_hpc.fsutil import atomic_write_json, read_json_object

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python < 3.11 (pyproject pulls in tomli there)
    import tomli as tomllib

CONFIG_FILE_NAME = "config.json"


class ConfigError(ValueError):
    """A configuration file (or a resolved config, or an option value) is wrong; the message says what
    and how to fix it."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """For hand-written parsers (granndis report): keep line breaks of descriptions and epilogs, and
    show defaults.  Parsers derived from an options dataclass write their defaults into the help text
    themselves (see :func:`build_parser`), so they need nothing beyond RawDescriptionHelpFormatter."""


# ---------------------------------------------------------------------------------------------
# Declaring options


def option(default=MISSING, help: Optional[str] = None, **rules):
    """A dataclass field with its command-line rules in the metadata (see the module docstring).
    A list default is given as a list and copied per instance."""
    unknown = set(rules) - _RULES
    if unknown:
        raise TypeError(f"option(): unknown rule(s) {sorted(unknown)}; known: {sorted(_RULES)}")
    metadata = dict(rules, help=help)
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


_RULES = {"choices", "ge", "gt", "le", "lt", "check", "parse", "flag", "nargs", "append", "metavar", "on_resume",
          "fingerprint"}
_NO_DEFAULT = object()


@dataclass(frozen=True)
class _Spec:
    """What the parser, the TOML reader and the validator need to know about one field."""
    name: str
    kind: type                 # int, float, str or bool (the element type for lists)
    optional: bool             # None is allowed
    is_list: bool
    default: Any               # _NO_DEFAULT for a required option
    meta: Dict

    @property
    def flag(self) -> str:
        return self.meta.get("flag") or "--" + self.name.replace("_", "-")

    @property
    def required(self) -> bool:
        return self.default is _NO_DEFAULT


def _unwrap(tp) -> Tuple[type, bool, bool]:
    """(element type, optional, is_list) of an annotation such as Optional[List[int]]."""
    optional = False
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Union and type(None) in args:
        optional = True
        tp = next(a for a in args if a is not type(None))
    is_list = typing.get_origin(tp) in (list, List)
    if is_list:
        tp = typing.get_args(tp)[0]
    if tp not in (int, float, str, bool):
        raise TypeError(f"option type {tp!r} is not supported (int, float, str, bool, lists of them)")
    return tp, optional, is_list


def specs(cls) -> List[_Spec]:
    """The option specs of an options dataclass, in declaration order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind, optional, is_list = _unwrap(hints[f.name])
        if f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = _NO_DEFAULT
        out.append(_Spec(f.name, kind, optional, is_list, default, dict(f.metadata)))
    return out


def defaults(cls) -> Dict[str, Any]:
    """{field: default} of an options dataclass (None for a required field)."""
    return {s.name: (None if s.required else s.default) for s in specs(cls)}


# ---------------------------------------------------------------------------------------------
# Checking one value (shared by the command line, the TOML reader and __post_init__)


def _describe(value) -> str:
    return f"{value!r} ({type(value).__name__})"


def allowed_choices(meta: Dict) -> Optional[tuple]:
    """An option's choices: a tuple, or a callable returning one (a registry read when the option is
    parsed or checked, so that a mode or model registered after import is a valid choice)."""
    choices = meta.get("choices")
    return tuple(choices()) if callable(choices) else choices


def _range_problem(spec: _Spec, value) -> Optional[str]:
    m = spec.meta
    # NaN compares false with every bound, and infinity passes a lower one: refuse both for every float
    # option, wherever the value came from (command line, TOML, code).
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    for key, bad, text in (("ge", lambda v, b: v < b, ">="), ("gt", lambda v, b: v <= b, ">"),
                           ("le", lambda v, b: v > b, "<="), ("lt", lambda v, b: v >= b, "<")):
        if key in m and bad(value, m[key]):
            return f"must be {text} {m[key]}, got {value!r}"
    allowed = allowed_choices(m)
    if allowed is not None and value not in allowed:
        return f"{value!r} is not one of the allowed values: {', '.join(repr(c) for c in allowed)}"
    if m.get("check") is not None:
        return m["check"](value)
    return None


def _parse_name(spec: _Spec) -> str:
    parse = spec.meta.get("parse")
    return getattr(parse, "__name__", None) or repr(parse)


def _scalar_from_text(spec: _Spec, text: str):
    """Command-line word -> value of one element, range-checked (argparse ``type=``)."""
    try:
        if spec.meta.get("parse") is not None:
            value = spec.meta["parse"](text)
        elif spec.kind is int:
            value = int(text)
        elif spec.kind is float:
            value = float(text)
        else:
            value = text
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        what = _parse_name(spec) if spec.meta.get("parse") else {int: "an integer", float: "a number"}[spec.kind]
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}" + (f": {exc}" if spec.meta.get("parse") else ""))
    problem = _range_problem(spec, value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def _scalar_from_file(spec: _Spec, value, where: str):
    """TOML value -> value of one element, checked the way the command line checks its text."""
    if spec.meta.get("parse") is not None:
        # A custom converter (a size parser, a positive-int parser): feed it the command line's text.
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ConfigError(f"{where}: expected a value for {_parse_name(spec)}, got {_describe(value)}")
        try:
            out = spec.meta["parse"](value if isinstance(value, str) else str(value))
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            raise ConfigError(f"{where}: {_describe(value)} is not a valid {_parse_name(spec)}: {exc}") from None
    elif spec.kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {_describe(value)}")
        out = value
    elif spec.kind is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {_describe(value)}")
        out = value
    elif spec.kind is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {_describe(value)}")
        out = float(value)
    else:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {_describe(value)}; quote it in the file")
        out = value
    problem = _range_problem(spec, out)
    if problem:
        raise ConfigError(f"{where}: {problem}")
    return out


def _from_file(spec: _Spec, value, where: str):
    if not spec.is_list:
        return _scalar_from_file(spec, value, where)
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list like [a, b], got {_describe(value)}")
    if spec.meta.get("nargs") == "+" and not value:
        raise ConfigError(f"{where}: expected a non-empty list")
    return [_scalar_from_file(spec, v, f"{where}[{i}]") for i, v in enumerate(value)]


def validate(obj) -> None:
    """Check every field of an options dataclass instance against its rules (for __post_init__);
    ConfigError naming the option (as its flag) and the problem."""
    for spec in specs(type(obj)):
        value = getattr(obj, spec.name)
        where = f"{spec.flag}"
        if value is None:
            if spec.optional or (spec.is_list and spec.meta.get("append")):
                continue
            raise ConfigError(f"{where} is required" if spec.required else f"{where} cannot be None")
        items = value if spec.is_list else [value]
        if spec.is_list and not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {_describe(value)}")
        for item in items:
            ok = (isinstance(item, bool) if spec.kind is bool else
                  isinstance(item, spec.kind) and not isinstance(item, bool) if spec.kind is int else
                  isinstance(item, (int, float)) and not isinstance(item, bool) if spec.kind is float else
                  isinstance(item, str))
            if not ok:
                raise ConfigError(f"{where}: expected {spec.kind.__name__}, got {_describe(item)}")
            if spec.meta.get("parse") is not None and isinstance(item, str):
                try:
                    spec.meta["parse"](item)
                except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
                    raise ConfigError(f"{where}: {item!r} is not a valid {_parse_name(spec)}: {exc}") from None
            problem = _range_problem(spec, item)
            if problem:
                raise ConfigError(f"{where}: {problem}")


# ---------------------------------------------------------------------------------------------
# The parser and --help


def _help_text(spec: _Spec) -> str:
    text = spec.meta.get("help") or ""
    bounds = [f"{sign} {spec.meta[key]}" for key, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
              if key in spec.meta]
    if bounds:  # the range checked at parse time, so --help says it before an error has to
        text += (" " if text else "") + f"[{', '.join(bounds)}]"
    text = text.replace("%", "%%")  # argparse %-formats help strings
    if spec.required or "(default:" in text:
        return text
    if spec.kind is bool and not spec.is_list:
        default = "off"  # a flag: "--no-eval (default: True)" would read as if the flag were on
    else:
        default = spec.default
    return (text + " " if text else "") + f"(default: {default})".replace("%", "%%")


def build_parser(cls, prog: Optional[str] = None, description: Optional[str] = None,
                 epilog: Optional[str] = None) -> argparse.ArgumentParser:
    """The command-line parser of an options dataclass (plus ``--config`` unless the class has a
    ``config`` field).  Every option's default is argparse.SUPPRESS, so the namespace holds only what
    the command line gave (precedence is applied by :func:`read_options`)."""
    p = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                argument_default=argparse.SUPPRESS)
    names = set()
    for spec in specs(cls):
        names.add(spec.name)
        kwargs = {"dest": spec.name, "help": _help_text(spec)}
        if spec.meta.get("metavar"):
            kwargs["metavar"] = spec.meta["metavar"]
        if spec.kind is bool and not spec.is_list:
            kwargs.pop("metavar", None)
            kwargs["action"] = "store_false" if spec.default is True else "store_true"
        else:
            kwargs["type"] = (lambda s: (lambda text: _scalar_from_text(s, text)))(spec)
            kwargs["type"].__name__ = spec.name  # argparse names the converter in some messages
            if spec.meta.get("choices") is not None and spec.meta.get("parse") is None:
                kwargs["choices"] = allowed_choices(spec.meta)
            if spec.is_list:
                if spec.meta.get("append"):
                    kwargs["action"] = "append"
                else:
                    kwargs["nargs"] = spec.meta.get("nargs", "+")
        p.add_argument(spec.flag, **kwargs)
    if "config" not in names:
        p.add_argument("--config", metavar="FILE.toml", dest="config",
                       help="TOML file with option values (keys = option names, '-' or '_'); options given "
                            "on the command line override it (default: None)")
    return p


# ---------------------------------------------------------------------------------------------
# The TOML reader


def _keys(cls) -> Dict[str, _Spec]:
    """Every accepted key spelling (the field name, with '_' or '-') -> its spec.  Flag names that
    differ from the field (``--no-eval`` for ``eval``) are deliberately not keys: ``no-eval = true``
    would read as the opposite of what it does."""
    by_key = {}
    for spec in specs(cls):
        if spec.name != "config":
            by_key[spec.name] = by_key[spec.name.replace("_", "-")] = spec
    return by_key


def _flag_hint(cls, key: str) -> Optional[str]:
    for spec in specs(cls):
        if spec.flag == "--" + key and key.replace("-", "_") != spec.name:
            example = f"{spec.name} = false" if spec.kind is bool and spec.default is True else f"{spec.name} = ..."
            return f" The flag --{key} stores into {spec.name!r}: write '{example}' in the config file."
    return None


def load_config_file(path, cls) -> Dict[str, Any]:
    """Read and check a TOML file against the options dataclass `cls`; return {field: value}."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} not found (check the --config path)") from None
    except OSError as exc:
        raise ConfigError(f"config file {path!r} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path!r} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8: random bytes, or a Latin-1 file
        raise ConfigError(f"config file {path!r} is not valid TOML: not UTF-8 text ({exc.reason} at byte "
                          f"{exc.start}); save it as UTF-8") from None
    except RecursionError:
        raise ConfigError(f"config file {path!r} is not valid TOML for options: its values nest too deeply "
                          f"(options are flat 'name = value' lines)") from None

    keys = _keys(cls)
    values, seen_as = {}, {}
    for key, value in raw.items():
        where = f"config file {path!r}, key {key!r}"
        if isinstance(value, dict):
            raise ConfigError(f"{where}: [sections] are not supported; write every option as a "
                              f"top-level 'name = value' line (before any [section] header)")
        if key.replace("-", "_") == "config":
            raise ConfigError(f"{where}: a config file cannot name another config file")
        spec = keys.get(key)
        if spec is None:
            flag_hint = _flag_hint(cls, key)
            if flag_hint:
                raise ConfigError(f"{where}: not an option name.{flag_hint}")
            close, named = [], set()
            for name in difflib.get_close_matches(key, sorted(keys), n=6, cutoff=0.6):
                if keys[name].name not in named:  # one spelling per option, the closest one
                    named.add(keys[name].name)
                    close.append(name)
            close = close[:3]
            hint = (" Did you mean " + " or ".join(repr(c) for c in close) + "?") if close else \
                " Run with --help for the list of options."
            raise ConfigError(f"{where}: unknown option.{hint}")
        if spec.name in seen_as:
            raise ConfigError(f"{where}: the same option is also given as {seen_as[spec.name]!r}; keep one of them")
        seen_as[spec.name] = key
        values[spec.name] = _from_file(spec, value, where)
    return values


# ---------------------------------------------------------------------------------------------
# Command line + file


def read_options(cls, argv=None, prog: Optional[str] = None, description: Optional[str] = None,
                 epilog: Optional[str] = None) -> Tuple[Dict[str, Any], Dict[str, Any], Optional[str]]:
    """(options given on the command line, options from --config FILE.toml, the file's path), with no
    defaults applied, so a caller can tell what the user asked for and where (``--resume`` does).
    argparse exits with status 2 on a bad flag or value (and 0 on --help); a bad file raises ConfigError."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(cls, prog, description, epilog)
    command_line = vars(parser.parse_args(argv))  # --help exits here, before a broken file is read
    path = command_line.get("config")  # only a file named on the command line is read, never a default
    if "config" not in {s.name for s in specs(cls)}:
        command_line.pop("config", None)
    file_values = load_config_file(path, cls) if path is not None else {}
    return command_line, file_values, path


def missing_required(cls, given: Dict[str, Any]) -> List[str]:
    """Flags of the required options that `given` lacks."""
    return [s.flag for s in specs(cls) if s.required and s.name not in given]


def parse_args_with_config(cls, argv=None, prog: Optional[str] = None, description: Optional[str] = None,
                           epilog: Optional[str] = None) -> argparse.Namespace:
    """Every option of `cls` after precedence (command line > --config FILE.toml > defaults), plus
    ``config`` (the file's path or None).  A required option missing from both is a usage error
    (exit status 2), as argparse makes it."""
    command_line, file_values, path = read_options(cls, argv, prog, description, epilog)
    given = {**file_values, **command_line}
    missing = missing_required(cls, given)
    if missing:
        build_parser(cls, prog, description, epilog).error(
            f"the following arguments are required: {', '.join(missing)}")
    values = defaults(cls)
    values.update(given)
    values.setdefault("config", path)
    return argparse.Namespace(**values)


def resume_rule(cls, rule: str) -> frozenset:
    """Names of the fields of `cls` whose on_resume rule is `rule` ("keep" when not given)."""
    return frozenset(s.name for s in specs(cls) if s.meta.get("on_resume", "keep") == rule)


# ---------------------------------------------------------------------------------------------
# The options of granndis-train

# The same lists as cluster.topology.DEVICES / TRANSPORTS (tests/unit/test_config.py keeps them equal).
# Not imported from there: that module imports mpi4py, which initialises MPI, and `granndis report`
# reads this module on machines without MPI.
DEVICE_NAMES = ("auto", "cpu", "cuda")
TRANSPORT_NAMES = ("auto", "gloo", "nccl", "mpi")
# Models whose recomputation --checkpoint-activations is implemented for (nn/models.py: only ResSAGE+
# wraps its residual blocks in torch.utils.checkpoint; sage/gcn are shallow and would ignore it).
CHECKPOINTABLE_MODELS = ("ressage",)
# --weight-decay-on: every parameter, or the first layer's only (nn/models.py GNN.first_layer_prefix).
WEIGHT_DECAY_ON = ("all", "first")
# --halo-dtype: the wire format of training halo rows (engine/exchange.py); float32 is exact.
HALO_DTYPES = ("float32", "bfloat16", "float16")


def _mode_names():
    # The engine's registry (engine/modes.py): one place declares the modes.
    from granndis_hpc.engine.modes import MODES
    return tuple(MODES)


def _model_names():
    from granndis_hpc.nn.models import MODELS
    return tuple(MODELS)


def _sampler_names():
    from granndis_hpc.graph.sampler import SAMPLERS
    return tuple(SAMPLERS)


def _size_text(text: str) -> str:
    """A memory size as written ('40GiB'), checked with units.parse_size and kept as written, so that
    config.json records what the user typed."""
    from granndis_hpc.units import parse_size
    parse_size(text)
    return text


_size_text.__name__ = "size"


def _fanout_problem(value: int) -> Optional[str]:
    if value == -1 or value >= 1:
        return None
    return f"must be a positive number of neighbours or -1 for all, got {value}"


@dataclass
class TrainConfig:
    """Every option of `granndis-train`; the parser, --config and --help are derived from it."""
    # on_resume: "keep" (default) = a resumed run must have the same value, and the checkpoint
    # fingerprint holds it (it changes the trajectory); "may_change" = given again with --resume it wins
    # (nothing the numbers depend on, or checked otherwise: shards, ranks_per_server, mode and
    # preloaded_layers are the fingerprint's shape, which only the exact modes may change, see
    # engine/checkpoint.py); "reset" = not carried over from the run being resumed.
    shards: str = option(help="shard directory written by `python -m preprocess build` (required, except with "
                              "--resume)", on_resume="may_change")
    mode: str = option("flx", choices=_mode_names, on_resume="may_change",
                       help="fb: full-batch baseline (1-hop halo every layer, world-wide); flx: flexible "
                            "preloading (full k-hop preload, only gradients cross servers); eas: "
                            "expansion-aware sampled preload; cob: cooperative batching (a server's GPUs share "
                            "one co-batch); mb: per-GPU mini-batches (the baseline cob is measured against); "
                            "auto: GraNNDis' automatic choice for --memory-per-gpu")
    model: str = option("sage", choices=_model_names, help="GNN architecture")
    layers: int = option(3, ge=1, help="message-passing layers")
    hidden: int = option(64, ge=1, help="hidden width")
    epochs: int = option(200, ge=1, on_resume="may_change", help="training epochs")
    lr: float = option(0.01, gt=0.0, help="Adam learning rate")
    weight_decay: float = option(0.0, ge=0.0, help="Adam weight decay")
    weight_decay_on: str = option("all", choices=WEIGHT_DECAY_ON,
                                  help="parameters --weight-decay applies to: all, or first = the layer that "
                                       "reads the input features (Kipf & Welling's GCN and PyG's examples/gcn.py "
                                       "decay conv 0 only)")
    dropout: float = option(0.5, ge=0.0, lt=1.0, help="dropout probability")
    input_dropout: float = option(0.0, ge=0.0, lt=1.0,
                                  help="dropout probability of the input features (Kipf & Welling's GCN: 0.5); "
                                       "keyed by vertex id like --dropout, so cached halo rows need no exchange")
    norm: bool = option(False, help="LayerNorm between sage/gcn layers")
    seed: int = option(0, ge=0, help="seed for parameters and dropout")
    eval_every: int = option(10, ge=0, on_resume="may_change",
                             help="exact full-graph evaluation every N epochs (and always at the end); "
                                  "0 = only at the end")
    out: Optional[str] = option(None, on_resume="may_change",
                                help="run directory (config.json, metrics.jsonl, summary.json, checkpoints); "
                                     "one that already holds a run is refused: continue it with --resume, "
                                     "or give --overwrite-run")
    ranks_per_server: Optional[int] = option(None, ge=1, on_resume="may_change",
                                             help="emulate servers of N ranks (default: env "
                                                  "GRANNDIS_RANKS_PER_SERVER, else one server per shared-memory "
                                                  "node)")
    device: str = option("auto", choices=DEVICE_NAMES, help="auto = cuda:local_rank when CUDA is available")
    intra_transport: str = option("auto", choices=TRANSPORT_NAMES, on_resume="may_change",
                                  help="intra-server transport (auto: NCCL on GPU, measured default on CPU)")
    quiet: bool = option(False, on_resume="may_change", help="no per-epoch lines on stdout and no progress bar")
    skip_checksums: bool = option(False, on_resume="may_change", help="do not verify shard sha256 at start-up")
    verify_content: bool = option(False, on_resume="may_change",
                                  help="before training, recompute the dataset content digest from the rows the "
                                       "ranks read and refuse a set whose files were edited after the build "
                                       "(dataset.content_sha256; the dataset's bytes travel to rank 0 once)")
    # Checkpoints (engine/checkpoint.py): every N epochs (0 = only when SIGUSR1/SIGTERM asks to stop),
    # and the run directory to continue from (its newest complete checkpoint).
    checkpoint_every: int = option(0, ge=0, metavar="N", on_resume="may_change",
                                   help="write a checkpoint into RUN_DIR/checkpoints/ every N epochs (the newest "
                                        "2 complete ones are kept); 0 = only when SIGUSR1 or SIGTERM asks the run "
                                        "to stop, which it does after the current epoch, with a checkpoint, "
                                        "exiting 0")
    resume: Optional[str] = option(None, metavar="RUN_DIR", on_resume="may_change",
                                   help="continue RUN_DIR from its newest complete checkpoint (from epoch 0 when "
                                        "it has none yet) with the options in RUN_DIR/config.json (nothing else "
                                        "is needed); options given again may differ only for --epochs, "
                                        "--eval-every, --checkpoint-every, --quiet, --progress, --skip-checksums, "
                                        "--intra-transport, and --shards / --ranks-per-server / --mode / "
                                        "--preloaded-layers when they name the same shard set and layout, or, in "
                                        "the exact modes fb and flx, the same dataset built for another layout")
    overwrite_run: bool = option(False, on_resume="reset",
                                 help="replace the run that --out already holds (it is deleted only after the new "
                                      "run has written its config.json)")
    # Cooperative batching (cob) and the per-GPU mini-batch baseline (mb).  Not in the checkpoint
    # fingerprint: the sampler's saved state holds them and its load_state_dict refuses other values,
    # in the modes where they change anything (the others never read them).
    batches_per_epoch: int = option(1, ge=1, fingerprint=False,
                                    help="cob/mb: co-batches per epoch (each server's training vertices in "
                                         "shuffled chunks)")
    sampler: str = option("sage", choices=_sampler_names, fingerprint=False,
                          help="cob/mb: sage = per-hop fanout sampling of the dependency graph; saint = the "
                               "subgraph induced on the batch")
    fanout: int = option(-1, check=_fanout_problem, fingerprint=False,
                         help="cob/mb: in-neighbours kept per vertex and hop (-1 = all)")
    sequential_sampling: bool = option(
        False, on_resume="may_change",
        help="cob/mb: sample each co-batch on the main thread after the previous step, instead of in a "
             "background thread while it computes (the same samples either way; for measuring the overlap)")
    checkpoint_activations: bool = option(
        False, help="recompute each residual block (its exchange included) in the backward pass instead of "
                    "keeping its activations (deep models, less memory); ressage only: refused for sage and "
                    "gcn, which have no residual blocks")
    preloaded_layers: Optional[int] = option(
        None, ge=1, metavar="K", on_resume="may_change",
        help="flx: the first K layers run on the server's preload (intra-server exchange only), the rest "
             "with the world exchange (default: the shard set's --hops, at most --layers)")
    memory_per_gpu: Optional[str] = option(
        None, parse=_size_text, metavar="SIZE",
        help="GPU memory budget per rank, e.g. 40GiB; --mode auto picks the largest preload that fits")
    # Communication hidden behind computation (engine/exchange.py, cluster/gradsync.py): only the order of
    # floating-point sums changes, so a resumed run may switch it.
    no_overlap: bool = option(False, on_resume="may_change",
                              help="wait for each layer's whole halo before computing and reduce the gradients "
                                   "after the whole backward (the order before overlap existed, for "
                                   "comparison); by default a layer aggregates the edges of the rows it holds "
                                   "while its halo travels, in both passes, and gradient buckets are reduced "
                                   "during the backward")
    halo_dtype: str = option("float32", choices=HALO_DTYPES,
                             help="dtype training halo rows and their gradients travel in; bfloat16/float16 "
                                  "halve the halo bytes and are widened on arrival, but the run is then not "
                                  "exact (summary.json says so; its checkpoints resume only on the same "
                                  "shape); evaluation always exchanges float32")
    # Force the rank-0 bar on (mpirun pipes output, so no terminal is seen).
    progress: bool = option(False, on_resume="may_change",
                            help="draw rank 0's progress bar (epochs, loss, ETA) even when stderr is not a "
                                 "terminal, as under mpirun/srun, which pipe the ranks' output")

    def __post_init__(self):
        # Like torchtitan's ParallelDims: a config that exists is a valid one, however it was made.
        validate(self)
        if self.weight_decay_on != "all" and self.weight_decay == 0.0:
            raise ConfigError(f"--weight-decay-on {self.weight_decay_on} says which parameters --weight-decay "
                              f"applies to, but --weight-decay is 0: give --weight-decay (e.g. 5e-4) or leave "
                              f"--weight-decay-on out")
        from granndis_hpc.engine.modes import MODES
        problem = MODES[self.mode].check_options(self)  # what a mode needs of the other options
        if problem:
            raise ConfigError(problem)
        if self.checkpoint_activations and self.model not in CHECKPOINTABLE_MODELS:
            raise ConfigError(f"--checkpoint-activations recomputes residual blocks, which only "
                              f"{', '.join(CHECKPOINTABLE_MODELS)} has; model {self.model!r} would ignore it: "
                              f"leave it out or use --model ressage")
        if self.checkpoint_every > 0 and not self.out:
            raise ConfigError("--checkpoint-every needs a run directory to write checkpoints into: add --out RUN_DIR")
        if self.resume and (not self.out or os.path.realpath(self.out) != os.path.realpath(self.resume)):
            raise ConfigError(f"--resume {self.resume} continues in that run directory, but --out is {self.out!r}; "
                              f"leave --out out or set it to {self.resume}")
        if self.resume and self.overwrite_run:
            raise ConfigError("--overwrite-run starts a new run in place of the old one and --resume continues "
                              "the old one: give one of them")

    @property
    def memory_per_gpu_bytes(self) -> Optional[int]:
        from granndis_hpc.units import parse_size
        return None if self.memory_per_gpu is None else parse_size(self.memory_per_gpu)


# ---------------------------------------------------------------------------------------------
# Resolved config of a run


def _jsonable(value, key):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, key) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, key) for k, v in value.items()}
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return _jsonable(value.item(), key)
    raise ConfigError(f"option {key!r} has a value of type {type(value).__name__} ({value!r}) that cannot "
                      "be written to config.json; give the option a plain type (str, int, float, bool, list)")


def resolved_config(ns) -> dict:
    """Every option of `ns` (an argparse.Namespace, a dict or an options dataclass) as a JSON-able dict
    with sorted keys."""
    if dataclasses.is_dataclass(ns) and not isinstance(ns, type):
        items = dataclasses.asdict(ns).items()
    else:
        items = ns.items() if isinstance(ns, dict) else vars(ns).items()
    return {k: _jsonable(v, k) for k, v in sorted(items)}


def write_resolved_config(ns, run_dir) -> str:
    """Write RUN_DIR/config.json atomically (a crash never leaves half a file); return its path."""
    path = os.path.join(os.fspath(run_dir), CONFIG_FILE_NAME)
    atomic_write_json(path, resolved_config(ns))
    return path


def load_resolved_config(run_dir) -> dict:
    """Read RUN_DIR/config.json; ConfigError naming the file if it is missing or not a JSON object."""
    path = os.path.join(os.fspath(run_dir), CONFIG_FILE_NAME)
    return read_json_object(path, ConfigError,
                            not_found_hint=f": {run_dir!s} is not a run directory (it has no resolved config)")


__all__ = ["ConfigError", "HelpFormatter", "TrainConfig", "allowed_choices", "DEVICE_NAMES", "TRANSPORT_NAMES",
           "CHECKPOINTABLE_MODELS", "WEIGHT_DECAY_ON", "option", "specs", "defaults", "validate", "build_parser", "read_options",
           "missing_required", "resume_rule",
           "parse_args_with_config", "load_config_file", "resolved_config", "write_resolved_config",
           "load_resolved_config", "CONFIG_FILE_NAME"]

"""One options framework for every command (`granndis-train`, `granndis report`, every
`python -m preprocess` subcommand): an options dataclass whose fields carry help, choices, defaults and
ranges, from which the command-line parser, the TOML reader and ``--help`` are derived.  Only the
standard library: building a parser loads no torch, h5py or MPI, and preprocess uses it as train does.

Declaring an option (see granndis_hpc.config.TrainConfig, preprocess/options.py)::

    epochs: int = option(200, "training epochs", ge=1)

``option(default, help, **rules)`` is ``dataclasses.field`` with the rules in its metadata:
``choices``, ``ge``/``gt``/``le``/``lt`` (ranges), ``check`` (a callable returning a problem or None),
``parse`` (a converter from text, e.g. a size parser), ``flag`` (a flag name other than ``--name``,
e.g. ``--no-eval`` for a bool that defaults to True), ``nargs="+"`` or ``append=True`` for lists,
``metavar``, ``on_resume`` ("keep", "may_change" or "reset", read by cli.resume_config and the checkpoint
fingerprint), ``resume_shape`` (a "may_change" option that may change only as far as the checkpoint's
shape allows), ``fingerprint=False`` (a "keep" option that a checkpoint checks otherwise),
``required=True`` (no usable default: a command-line or file value is needed, while the dataclass
default stays None so that option classes compose by inheritance), ``positional=True`` (an argument
without a flag, e.g. a directory), ``group`` (the --help section; by default the declaring class's
``OPTIONS_GROUP``) and ``deprecated`` ({old flag: release it goes in}: spellings still accepted with a
warning).  ``help`` may be a callable of the options class (help derived from the other fields).
The same rules run three times from that one place: when a command-line word is converted (argparse
``type=``), when a TOML value is read, and in ``__post_init__`` (:func:`validate`), so an options object
built in code is checked exactly like one parsed from a command line.  :func:`reuse` copies another
class's declaration (preprocess plan's --model/--hidden/--dropout are granndis-train's), and
:func:`read_command` serves a command with subcommands, each with its own options class.

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

The resolved config of a run (granndis_hpc/config.py) is written to ``RUN_DIR/config.json`` so a run
can be reproduced and ``granndis report`` can label it.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import sys
import typing
from dataclasses import MISSING, dataclass
from typing import Any, Dict, List, Optional, Tuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python < 3.11 (pyproject pulls in tomli there)
    import tomli as tomllib


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
          "fingerprint", "resume_shape", "required", "positional", "group", "deprecated"}
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
        return self.default is _NO_DEFAULT or bool(self.meta.get("required"))


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


def reuse(cls, name: str, **changes):
    """A field declared like `cls`'s field `name` (its default and rules), with `changes` (a default, a
    help text, a rule) applied: the one declaration of an option that several commands take."""
    spec = next((s for s in specs(cls) if s.name == name), None)
    if spec is None:
        raise TypeError(f"reuse(): {cls.__name__} has no option {name!r}")
    rules = dict(spec.meta)
    default = changes.pop("default", MISSING if spec.default is _NO_DEFAULT else spec.default)
    rules.update(changes)
    return option(default, **rules)


class Options:
    """Base of the options classes of the commands: a dataclass subclass is validated when made."""

    def __post_init__(self):
        validate(self)


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


def _help_text(spec: _Spec, cls=None) -> str:
    text = spec.meta.get("help") or ""
    if callable(text):  # derived from the other fields (granndis-train's --resume lists what may change)
        text = text(cls)
    bounds = [f"{sign} {spec.meta[key]}" for key, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
              if key in spec.meta]
    if bounds:  # the range checked at parse time, so --help says it before an error has to
        text += (" " if text else "") + f"[{', '.join(bounds)}]"
    text = text.replace("%", "%%")  # argparse %-formats help strings
    if spec.required or "(default:" in text or spec.meta.get("positional"):
        return text
    if spec.kind is bool and not spec.is_list:
        default = "off"  # a flag: "--no-eval (default: True)" would read as if the flag were on
    else:
        default = spec.default
    return (text + " " if text else "") + f"(default: {default})".replace("%", "%%")


class _DeprecatedSpelling(argparse.Action):
    """A stored value whose flag has an old spelling still accepted for a release: using it warns on
    stderr (the value is taken all the same)."""

    def __init__(self, option_strings, dest, deprecated=None, **kwargs):
        self.deprecated = dict(deprecated or {})
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string in self.deprecated:
            print(f"{parser.prog}: warning: {option_string} is deprecated and goes in {self.deprecated[option_string]}; "
                  f"write {self.option_strings[0]}", file=sys.stderr, flush=True)
        setattr(namespace, self.dest, values)


def _group_title(cls, spec: _Spec) -> Optional[str]:
    """The --help section of an option: its ``group`` rule, else the OPTIONS_GROUP of the class that
    declares the field (option classes compose by inheritance, each base one section)."""
    if spec.meta.get("group"):
        return spec.meta["group"]
    for klass in cls.__mro__:
        if spec.name in klass.__dict__.get("__annotations__", {}):
            return klass.__dict__.get("OPTIONS_GROUP")
    return None


def add_options(p: argparse.ArgumentParser, cls, with_defaults: bool = False,
                config: bool = True) -> argparse.ArgumentParser:
    """Add the options of the dataclass `cls` to the parser `p` (a parser or a subcommand's parser made
    with ``argument_default=argparse.SUPPRESS``), plus ``--config`` unless `config` is False or the class
    has a ``config`` field.  `with_defaults`: the fields' defaults go into the namespace (for a plain
    parser that some caller finishes itself; :func:`read_options` applies them after the file)."""
    names, groups = set(), {}
    for spec in specs(cls):
        names.add(spec.name)
        kwargs = {"help": _help_text(spec, cls)}
        if with_defaults and not spec.required:
            kwargs["default"] = spec.default
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
        flags = [spec.flag]
        if spec.meta.get("deprecated"):
            if "action" in kwargs or "nargs" in kwargs:
                raise TypeError(f"option {spec.name!r}: deprecated spellings are supported for single values only")
            flags += list(spec.meta["deprecated"])
            kwargs.update(action=_DeprecatedSpelling, deprecated=spec.meta["deprecated"])
        title = _group_title(cls, spec)
        if title is not None and title not in groups:
            groups[title] = p.add_argument_group(title)
        target = groups[title] if title is not None else p
        if spec.meta.get("positional"):
            target.add_argument(spec.name, **kwargs)
        else:
            target.add_argument(*flags, dest=spec.name, **kwargs)
    if config and "config" not in names:
        p.add_argument("--config", metavar="FILE.toml", dest="config",
                       help="TOML file with option values (keys = option names, '-' or '_'); options given "
                            "on the command line override it (default: None)")
    return p


def build_parser(cls, prog: Optional[str] = None, description: Optional[str] = None,
                 epilog: Optional[str] = None) -> argparse.ArgumentParser:
    """The command-line parser of an options dataclass (see :func:`add_options`).  Every option's
    default is argparse.SUPPRESS, so the namespace holds only what the command line gave (precedence
    is applied by :func:`read_options`)."""
    p = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                argument_default=argparse.SUPPRESS)
    return add_options(p, cls)


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
    """Flags (names, for a positional argument) of the required options that `given` lacks."""
    return [s.name if s.meta.get("positional") else s.flag for s in specs(cls)
            if s.required and s.name not in given]


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


def read_command(commands: Dict[str, Tuple[type, str]], argv=None, prog: Optional[str] = None,
                 description: Optional[str] = None, epilog: Optional[str] = None) -> Tuple[str, Any]:
    """A command with subcommands (`python -m preprocess build|plan|...`): `commands` maps each name to
    (its options class, a line of help).  Returns (the name, its options object after precedence,
    command line > --config FILE.toml > defaults, validated by the class).  Every problem is the
    subcommand's usage error (exit status 2) naming the option; --help exits 0."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(commands) + "}")
    parsers = {}
    for name, (cls, text) in commands.items():
        parsers[name] = sub.add_parser(name, help=text, description=text, argument_default=argparse.SUPPRESS,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
    # Only the chosen command's options are added (the command is the first word: the top level has
    # no option but --help): a registry read for another command's choices (plan's --model reads the
    # models) is not loaded by `verify`.
    if argv and argv[0] in commands:
        add_options(parsers[argv[0]], commands[argv[0]][0])
    command_line = vars(parser.parse_args(argv))
    name = command_line.pop("command")
    return name, _finish(parsers[name], commands[name][0], command_line)


def parse_options(cls, argv=None, prog: Optional[str] = None, description: Optional[str] = None,
                  epilog: Optional[str] = None):
    """The options object of a command without subcommands (`granndis report`), after precedence and
    validated by the class; every problem is a usage error (exit status 2), --help exits 0."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(cls, prog, description, epilog)
    return _finish(parser, cls, vars(parser.parse_args(argv)))


def _finish(parser: argparse.ArgumentParser, cls, command_line: Dict[str, Any]):
    """Precedence (command line > --config file > defaults) and the class's checks, as usage errors."""
    path = command_line.get("config")
    if "config" not in {s.name for s in specs(cls)}:
        command_line.pop("config", None)
    try:
        given = {**(load_config_file(path, cls) if path is not None else {}), **command_line}
        missing = missing_required(cls, given)
        if missing:
            raise ConfigError(f"the following arguments are required: {', '.join(missing)}")
        return cls(**{**defaults(cls), **given})
    except ConfigError as exc:
        parser.error(str(exc))


def resume_rule(cls, rule: str) -> frozenset:
    """Names of the fields of `cls` whose on_resume rule is `rule` ("keep" when not given)."""
    return frozenset(s.name for s in specs(cls) if s.meta.get("on_resume", "keep") == rule)


__all__ = ["ConfigError", "HelpFormatter", "Options", "add_options", "allowed_choices", "build_parser", "defaults",
           "load_config_file", "missing_required", "option", "parse_args_with_config", "parse_options", "read_command", "read_options",
           "resume_rule", "reuse", "specs", "validate"]

"""Declaring options and checking values (granndis_hpc/options/__init__.py says how): option(), the
specs of an options class, defaults, reuse, validate, and the per-value rules the command line, the
TOML reader and __post_init__ share."""
from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from dataclasses import MISSING, dataclass
from typing import Any, Dict, List, Optional, Tuple


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


def group_title(cls, spec: _Spec) -> Optional[str]:
    """The group of an option (its --help section, its section of the configuration reference and of a
    TOML file): its ``group`` rule, else the OPTIONS_GROUP of the class that declares the field (option
    classes compose by inheritance, each base one group)."""
    if spec.meta.get("group"):
        return spec.meta["group"]
    for klass in cls.__mro__:
        if spec.name in klass.__dict__.get("__annotations__", {}):
            return klass.__dict__.get("OPTIONS_GROUP")
    return None


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


# The longest string a value read from a file may be (a path: PATH_MAX); a longer one is refused, not echoed.
MAX_VALUE_CHARS = 4096


def check_recorded(cls, name: str, value, where: str):
    """A value of option `name` of `cls` that a file records (a model file's options): checked as data,
    the way a TOML value is (type, choices, range, parse, lists); ConfigError naming `where` otherwise."""
    spec = {s.name: s for s in specs(cls)}[name]
    for item in (value if isinstance(value, list) else [value]):
        if isinstance(item, str) and len(item) > MAX_VALUE_CHARS:
            raise ConfigError(f"{where}: a value of {len(item)} characters (starting {item[:24]!r}); option values "
                              f"are at most {MAX_VALUE_CHARS} characters")
    return _from_file(spec, value, where)


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


def resume_rule(cls, rule: str) -> frozenset:
    """Names of the fields of `cls` whose on_resume rule is `rule` ("keep" when not given)."""
    return frozenset(s.name for s in specs(cls) if s.meta.get("on_resume", "keep") == rule)

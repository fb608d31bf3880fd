"""TOML configuration files for the command-line tools, and the resolved config of a run.

Rules (one place, so every tool behaves the same):

- ``--config FILE.toml`` is added to the parser if it is not there already.
- The file is FLAT: ``key = value`` pairs at top level, no ``[sections]``.  Keys are the options'
  dest names; ``batches-per-epoch`` and ``batches_per_epoch`` mean the same thing.  A value is what
  the option stores: ``--no-eval`` (dest ``eval``, store_false) is written ``eval = false``.  Flat keys were
  chosen over sections because every option already has exactly one name on the command line, and
  a section would be a second name for the same thing that could disagree with it.
- Precedence: command line > config file > the parser's defaults.
- File values are checked against the option the way argparse would check the same text on the
  command line (``type=``, ``choices=``, ``store_true`` -> bool, ``nargs``/``append`` -> list), so a
  wrong file is an error before any work starts.  Every problem is a :class:`ConfigError` that names
  the file, the key, what was expected and what was found.
- Unknown keys are errors (a typo must not silently fall back to a default) with close matches.

The resolved config (every option after precedence) is written to ``RUN_DIR/config.json`` so a run can
be reproduced and ``granndis report`` can label it.
"""
from __future__ import annotations

import argparse
import copy
import difflib
import os
import sys

from granndis_hpc.fsutil import atomic_write_json, read_json_object

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python < 3.11 (pyproject pulls in tomli there)
    import tomli as tomllib

CONFIG_FILE_NAME = "config.json"


class ConfigError(ValueError):
    """A configuration file (or a resolved config) is wrong; the message says what and how to fix it."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows every option with its default, including options declared without help text.

    (argparse's own ArgumentDefaultsHelpFormatter skips options that have no ``help=``.)  On/off flags
    show ``(default: off)`` rather than the stored value, because "--no-eval (default: True)" reads as
    if the flag were on.  Required options show no default.  Descriptions and epilogs keep their line
    breaks so that usage examples stay readable.
    """

    def _default_text(self, action):
        if action.default is argparse.SUPPRESS or action.required:
            return None
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            return None
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return None  # required positionals have no default worth printing
        if (isinstance(action, argparse._StoreTrueAction) and action.default is False) or \
                (isinstance(action, argparse._StoreFalseAction) and action.default is True):
            return "(default: off)"
        return "(default: %(default)s)"

    def _get_help_string(self, action):
        text = action.help or ""
        extra = self._default_text(action)
        if extra is None or "%(default)" in text:
            return text
        return (text + " " if text else "") + extra

    def _format_action(self, action):
        # argparse prints nothing after an option without help text; give it one that holds the default
        if action.help is None and self._default_text(action) is not None:
            action = copy.copy(action)
            action.help = ""
            action.help = self._get_help_string(action)
        return super()._format_action(action)


# ---------------------------------------------------------------------------------------------
# Parsing


def _find_config_action(parser):
    for action in parser._actions:
        if "--config" in action.option_strings:
            return action
    return None


def _ensure_config_option(parser) -> str:
    """Add ``--config`` if missing; return its dest."""
    action = _find_config_action(parser)
    if action is None:
        action = parser.add_argument(
            "--config", metavar="FILE.toml", default=None,
            help="TOML file with option values (keys = option names, '-' or '_'); "
                 "options given on the command line override it")
    return action.dest


def _config_path_from_argv(parser, argv, config_dest):
    """Find ``--config`` in argv without running the full parser (which may fail on required options
    that the file provides).  Uses the same prefix rules as the real parser."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=parser.allow_abbrev,
                                  prefix_chars=parser.prefix_chars)
    pre.add_argument("--config", dest=config_dest, default=None)
    known, _ = pre.parse_known_args(argv)
    return getattr(known, config_dest)


def _settable_actions(parser, config_dest):
    """Map every accepted key spelling (the dest, with '_' or '-') to its action.

    Flag names that differ from the dest (``--no-eval`` storing False into ``eval``) are deliberately
    not keys: ``no-eval = true`` would read as the opposite of what it does.
    """
    by_key = {}
    for action in parser._actions:
        if action.dest in (argparse.SUPPRESS, config_dest) or not action.option_strings:
            continue
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        by_key[action.dest] = by_key[action.dest.replace("_", "-")] = action
    return by_key


def _flag_hint(parser, key):
    """If `key` is a flag name whose dest differs, say which key to use instead."""
    for action in parser._actions:
        if "--" + key in action.option_strings and action.dest not in (key, key.replace("-", "_")):
            example = f"{action.dest} = false" if isinstance(action, argparse._StoreFalseAction) else \
                f"{action.dest} = ..."
            return f" The flag --{key} stores into {action.dest!r}: write '{example}' in the config file."
    return None


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or repr(tp)


def _describe(value) -> str:
    return f"{value!r} ({type(value).__name__})"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _convert_scalar(value, action, where):
    """Convert one TOML scalar the way argparse converts one command-line word for `action`."""
    tp = action.type
    if tp is None or tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {_describe(value)}; quote it in the file")
        return value
    if tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {_describe(value)}")
        return value
    if tp is float:
        if not _is_number(value):
            raise ConfigError(f"{where}: expected a number, got {_describe(value)}")
        return float(value)
    # A custom converter (e.g. a path checker or a positive-int parser): feed it the text that the
    # command line would have given it.
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f"{where}: expected a value for {_type_name(tp)}, got {_describe(value)}")
    try:
        return tp(value if isinstance(value, str) else str(value))
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        raise ConfigError(f"{where}: {_describe(value)} is not a valid {_type_name(tp)}: {exc}") from None


def _check_choices(value, action, where):
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(repr(c) for c in action.choices)
        raise ConfigError(f"{where}: {value!r} is not one of the allowed values: {choices}")


def _convert(value, action, where):
    """Type-check and convert a file value for `action`; the result is what argparse would store."""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                           getattr(argparse, "BooleanOptionalAction", ()))):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {_describe(value)}")
        return value
    if isinstance(action, argparse._StoreConstAction):  # e.g. store_const / append_const-like flags
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true (= {action.const!r}) or false (= default), "
                              f"got {_describe(value)}")
        return action.const if value else action.default
    if isinstance(action, argparse._CountAction):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{where}: expected a count (integer >= 0), got {_describe(value)}")
        return value
    takes_list = isinstance(action, (argparse._AppendAction, getattr(argparse, "_ExtendAction", ()))) \
        or action.nargs in (argparse.ZERO_OR_MORE, argparse.ONE_OR_MORE) or isinstance(action.nargs, int)
    if takes_list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list like [a, b], got {_describe(value)}")
        if isinstance(action.nargs, int) and not isinstance(action, argparse._AppendAction) \
                and len(value) != action.nargs:
            raise ConfigError(f"{where}: expected a list of exactly {action.nargs} values, got {len(value)}")
        if action.nargs == argparse.ONE_OR_MORE and not value:
            raise ConfigError(f"{where}: expected a non-empty list")
        items = [_convert_scalar(v, action, f"{where}[{i}]") for i, v in enumerate(value)]
        for i, item in enumerate(items):
            _check_choices(item, action, f"{where}[{i}]")
        return items
    if isinstance(action, argparse._StoreAction):
        out = _convert_scalar(value, action, where)
        _check_choices(out, action, where)
        return out
    raise ConfigError(f"{where}: option kind {type(action).__name__} cannot be set from a config file; "
                      "give it on the command line")


def load_config_file(path, parser, config_dest="config") -> dict:
    """Read and check a TOML file against `parser`; return {dest: value} ready to use as defaults."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} not found (check the --config path)") from None
    except OSError as exc:
        raise ConfigError(f"config file {path!r} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path!r} is not valid TOML: {exc}") from None

    actions = _settable_actions(parser, config_dest)
    values, seen_as = {}, {}
    for key, value in raw.items():
        where = f"config file {path!r}, key {key!r}"
        if isinstance(value, dict):
            raise ConfigError(f"{where}: [sections] are not supported; write every option as a "
                              f"top-level 'name = value' line (before any [section] header)")
        if key.replace("-", "_") == config_dest:
            raise ConfigError(f"{where}: a config file cannot name another config file")
        action = actions.get(key)
        if action is None:
            flag_hint = _flag_hint(parser, key)
            if flag_hint:
                raise ConfigError(f"{where}: not an option name.{flag_hint}")
            close, named = [], set()
            for name in difflib.get_close_matches(key, sorted(actions), n=6, cutoff=0.6):
                if actions[name].dest not in named:  # one spelling per option, the closest one
                    named.add(actions[name].dest)
                    close.append(name)
            close = close[:3]
            hint = (" Did you mean " + " or ".join(repr(c) for c in close) + "?") if close else \
                " Run with --help for the list of options."
            raise ConfigError(f"{where}: unknown option.{hint}")
        if action.dest in seen_as:
            raise ConfigError(f"{where}: the same option is also given as {seen_as[action.dest]!r}; "
                              "keep one of them")
        seen_as[action.dest] = key
        values[action.dest] = _convert(value, action, where)
    return values


def parse_args_with_config(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Parse `argv` (default sys.argv[1:]) with values from ``--config FILE.toml`` as defaults.

    Raises ConfigError for a bad file; argparse itself still exits with status 2 on bad flags.
    Entry points should turn ConfigError into ``parser.error(str(exc))`` so that every rank exits
    non-zero with the message.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    config_dest = _ensure_config_option(parser)
    path = _config_path_from_argv(parser, argv, config_dest)
    # --help must work even when the config file is broken, so do not read it then.
    options_part = argv[:argv.index("--")] if "--" in argv else argv
    wants_help = any(a in ("-h", "--help") for a in options_part)
    file_values = load_config_file(path, parser, config_dest) if path is not None and not wants_help else {}

    actions = {a.dest: a for a in _settable_actions(parser, config_dest).values()}
    # argparse only fills in defaults for attributes missing from the namespace, so pre-filling it with
    # the file's values makes them defaults that the command line overrides.  List-accumulating options
    # (append/extend) would append to the file's list instead of replacing it, so they start as None
    # and get the file's list only if the command line did not give them.
    accumulating = {d for d in file_values
                    if isinstance(actions[d], (argparse._AppendAction, getattr(argparse, "_ExtendAction", ())))}
    namespace = argparse.Namespace(**{d: (None if d in accumulating else v) for d, v in file_values.items()})
    # An option required on the command line is satisfied by the file.
    relaxed = [actions[d] for d in file_values if actions[d].required]
    for action in relaxed:
        action.required = False
    try:
        ns = parser.parse_args(argv, namespace=namespace)
    finally:
        for action in relaxed:
            action.required = True
    for dest in accumulating:
        if getattr(ns, dest) is None:
            setattr(ns, dest, list(file_values[dest]))
    return ns


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
    """Every option of `ns` (an argparse.Namespace or a dict) as a JSON-able dict with sorted keys."""
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


__all__ = ["ConfigError", "HelpFormatter", "parse_args_with_config", "load_config_file",
           "resolved_config", "write_resolved_config", "load_resolved_config", "CONFIG_FILE_NAME"]

"""The command-line side: an options class's argparse parser and --help, and reading a command's
options (command line > --config FILE.toml > defaults)."""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

from .declare import ConfigError, _scalar_from_text, _Spec, allowed_choices, defaults, group_title, specs
from .toml import load_config_file


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


# Set by the MPI launchers (Open MPI, PMIx, MPICH/Intel MPI, MVAPICH) and srun before MPI starts.
_LAUNCH_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")


def launch_rank() -> int:
    """This process's rank as its launcher set it (0 when not launched as a parallel job): options are
    read before MPI starts, and every rank reads them alike."""
    for name in _LAUNCH_RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


@contextlib.contextmanager
def _said_once():
    """Usage errors, --help and deprecation warnings from rank 0 only: every rank parses the same
    command line and reaches the same verdict (the exit status stays every rank's), so the copies of
    the other ranks only repeat it, interleaved on one line."""
    if launch_rank() == 0:
        yield
        return
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        yield


class _DeprecatedSpelling(argparse.Action):
    """A stored value whose flag has an old spelling still accepted for a release: using it warns on
    stderr (the value is taken all the same)."""

    def __init__(self, option_strings, dest, deprecated=None, **kwargs):
        self.deprecated = dict(deprecated or {})
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string in self.deprecated:
            print(f"{parser.prog}: warning: {option_string} is deprecated and goes in "
                  f"{self.deprecated[option_string]}; "
                  f"write {self.option_strings[0]}", file=sys.stderr, flush=True)
        setattr(namespace, self.dest, values)


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
        title = group_title(cls, spec)
        if title is not None and title not in groups:
            groups[title] = p.add_argument_group(title)
        target = groups[title] if title is not None else p
        if spec.meta.get("positional"):
            target.add_argument(spec.name, **kwargs)
        else:
            target.add_argument(*flags, dest=spec.name, **kwargs)
    if config and "config" not in names:
        p.add_argument("--config", metavar="FILE.toml|PRESET", dest="config",
                       help="TOML file with option values (keys = option names, '-' or '_'), or the name of an "
                            "installed preset (arxiv, products, reddit, papers100m and their .build: "
                            "docs/paper-experiments.md); options given on the command line override it "
                            "(default: None)")
    return p


def build_parser(cls, prog: Optional[str] = None, description: Optional[str] = None,
                 epilog: Optional[str] = None, config: bool = True) -> argparse.ArgumentParser:
    """The command-line parser of an options dataclass (see :func:`add_options`; `config`: whether it
    takes --config).  Every option's default is argparse.SUPPRESS, so the namespace holds only what the
    command line gave (precedence is applied by :func:`read_options`)."""
    p = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                argument_default=argparse.SUPPRESS)
    return add_options(p, cls, config=config)


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
    """A command with subcommands (`granndis preprocess build|plan|...`): `commands` maps each name to
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
    with _said_once():
        command_line = vars(parser.parse_args(argv))
        name = command_line.pop("command")
        return name, _finish(parsers[name], commands[name][0], command_line)


def parse_options(cls, argv=None, prog: Optional[str] = None, description: Optional[str] = None,
                  epilog: Optional[str] = None, config: bool = True):
    """The options object of a command without subcommands (`granndis report`), after precedence and
    validated by the class; every problem is a usage error (exit status 2), --help exits 0.  `config`:
    whether the command takes --config FILE.toml."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(cls, prog, description, epilog, config=config)
    with _said_once():
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

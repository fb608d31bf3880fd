"""granndis_hpc.options: the options of every command, in one place.  The framework (this package's
declare.py, parser.py, toml.py): an options dataclass whose fields carry help, choices, defaults and
ranges, from which the command-line parser, the TOML reader, ``--help`` and docs/configuration.md
(reference.py) are derived.  The declarations: train.py (`granndis-train`'s TrainConfig, composed of
the groups of train_groups.py and startup.py), predict.py, report.py, selfcheck.py (the cluster
self-check), startup.py (the cluster options they share); resume.py turns what a user gave into a
run's options (--resume, --init-from).  `granndis preprocess` declares its own (preprocess/options.py),
with this framework.  The framework, startup.py and selfcheck.py import the standard library only:
building a parser loads no torch, h5py or MPI, and the cluster package may read them.

Declaring an option (see train_groups.py, preprocess/options.py)::

    epochs: int = option(200, "training epochs", ge=1)

``option(default, help, **rules)`` is ``dataclasses.field`` with the rules in its metadata:
``choices``, ``ge``/``gt``/``le``/``lt`` (ranges), ``check`` (a callable returning a problem or None),
``parse`` (a converter from text, e.g. a size parser), ``flag`` (a flag name other than ``--name``,
e.g. ``--no-eval`` for a bool that defaults to True), ``nargs="+"`` or ``append=True`` for lists,
``metavar``, ``on_resume`` ("keep", "may_change" or "reset", read by resume.resume_config and the checkpoint
fingerprint), ``resume_shape`` (a "may_change" option that may change only as far as the checkpoint's
shape allows), ``fingerprint=False`` (a "keep" option that a checkpoint checks otherwise),
``required=True`` (no usable default: a command-line or file value is needed, while the dataclass
default stays None so that option classes compose by inheritance), ``positional=True`` (an argument
without a flag, e.g. a directory), ``group`` (the option's group; by default the declaring class's
``OPTIONS_GROUP``) and ``deprecated`` ({old flag: release it goes in}: spellings still accepted with a
warning).  ``help`` may be a callable of the options class (help derived from the other fields).
The same rules run three times from that one place: when a command-line word is converted (argparse
``type=``), when a TOML value is read, and in ``__post_init__`` (:func:`validate`), so an options object
built in code is checked exactly like one parsed from a command line.  :func:`reuse` copies another
class's declaration (preprocess plan's --model/--hidden/--dropout are granndis-train's), and
:func:`read_command` serves a command with subcommands, each with its own options class.  Option
classes compose by inheritance, one class a group: a group is a --help section, a table of the
configuration reference and a TOML section.

Rules for ``--config FILE.toml`` (one place, so every tool behaves the same):

- ``key = value`` pairs at top level.  Keys are the field names; ``batches-per-epoch`` and
  ``batches_per_epoch`` mean the same thing.  A value is what the field holds: ``--no-eval`` (field
  ``eval``, default true) is written ``eval = false``.
- Where the options come in groups, an option may also be written under its group's ``[section]``
  (the group's name with ``-`` or ``_`` for spaces: ``[model]``, ``[run-directory]``); a section holds
  only its own group's options, and the flat and sectioned forms mix.  An option still has exactly one
  name: a section only says where it belongs, so the file cannot disagree with the command line.
  A command without groups takes no sections.
- Precedence: command line > config file > the field's default.
- File values are checked against the field the way the command line's text is checked (type,
  choices, range, ``parse``, lists), so a wrong file is an error before any work starts.  Every
  problem is a :class:`ConfigError` that names the file, the key, what was expected and what was found.
- Unknown keys are errors (a typo must not silently fall back to a default) with close matches.

The resolved config of a run (granndis_hpc/rundir/config_file.py) is written, flat, to
``RUN_DIR/config.json`` so a run can be reproduced and ``granndis report`` can label it.
"""
# declare.py: option(), specs, reuse, validate and the value rules; parser.py: argparse and reading a
# command's options; toml.py: --config FILE.toml.
from .declare import (ConfigError, HelpFormatter, Options, allowed_choices, check_recorded, defaults, option,
                      resume_rule, reuse, specs, validate)
from .parser import (add_options, build_parser, missing_required, parse_args_with_config, parse_options,
                     read_command, read_options)
from .toml import load_config_file

__all__ = ["ConfigError", "HelpFormatter", "Options", "add_options", "allowed_choices", "build_parser",
           "check_recorded",
           "defaults", "load_config_file", "missing_required", "option", "parse_args_with_config", "parse_options",
           "read_command", "read_options", "resume_rule", "reuse", "specs", "validate"]

"""The model options that name code to import (`--model pyg`'s module and factory: registry entries'
``names_code`` options) come from the user only: the command line or the --config file they pass.

A model file (best-model.pt, a checkpoint) and a run's config.json record a model's options.  What they
record is data: it is checked (types, known names) and compared with what the user gives, and a
model whose code the user does not name is refused with the exact options to add.  A file someone sends
you can therefore not make a command import a module of its choosing (docs/reliability.md, "Trust
boundary").  Torch-free: the option parser (options.resume.resumed_model_options) uses it as the engine does."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from granndis_hpc import registry


def given_names(items: Optional[Sequence[str]]) -> set:
    """The option names that NAME=VALUE items set (as registry.model_options reads them)."""
    return {str(item).partition("=")[0].strip().replace("-", "_") for item in items or ()}


def as_flags(values: Dict[str, Any]) -> str:
    return " ".join(f"--model-option {name}={value}" for name, value in values.items())


def code_refusal(model: str, recorded: Dict[str, Any], given: Optional[Sequence[str]], source: str) -> Optional[str]:
    """Why the model `source` records (its parsed options `recorded`) cannot be rebuilt with the code the
    user names in `given` (None: the user names the same code, or the model names none)."""
    names = registry.code_options(model)
    if not names:
        return None
    want = {name: recorded[name] for name in names}
    if not given_names(given) & set(names):
        return (f"{source} records --model {model} with code to import ({as_flags(want)}), and a file never "
                f"chooses the code that runs: if you trust that code, name it yourself: add {as_flags(want)}")
    have = {name: value for name, value in registry.model_options(model, given).items() if name in names}
    if have != want:
        return (f"the code you name ({as_flags(have)}) is not the code {source} records ({as_flags(want)}): "
                f"give {as_flags(want)}, or the model file of your code")
    return None


def rebuild_options(model: str, recorded: Optional[Sequence[str]], given: Optional[Sequence[str]],
                    source: str) -> Dict[str, Any]:
    """The constructor options of the model `source` records (`recorded`: its NAME=VALUE items, already
    checked as data), with the user's `given` items: every code option must be given and equal, any other
    option given must equal the recorded one.  ValueError saying what differs."""
    options = registry.model_options(model, recorded)
    problem = code_refusal(model, options, given, source)
    if problem:
        raise ValueError(problem)
    mine = registry.model_options(model, given)
    differ = [f"{name}={mine[name]} ({source} records {name}={options[name]})"
              for name in sorted(given_names(given)) if name in options and mine[name] != options[name]]
    if differ:
        raise ValueError(f"--model-option {', '.join(differ)}: leave them out or give the recorded values")
    return options

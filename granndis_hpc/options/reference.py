"""The configuration reference (docs/configuration.md), rendered from the option declarations.

    python -m granndis_hpc.options.reference > docs/configuration.md

Every command's options class is the one source of its parser, its TOML reader and this page, so the
page cannot drift from the code; tests/unit/test_config_reference.py fails when the committed page differs
from what this module renders.  The commands are named as "module:Class" and imported when the page is
rendered, so this package imports neither the trainer nor preprocess."""
from __future__ import annotations

import importlib
from typing import List, Optional

from . import environment
from .declare import _Spec, allowed_choices, group_title, specs

# (command, its options class, what the command does)
COMMANDS = [
    ("granndis-train", "granndis_hpc.options.train:TrainConfig",
     "train on a shard set (one rank per GPU, under mpirun or srun)"),
    ("granndis report", "granndis_hpc.options.report:ReportOptions", "tables and plots of finished runs"),
    ("granndis preprocess build", "granndis_hpc.preprocess.options:BuildOptions", "write a shard set"),
    ("granndis preprocess plan", "granndis_hpc.preprocess.options:PlanOptions",
     "partition and expand the halos without writing; estimate memory and bytes per option"),
    ("granndis preprocess chunk", "granndis_hpc.preprocess.options:ChunkOptions", "write a dataset in the chunked "
                                                                                  "input format"),
    ("granndis preprocess verify | info", "granndis_hpc.preprocess.options:ShardSetOptions", "check or describe a "
                                                                                             "shard set"),
]


_RESUME = {"keep": "must match", "may_change": "may change", "reset": "reset"}


def _load(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(spec: _Spec) -> str:
    if spec.required:
        return "required"
    if spec.kind is bool and not spec.is_list:
        return "on" if spec.default else "off"
    if spec.default is None or spec.default == []:
        return "-"
    if spec.is_list:
        return "`" + " ".join(str(v) for v in spec.default) + "`"
    return f"`{spec.default}`"


def _values(spec: _Spec) -> str:
    choices = allowed_choices(spec.meta)
    if choices:
        return " | ".join(f"`{c}`" for c in choices)
    bounds = [f"{sign} {spec.meta[key]}" for key, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
              if key in spec.meta]
    kind = spec.kind.__name__ + (" list" if spec.is_list else "")
    if spec.kind is bool and not spec.is_list:
        kind = "flag"
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _help(spec: _Spec, cls) -> str:
    text = spec.meta.get("help") or ""
    return text(cls) if callable(text) else text


def _name(spec: _Spec) -> str:
    if spec.meta.get("positional"):
        return spec.meta.get("metavar") or spec.name.upper()
    return f"`{spec.flag}`"


def render_class(cls, resume_column: bool = False, toml_sections: bool = False) -> List[str]:
    """Markdown tables of one options class, one per group (its --help section), in declaration order;
    `toml_sections`: name each group's section of a TOML file too."""
    sections: dict = {}
    for spec in specs(cls):
        sections.setdefault(group_title(cls, spec) or "options", []).append(spec)
    lines: List[str] = []
    for title, group in sections.items():
        section = f" (TOML section `[{title.replace(' ', '-')}]`)" if toml_sections else ""
        lines += [f"**{title}**{section}", ""]
        head = "| option | values | default | " + ("on `--resume` | " if resume_column else "") + "what it does |"
        lines += [head, "|---" * (5 if resume_column else 4) + "|"]
        for spec in group:
            row = [_name(spec), _values(spec), _default(spec)]
            if resume_column:
                shape = " (as the shape allows)" if spec.meta.get("resume_shape") else ""
                row.append(_RESUME[spec.meta.get("on_resume", "keep")] + shape)
            row.append(_help(spec, cls))
            lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
        lines.append("")
    return lines


# The preamble's example file (tests/unit/test_presets.py reads it as a train config).
TOML_EXAMPLE = """model = "gat"
layers = 3
model-option = ["heads=4", "concat=true"]   # --model-option heads=4 --model-option concat=true"""


# The same file with sections (tests/unit/test_options_toml_sections.py reads it as a train config).
TOML_SECTIONS_EXAMPLE = """epochs = 50

[model]
model = "gat"
layers = 3
model-option = ["heads=4", "concat=true"]

[run-directory]
out = "runs/gat\""""


def page(commands: Optional[list] = None) -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the option declarations by `python -m granndis_hpc.options.reference >",
        "docs/configuration.md`; do not edit by hand (a unit test fails when this page is stale).",
        "",
        "Every option can also be given in a flat TOML file, `--config FILE.toml`, with the option's name as",
        "the key (`batches-per-epoch = 4`; the spelling with underscores, `batches_per_epoch`, is read too);",
        "the command line overrides the file and the file the default. Values are checked the same way from",
        "either. An option that may be given more than once on the command line is a list in the file:",
        "",
    ] + [f"    {line}" for line in TOML_EXAMPLE.splitlines()] + [
        "",
        "For `granndis-train`, whose options come in groups (the sections below), the file may also put an",
        "option under its group's section, named as the group with `-` for spaces; the two forms mix, and an",
        "option given in both is an error:",
        "",
    ] + [f"    {line}" if line else "" for line in TOML_SECTIONS_EXAMPLE.splitlines()] + [
        "",
        "`--config NAME` with the name of an installed preset (`products`, `products.build`, ...: the GraNNDis",
        "artifact's settings, docs/paper-experiments.md) reads that preset from any directory.",
        "A run's resolved options are saved in `RUN_DIR/config.json`.",
        "",
    ]
    for command, path, what in commands or COMMANDS:
        cls = _load(path)
        lines += [f"## `{command}`", "", what[0].upper() + what[1:] + ".", ""]
        train = path.endswith(":TrainConfig")
        lines += render_class(cls, resume_column=train, toml_sections=train)
    if commands is None:
        lines += environment.render()
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(page(), end="")

"""A run's options from what the user gave (`granndis-train`'s command line and --config, the Python API's
``train()``): --resume's rules (which options a resumed run takes from RUN_DIR/config.json and which may be
given again with another value), --init-from's (the saved model's options unless given), and the check
that the code a model imports is the user's to name (model_code.py)."""
from __future__ import annotations

import os
from typing import Dict

from granndis_hpc.rundir.config_file import load_resolved_config

from .declare import ConfigError, defaults, resume_rule, specs
from .parser import missing_required
from .train import TrainConfig

# Options that may be given again with another value together with --resume (TrainConfig's on_resume
# metadata): they change nothing the trajectory depends on, or are checked otherwise (`shards`,
# `ranks_per_server`, `mode` and `preloaded_layers` may differ because they are the checkpoint
# fingerprint's shape: the same shard set, layout and mode, or, in the exact modes, any shard set of
# the same dataset, rundir/checkpoint.py).  `out` is the run directory itself.  "reset" options
# (overwrite_run) are not carried over from the run being resumed.
RESUME_OVERRIDABLE = resume_rule(TrainConfig, "may_change")
RESUME_RESET = resume_rule(TrainConfig, "reset")
# The overridable options that are the checkpoint's shape (may change only as far as it allows).
RESUME_SHAPE = sorted(s.name for s in specs(TrainConfig) if s.meta.get("resume_shape"))


def resume_config(saved: Dict, given: Dict, run_dir: str, defaults: Dict) -> Dict:
    """The options of a resumed run: RUN_DIR/config.json (`saved`), with options given again on the
    command line or in --config (`given`) allowed to differ only where RESUME_OVERRIDABLE says so.
    `defaults` maps every option the trainer takes to its default (what a run whose config.json
    predates an option ran with); other keys, in either dict, are dropped."""
    from granndis_hpc.rundir.checkpoint_files import CheckpointError

    run_dir = os.fspath(run_dir)
    ran_with = {k: (d if k in RESUME_RESET else saved.get(k, d)) for k, d in defaults.items()}
    # model_option is compared by value, not as text, once the options are checked (resumed_model_options)
    refused = [f"{k}={given[k]!r} (the run has {ran_with[k]!r})" for k in sorted(given)
               if k in defaults and k not in RESUME_OVERRIDABLE | RESUME_RESET | {"model_option"}
               and given[k] != ran_with[k]]
    out = given.get("out")
    if out is not None and os.path.realpath(out) != os.path.realpath(run_dir):
        refused.append(f"out={out!r} (a resumed run writes into the run directory {run_dir!r})")
    if refused:
        raise CheckpointError(
            f"--resume {run_dir} continues that run with its own settings ({os.path.join(run_dir, 'config.json')}); "
            f"these options differ: {', '.join(refused)}.  Only "
            f"{', '.join(sorted(RESUME_OVERRIDABLE - {'resume', 'out'}))} may change on resume "
            f"({', '.join(RESUME_SHAPE[:-1])} and {RESUME_SHAPE[-1]} as far as the checkpoint allows); start a new run "
            f"(another --out) to change anything else")
    merged = dict(ran_with)
    merged.update({k: v for k, v in given.items() if k in defaults and k != "model_option"})
    merged["out"], merged["resume"] = run_dir, run_dir
    return merged


def resumed_model_options(cfg: TrainConfig, given: Dict) -> None:
    """--resume: the code the run's model imports is named again by the user (command line or --config),
    equal to what RUN_DIR/config.json records, which never chooses it; other model options given again
    must equal the run's.  ConfigError otherwise."""
    from granndis_hpc.model_code import rebuild_options

    try:
        rebuild_options(cfg.model, cfg.model_option, given.get("model_option"),
                        os.path.join(cfg.resume, "config.json"))
    except ValueError as exc:
        raise ConfigError(f"--resume {cfg.resume}: {exc}") from None


def train_config(given: Dict) -> TrainConfig:
    """The run's options from the values the user gave (`given`: TrainConfig's field names): with --resume
    the run's own, as resume_config allows; with --init-from the saved model's architecture where not
    given; else the defaults.  ConfigError or CheckpointError saying what is wrong."""
    given = dict(given)
    if given.get("resume") is None and given.get("init_from"):
        from granndis_hpc.engine.model_source import ModelSourceError, saved_model_options
        try:
            given.update(saved_model_options(given["init_from"], given))
        except ModelSourceError as exc:
            raise ConfigError(f"--init-from {given['init_from']}: {exc}") from None
    if given.get("resume") is None:
        missing = missing_required(TrainConfig, given)
        if missing:
            raise ConfigError(f"the following arguments are required: {', '.join(missing)}")
        return TrainConfig(**{**defaults(TrainConfig), **given})
    run_dir = os.fspath(given["resume"])
    cfg = TrainConfig(**resume_config(load_resolved_config(run_dir), given, run_dir, defaults(TrainConfig)))
    resumed_model_options(cfg, given)
    return cfg

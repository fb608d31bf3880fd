"""The options of `granndis-train`: :class:`TrainConfig`, composed of the option groups (train_groups.py,
and the cluster options startup.py shares with `granndis predict`), with the checks that span groups.  Its
parser, ``--config FILE.toml`` (flat keys, or one ``[section]`` per group), ``--help`` and the
configuration reference are derived from it by this package; a run's resolved options are written to
``RUN_DIR/config.json`` (granndis_hpc/rundir/config_file.py)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from granndis_hpc import registry
from granndis_hpc.units import parse_size

from .declare import ConfigError, validate
from .startup import ClusterOptions
from .train_groups import (DataOptions, ExchangeOptions, LoggingOptions, ModelOptions, OptimOptions, RunDirOptions,
                           ScheduleOptions)


def schedule_problem(cfg) -> Optional[str]:
    """What is wrong with a combination of the optimisation and schedule options (None: nothing)."""
    if cfg.optimizer != "sgd" and (cfg.momentum > 0 or cfg.nesterov):
        return (f"--momentum and --nesterov are sgd's; --optimizer is {cfg.optimizer}: give --optimizer sgd or "
                f"leave them out")
    if cfg.nesterov and cfg.momentum == 0:
        return "--nesterov needs momentum: give --momentum (e.g. 0.9)"
    if cfg.lr_schedule in ("cosine", "plateau") and cfg.min_lr >= cfg.lr:
        return f"--min-lr {cfg.min_lr} must be below --lr {cfg.lr} for the {cfg.lr_schedule} schedule"
    horizon = cfg.lr_decay_epochs or cfg.epochs
    if cfg.lr_schedule == "cosine" and cfg.warmup_epochs >= horizon:
        return (f"--warmup-epochs {cfg.warmup_epochs} leaves no epoch to decay over before epoch {horizon} "
                f"(--lr-decay-epochs, default --epochs): lower it or raise the horizon")
    if cfg.patience > 0 and cfg.eval_every == 0:
        return "--patience counts evaluations, and --eval-every 0 evaluates only at the end: give --eval-every N"
    return None


@dataclass
class TrainConfig(LoggingOptions, ClusterOptions, RunDirOptions, ExchangeOptions, ScheduleOptions, OptimOptions,
                  ModelOptions, DataOptions):
    """Every option of `granndis-train`, one group after another (the last base's fields come first: data,
    model, optimisation, schedule, mode and exchange, run directory, cluster, logging and output)."""

    def __post_init__(self):
        # Like torchtitan's ParallelDims: a config that exists is a valid one, however it was made.
        validate(self)
        if self.weight_decay_on != "all" and self.weight_decay == 0.0:
            raise ConfigError(f"--weight-decay-on {self.weight_decay_on} says which parameters --weight-decay "
                              f"applies to, but --weight-decay is 0: give --weight-decay (e.g. 5e-4) or leave "
                              f"--weight-decay-on out")
        # What a mode needs of the other options: its registry entry's `needs`, or the check_options
        # of a mode class registered in code (read from the loaded class only: no engine import here).
        entry = registry.MODES.entry(self.mode)
        check = entry.get("check_options")
        problem = registry.mode_problem(self.mode, self) or (check(self) if check is not None else None)
        if problem:
            raise ConfigError(problem)
        if not self.linear_layers:
            self.linear_layers = None
        problem = registry.linear_head_problem(self.model, self.layers, self.linear_layers)
        if problem:
            raise ConfigError(problem)
        if self.checkpoint_activations and not registry.checkpointable(self.model):
            able = [name for name in registry.MODELS if registry.checkpointable(name)]
            raise ConfigError(f"--checkpoint-activations recomputes residual blocks, which only "
                              f"{', '.join(able)} has; model {self.model!r} would ignore it: "
                              f"leave it out or use --model {able[0] if able else 'ressage'}")
        try:
            registry.model_options(self.model, self.model_option)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        problem = schedule_problem(self)
        if problem:
            raise ConfigError(problem)
        if self.precision == "bf16" and self.halo_dtype == "float16":
            raise ConfigError("--precision bf16 computes the halo rows in bfloat16, and --halo-dtype float16 would "
                              "round them again to float16 (another format, with a narrower range): leave "
                              "--halo-dtype out (bf16 halos already travel at half width)")
        if self.eval_only and not self.init_from:
            raise ConfigError("--eval-only evaluates a saved model: give it with --init-from RUN_OR_FILE")
        if self.eval_only and self.resume:
            raise ConfigError("--eval-only trains nothing, so there is nothing to --resume: leave one of them out")
        for flag, given in (("--checkpoint-every", self.checkpoint_every > 0),
                            ("--checkpoint-initial", self.checkpoint_initial)):
            if given and not self.out:
                raise ConfigError(f"{flag} needs a run directory to write checkpoints into: add --out RUN_DIR")
        if self.resume and (not self.out or os.path.realpath(self.out) != os.path.realpath(self.resume)):
            raise ConfigError(f"--resume {self.resume} continues in that run directory, but --out is {self.out!r}; "
                              f"leave --out out or set it to {self.resume}")
        if self.resume and self.overwrite_run:
            raise ConfigError("--overwrite-run starts a new run in place of the old one and --resume continues "
                              "the old one: give one of them")

    @property
    def conv_layers(self) -> int:
        """The model's message-passing layers: the hops its training and evaluation views span."""
        return self.layers - (self.linear_layers or 0)

    @property
    def memory_per_gpu_bytes(self) -> Optional[int]:
        return None if self.memory_per_gpu is None else parse_size(self.memory_per_gpu)

"""The choices and cross-option rules of the optimizer and schedule options (TrainConfig declares the
options; engine/optim.py implements them).  Standard library only, like the options framework."""
from __future__ import annotations

from typing import Optional

OPTIMIZER_NAMES = ("adam", "adamw", "sgd")
LR_SCHEDULES = ("constant", "step", "cosine", "plateau")
SCHEDULE_GROUP = "optimizer and schedule"


def schedule_problem(cfg) -> Optional[str]:
    """What is wrong with a combination of these options (None: nothing)."""
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

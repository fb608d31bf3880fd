"""The optimizer and its schedule (--optimizer, --lr-schedule, --clip-grad-norm, --patience).

`ScheduledOptimizer` wraps the torch optimizer with everything the training loop does around its step:

* the learning rate of each epoch: linear warm-up over --warmup-epochs (epoch e < W runs at
  lr * (e + 1) / W), then constant, step (lr * gamma ** floor((e - W) / step_size)), cosine (from lr down
  to --min-lr over the epochs after warm-up: min_lr + (lr - min_lr) * (1 + cos(pi * (e - W) / (T - W))) / 2,
  T the decay horizon), or plateau (lr * gamma each time the validation metric has not improved for
  --plateau-patience evaluations, never below --min-lr);
* gradient clipping by global norm: applied after the all-reduce, when every rank holds the summed
  gradient of the whole graph, so the norm is the single-process norm and every rank clips alike;
* early stopping: --patience evaluations without a better validation metric end the run (ending with
  the best model in best-model.pt and a checkpoint).

Its state_dict is the torch optimizer's plus the schedule's (the horizon T, the plateau's learning rate,
best value and count, the early-stopping count), so a checkpoint carries both and a resumed run continues
the schedule exactly; T is fixed when the run starts (--lr-decay-epochs, default --epochs), so a run
resumed with more --epochs keeps its schedule.  Everything here is a function of the epoch and of the
all-reduced validation metrics, identical on every rank.
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, List, Optional

import torch

from granndis_hpc.options.train_groups import OptimOptions
from granndis_hpc.rundir.checkpoint_files import CheckpointError

# The options the saved state must agree with (not in the checkpoint fingerprint: see options/train_groups.py), and
# what a run made before they existed ran with.
SCHEDULE_OPTIONS = {"optimizer": "adam", "momentum": 0.0, "nesterov": False, "lr_schedule": "constant",
                    "warmup_epochs": 0, "step_size": 30, "gamma": 0.1, "min_lr": 0.0, "lr_decay_epochs": 0,
                    "plateau_patience": 10, "clip_grad_norm": 0.0, "metric": "accuracy"}


def make_torch_optimizer(cfg: OptimOptions, groups: List[Dict]) -> torch.optim.Optimizer:
    """--optimizer over the parameter groups (engine/preflight.optimizer_groups: their weight decay)."""
    name = cfg.optimizer
    if name == "adam":
        return torch.optim.Adam(groups, lr=cfg.lr)
    if name == "adamw":  # decoupled weight decay (Loshchilov & Hutter)
        return torch.optim.AdamW(groups, lr=cfg.lr)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    raise ValueError(f"unknown optimizer {name!r}; choose adam, adamw or sgd")


def scheduled_lr(cfg, epoch: int, horizon: int) -> float:
    """The learning rate of epoch `epoch` (0-based) for the schedules that depend on the epoch only
    (plateau: the rate it starts from, before any reduction)."""
    base, warm = cfg.lr, cfg.warmup_epochs
    if epoch < warm:
        return base * (epoch + 1) / warm
    after = epoch - warm
    if cfg.lr_schedule == "step":
        return base * cfg.gamma ** (after // cfg.step_size)
    if cfg.lr_schedule == "cosine":
        span = max(horizon - warm, 1)
        return cfg.min_lr + (base - cfg.min_lr) * 0.5 * (1.0 + math.cos(math.pi * min(after, span) / span))
    return base


class ScheduledOptimizer:
    """A torch optimizer with the run's schedule, clipping and early stopping (module docstring).  It
    offers what the trainer and the checkpoint use of an optimizer: zero_grad, step, param_groups,
    state_dict and load_state_dict."""

    def __init__(self, cfg, groups: List[Dict], parameters: Iterable[torch.nn.Parameter]):
        self.cfg = cfg
        self.torch = make_torch_optimizer(cfg, groups)
        self.parameters = [p for p in parameters]
        self.horizon = int(cfg.lr_decay_epochs or cfg.epochs)
        self.plateau_lr = float(cfg.lr)  # the plateau schedule's rate after warm-up
        self.best: Optional[float] = None  # best validation metric seen (plateau and early stopping)
        self.plateau_bad = 0  # evaluations since the plateau's last improvement or reduction
        self.since_best = 0  # evaluations since the best one (early stopping)
        self.stopped_at: Optional[int] = None  # the epoch early stopping ended the run after
        self.lr = float(cfg.lr)
        self.last_norm: Optional[float] = None  # the gradient norm of the last step, before clipping

    # ---- what torch's optimizer offers ----
    @property
    def param_groups(self):
        return self.torch.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.torch.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        """Clip by global norm (the gradients are already all-reduced), then the optimizer's step."""
        if self.cfg.clip_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.cfg.clip_grad_norm)
            self.last_norm = float(norm)
        self.torch.step()

    # ---- the schedule ----
    def start_epoch(self, epoch: int) -> float:
        """Set the learning rate of epoch `epoch`; returns it."""
        if self.cfg.lr_schedule == "plateau" and epoch >= self.cfg.warmup_epochs:
            lr = self.plateau_lr
        else:
            lr = scheduled_lr(self.cfg, epoch, self.horizon)
        for group in self.torch.param_groups:
            group["lr"] = lr
        self.lr = lr
        return lr

    def observe(self, value: float, epoch: int, final: bool = False) -> bool:
        """After an evaluation: the validation metric `value` (all-reduced: the same on every rank) after
        `epoch` epochs.  Reduces the plateau rate when due; True when early stopping ends the run (never
        after the `final` epoch, which ends it anyway).  "Better" is strictly greater, as best-model
        selection's, so both agree on which evaluation is the best."""
        if self.best is None or value > self.best:
            self.best, self.plateau_bad, self.since_best = float(value), 0, 0
        else:
            self.since_best += 1
            # Evaluations during warm-up do not count towards a plateau decay (the rate is still rising).
            self.plateau_bad = self.plateau_bad + 1 if epoch > self.cfg.warmup_epochs else 0
        if self.cfg.lr_schedule == "plateau" and self.plateau_bad >= self.cfg.plateau_patience:
            self.plateau_lr = max(self.plateau_lr * self.cfg.gamma, self.cfg.min_lr)
            self.plateau_bad = 0
        if self.cfg.patience > 0 and self.since_best >= self.cfg.patience and not final:
            self.stopped_at = int(epoch)
            return True
        return False

    def summary(self) -> Dict:
        """summary.json's "optimizer" entry."""
        return {"optimizer": self.cfg.optimizer, "lr_schedule": self.cfg.lr_schedule, "final_lr": self.lr,
                "lr_decay_epochs": self.horizon, "clip_grad_norm": self.cfg.clip_grad_norm,
                "stopped_early_after_epoch": self.stopped_at, "patience": self.cfg.patience}

    # ---- checkpoints ----
    def _options(self) -> Dict:
        # --metric None: not resolved for a set (the trainer resolves it before it builds this), the default
        return {k: SCHEDULE_OPTIONS[k] if getattr(self.cfg, k) is None else getattr(self.cfg, k)
                for k in SCHEDULE_OPTIONS}

    def state_dict(self) -> Dict:
        return {"torch": self.torch.state_dict(), "options": self._options(),
                "schedule": {"horizon": self.horizon, "plateau_lr": self.plateau_lr, "best": self.best,
                             "plateau_bad": self.plateau_bad, "since_best": self.since_best,
                             "stopped_at": self.stopped_at, "lr": self.lr}}

    def load_state_dict(self, state: Dict) -> None:
        """A checkpoint's state; one written before the schedule was saved holds the torch optimizer's
        state alone (a constant learning rate, nothing else to restore)."""
        saved = state.get("options", SCHEDULE_OPTIONS) if "torch" in state else SCHEDULE_OPTIONS
        saved = {**SCHEDULE_OPTIONS, **saved}  # an option the checkpoint predates: what such runs ran with
        differ = [f"{k}: checkpoint {saved.get(k)!r}, this run {v!r}" for k, v in self._options().items()
                  if saved.get(k) != v]
        if differ:
            raise CheckpointError(f"the checkpoint's optimizer and schedule differ from this run's "
                                  f"({'; '.join(differ)}); "
                                  f"resume with the run's own options, or start a new run (--init-from RUN_DIR "
                                  f"starts one from its parameters)")
        if "torch" not in state:
            self.torch.load_state_dict(state)
            return
        self.torch.load_state_dict(state["torch"])
        s = state["schedule"]
        self.horizon, self.plateau_lr, self.best = int(s["horizon"]), float(s["plateau_lr"]), s["best"]
        self.plateau_bad, self.since_best = int(s["plateau_bad"]), int(s["since_best"])
        self.stopped_at = s["stopped_at"]
        self.lr = float(s["lr"])

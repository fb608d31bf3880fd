"""What the model is trained and measured against: the loss and the evaluation metric (--metric).

Single-label sets (labels: int64 class ids): cross-entropy over the target rows, summed and divided by
their global count; accuracy (the default), or micro-F1, which equals accuracy there (one label and
one prediction per vertex: every wrong prediction is one false positive and one false negative).

Multi-label sets (labels: uint8 [n, C] of 0/1, manifest dataset.multilabel): binary cross-entropy with
logits over every (vertex, task) entry of the target rows, summed and divided by their global count
times C (torch's BCEWithLogitsLoss with its mean over all entries), and
* micro-f1 (the default): sklearn's f1_score(y, logits > 0, average="micro"), 2 TP / (2 TP + FP + FN)
  over every entry of the split (0.0 when the split has neither positives nor positive predictions);
* rocauc: OGB's Evaluator for ogbn-proteins: the ROC-AUC of each task that has both a positive and a
  negative vertex in the split, averaged over those tasks (0.0 when no task has both).
accuracy is not defined for multi-label targets here (OGB defines none) and is refused.

Every value is exact across ranks: accuracy and micro-F1 from all-reduced counts; ROC-AUC ranks a
task's scores over the whole split, so rank 0 gathers the split's scores and targets (module Scorer).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import torch

from granndis_hpc.engine.steps import TrainingError
from granndis_hpc.metric_names import METRICS


def resolve_metric(metric: Optional[str], multilabel: bool, where: str) -> str:
    """--metric for this set (None: accuracy for single-label, micro-f1 for multi-label targets);
    TrainingError for a metric the targets do not define."""
    if metric is None:
        return "micro-f1" if multilabel else "accuracy"
    if metric not in METRICS:
        raise TrainingError(f"--metric {metric!r} is not one of {', '.join(METRICS)}")
    if multilabel and metric == "accuracy":
        raise TrainingError(f"--metric accuracy: {where} holds multi-label targets (one 0/1 entry per vertex and "
                            f"task), for which accuracy is not defined; use --metric micro-f1 or --metric rocauc")
    if not multilabel and metric == "rocauc":
        raise TrainingError(f"--metric rocauc: {where} holds one class id per vertex; ROC-AUC is defined here for "
                            f"multi-label (binary) targets: use --metric accuracy or --metric micro-f1")
    return metric


def loss(logits: torch.Tensor, labels: torch.Tensor, num_targets: int) -> torch.Tensor:
    """The step's loss: its target rows' share of the mean over all target rows (module docstring), so
    the all-reduced sum of the ranks' gradients is the single-process gradient."""
    if labels.dim() == 2:  # multi-label
        return torch.nn.functional.binary_cross_entropy_with_logits(
            logits, labels.to(logits.dtype), reduction="sum") / float(num_targets * labels.shape[1])
    if logits.is_cuda and torch.are_deterministic_algorithms_enabled():  # --deterministic on a GPU
        return class_loss_by_gather(logits, labels) / float(num_targets)
    return torch.nn.functional.cross_entropy(logits, labels, reduction="sum") / float(num_targets)


def class_loss_by_gather(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The summed cross-entropy as -log_softmax gathered at the labels: torch's NLLLoss has no deterministic
    CUDA kernel (use_deterministic_algorithms refuses it), gather's backward has one."""
    return -logits.log_softmax(1).gather(1, labels.long().unsqueeze(1)).sum()


def prediction(logits: torch.Tensor, multilabel: bool) -> torch.Tensor:
    """The predicted class (int64 [n]), or the predicted 0/1 entries (uint8 [n, C]: logit > 0)."""
    return (logits > 0).to(torch.uint8) if multilabel else logits.argmax(dim=1)


def probabilities(logits: torch.Tensor, multilabel: bool) -> torch.Tensor:
    """softmax over the classes, or each task's sigmoid."""
    return torch.sigmoid(logits) if multilabel else torch.softmax(logits, dim=1)


# ---- the metrics on one process's arrays (NumPy; the unit tests check them on hand-made cases) ----
def f1_counts(logits, y) -> np.ndarray:
    """[TP, FP, FN] (int64) of the predictions logits > 0 against the 0/1 targets y."""
    pred, y = np.asarray(logits) > 0, np.asarray(y).astype(bool)
    return np.array([np.count_nonzero(pred & y), np.count_nonzero(pred & ~y), np.count_nonzero(~pred & y)],
                    dtype=np.int64)


def micro_f1(counts) -> float:
    tp, fp, fn = (int(c) for c in counts)
    return 2.0 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else 0.0


def rocauc(scores, y) -> float:
    """OGB's multi-task ROC-AUC: the mean over the tasks (columns) that have both classes of the task's
    ROC-AUC, from ranks (the Mann-Whitney statistic; tied scores share their mean rank, as sklearn's
    roc_auc_score counts a tie as half a correct pair)."""
    from scipy.stats import rankdata

    scores, y = np.asarray(scores, dtype=np.float64), np.asarray(y).astype(bool)
    if scores.ndim != 2 or scores.shape != y.shape:
        raise ValueError(f"rocauc: scores {scores.shape} and targets {y.shape} must be the same [n, C]")
    pos = y.sum(axis=0).astype(np.float64)
    neg = y.shape[0] - pos
    both = (pos > 0) & (neg > 0)
    if not both.any():
        return 0.0
    ranks = rankdata(scores[:, both], axis=0)
    pos, neg = pos[both], neg[both]
    auc = ((ranks * y[:, both]).sum(axis=0) - pos * (pos + 1) / 2) / (pos * neg)
    return float(auc.mean())


class Scorer:
    """Collective evaluation of the chosen metric on every split, the same values on every rank.

    parts: split -> (logits of this rank's rows of the split, their labels)."""

    def __init__(self, comm, world, metric: str, multilabel: bool, totals: Dict[str, int]):
        self.comm, self.world, self.metric, self.multilabel = comm, world, metric, multilabel
        self.totals = totals

    def scores(self, parts: Dict[str, Tuple[torch.Tensor, torch.Tensor]]) -> Dict[str, float]:
        names = list(parts)
        if not self.multilabel:  # accuracy, and micro-F1, which equals it here
            correct = np.array([int((lg.argmax(dim=1) == y).sum()) for lg, y in parts.values()], dtype=np.int64)
            correct = self.comm.allreduce_scalar(correct, "sum")
            return {name: float(c) / max(int(self.totals[name]), 1) for name, c in zip(names, correct)}
        if self.metric == "micro-f1":
            counts = np.stack([f1_counts(lg.detach().cpu().numpy(), y.cpu().numpy()) for lg, y in parts.values()])
            counts = self.comm.allreduce_scalar(counts, "sum")
            return {name: micro_f1(c) for name, c in zip(names, counts)}
        # ROC-AUC ranks each task over the whole split: rank 0 gathers the split's float32 logits and uint8
        # targets, 5 C bytes per vertex of the split (ogbn-proteins' largest split, 86 619 training
        # vertices x 112 tasks: 48 MB), one split at a time, and computes every split's value.
        out = {}
        for name, (lg, y) in parts.items():
            got = self.world.gather((lg.detach().float().cpu().numpy(), y.cpu().numpy()), root=0)
            if self.world.Get_rank() == 0:
                out[name] = rocauc(np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got]))
            del got
        return self.world.bcast(out, root=0)

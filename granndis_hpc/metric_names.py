"""The evaluation metrics' names (--metric) and the keys their values go under in metrics.jsonl,
summary.json, checkpoints and best-model.pt.  No torch here: the options and `granndis report` read it.

accuracy keeps the keys it always had (train_acc/val_acc/test_acc, summary "accuracy"), so a
single-label run's files are what they were; micro-f1 and rocauc get their own (train_micro_f1, ...,
summary "micro_f1"; train_rocauc, ..., summary "rocauc").  summary.json's "best_val" holds the chosen
metric's values under train/val/test whatever it is, and "metric" names it.
"""
from __future__ import annotations

from typing import Dict, Optional

METRICS = ("accuracy", "micro-f1", "rocauc")
_SHORT = {"accuracy": "acc", "micro-f1": "micro_f1", "rocauc": "rocauc"}
_SHOWN = {"accuracy": "Acc", "micro-f1": "Micro-F1", "rocauc": "ROC-AUC"}
SPLITS = ("train", "val", "test")


def split_keys(metric: str) -> Dict[str, str]:
    """Split -> the key of its value in an epoch record (and in the best-validation record)."""
    return {split: f"{split}_{_SHORT[metric]}" for split in SPLITS}


def summary_key(metric: str) -> str:
    """The key of the last evaluation's values in summary.json."""
    return "accuracy" if metric == "accuracy" else _SHORT[metric]


def shown(metric: str) -> str:
    """The metric's name in the epoch line and the report ("Acc", "Micro-F1", "ROC-AUC")."""
    return _SHOWN[metric]


def metric_of_record(rec: Dict) -> Optional[str]:
    """The metric whose validation value a record (an epoch's, or a best-validation one) holds; None
    when it holds none (an epoch that was not evaluated)."""
    for metric in METRICS:
        if split_keys(metric)["val"] in rec:
            return metric
    return None

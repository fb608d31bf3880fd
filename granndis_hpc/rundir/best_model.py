"""RUN_DIR/best-model.pt: the model of the epoch with the best validation metric."""
from __future__ import annotations

import io
import os
from typing import Dict, Optional

import torch

from granndis_hpc.fsutil import atomic_write_bytes

BEST_MODEL = "best-model.pt"


def write_best_model(run_dir: str, best: Dict, state: Dict, provenance: Optional[Dict] = None) -> str:
    """RUN_DIR/best-model.pt, atomically: {"epoch", the metric's train/val/test values ("train_acc",
    "val_acc", "test_acc" for accuracy: metric_names.split_keys), "model"} and, when given, "provenance"
    (the run's options and dataset digest: engine/model_source.py reads it); load it with
    torch.load(path, weights_only=True) and model.load_state_dict(obj["model"])."""
    buf = io.BytesIO()
    obj = {**{k: v for k, v in best.items() if k != "model"}, "model": state}
    if provenance is not None:
        obj["provenance"] = provenance
    torch.save(obj, buf)
    path = os.path.join(run_dir, BEST_MODEL)
    atomic_write_bytes(path, buf.getvalue())
    return path

"""Run-directory outputs: the per-epoch line users of PipeGCN/GraNNDis know, metrics.jsonl, summary.json."""
from __future__ import annotations

import json
import os
import resource
import statistics
from typing import Dict, List, Optional

import torch

from granndis_hpc.fsutil import atomic_write_json


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process: max allocated on CUDA, peak RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def epoch_line(rec: Dict) -> str:
    line = (f"Epoch {rec['epoch']:05d} | Time(s) {rec['time_s']:.4f} | "
            f"Comm(s) {rec['intra_comm_s'] + rec['inter_comm_s']:.4f} | Reduce(s) {rec['grad_sync_s']:.4f} | "
            f"Loss {rec['loss']:.4f}")
    if "val_acc" in rec:
        line += f" | Train Acc {rec['train_acc']:.4f} | Val Acc {rec['val_acc']:.4f} | Test Acc {rec['test_acc']:.4f}"
    return line


class MetricsWriter:
    """Rank 0's writer: appends one JSON line per epoch (flushed, so a killed job keeps its epochs)."""

    def __init__(self, run_dir: str, append: bool = False):
        os.makedirs(run_dir, exist_ok=True)
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self._f = open(self.path, "a" if append else "w")

    def write(self, rec: Dict) -> None:
        self._f.write(json.dumps(rec, sort_keys=True) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_metrics(run_dir: str) -> List[Dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def summarize(records: List[Dict], config: Dict, accuracy: Optional[Dict], peak_memory: int,
              topology: Dict, total_time_s: float) -> Dict:
    """summary.json: medians over epochs (epoch time is already the slowest rank's)."""
    def med(key):
        vals = [r[key] for r in records]
        return float(statistics.median(vals)) if vals else 0.0

    def med_bytes(key):
        vals = [r["bytes"][key] for r in records]
        return int(statistics.median(vals)) if vals else 0

    return {
        "mode": config["mode"], "model": config["model"], "layers": config["layers"],
        "servers": topology["servers"], "ranks_per_server": topology["ranks_per_server"],
        "epochs": len(records),
        "epoch_time_s": med("time_s"),
        "seconds_per_epoch": {"compute": med("compute_s"), "intra_comm": med("intra_comm_s"),
                              "inter_comm": med("inter_comm_s"), "grad_sync": med("grad_sync_s"),
                              "sampling": med("sampling_s")},
        "bytes_per_epoch": {k: med_bytes(k) for k in ("intra_halo", "inter_halo", "intra_grad", "inter_grad")},
        "accuracy": accuracy or {},
        "peak_memory_bytes": int(peak_memory),
        "activation_memory_bytes": int(max((r.get("activation_memory_bytes", 0) for r in records), default=0)),
        "total_time_s": float(total_time_s),
    }


def write_summary(run_dir: str, summary: Dict) -> str:
    path = os.path.join(run_dir, "summary.json")
    atomic_write_json(path, summary)
    return path

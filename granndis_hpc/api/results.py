"""What the API's functions return: ShardSet (build), TrainResult (train) and Predictions (predict, and
read_predictions of a file `granndis predict` wrote).  Plain records with named fields; NumPy only."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from granndis_hpc.metric_names import summary_key

BEST_MODEL_FILE = "best-model.pt"  # rundir/best_model.py's name (not imported: it imports torch)
SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class ShardSet:
    """A shard set on disk: where it is, the job shape it serves and what it preloads.  Usable wherever a
    shard directory's path is (``os.fspath(shard_set)``)."""
    path: str
    servers: int
    gpus_per_server: int
    layers: int
    preload: str                 # "full" (k-hop preload) or "eas" (Expansion-aware Sampling)
    hops: int
    dataset: str                 # the dataset's name
    content_sha256: str          # the dataset content digest (the same for every shape and preload)
    reused: bool = False         # True: a verified set from the cache, not built by this call
    build_options: Mapping[str, Any] = field(default_factory=dict, repr=False)  # what it was built with

    @property
    def shape(self) -> str:
        return f"{self.servers}x{self.gpus_per_server}"

    def __fspath__(self) -> str:
        return self.path

    @classmethod
    def from_manifest(cls, path: str, manifest: Mapping, reused: bool = False,
                      build_options: Optional[Mapping] = None) -> "ShardSet":
        pre, ds = manifest["preload"], manifest["dataset"]
        return cls(path=os.fspath(path), servers=int(manifest["servers"]),
                   gpus_per_server=int(manifest["gpus_per_server"]), layers=int(manifest["layers"]),
                   preload=str(pre["kind"]), hops=int(pre["hops"]), dataset=str(ds.get("name")),
                   content_sha256=str(ds.get("content_sha256")), reused=reused,
                   build_options=dict(build_options or {}))


@dataclass(frozen=True)
class TrainResult:
    """A finished (or stopped) training run.  `summary` is RUN_DIR/summary.json's content (None when a
    stop signal ended the run with a checkpoint: continue it with ``train(..., resume=result.run_dir)``)."""
    run_dir: str
    summary: Optional[Dict[str, Any]]
    config: Any                  # the resolved TrainConfig (--mode auto: the mode it chose)
    shards: Optional[ShardSet]
    rank: int = 0                # this process's rank in the job

    @property
    def completed(self) -> bool:
        return self.summary is not None

    @property
    def metric(self) -> str:
        """The evaluation metric: accuracy, micro-f1 or rocauc."""
        return (self.summary or {}).get("metric") or self.config.metric or "accuracy"

    @property
    def metrics(self) -> Dict[str, float]:
        """The last evaluation's values of `metric`: {"train": ..., "val": ..., "test": ...}."""
        if self.summary is None:
            return {}
        return dict(self.summary.get(summary_key(self.metric)) or {})

    @property
    def best(self) -> Optional[Dict[str, float]]:
        """The best-validation epoch's record: {"epoch", "train", "val", "test"} (None: none evaluated)."""
        return None if self.summary is None else self.summary.get("best_val")

    @property
    def best_model(self) -> Optional[str]:
        """RUN_DIR/best-model.pt (the best-validation epoch's parameters), or None when not written."""
        path = os.path.join(self.run_dir, BEST_MODEL_FILE)
        return path if os.path.exists(path) else None

    def history(self) -> List[Dict[str, Any]]:
        """The per-epoch records of RUN_DIR/metrics.jsonl (loss, times, bytes, evaluated metrics)."""
        with open(os.path.join(self.run_dir, METRICS_FILE), encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]


@dataclass(frozen=True)
class Predictions:
    """Per-vertex outputs of a trained model, row i for vertex global_id[i] (ascending).  `logits` or
    `probabilities` (predict(probabilities=True)) holds the scores, the other is None; `prediction` is
    the class of each vertex (a multi-label set: the 0/1 matrix logit > 0); `embeddings` the rows layer
    K reads (predict(layer=K)), else None.  `provenance`: the model, the shard set, the split and the
    job shape that produced them."""
    global_id: np.ndarray
    prediction: np.ndarray
    logits: Optional[np.ndarray] = None
    probabilities: Optional[np.ndarray] = None
    embeddings: Optional[np.ndarray] = None
    type_id: Optional[np.ndarray] = None  # a heterogeneous set: per-type ids of provenance["vertex_type"]
    provenance: Mapping[str, Any] = field(default_factory=dict)
    rank: int = 0                # this process's rank in the job
    out: Optional[str] = None    # the file written (predict(out=...)), or None

    def __len__(self) -> int:
        return int(self.global_id.shape[0])

    @property
    def scores(self) -> np.ndarray:
        """`logits` or `probabilities`, whichever was computed."""
        return self.logits if self.logits is not None else self.probabilities

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], provenance: Mapping, rank: int = 0,
                    out: Optional[str] = None) -> "Predictions":
        known = {"global_id", "prediction", "logits", "probabilities", "embeddings", "type_id"}
        extra = sorted(set(arrays) - known)
        if extra:
            raise ValueError(f"unexpected arrays {extra} in predictions (expected {sorted(known)})")
        return cls(global_id=np.asarray(arrays["global_id"]), prediction=np.asarray(arrays["prediction"]),
                   logits=arrays.get("logits"), probabilities=arrays.get("probabilities"),
                   embeddings=arrays.get("embeddings"), type_id=arrays.get("type_id"), provenance=dict(provenance),
                   rank=rank, out=out)


def read_predictions(path) -> Predictions:
    """The predictions in a file or directory written by `granndis predict` or predict(out=...)."""
    from granndis_hpc.engine.predict_io import read_output

    arrays, provenance = read_output(os.fspath(path))
    return Predictions.from_arrays(arrays, provenance, out=os.fspath(path))

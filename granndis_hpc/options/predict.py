"""`granndis predict`'s options: its own, the cluster group it shares with `granndis-train`
(startup.py), and train's declarations of the options that mean the same in both (:func:`reuse`).  No
torch, h5py or MPI imported here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from .declare import ConfigError, option, reuse
from .startup import ClusterOptions
from .train import TrainConfig

PREDICT_PROG = "granndis predict"
PREDICT_DESCRIPTION = (
    "Exact distributed inference of a trained model over a shard set of the same dataset, on any cluster "
    "shape (mpirun -n S*G granndis predict --model RUN_DIR --shards DIR --out preds.h5).  Writes, for every "
    "vertex in global-id order (or those of one --split), the logits or probabilities, the predicted class "
    "and, with --layer K, the embeddings of layer K, to HDF5 or to a directory of .npy files.")
PREDICT_EPILOG = ("examples:\n"
                  "  mpirun -n 4 granndis predict --model runs/cora --shards shards/cora-2x2 --out cora-preds.h5\n"
                  "  mpirun -n 4 granndis predict --model runs/cora/best-model.pt --shards shards/cora-4x1 \\\n"
                  "      --ranks-per-server 1 --layer 2 --split test --probabilities --out cora-test-npy")
SPLITS = ("all", "train", "val", "test")
FORMATS = ("auto", "hdf5", "npy")


@dataclass
class PredictOptions(ClusterOptions):
    # required=True, not a missing default: the cluster group's fields, with defaults, come first.
    model: str = option(None, required=True, metavar="RUN_OR_FILE",
                        help="the trained model: a run directory (its best-model.pt, else its newest complete "
                             "checkpoint), a best-model.pt, or a checkpoint directory RUN_DIR/checkpoints/epoch-E")
    shards: str = reuse(TrainConfig, "shards", help="shard directory of the same dataset (any servers x ranks, "
                                                    "any preload): its content digest must match the model's")
    out: str = option(None, required=True,
                      help="output: FILE.h5 / FILE.hdf5 (HDF5), or a directory of .npy files (see --format)")
    model_option: Optional[List[str]] = reuse(
        TrainConfig, "model_option",
        help="the model's code, named again: a model file records --model pyg's module and factory but never chooses "
             "the code that runs, so give them as it records them (module=M, factory=F); any other option given "
             "must equal the recorded one")
    format: str = option("auto", choices=FORMATS, help="auto: HDF5 when --out ends in .h5 or .hdf5, else a "
                                                       "directory of .npy files")
    probabilities: bool = option(False, help="write softmax probabilities instead of the logits (a multi-label "
                                             "set: each task's sigmoid; its prediction is then the 0/1 matrix "
                                             "logit > 0)")
    layer: Optional[int] = option(None, ge=0, metavar="K",
                                  help="also write layer K's embeddings: the rows message-passing layer K reads "
                                       "(0 = the input features, 1 .. L-1 = the output of the first K layers)")
    split: str = option("all", choices=SPLITS, help="the vertices written: all, or one split's (their global ids "
                                                    "are written beside them)")
    vertex_type: Optional[str] = option(None, metavar="TYPE",
                                        help="a heterogeneous set: the vertices of this type only, with their "
                                             "per-type ids (type_id) beside the global ids (default: the target "
                                             "type, whose classes the model predicts)")
    overwrite: bool = option(False, help="replace an earlier output of predict at --out (anything else there is "
                                           "refused, as are links, devices and the current directory)")
    halo_route: str = reuse(TrainConfig, "halo_route",
                            help="how halo rows cross between servers: 'per-server' (default) once per server "
                                 "that reads them, 'direct' once per rank; the same predictions either way")
    skip_checksums: bool = reuse(TrainConfig, "skip_checksums")
    verify_content: bool = reuse(TrainConfig, "verify_content",
                                 help="before predicting, recompute the dataset content digest from the rows the "
                                      "ranks read and refuse a set whose files were edited after the build")
    quiet: bool = option(False, help="print nothing but errors")
    log_level: str = reuse(TrainConfig, "log_level")
    log_all_ranks: bool = reuse(TrainConfig, "log_all_ranks")

    def __post_init__(self):
        super().__post_init__()
        if self.resolved_format() == "hdf5" and self.out.endswith("/"):
            raise ConfigError(f"--out {self.out!r} names a directory but --format hdf5 writes one file")

    def resolved_format(self) -> str:
        if self.format != "auto":
            return self.format
        return "hdf5" if self.out.lower().endswith((".h5", ".hdf5")) else "npy"

"""Checkpoints and resuming: one CheckpointManager per run, over the state_dict/load_state_dict of the
model, the optimizer, the sampler (when the mode has one), every rank's RNG streams and the metrics
cursor (epochs done, seconds spent; metrics.jsonl is cut back to it on resume).

Layout of one checkpoint (written after epoch E has finished, so training resumes with epoch E)::

    RUN_DIR/checkpoints/epoch-00000E/
        state.pt          rank 0: model and optimizer state, epoch, elapsed seconds.  Gradients are
                          all-reduced, so every rank holds the same parameters and optimizer state and
                          one copy is enough.
        rank-0000.pt ...  every rank: its own RNG states (torch CPU, CUDA when used, NumPy, Python
                          `random`) and its sampler's state (co-batches are drawn per server), restored
                          on the same layout so that a resumed run repeats the same numbers.
        COMPLETE.json     written LAST, by rank 0, after every rank reported its files written: epoch,
                          world size, the run's fingerprint and the size and sha256 of every file.

Every file is written to a temporary name, fsynced and renamed (fsutil.atomic_path), so a crash while
writing leaves either no file or a whole one; a directory without COMPLETE.json is ignored by
`latest_complete`.  After a new checkpoint is complete, rank 0 deletes all but the newest KEEP complete
checkpoints and any incomplete leftovers, never before: a crash during writing always leaves the
previous complete checkpoint as the newest.

The fingerprint says which run a checkpoint can continue: every option that changes the trajectory
(every TrainConfig field whose ``on_resume`` rule is "keep": model, widths, lr, weight decay, dropout,
seed, ...), the dataset (its name and content digest, dataset.content_sha256 of the shard set's
manifest, computed by the build over the canonical graph, features, labels and splits in global-id
order), and the SHAPE: the layout (servers x ranks per server), the shard set (its files' digests),
the mode and flx's preloaded layers.  Another one is refused on every rank with the differences named.

The shape may differ (a requeued job that lands on other nodes: `--resume RUN_DIR --shards OTHER_SET
--ranks-per-server G`) when the checkpoint's run and this one both follow a trajectory that does not
depend on it, and both shard sets carry the same content digest.  That holds in the exact modes fb and
flx (either may follow the other, with any preloaded depth): dropout masks are keyed by (seed, epoch,
layer, global vertex id) and gradients are all-reduced, so nothing any rank draws depends on the
partition.  The fingerprint's "shape_dependent" says why a run's trajectory does depend on it (cob and
mb draw co-batches per server, eas samples its preload, a model may draw its own dropout per rank), and
such a checkpoint continues only on its own shape.  On another layout the per-rank files are not read:
the exact modes draw nothing from a rank's RNG streams, and the new ranks are not the old ones.

Files are read with torch.load(weights_only=True), which refuses pickled code; a file it refuses, or
one whose contents are not what this program writes, is "not a valid granndis checkpoint".

Collectives go through the job's Topology (its object gather/broadcast and cluster.collective_errors),
so this module needs no MPI of its own: a failure on any rank raises the same ClusterError on every
rank.  Signals are engine/signals.py; the --resume option rules are options/resume.py (resume_config).
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import pickle
import re
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from granndis_hpc.cluster.errors import collective_errors
from granndis_hpc.fsutil import atomic_write_bytes, atomic_write_json
from granndis_hpc.metrics import METRICS_FILE, MetricsError, truncate_metrics
from granndis_hpc.metric_names import metric_of_record, split_keys
# The concerns of a checkpoint, one module each: where the files are and pruning them
# (checkpoint_files), what identifies a run (fingerprint), the RNG streams (rngstate).
from granndis_hpc.rundir.checkpoint_files import (
    COMPLETE, FORMAT_VERSION, KEEP, SHARED_FILE, CheckpointError, CheckpointInfo, checkpoints_dir, epoch_dir,
    latest_complete, note, prune, rank_file, read_complete)
from granndis_hpc.rundir.fingerprint import check_fingerprint, same_layout, shape_change
from granndis_hpc.rundir.rngstate import RNGState

log = logging.getLogger(__name__)


# What each file must hold (checked after loading, before anything is restored).
_SHARED_KEYS = {"epoch": int, "elapsed_s": (int, float), "model": dict, "optimizer": dict}
_RANK_KEYS = {"rng": dict}


# ---- files --------------------------------------------------------------------------------------
# torch.load(weights_only=True) refuses arbitrary pickles; NumPy arrays (in NumPy's RNG state, or in a
# sampler's state) are stored as tensors under a tag and turned back on load.
_NDARRAY = "__ndarray__"


def _to_storable(obj):
    if isinstance(obj, np.ndarray):
        return {_NDARRAY: torch.from_numpy(np.ascontiguousarray(obj))}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: _to_storable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_storable(v) for v in obj)
    return obj


def _from_storable(obj):
    if isinstance(obj, dict):
        if set(obj) == {_NDARRAY}:
            return obj[_NDARRAY].numpy()
        return {k: _from_storable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_from_storable(v) for v in obj)
    return obj


def not_valid(path: str, why: str) -> CheckpointError:
    return CheckpointError(f"checkpoint file {path} is not a valid granndis checkpoint ({why})")


def write_payload(directory: str, name: str, payload: Dict) -> Dict:
    """Serialise `payload` and write it atomically as DIRECTORY/NAME; returns its size and sha256."""
    buf = io.BytesIO()
    torch.save(_to_storable(payload), buf)
    data = buf.getvalue()
    atomic_write_bytes(os.path.join(directory, name), data)
    return {"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _safe_load(path: str, data: bytes):
    """torch.load(weights_only=True), with its refusals turned into our message.  PyTorch's own text is
    dropped on purpose: it advises weights_only=False, which would run whatever the file holds."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch names a refused class as "GLOBAL module.name"; anything else is not a pickle it can read.
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        if found is None:
            raise not_valid(path, "it is not a file written by torch.save, or it is damaged") from None
        raise not_valid(path, f"it holds a Python object ({found.group(1)}) that is not a tensor, number, "
                              f"string or container, and such objects are never loaded") from None
    except (RuntimeError, ValueError, EOFError, OSError, TypeError, AttributeError, KeyError, IndexError):
        raise not_valid(path, "it is not a file written by torch.save, or it is damaged") from None


def read_payload(directory: str, entry: Dict) -> Dict:
    """Read a file listed in COMPLETE.json, checking its size and sha256 first."""
    path = os.path.join(directory, entry["name"])
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc}); the checkpoint is damaged: delete "
                              f"{directory} to resume from the one before it") from None
    if len(data) != int(entry["bytes"]) or hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise CheckpointError(f"{path}: size or sha256 differs from {COMPLETE} (the file was modified or "
                              f"damaged after it was written); delete {directory} to resume from the one "
                              f"before it")
    return _from_storable(_safe_load(path, data))


def _check_keys(path: str, payload, keys: Dict) -> None:
    if not isinstance(payload, dict):
        raise not_valid(path, f"it holds a {type(payload).__name__}, not a dict")
    for key, kind in keys.items():
        if key not in payload:
            raise not_valid(path, f"it has no {key!r}")
        if not isinstance(payload[key], kind) or isinstance(payload[key], bool):
            raise not_valid(path, f"its {key!r} is a {type(payload[key]).__name__}")


# ---- collective save and load ------------------------------------------------------------------
# `topo` is the job's cluster.Topology, or anything with its rank, world_size, world (for
# collective_errors), gather_object and bcast_object.
_WRITE_ERRORS = (OSError, RuntimeError, TypeError, ValueError)


def save(topo, run_dir: str, epoch: int, fp: Dict, shared: Optional[Dict], mine: Dict,
         keep: int = KEEP) -> str:
    """Collective: every rank writes its file, rank 0 also the shared state; once all have succeeded
    rank 0 writes COMPLETE.json and prunes.  A failure on any rank raises the same ClusterError on
    every rank and leaves no COMPLETE.json."""
    rank = topo.rank
    path = epoch_dir(run_dir, epoch)
    entries = []
    with collective_errors(topo.world, f"writing checkpoint {path} failed", catch=_WRITE_ERRORS):
        if rank == 0:
            # Never let an old marker vouch for files being rewritten (only possible when a run is
            # re-run from an earlier checkpoint by hand).
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(path, COMPLETE))
        os.makedirs(path, exist_ok=True)
        entries.append(write_payload(path, rank_file(rank), mine))
        if rank == 0:
            entries.append(write_payload(path, SHARED_FILE, shared))
    listed = topo.gather_object(entries, root=0)
    with collective_errors(topo.world, f"writing {os.path.join(path, COMPLETE)} failed", catch=(OSError,)):
        if rank == 0:
            # Every rank has finished writing, so any temporary file left is a dead writer's leftover.
            for name in os.listdir(path):
                if name.startswith(".") and name.endswith(".tmp"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(path, name))
            manifest = {"format_version": FORMAT_VERSION, "epoch": int(epoch), "world_size": int(topo.world_size),
                        "fingerprint": fp, "files": {e["name"]: e for part in listed for e in part}}
            atomic_write_json(os.path.join(path, COMPLETE), manifest)
    if rank == 0:
        try:
            prune(run_dir, keep)
        except OSError as exc:  # the new checkpoint is complete; old ones are only disk space
            log.warning(f"could not delete old checkpoints in {checkpoints_dir(run_dir)}: {exc}")
    return path


@dataclass
class Loaded:
    info: CheckpointInfo
    shared: Dict
    mine: Optional[Dict]  # this rank's file; None on another layout (see same_layout)


def _open_checkpoint(chosen: str, run_dir: str, fp: Dict, rank: int, world_size: int) -> Loaded:
    manifest = read_complete(chosen)
    if manifest is None:
        raise CheckpointError(f"{chosen} is complete on rank 0 but not readable here; is {run_dir} on a "
                              f"file system every node sees?")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{chosen} has checkpoint format {manifest.get('format_version')!r}, this "
                              f"program reads {FORMAT_VERSION}: finish the run with the granndis-hpc version "
                              f"that wrote it, or start a new run in another --out directory")
    check_fingerprint(manifest["fingerprint"], fp, f"checkpoint {chosen}")
    # On another layout (allowed by the fingerprint only where the trajectory does not depend on it) the
    # rank files are not read: rank r of this job is not rank r of the checkpoint's.
    own = same_layout(manifest["fingerprint"], fp)
    if own and int(manifest["world_size"]) != world_size:
        raise CheckpointError(f"checkpoint {chosen} was written by {manifest['world_size']} ranks, this job "
                              f"has {world_size}; launch {manifest['world_size']} ranks")
    files = manifest["files"]
    needed = [SHARED_FILE] + ([rank_file(rank)] if own else [])
    if not isinstance(files, dict) or any(name not in files for name in needed):
        raise CheckpointError(f"{chosen}/{COMPLETE} does not list {' and '.join(needed)}")
    info = CheckpointInfo(int(manifest["epoch"]), chosen, manifest)
    shared = read_payload(chosen, files[SHARED_FILE])
    _check_keys(os.path.join(chosen, SHARED_FILE), shared, _SHARED_KEYS)
    _check_finite(os.path.join(chosen, SHARED_FILE), shared["model"])
    mine = None
    if own:
        mine = read_payload(chosen, files[rank_file(rank)])
        _check_keys(os.path.join(chosen, rank_file(rank)), mine, _RANK_KEYS)
    if shared["epoch"] != info.epoch:
        raise not_valid(os.path.join(chosen, SHARED_FILE),
                        f"it says epoch {shared['epoch']}, {COMPLETE} says {info.epoch}")
    return Loaded(info, shared, mine)


def _check_finite(path: str, model_state) -> None:
    """A checkpoint whose parameters hold NaN or infinity is named as such: resumed, it failed an epoch
    later as "loss became nan ... lower --lr", which blamed the options, not the file."""
    for name, value in (model_state.items() if isinstance(model_state, dict) else ()):
        if torch.is_tensor(value) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise not_valid(path, f"its model parameter {name!r} holds NaN or infinite values; resume from an "
                                  f"earlier checkpoint (delete {os.path.dirname(path)}) or start a new run")


def load_latest(topo, run_dir: str, fp: Dict) -> Optional[Loaded]:
    """Collective: the newest complete checkpoint of RUN_DIR (chosen by rank 0, so every rank loads the
    same one), checked against this run's fingerprint (and, on its own layout, world size); None if
    there is none.  Any problem on any rank raises the same ClusterError on every rank."""
    chosen = None
    with collective_errors(topo.world, "", catch=(CheckpointError, OSError)):  # a damaged marker stops all
        if topo.rank == 0:
            info = latest_complete(run_dir)
            chosen = None if info is None else info.path
    chosen = topo.bcast_object(chosen, root=0)
    if chosen is None:
        return None
    loaded = None
    with collective_errors(topo.world, "", catch=(CheckpointError, OSError, RuntimeError, KeyError,
                                                  ValueError, TypeError)):
        loaded = _open_checkpoint(chosen, run_dir, fp, topo.rank, topo.world_size)
    return loaded


# ---- the manager the trainer holds -------------------------------------------------------------
@dataclass
class Resumed:
    """Where a resumed run continues: epochs done, seconds already spent, the checkpoint (None when
    the run directory had none yet, so training starts at epoch 0), and the metrics records kept."""
    epoch: int
    elapsed_s: float
    path: Optional[str]
    records: List[Dict]
    # The best-validation epoch up to the checkpoint (epoch, accuracies, "model": its parameters), or None.
    best: Optional[Dict] = None


class CheckpointManager:
    """Saves and restores one run's training state in RUN_DIR/checkpoints (like torchtitan's
    CheckpointManager): the model and optimizer (one copy, rank 0's), and on every rank its RNG streams
    and the sampler's state (`sampler`: anything with state_dict/load_state_dict, or None).  Every
    method is collective over `topo`."""

    def __init__(self, topo, run_dir: str, fp: Dict, model, optimizer, device: torch.device,
                 sampler=None, keep: int = KEEP):
        self.topo, self.run_dir, self.fp, self.keep = topo, os.fspath(run_dir), fp, keep
        self.model, self.optimizer, self.sampler = model, optimizer, sampler
        self.rng = RNGState(device)

    def save(self, epoch: int, elapsed_s: float = 0.0, best: Optional[Dict] = None) -> str:
        """Checkpoint the state after `epoch` epochs; returns the checkpoint's directory.  `best` (rank
        0's is stored): the best-validation epoch so far, {"epoch", "train_acc", "val_acc", "test_acc",
        "model": its state_dict}, so best-validation selection survives a resume."""
        mine = {"rng": self.rng.state_dict(),
                "sampler": None if self.sampler is None else self.sampler.state_dict()}
        shared = None
        if self.topo.rank == 0:  # parameters and optimizer state are identical on every rank
            shared = {"epoch": int(epoch), "elapsed_s": float(elapsed_s), "model": self.model.state_dict(),
                      "optimizer": self.optimizer.state_dict(), "best": best}
        return save(self.topo, self.run_dir, epoch, self.fp, shared, mine, self.keep)

    def load(self, max_epoch: int) -> Resumed:
        """Restore the newest complete checkpoint (none: start at epoch 0, as a job stopped before its
        first checkpoint must) and cut metrics.jsonl back to it; returns where to continue."""
        loaded = load_latest(self.topo, self.run_dir, self.fp)
        epoch, elapsed_s, path, best = 0, 0.0, None, None
        if loaded is not None:
            path = loaded.info.path
            with collective_errors(self.topo.world, f"resuming from {path}",
                                   catch=(CheckpointError, RuntimeError, KeyError, ValueError, TypeError)):
                epoch = int(loaded.shared["epoch"])
                if epoch > max_epoch:
                    raise CheckpointError(f"checkpoint {path} is after epoch {epoch}, beyond --epochs "
                                          f"{max_epoch}; resume with --epochs {epoch} or more")
                self.model.load_state_dict(loaded.shared["model"])
                self.optimizer.load_state_dict(loaded.shared["optimizer"])
                if loaded.mine is not None:  # None: another layout, in a mode that draws nothing per rank
                    if self.sampler is not None:
                        self.sampler.load_state_dict(loaded.mine.get("sampler"))
                    self.rng.load_state_dict(loaded.mine["rng"])  # last: nothing may draw after it
                elif self.topo.rank == 0:
                    note(shape_change(loaded.info.manifest["fingerprint"], self.fp, path))
                elapsed_s = float(loaded.shared["elapsed_s"])
                best = _checked_best(path, loaded.shared.get("best"))
        records = []
        with collective_errors(self.topo.world, f"cannot rewrite {os.path.join(self.run_dir, METRICS_FILE)}",
                               catch=(OSError, MetricsError)):
            if self.topo.rank == 0:
                records = truncate_metrics(self.run_dir, epoch, note=note)
        return Resumed(epoch, elapsed_s, path, self.topo.bcast_object(records, root=0), best)


def _checked_best(path: str, best) -> Optional[Dict]:
    """The shared payload's best-validation entry, checked (None: no epoch evaluated yet)."""
    if best is None:
        return None
    metric = metric_of_record(best) if isinstance(best, dict) else None
    keys = {"epoch": int, "model": dict, **{k: (int, float) for k in split_keys(metric or "accuracy").values()}}
    _check_keys(os.path.join(path, SHARED_FILE) + " (best)", best, keys)
    return best


__all__ = ["CheckpointManager", "Loaded", "Resumed", "write_payload", "read_payload", "save", "load_latest"]

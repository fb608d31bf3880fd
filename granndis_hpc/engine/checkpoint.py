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
rank.  Signals are engine/signals.py; the --resume option rules are cli.resume_config.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import random
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from granndis_hpc.cluster.errors import collective_errors
from granndis_hpc.fsutil import atomic_write_bytes, atomic_write_json
from granndis_hpc.metrics import BEST_MODEL

CHECKPOINTS = "checkpoints"
COMPLETE = "COMPLETE.json"
SHARED_FILE = "state.pt"
# 2: the fingerprint covers every trajectory option (version 1 held only shapes, wiring and data, so
# a checkpoint of another lr or seed passed as this run's).  3: it names the dataset by its content and
# says whether the trajectory depends on the shape, so that an exact run may continue on another one.
FORMAT_VERSION = 3
# What may differ between a shape-free checkpoint and a shape-free run of the same dataset.
SHAPE_KEYS = ("servers", "ranks_per_server", "shard_set", "mode", "preloaded_layers")
KEEP = 2
_EPOCH_DIR = re.compile(r"^epoch-(\d{6,})$")
# What each file must hold (checked after loading, before anything is restored).
_SHARED_KEYS = {"epoch": int, "elapsed_s": (int, float), "model": dict, "optimizer": dict}
_RANK_KEYS = {"rng": dict}


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written, found or used; the message says why and what to do."""


# ---- where things are ---------------------------------------------------------------------------
def checkpoints_dir(run_dir: str) -> str:
    return os.path.join(os.fspath(run_dir), CHECKPOINTS)


def epoch_dir(run_dir: str, epoch: int) -> str:
    return os.path.join(checkpoints_dir(run_dir), f"epoch-{int(epoch):06d}")


def rank_file(rank: int) -> str:
    return f"rank-{int(rank):04d}.pt"


@dataclass(frozen=True)
class CheckpointInfo:
    epoch: int
    path: str
    manifest: Dict


# ---- what identifies a run ----------------------------------------------------------------------
def shard_set_id(manifest: Dict) -> str:
    """One digest for a shard set: the sha256 of its server files (names and digests, sorted)."""
    files = manifest.get("files", {})
    listing = sorted((name, entry.get("sha256", "")) for name, entry in files.items())
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


def dataset_digest(manifest: Dict) -> Optional[str]:
    """The shard set's dataset.content_sha256 (preprocess/build.py dataset_digest); None for a set built
    before the build recorded one."""
    value = manifest.get("dataset", {}).get("content_sha256")
    return value if isinstance(value, str) else None


def trajectory_options(cfg) -> Dict:
    """The options of `cfg` (a TrainConfig) that a continuation must share: every field whose
    on_resume rule is "keep" (the default).  Options that may change on resume (epochs, output,
    shards path, ...) or are reset (overwrite_run) do not change the numbers, or are shape keys the
    fingerprint holds itself (mode, preloaded_layers); the sampler's options (fingerprint=False) are
    checked by the sampler's own saved state."""
    from granndis_hpc.config import specs
    return {s.name: getattr(cfg, s.name) for s in specs(type(cfg))
            if s.meta.get("on_resume", "keep") == "keep" and s.meta.get("fingerprint", True)}


def fingerprint(cfg, servers: int, ranks_per_server: int, manifest: Dict, *, shape_dependent: Optional[str]) -> Dict:
    """What a checkpoint must share with the run that continues it: trajectory options, dataset and
    shape (SHAPE_KEYS).  `shape_dependent` says why the run's trajectory depends on the shape (None:
    it does not, and the shape may change on resume)."""
    fp = trajectory_options(cfg)
    fp.update({"servers": int(servers), "ranks_per_server": int(ranks_per_server), "mode": cfg.mode,
               "preloaded_layers": cfg.preloaded_layers, "dataset": manifest.get("dataset", {}).get("name", "?"),
               "dataset_sha256": dataset_digest(manifest), "shard_set": shard_set_id(manifest),
               "shape_dependent": shape_dependent})
    return fp


def _shape_refusal(saved: Dict, current: Dict) -> Optional[str]:
    """Why the checkpoint cannot continue on this run's shape (None: it can)."""
    for fp, whose in ((saved, "the checkpoint's run"), (current, "this run")):
        if fp.get("shape_dependent"):
            return (f"the shape (layout, shard set, mode) may change on resume only in the exact modes fb and flx, "
                    f"and {whose} depends on it: {fp['shape_dependent']}")
    if saved.get("shard_set") == current.get("shard_set"):
        return None  # the same files: the same data, digest or not
    if saved.get("dataset_sha256") is None:
        return ("the checkpoint was written on a shard set without a dataset content digest (built by an older "
                "granndis-hpc), so no other shard set can be shown to hold the same dataset; resume it on the "
                "shard set and layout it was written with")
    if current.get("dataset_sha256") is None:
        return ("this run's shard set (--shards) has no dataset content digest (built by an older granndis-hpc): "
                "rebuild it with this version (`python -m preprocess build ... --overwrite`), whose manifest "
                "records dataset.content_sha256")
    return None


def check_fingerprint(saved: Dict, current: Dict, where: str) -> None:
    """Raise CheckpointError naming every difference between a checkpoint and this run (the shape keys
    only where they may not differ, see the module docstring)."""
    # A missing digest (a shard set built before the build recorded one) says nothing about the data:
    # such a checkpoint or run is held to its own shard set (a shape key) instead.
    known = saved.get("dataset_sha256") is not None and current.get("dataset_sha256") is not None
    ignored = {"shape_dependent"} if known else {"shape_dependent", "dataset_sha256"}
    keys = [k for k in sorted(set(saved) | set(current)) if k not in ignored and saved.get(k) != current.get(k)]
    refusal = _shape_refusal(saved, current) if any(k in SHAPE_KEYS for k in keys) else None
    if refusal is None:
        keys = [k for k in keys if k not in SHAPE_KEYS]
    if not keys:
        return
    diffs = "; ".join(f"{key}: checkpoint {saved.get(key)!r}, this run {current.get(key)!r}" for key in keys)
    if all(k in SHAPE_KEYS for k in keys):
        raise CheckpointError(
            f"{where} cannot continue on this run's shape ({diffs}): {refusal}; resume it with the mode, shard "
            f"set and layout it was written with ({saved.get('servers')} servers x {saved.get('ranks_per_server')} "
            f"ranks per server, mode {saved.get('mode')!r}; its run directory's config.json names the shard "
            f"set), or start a new run in another --out directory")
    if "dataset_sha256" in keys:
        refusal = ("the shard sets hold different data (the graph, features, labels or split differ; "
                   "dataset.content_sha256 of their manifests)" + (f"; {refusal}" if refusal else ""))
    raise CheckpointError(
        f"{where} was written by another run ({diffs}); " + (f"{refusal}; " if refusal else "")
        + "resume it with the settings, shard set and layout it was written with (its run directory's "
          "config.json), or start a new run in another --out directory")


# ---- RNG states ---------------------------------------------------------------------------------
def rng_state(device: torch.device) -> Dict:
    """This process's random streams (the ones dropout and samplers draw from)."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(legacy=False),
             "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: Dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if device.type == "cuda":
        if "cuda" not in state:
            raise CheckpointError("the checkpoint was written on CPU and holds no CUDA random state; "
                                  "resume it with --device cpu")
        torch.cuda.set_rng_state(state["cuda"], device)


class RNGState:
    """A process's random streams as a stateful object (state_dict / load_state_dict)."""

    def __init__(self, device: torch.device):
        self.device = device

    def state_dict(self) -> Dict:
        return rng_state(self.device)

    def load_state_dict(self, state: Dict) -> None:
        set_rng_state(state, self.device)


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


# ---- finding and pruning ------------------------------------------------------------------------
def list_checkpoints(run_dir: str) -> List[tuple]:
    """(epoch, path, complete) for every epoch-* directory, oldest first."""
    root = checkpoints_dir(run_dir)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = _EPOCH_DIR.match(name)
        path = os.path.join(root, name)
        if m and os.path.isdir(path):
            found.append((int(m.group(1)), path, os.path.isfile(os.path.join(path, COMPLETE))))
    return sorted(found)


def read_complete(path: str) -> Optional[Dict]:
    """The COMPLETE.json of a checkpoint directory if it is whole and every listed file has its size."""
    try:
        with open(os.path.join(path, COMPLETE), encoding="utf-8") as f:
            manifest = json.load(f)
        files = manifest["files"]
        for entry in files.values():
            if os.path.getsize(os.path.join(path, entry["name"])) != int(entry["bytes"]):
                return None
        int(manifest["epoch"]), int(manifest["world_size"]), dict(manifest["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return manifest


def latest_complete(run_dir: str) -> Optional[CheckpointInfo]:
    """The newest checkpoint whose COMPLETE.json exists and whose files are all there."""
    for epoch, path, complete in reversed(list_checkpoints(run_dir)):
        manifest = read_complete(path) if complete else None
        if manifest is not None and int(manifest["epoch"]) == epoch:
            return CheckpointInfo(epoch, path, manifest)
    return None


def prune(run_dir: str, keep: int = KEEP) -> List[str]:
    """Delete all but the newest `keep` complete checkpoints, and incomplete ones older than the
    newest complete one (leftovers of interrupted writes).  Returns the deleted paths."""
    entries = list_checkpoints(run_dir)
    complete = [(e, p) for e, p, c in entries if c and read_complete(p) is not None]
    if not complete:
        return []  # nothing is complete: keep everything, it may be all there is
    kept = {p for _, p in complete[-keep:]}
    newest = complete[-1][0]
    doomed = [p for e, p, _ in entries if p not in kept and e <= newest]
    for path in doomed:
        # The marker goes first, so a crash half-way through a deletion leaves an incomplete directory
        # (ignored) rather than a "complete" one with files missing.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(path, COMPLETE))
        shutil.rmtree(path, ignore_errors=True)
    return doomed


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
            print(f"warning: could not delete old checkpoints in {checkpoints_dir(run_dir)}: {exc}",
                  file=sys.stderr, flush=True)
    return path


@dataclass
class Loaded:
    info: CheckpointInfo
    shared: Dict
    mine: Optional[Dict]  # this rank's file; None on another layout (see same_layout)


def same_layout(saved: Dict, current: Dict) -> bool:
    """Whether a checkpoint's fingerprint and this run's name the same servers x ranks per server (so
    rank r of this job continues rank r of the checkpoint's)."""
    return all(saved.get(k) == current.get(k) for k in ("servers", "ranks_per_server"))


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
    mine = None
    if own:
        mine = read_payload(chosen, files[rank_file(rank)])
        _check_keys(os.path.join(chosen, rank_file(rank)), mine, _RANK_KEYS)
    if shared["epoch"] != info.epoch:
        raise not_valid(os.path.join(chosen, SHARED_FILE),
                        f"it says epoch {shared['epoch']}, {COMPLETE} says {info.epoch}")
    return Loaded(info, shared, mine)


def load_latest(topo, run_dir: str, fp: Dict) -> Optional[Loaded]:
    """Collective: the newest complete checkpoint of RUN_DIR (chosen by rank 0, so every rank loads the
    same one), checked against this run's fingerprint (and, on its own layout, world size); None if
    there is none.  Any problem on any rank raises the same ClusterError on every rank."""
    chosen = None
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


# ---- the run directory -------------------------------------------------------------------------
# What the trainer writes into a run directory; any of them there means the directory holds a run.
RUN_OUTPUTS = ("config.json", "metrics.jsonl", "summary.json", BEST_MODEL, CHECKPOINTS)
_ASIDE_PREFIX = ".replaced-run-"


def run_contents(run_dir: str) -> List[str]:
    """The trainer's outputs present in RUN_DIR (an empty checkpoints/ does not count: nothing was
    written into it)."""
    found = []
    for name in RUN_OUTPUTS:
        path = os.path.join(os.fspath(run_dir), name)
        if name == CHECKPOINTS:
            if os.path.isdir(path) and os.listdir(path):
                found.append(name + "/")
        elif os.path.lexists(path):
            found.append(name)
    return found


def refuse_new_run_in(run_dir: str, found: List[str]) -> CheckpointError:
    return CheckpointError(
        f"run directory {run_dir} already holds a run ({', '.join(found)}); a new run there would mix with "
        f"or destroy it: continue it with --resume {run_dir}, start a new run in another --out, or replace "
        f"it with --overwrite-run")


def move_run_aside(run_dir: str) -> Optional[str]:
    """Move the trainer's outputs in RUN_DIR into a hidden directory inside it, so a new run can write
    its config before the old run is deleted (renames only: nothing is lost if the job dies here).
    Returns that directory, or None when there was nothing to move."""
    run_dir = os.fspath(run_dir)
    present = [name for name in RUN_OUTPUTS if os.path.lexists(os.path.join(run_dir, name))]
    if not present:
        return None
    aside = tempfile.mkdtemp(prefix=_ASIDE_PREFIX, dir=run_dir)
    for name in present:
        os.rename(os.path.join(run_dir, name), os.path.join(aside, name))
    return aside


def replace_run(run_dir: str, write_new_config) -> bool:
    """--overwrite-run: move the old run's outputs aside, call write_new_config(), then delete the old
    run.  If writing the new config fails, the old run is moved back (and the error raised), so at no
    point is the old run gone without the new one's config in its place.  Returns whether there was a
    run to replace; a failure to delete the old one after success is only reported (disk space)."""
    aside = move_run_aside(run_dir)
    try:
        write_new_config()
    except BaseException:
        if aside is not None:
            for name in os.listdir(aside):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(run_dir, name))  # a half-made new file (atomic writes leave none)
                os.rename(os.path.join(aside, name), os.path.join(run_dir, name))
            os.rmdir(aside)
        raise
    if aside is None:
        return False
    try:
        shutil.rmtree(aside)
    except OSError as exc:
        note(f"--overwrite-run: the new run is in {run_dir}, but the old one in {aside} could not be deleted: {exc}")
    return True


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
        from granndis_hpc.metrics import MetricsError, truncate_metrics

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
                    note(_shape_change(loaded.info.manifest["fingerprint"], self.fp, path))
                elapsed_s = float(loaded.shared["elapsed_s"])
                best = _checked_best(path, loaded.shared.get("best"))
        records = []
        with collective_errors(self.topo.world, f"cannot rewrite {os.path.join(self.run_dir, 'metrics.jsonl')}",
                               catch=(OSError, MetricsError)):
            if self.topo.rank == 0:
                records = truncate_metrics(self.run_dir, epoch, note=note)
        return Resumed(epoch, elapsed_s, path, self.topo.bcast_object(records, root=0), best)


def _checked_best(path: str, best) -> Optional[Dict]:
    """The shared payload's best-validation entry, checked (None: no epoch evaluated yet)."""
    if best is None:
        return None
    keys = {"epoch": int, "train_acc": (int, float), "val_acc": (int, float), "test_acc": (int, float),
            "model": dict}
    _check_keys(os.path.join(path, SHARED_FILE) + " (best)", best, keys)
    return best


def _shape_change(saved: Dict, current: Dict, path: str) -> str:
    def shape(fp):
        return f"{fp.get('servers')} x {fp.get('ranks_per_server')} ({fp.get('mode')})"
    return (f"continuing {path}, written on {shape(saved)}, on {shape(current)}: the mode is exact and draws no "
            f"per-rank randomness, so the trajectory continues; the per-rank random states are not restored")


def note(message: str) -> None:
    """A line for the job log (stderr, flushed: the job may be killed soon after)."""
    print(f"granndis-train: {message}", file=sys.stderr, flush=True)


__all__ = ["CHECKPOINTS", "COMPLETE", "SHARED_FILE", "KEEP", "FORMAT_VERSION", "CheckpointError",
           "CheckpointInfo", "CheckpointManager", "Loaded", "Resumed", "RNGState", "checkpoints_dir", "epoch_dir",
           "rank_file", "fingerprint", "trajectory_options", "shard_set_id", "dataset_digest", "check_fingerprint",
           "same_layout", "SHAPE_KEYS", "rng_state",
           "set_rng_state", "write_payload", "read_payload", "list_checkpoints", "read_complete",
           "latest_complete", "prune", "save", "load_latest", "note", "RUN_OUTPUTS", "run_contents",
           "refuse_new_run_in", "move_run_aside", "replace_run"]

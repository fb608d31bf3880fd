"""Checkpoints, resuming, and stopping cleanly on SIGUSR1/SIGTERM.

Layout of one checkpoint (written after epoch E has finished, so training resumes with epoch E)::

    RUN_DIR/checkpoints/epoch-00000E/
        state.pt          rank 0: model and optimizer state, epoch, elapsed seconds.  Gradients are
                          all-reduced, so every rank holds the same parameters and optimizer state and
                          one copy is enough.
        rank-0000.pt ...  every rank: its own RNG states (torch CPU, CUDA when used, NumPy, Python
                          `random`) and its sampler's state.  Dropout masks differ per rank, so the RNG
                          streams must be restored per rank for a resumed run to repeat the same numbers.
        COMPLETE.json     written LAST, by rank 0, after every rank reported its files written: epoch,
                          world size, the run's fingerprint and the size and sha256 of every file.

Every file is written to a temporary name, fsynced and renamed (fsutil.atomic_path), so a crash while
writing leaves either no file or a whole one; a directory without COMPLETE.json is ignored by
`latest_complete`.  After a new checkpoint is complete, rank 0 deletes all but the newest KEEP complete
checkpoints and any incomplete leftovers, never before: a crash during writing always leaves the
previous complete checkpoint as the newest.

The fingerprint (model, mode, layers, hidden, norm, servers x ranks per server, shard set) says which run a
checkpoint can continue; another one is refused on every rank with the differences named.

Signals: `StopSignals` turns SIGUSR1/SIGTERM into a flag.  The trainer reduces that flag (max over
ranks) after every epoch, so a signal that reaches only some ranks, or reaches them at different
times, still stops every rank after the same epoch; they write a checkpoint and exit 0.  Measured with
Open MPI 4.1.4: mpirun forwards SIGUSR1 to every rank, but on SIGTERM it tears the job down (the ranks
get SIGTERM and are killed about a second later, odls_base_sigkill_timeout=1), too soon for a
checkpoint, so under mpirun send SIGUSR1.  Under Slurm, scancel and preemption send SIGTERM to every
task and SIGKILL after KillWait / GraceTime (Slurm's documentation; not measured here).
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from granndis_hpc.cluster.errors import agree
from granndis_hpc.fsutil import atomic_write_bytes, atomic_write_json

CHECKPOINTS = "checkpoints"
COMPLETE = "COMPLETE.json"
SHARED_FILE = "state.pt"
FORMAT_VERSION = 1
KEEP = 2
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
_EPOCH_DIR = re.compile(r"^epoch-(\d{6,})$")

# Options that may be given again with another value together with --resume.  The first group changes
# nothing the trajectory depends on; `shards` and `ranks_per_server` may point elsewhere because the
# checkpoint's fingerprint still has to match the shard set and layout (a moved shard directory, or
# the layout given by flag instead of GRANNDIS_RANKS_PER_SERVER).  `out` is the run directory itself.
RESUME_OVERRIDABLE = frozenset({"epochs", "eval_every", "checkpoint_every", "quiet", "skip_checksums",
                                "intra_transport", "shards", "ranks_per_server", "resume", "out"})


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


def fingerprint(cfg, servers: int, ranks_per_server: int, manifest: Dict) -> Dict:
    """What a checkpoint must share with the run that continues it (shapes, wiring, data)."""
    return {"model": cfg.model, "mode": cfg.mode, "layers": int(cfg.layers), "hidden": int(cfg.hidden),
            "norm": bool(cfg.norm), "servers": int(servers), "ranks_per_server": int(ranks_per_server),
            "dataset": manifest.get("dataset", {}).get("name", "?"), "shard_set": shard_set_id(manifest)}


def check_fingerprint(saved: Dict, current: Dict, where: str) -> None:
    """Raise CheckpointError naming every difference between a checkpoint and this run."""
    diffs = [f"{key}: checkpoint {saved.get(key)!r}, this run {current.get(key)!r}"
             for key in sorted(set(saved) | set(current)) if saved.get(key) != current.get(key)]
    if diffs:
        raise CheckpointError(
            f"{where} was written by another run ({'; '.join(diffs)}); resume it with the settings, shard "
            f"set and layout it was written with (its run directory's config.json), or start a new run "
            f"in another --out directory")


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


def write_payload(directory: str, name: str, payload: Dict) -> Dict:
    """Serialise `payload` and write it atomically as DIRECTORY/NAME; returns its size and sha256."""
    buf = io.BytesIO()
    torch.save(_to_storable(payload), buf)
    data = buf.getvalue()
    atomic_write_bytes(os.path.join(directory, name), data)
    return {"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


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
    return _from_storable(torch.load(io.BytesIO(data), map_location="cpu", weights_only=True))


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
def save(world, run_dir: str, epoch: int, fp: Dict, shared: Optional[Dict], mine: Dict,
         keep: int = KEEP) -> str:
    """Collective over `world` (an mpi4py communicator): every rank writes its file, rank 0 also the
    shared state; once all have succeeded rank 0 writes COMPLETE.json and prunes.  A failure on any rank
    raises the same ClusterError on every rank and leaves no COMPLETE.json."""
    rank = world.Get_rank()
    path = epoch_dir(run_dir, epoch)
    entries, error = [], ""
    try:
        if rank == 0:
            # Never let an old marker vouch for files being rewritten (only possible when a run is
            # re-run from an earlier checkpoint by hand).
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(path, COMPLETE))
        os.makedirs(path, exist_ok=True)
        entries.append(write_payload(path, rank_file(rank), mine))
        if rank == 0:
            entries.append(write_payload(path, SHARED_FILE, shared))
    except (OSError, RuntimeError, TypeError, ValueError) as exc:
        error = f"writing checkpoint {path} failed: {type(exc).__name__}: {exc}"
    agree(world, not error, error)
    listed = world.gather(entries, root=0)
    error = ""
    if rank == 0:
        try:
            # Every rank has finished writing, so any temporary file left is a dead writer's leftover.
            for name in os.listdir(path):
                if name.startswith(".") and name.endswith(".tmp"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(path, name))
            manifest = {"format_version": FORMAT_VERSION, "epoch": int(epoch), "world_size": world.Get_size(),
                        "fingerprint": fp, "files": {e["name"]: e for part in listed for e in part}}
            atomic_write_json(os.path.join(path, COMPLETE), manifest)
        except OSError as exc:
            error = f"writing {os.path.join(path, COMPLETE)} failed: {exc}"
        if not error:
            try:
                prune(run_dir, keep)
            except OSError as exc:  # the new checkpoint is complete; old ones are only disk space
                print(f"warning: could not delete old checkpoints in {checkpoints_dir(run_dir)}: {exc}",
                      file=sys.stderr, flush=True)
    agree(world, not error, error)
    return path


@dataclass
class Loaded:
    info: CheckpointInfo
    shared: Dict
    mine: Dict


def load_latest(world, run_dir: str, fp: Dict) -> Optional[Loaded]:
    """Collective: the newest complete checkpoint of RUN_DIR (chosen by rank 0, so every rank loads the
    same one), checked against this run's fingerprint and world size; None if there is none.  Any
    problem on any rank raises the same ClusterError on every rank."""
    rank = world.Get_rank()
    chosen = None
    if rank == 0:
        info = latest_complete(run_dir)
        chosen = None if info is None else info.path
    chosen = world.bcast(chosen, root=0)
    if chosen is None:
        return None
    loaded, error = None, ""
    try:
        manifest = read_complete(chosen)
        if manifest is None:
            raise CheckpointError(f"{chosen} is complete on rank 0 but not readable here; is {run_dir} on a "
                                  f"file system every node sees?")
        if int(manifest.get("format_version", -1)) != FORMAT_VERSION:
            raise CheckpointError(f"{chosen} has checkpoint format {manifest.get('format_version')!r}, this "
                                  f"program reads {FORMAT_VERSION}")
        check_fingerprint(manifest["fingerprint"], fp, f"checkpoint {chosen}")
        if int(manifest["world_size"]) != world.Get_size():
            raise CheckpointError(f"checkpoint {chosen} was written by {manifest['world_size']} ranks, this job "
                                  f"has {world.Get_size()}; launch {manifest['world_size']} ranks")
        files = manifest["files"]
        if rank_file(rank) not in files or SHARED_FILE not in files:
            raise CheckpointError(f"{chosen}/{COMPLETE} does not list {rank_file(rank)} and {SHARED_FILE}")
        info = CheckpointInfo(int(manifest["epoch"]), chosen, manifest)
        loaded = Loaded(info, read_payload(chosen, files[SHARED_FILE]), read_payload(chosen, files[rank_file(rank)]))
    except (CheckpointError, OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    agree(world, not error, error)
    return loaded


# ---- metrics.jsonl on resume --------------------------------------------------------------------
def truncate_metrics(run_dir: str, epoch: int) -> List[Dict]:
    """Keep the records of epochs before `epoch` (those the checkpoint includes) and drop the rest, so
    the resumed run appends without duplicates.  Rewritten atomically; returns the kept records."""
    path = os.path.join(os.fspath(run_dir), "metrics.jsonl")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except FileNotFoundError:
        lines = []
    kept, text = [], []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:  # a line cut short by the kill that stopped the run
            continue
        if isinstance(rec, dict) and int(rec.get("epoch", -1)) < epoch:
            kept.append(rec)
            text.append(json.dumps(rec, sort_keys=True) + "\n")
    atomic_write_bytes(path, "".join(text).encode())
    return kept


# ---- --resume on the command line ---------------------------------------------------------------
def resume_config(saved: Dict, given: Dict, run_dir: str, defaults: Dict) -> Dict:
    """The options of a resumed run: RUN_DIR/config.json (`saved`), with options given again on the
    command line or in --config (`given`) allowed to differ only where RESUME_OVERRIDABLE says so.
    `defaults` maps every option the trainer takes to its default (what a run whose config.json
    predates an option ran with); other keys, in either dict, are dropped."""
    run_dir = os.fspath(run_dir)
    ran_with = {k: saved.get(k, d) for k, d in defaults.items()}
    refused = [f"{k}={given[k]!r} (the run has {ran_with[k]!r})" for k in sorted(given)
               if k in defaults and k not in RESUME_OVERRIDABLE and given[k] != ran_with[k]]
    out = given.get("out")
    if out is not None and os.path.realpath(out) != os.path.realpath(run_dir):
        refused.append(f"out={out!r} (a resumed run writes into the run directory {run_dir!r})")
    if refused:
        raise CheckpointError(
            f"--resume {run_dir} continues that run with its own settings ({os.path.join(run_dir, 'config.json')}); "
            f"these options differ: {', '.join(refused)}.  Only "
            f"{', '.join(sorted(RESUME_OVERRIDABLE - {'resume', 'out'}))} may change on resume; start a new run "
            f"(another --out) to change anything else")
    merged = dict(ran_with)
    merged.update({k: v for k, v in given.items() if k in defaults})
    merged["out"], merged["resume"] = run_dir, run_dir
    return merged


# ---- signals -------------------------------------------------------------------------------------
class StopSignals:
    """SIGUSR1/SIGTERM set a flag (the handler does nothing else: it may run between any two bytecodes);
    the training loop polls it after each epoch."""

    def __init__(self):
        self.received: Optional[int] = None
        self._previous: Dict[int, object] = {}

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False  # Python only lets the main thread install handlers
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return True

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum

    def request(self, signum: int = signal.SIGUSR1) -> None:
        """Ask for a stop as a signal would (used by tests and by code that wants a clean stop)."""
        self._handle(signum, None)

    @property
    def requested(self) -> bool:
        return self.received is not None

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}


def note(message: str) -> None:
    """A line for the job log (stderr, flushed: the job may be killed soon after)."""
    print(f"granndis-train: {message}", file=sys.stderr, flush=True)


__all__ = ["CHECKPOINTS", "COMPLETE", "SHARED_FILE", "KEEP", "RESUME_OVERRIDABLE", "CheckpointError",
           "CheckpointInfo", "Loaded", "StopSignals", "checkpoints_dir", "epoch_dir", "rank_file",
           "fingerprint", "shard_set_id", "check_fingerprint", "rng_state", "set_rng_state", "write_payload",
           "read_payload", "list_checkpoints", "read_complete", "latest_complete", "prune", "save",
           "load_latest", "truncate_metrics", "resume_config", "note"]

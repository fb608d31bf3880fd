"""The on-disk layout of a run's checkpoints, and finding and pruning them (engine/checkpoint.py
describes the layout; this module knows where things are, not how they are written)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional

CHECKPOINTS = "checkpoints"
COMPLETE = "COMPLETE.json"
SHARED_FILE = "state.pt"
# 2: the fingerprint covers every trajectory option (version 1 held only shapes, wiring and data, so
# a checkpoint of another lr or seed passed as this run's).  3: it names the dataset by its content and
# says whether the trajectory depends on the shape, so that an exact run may continue on another one.
FORMAT_VERSION = 3
KEEP = 2
_EPOCH_DIR = re.compile(r"^epoch-(\d{6,})$")


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


def note(message: str) -> None:
    """A line for the job log (stderr, flushed: the job may be killed soon after)."""
    print(f"granndis-train: {message}", file=sys.stderr, flush=True)

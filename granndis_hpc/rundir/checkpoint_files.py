"""The on-disk layout of a run's checkpoints, and finding and pruning them (rundir/checkpoint.py
describes the layout; this module knows where things are, not how they are written)."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from typing import Dict, List, Optional

log = logging.getLogger(__name__)

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


_FILE_NAME = re.compile(r"^(state\.pt|rank-\d{4,}\.pt)$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _is_count(value, minimum: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def manifest_problem(manifest, epoch: int) -> Optional[str]:
    """What is wrong with a COMPLETE.json of directory epoch-`epoch` (None: complete and well-formed).
    A checkpoint is trusted only through its manifest (the checksums and the fingerprint it holds), so
    a manifest with any field missing or malformed must not pass as one with nothing to check."""
    if not isinstance(manifest, dict):
        return f"it holds a JSON {type(manifest).__name__}, not an object"
    for key in ("format_version", "epoch", "world_size", "fingerprint", "files"):
        if key not in manifest:
            return f"it has no {key!r}"
    if not _is_count(manifest["format_version"], 1):
        return f"format_version is {manifest['format_version']!r}, not a version number"
    if manifest["epoch"] != epoch or not _is_count(manifest["epoch"]):
        return f"epoch is {manifest['epoch']!r} in the directory of epoch {epoch}"
    fp, world = manifest["fingerprint"], manifest["world_size"]
    if not isinstance(fp, dict) or not fp or not all(isinstance(k, str) for k in fp):
        return f"fingerprint is {str(fp)[:60]!r}, not the run's fingerprint (an object of the run's options)"
    if not _is_count(world, 1):
        return f"world_size is {world!r}, not a rank count >= 1"
    files = manifest["files"]
    if not isinstance(files, dict) or SHARED_FILE not in files:
        return f"files is {str(files)[:60]!r}, which does not list {SHARED_FILE}"
    for name, entry in files.items():
        if not (_FILE_NAME.match(str(name)) and isinstance(entry, dict) and entry.get("name") == name
                and _is_count(entry.get("bytes")) and isinstance(entry.get("sha256"), str)
                and _SHA256.match(entry["sha256"])):
            return f"its entry for {str(name)[:40]!r} is not {{name, bytes, sha256}} of a checkpoint file"
    return None


def read_complete(path: str) -> Optional[Dict]:
    """The COMPLETE.json of a checkpoint directory if it is whole and every listed file has its size
    (None: no marker, or a file of another size: an interrupted write).  A marker that exists but is
    not a complete, well-formed manifest raises CheckpointError: it cannot vouch for the checkpoint,
    and skipping it silently would lose the run's progress or resume unchecked."""
    marker = os.path.join(path, COMPLETE)
    m = _EPOCH_DIR.match(os.path.basename(os.path.normpath(path)))
    try:
        with open(marker, "rb") as f:
            raw = f.read()
        manifest = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        problem = f"not readable JSON: {str(exc)[:80]}"
    else:
        problem = manifest_problem(manifest, int(m.group(1)) if m else manifest.get("epoch")
                                   if isinstance(manifest, dict) else -1)
    if problem is not None:
        raise CheckpointError(f"{marker} is damaged ({problem}): the checkpoint cannot be checked, so it is not "
                              f"used. Fix: delete {path} to resume from the checkpoint before it, or start a new "
                              f"run in another --out directory")
    for entry in manifest["files"].values():
        try:
            if os.path.getsize(os.path.join(path, entry["name"])) != entry["bytes"]:
                return None
        except OSError:
            return None
    return manifest


def latest_complete(run_dir: str) -> Optional[CheckpointInfo]:
    """The newest checkpoint whose COMPLETE.json exists and whose files are all there (CheckpointError
    when the newest marker is damaged, see read_complete)."""
    for epoch, path, complete in reversed(list_checkpoints(run_dir)):
        manifest = read_complete(path) if complete else None
        if manifest is not None:
            return CheckpointInfo(epoch, path, manifest)
    return None


def _readable_complete(path: str) -> bool:
    try:
        return read_complete(path) is not None
    except CheckpointError:
        return False


def prune(run_dir: str, keep: int = KEEP) -> List[str]:
    """Delete all but the newest `keep` complete checkpoints, and incomplete ones older than the
    newest complete one (leftovers of interrupted writes).  A complete checkpoint of epoch 0 (only
    --checkpoint-initial writes one: the run's initial parameters) is kept too.  Returns the deleted paths."""
    entries = list_checkpoints(run_dir)
    complete = [(e, p) for e, p, c in entries if c and _readable_complete(p)]
    if not complete:
        return []  # nothing is complete: keep everything, it may be all there is
    kept = {p for _, p in complete[-keep:]} | {p for e, p in complete if e == 0}
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
    """A notice for the job log (INFO: rank 0's, or every rank's with --log-all-ranks); the handler
    flushes each line, since the job may be killed soon after."""
    log.info(message)

"""Writing a shard set atomically.

Protocol (so an interrupted build never leaves a set that `verify` or a reader accepts, and an old set
survives until the new one is complete):

1. `prepare_output_dir`: refuse a non-empty directory unless overwrite; refuse to overwrite a non-empty
   directory that is not a shard set (no manifest.json), so a typo cannot clobber unrelated files.
2. `stage_server_file` (any rank, one call per server): write the HDF5 file under a hidden temporary
   name in the output directory, fsync it, hash it.  Nothing visible changes yet.
3. `commit_shard_set` (one rank, after every file is staged): remove the old manifest (from here on the
   directory is not a valid set), rename each staged file to its final name, delete server files the
   new set does not have, then write the new manifest atomically, last.
"""
from __future__ import annotations

import contextlib
import glob
import os
import tempfile
from dataclasses import dataclass

import h5py
import numpy as np

from ..fsutil import atomic_write_json, fsync_dir
from .manifest import sha256_file
from .schema import (DATASETS, FORMAT_VERSION, MANIFEST_NAME, ShardError, check_server_arrays,
                     feature_chunk_rows, server_file_name)

_TMP_SUFFIX = ".tmp"


@dataclass
class StagedFile:
    name: str  # final name, e.g. server-0000.h5
    tmp_path: str
    sha256: str
    bytes: int


def prepare_output_dir(out_dir: str, overwrite: bool) -> None:
    """Check (and create) the output directory before any work is done."""
    out_dir = os.fspath(out_dir)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ShardError(f"--out {out_dir!r} exists and is not a directory; choose another --out")
    entries = [e for e in os.listdir(out_dir)] if os.path.isdir(out_dir) else []
    visible = [e for e in entries if not e.startswith(".")]
    if visible and not overwrite:
        raise ShardError(f"output directory {out_dir!r} already exists and is not empty; pass --overwrite to "
                         f"replace the shard set in it (the old set stays intact until the new one is complete) "
                         f"or choose another --out")
    if visible and overwrite and MANIFEST_NAME not in entries:
        raise ShardError(f"refusing --overwrite of {out_dir!r}: it is not empty and holds no {MANIFEST_NAME}, so it "
                         f"is not a shard set; choose another --out or empty it yourself")
    os.makedirs(out_dir, exist_ok=True)
    # Temporaries left by a killed earlier build are invisible to readers; remove them now.
    for stale in glob.glob(os.path.join(out_dir, ".server-*" + _TMP_SUFFIX)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stale)


def _write_h5(path: str, server: int, servers: int, gpus_per_server: int, arrays: dict) -> None:
    with h5py.File(path, "w") as f:
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["server"] = int(server)
        f.attrs["servers"] = int(servers)
        f.attrs["gpus_per_server"] = int(gpus_per_server)
        for name in DATASETS:
            data = np.ascontiguousarray(arrays[name])
            if name == "features" and data.shape[0] > 0:
                rows = feature_chunk_rows(data.shape[0], data.shape[1])
                f.create_dataset(name, data=data, chunks=(rows, max(1, data.shape[1])))
            else:
                f.create_dataset(name, data=data)


def stage_server_file(out_dir: str, server: int, servers: int, gpus_per_server: int, arrays: dict) -> StagedFile:
    """Write one server file under a temporary name in out_dir, fsync and hash it."""
    name = server_file_name(server)
    check_server_arrays(arrays, gpus_per_server, where=name)
    fd, tmp = tempfile.mkstemp(prefix="." + name + ".", suffix=_TMP_SUFFIX, dir=out_dir)
    os.close(fd)
    try:
        _write_h5(tmp, server, servers, gpus_per_server, arrays)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        return StagedFile(name=name, tmp_path=tmp, sha256=sha256_file(tmp), bytes=os.path.getsize(tmp))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def discard_staged(staged) -> None:
    for s in staged:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(s.tmp_path)


def commit_shard_set(out_dir: str, manifest: dict, staged: list) -> dict:
    """Make the staged files the shard set; the manifest (with their checksums) is written last."""
    out_dir = os.fspath(out_dir)
    names = sorted(s.name for s in staged)
    expected = [server_file_name(s) for s in range(int(manifest["servers"]))]
    if names != expected:
        raise ShardError(f"internal error: staged files {names} but the manifest needs {expected}")
    manifest = dict(manifest)
    manifest["files"] = {s.name: {"sha256": s.sha256, "bytes": s.bytes} for s in sorted(staged, key=lambda s: s.name)}
    old_manifest = os.path.join(out_dir, MANIFEST_NAME)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(old_manifest)
    fsync_dir(out_dir)
    for s in staged:
        os.replace(s.tmp_path, os.path.join(out_dir, s.name))
    for old in glob.glob(os.path.join(out_dir, "server-*.h5")):
        if os.path.basename(old) not in manifest["files"]:
            os.unlink(old)
    fsync_dir(out_dir)
    atomic_write_json(old_manifest, manifest)
    return manifest


def write_shards(out_dir, manifest: dict, server_arrays: dict, overwrite: bool = False) -> dict:
    """Serial convenience: prepare, stage every server file, commit.  Returns the final manifest."""
    out_dir = os.fspath(out_dir)
    prepare_output_dir(out_dir, overwrite)
    staged = []
    try:
        for server in sorted(server_arrays):
            staged.append(stage_server_file(out_dir, server, int(manifest["servers"]),
                                            int(manifest["gpus_per_server"]), server_arrays[server]))
        return commit_shard_set(out_dir, manifest, staged)
    except BaseException:
        discard_staged(staged)
        raise

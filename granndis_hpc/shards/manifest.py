"""manifest.json: reading it, checking it against the job, and checking file checksums."""
from __future__ import annotations

import hashlib
import json
import os
from typing import Iterable

from .schema import FORMAT_VERSION, MANIFEST_NAME, ShardError, server_file_name

_REBUILD = "re-run `granndis preprocess build ... --out {path} --overwrite`"


def sha256_file(path: str, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(block)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def read_manifest(path) -> dict:
    """Load DIR/manifest.json and check that it is a complete shard set of a version we read."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise ShardError(f"shard directory {path!r} does not exist; build it with `granndis preprocess build --out "
                         f"{path}`")
    mpath = os.path.join(path, MANIFEST_NAME)
    if not os.access(path, os.R_OK | os.X_OK):  # else "no manifest.json ... rebuild" would name the wrong cause
        raise ShardError(f"shard directory {path!r} cannot be read by this user (Permission denied); fix its "
                         f"permissions (e.g. chmod -R g+rX {path}) or ask its owner")
    if os.path.exists(mpath) and not os.access(mpath, os.R_OK):
        raise ShardError(f"{mpath}: cannot be read by this user (Permission denied); fix its permissions or ask "
                         f"the shard set's owner")
    if not os.path.exists(mpath):
        raise ShardError(
            f"{path!r} has no {MANIFEST_NAME}: it is not a complete shard set (a build writes the manifest "
            f"last, so an interrupted build leaves none); " + _REBUILD.format(path=path))
    try:
        with open(mpath, "r", encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ShardError(f"{mpath}: unreadable manifest ({exc}); " + _REBUILD.format(path=path)) from exc
    if not isinstance(manifest, dict):
        raise ShardError(f"{mpath}: manifest is not a JSON object; " + _REBUILD.format(path=path))
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ShardError(
            f"{mpath}: shard format_version {version!r}, this program reads version {FORMAT_VERSION}; "
            + _REBUILD.format(path=path) + " with this version of granndis-hpc")
    for key in ("servers", "gpus_per_server", "layers", "dataset", "files", "preload"):
        if key not in manifest:
            raise ShardError(f"{mpath}: manifest lacks {key!r}; " + _REBUILD.format(path=path))
    problems = _type_problems(manifest)
    if problems:
        raise ShardError(f"{mpath}: " + "; ".join(problems) + "; " + _REBUILD.format(path=path))
    changed = _changed_fields(manifest)
    if changed:
        raise ShardError(f"{mpath}: " + "; ".join(changed) + ": the manifest was edited after the build "
                         "(it no longer matches the digests the build recorded); restore it or "
                         + _REBUILD.format(path=path))
    return manifest


def _canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def manifest_digests(manifest: dict) -> dict:
    """sha256 (first 16 hex digits) of every field of the manifest, by dotted name: each entry of
    "dataset" on its own (the counts the engine sizes tensors with), every other top-level key as a
    whole.  "files" is left out: each file's own sha256 and size are checked against the file."""
    out = {}
    for key, value in manifest.items():
        if key in ("files", "digests"):
            continue
        if key == "dataset" and isinstance(value, dict):
            for field, v in value.items():
                out[f"dataset.{field}"] = hashlib.sha256(_canonical(v)).hexdigest()[:16]
        else:
            out[key] = hashlib.sha256(_canonical(value)).hexdigest()[:16]
    return out


def _changed_fields(manifest: dict) -> list:
    recorded = manifest.get("digests")
    if not isinstance(recorded, dict):
        return ["it has no field digests (written by an older granndis-hpc, or they were removed)"]
    now = manifest_digests(manifest)
    out = [f"field {name} was changed" for name in sorted(now) if name in recorded and recorded[name] != now[name]]
    out += [f"field {name} was added" for name in sorted(set(now) - set(recorded))]
    out += [f"field {name} was removed" for name in sorted(set(recorded) - set(now))]
    return out


def _is_count(value, minimum: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _type_problems(manifest: dict) -> list:
    """What does not have the type the readers rely on (so that no reader fails with a TypeError)."""
    out = []
    for key in ("servers", "gpus_per_server", "layers"):
        if not _is_count(manifest[key], 1):
            out.append(f"{key} must be a positive integer, got {json.dumps(manifest[key])}")
    ds = manifest["dataset"]
    if not isinstance(ds, dict):
        out.append(f"dataset must be an object, got {json.dumps(ds)}")
    else:
        if not isinstance(ds.get("name"), str):
            out.append(f"dataset.name must be a string, got {json.dumps(ds.get('name'))}")
        for field in ("num_vertices", "num_edges", "num_features", "num_classes", "num_train", "num_val", "num_test"):
            if not _is_count(ds.get(field)):
                out.append(f"dataset.{field} must be a non-negative integer, got {json.dumps(ds.get(field))}")
    pre = manifest["preload"]
    if not isinstance(pre, dict) or pre.get("kind") not in ("full", "eas") or not _is_count(pre.get("hops")):
        out.append(f"preload must be an object with kind full|eas and integer hops, got {json.dumps(pre)}")
    elif pre["kind"] == "eas" and not _is_count(pre.get("fanout"), 1):
        out.append(f"preload.fanout must be a positive integer for EAS, got {json.dumps(pre.get('fanout'))}")
    files = manifest["files"]
    if not isinstance(files, dict):
        out.append(f"files must be an object, got {json.dumps(files)}")
    else:
        for name, entry in files.items():
            if not isinstance(entry, dict):
                out.append(f"files[{name!r}] must be an object with sha256 and bytes, got {json.dumps(entry)}")
                continue
            if not isinstance(entry.get("sha256"), str):
                out.append(f"files[{name!r}] lacks a string 'sha256'")
            if not _is_count(entry.get("bytes")):
                out.append(f"files[{name!r}] lacks an integer 'bytes'")
    return out


def check_job(manifest: dict, servers: int, gpus_per_server: int, layers: int | None = None) -> None:
    """Refuse a shard set built for a different job shape; the message names both shapes and the fix."""
    built_s, built_g = int(manifest["servers"]), int(manifest["gpus_per_server"])
    problems = []
    if built_s != servers or built_g != gpus_per_server:
        problems.append(
            f"it was built for {built_s} servers x {built_g} GPUs per server but this job runs "
            f"{servers} servers x {gpus_per_server} GPUs per server (re-run preprocess with --servers {servers} "
            f"--gpus-per-server {gpus_per_server}, or launch {built_s * built_g} ranks with "
            f"{built_g} ranks per server)")
    if layers is not None and int(manifest["layers"]) != int(layers):
        problems.append(
            f"it was built for a {manifest['layers']}-layer model but this job trains {layers} layers "
            f"(re-run preprocess with --layers {layers}, or train with {manifest['layers']} layers; a per-vertex "
            f"head adds no hop: train's --layers less --linear-layers is the count that must match)")
    if problems:
        name = manifest.get("dataset", {}).get("name", "?")
        raise ShardError(f"shard set for dataset {name!r} does not match the job: " + "; ".join(problems))


def verify_checksums(path, manifest: dict, servers: Iterable[int] | None = None) -> None:
    """sha256 of each listed server file (or only of `servers`) against the manifest; names the bad file."""
    path = os.fspath(path)
    files = manifest.get("files", {})
    wanted = range(int(manifest["servers"])) if servers is None else servers
    for s in wanted:
        name = server_file_name(s)
        entry = files.get(name)
        if entry is None:
            raise ShardError(f"{path}: manifest lists no {name}; " + _REBUILD.format(path=path))
        fpath = os.path.join(path, name)
        if not os.path.exists(fpath):
            raise ShardError(f"{fpath}: file missing (the set is incomplete); " + _REBUILD.format(path=path))
        try:
            size = os.path.getsize(fpath)
            digest = sha256_file(fpath) if size == int(entry["bytes"]) else None
        except OSError as exc:
            raise ShardError(f"{fpath}: cannot be read by this user ({exc.strerror or exc}); fix its permissions or "
                             f"ask its owner for access") from None
        if size != int(entry["bytes"]):
            raise ShardError(f"{fpath}: {size} bytes, manifest says {entry['bytes']} (file truncated or replaced); "
                             + _REBUILD.format(path=path))
        if digest != entry["sha256"]:
            raise ShardError(f"{fpath}: sha256 {digest[:12]}... does not match the manifest "
                             f"({entry['sha256'][:12]}...): the file is corrupted or was modified after the build; "
                             + _REBUILD.format(path=path))

"""The shard-set cache: a set built from a graph in memory is kept under a directory of the user's, named by
a key of everything it depends on, and reused only after it is verified.

The key is sha256 of the dataset's content digest (the canonical graph: edges, features, labels,
splits), the job shape (servers x GPUs per server) and every build option, so a changed graph, shape
or option never meets an old set.  Before reuse rank 0 reads the set's manifest (complete, unedited:
shards.read_manifest), compares the key, digest and shape it records, and checks every server file's
sha256; a set that fails is built again in its place.

The cache lives where the user says (train's run directory by default), never in a shared place:
a directory every user may write to (/tmp) is refused, since anyone could leave a set there whose
manifest and checksums agree with its edited files.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from typing import Any, Mapping, Optional, Tuple

# Recorded in the manifest of every set the API builds (build options travel into it as `extra`).
KEY_FIELD = "api_cache_key"
DEFAULT_SUBDIR = "shard-cache"  # under a run directory


def cache_key(content_sha256: str, servers: int, gpus_per_server: int, options: Mapping[str, Any]) -> str:
    """sha256 (hex) of what a shard set is a function of."""
    from granndis_hpc.shards import FORMAT_VERSION

    payload = {"format_version": FORMAT_VERSION, "content_sha256": content_sha256, "servers": int(servers),
               "gpus_per_server": int(gpus_per_server), "options": {k: options[k] for k in sorted(options)}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def entry_name(name: str, servers: int, gpus_per_server: int, preload: str, key: str) -> str:
    """The cache entry's directory name: readable (dataset, shape, preload) and unique (the key)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "graph"
    return f"{safe[:40]}-{servers}x{gpus_per_server}-{preload}-{key[:16]}"


def check_cache_dir(path: str) -> None:
    """Refuse a cache directory every user may write to (OptionError saying why)."""
    from granndis_hpc.api.errors import OptionError

    probe = os.path.abspath(path)
    while not os.path.exists(probe):  # the nearest existing directory decides who may create it
        parent = os.path.dirname(probe)
        if parent == probe:
            return
        probe = parent
    mode = os.stat(probe).st_mode
    if mode & stat.S_IWOTH:
        raise OptionError(f"cache_dir {path!r}: {probe} is writable by every user, so anyone could leave a shard set "
                         f"there for this job to train on; give a directory of your own (e.g. under the run "
                         f"directory or your home)")


def make_cache_dir(path: str) -> None:
    check_cache_dir(path)
    os.makedirs(path, mode=0o700, exist_ok=True)


def verified(path: str, key: str, content_sha256: str, servers: int,
             gpus_per_server: int) -> Tuple[Optional[dict], str]:
    """(the manifest, "") when `path` holds the complete, unedited set of this key, digest and shape with
    every file's checksum right; else (None, why not)."""
    from granndis_hpc.shards import MANIFEST_NAME, ShardError, read_manifest, verify_checksums

    if not os.path.exists(os.path.join(path, MANIFEST_NAME)):
        return None, "not built yet"
    try:
        manifest = read_manifest(path)
        recorded = (manifest.get(KEY_FIELD), manifest["dataset"].get("content_sha256"), int(manifest["servers"]),
                    int(manifest["gpus_per_server"]))
        if recorded != (key, content_sha256, int(servers), int(gpus_per_server)):
            return None, "built from another graph, shape or options"
        verify_checksums(path, manifest)
    except (ShardError, OSError, KeyError, TypeError, ValueError) as exc:
        return None, " ".join(str(exc).split())
    return manifest, ""

"""What identifies a run (the fingerprint a checkpoint carries) and which runs may continue which
checkpoints: the rules are rundir/checkpoint.py's module docstring."""
from __future__ import annotations

import hashlib
import json
from typing import Dict, Optional

from granndis_hpc.options import specs
from granndis_hpc.rundir.checkpoint_files import CheckpointError

# What may differ between a shape-free checkpoint and a shape-free run of the same dataset.
SHAPE_KEYS = ("servers", "ranks_per_server", "shard_set", "mode", "preloaded_layers")


def shard_set_id(manifest: Dict) -> str:
    """One digest for a shard set: the sha256 of its server files (names and digests, sorted)."""
    files = manifest.get("files", {})
    listing = sorted((name, entry.get("sha256", "")) for name, entry in files.items())
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


def dataset_digest(manifest: Dict) -> Optional[str]:
    """The shard set's dataset.content_sha256 (preprocess/build/pipeline.py dataset_digest); None for a set built
    before the build recorded one."""
    value = manifest.get("dataset", {}).get("content_sha256")
    return value if isinstance(value, str) else None


def trajectory_options(cfg) -> Dict:
    """The options of `cfg` (a TrainConfig) that a continuation must share: every field whose
    on_resume rule is "keep" (the default).  Options that may change on resume (epochs, output,
    shards path, ...) or are reset (overwrite_run) do not change the numbers, or are shape keys the
    fingerprint holds itself (mode, preloaded_layers); the sampler's options (fingerprint=False) are
    checked by the sampler's own saved state."""
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
                "rebuild it with this version (`granndis preprocess build ... --overwrite`), whose manifest "
                "records dataset.content_sha256")
    return None


# Trajectory options added after checkpoints were first written, with the value such a checkpoint's run had.
ADDED_OPTIONS = {"inductive": False}


def check_fingerprint(saved: Dict, current: Dict, where: str) -> None:
    """Raise CheckpointError naming every difference between a checkpoint and this run (the shape keys
    only where they may not differ, see the module docstring)."""
    saved, current = ({**fp, **{k: v for k, v in ADDED_OPTIONS.items() if fp.get(k) is None}}
                      for fp in (saved, current))
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


def same_layout(saved: Dict, current: Dict) -> bool:
    """Whether a checkpoint's fingerprint and this run's name the same servers x ranks per server (so
    rank r of this job continues rank r of the checkpoint's)."""
    return all(saved.get(k) == current.get(k) for k in ("servers", "ranks_per_server"))


def shape_change(saved: Dict, current: Dict, path: str) -> str:
    def shape(fp):
        return f"{fp.get('servers')} x {fp.get('ranks_per_server')} ({fp.get('mode')})"
    return (f"continuing {path}, written on {shape(saved)}, on {shape(current)}: the mode is exact and draws no "
            f"per-rank randomness, so the trajectory continues; the per-rank random states are not restored")

"""Per-type tables of heterogeneous runs for `granndis report`.

A run on a heterogeneous shard set gets a table of its vertex types from the set's manifest (the
``shards`` directory its config.json names): each type's vertices and the bytes of its feature rows,
and the target type's train / validation / test counts (the split lies on the target type only).  A
run whose shard set is no longer where it was trained, or is homogeneous, gets none.
"""
from __future__ import annotations

import os
from typing import List, Optional

from granndis_hpc.fsutil import read_json_object
from granndis_hpc.graph.hetero import GraphTypes, TypesError
from granndis_hpc.units import format_size


def run_dataset(run) -> Optional[dict]:
    """The manifest's dataset entry of the run's shard set, when the set is still there and typed."""
    shards = (run.config or {}).get("shards")
    path = os.path.join(str(shards), "manifest.json") if shards else None
    if path is None or not os.path.isfile(path):
        return None
    try:
        dataset = read_json_object(path).get("dataset") or {}
    except ValueError:
        return None
    return dataset if isinstance(dataset.get("types"), dict) else None


def types_table(run) -> List[str]:
    """Markdown lines of the run's per-type table (none for a homogeneous or moved shard set)."""
    dataset = run_dataset(run)
    if dataset is None:
        return []
    try:
        types = GraphTypes.from_record(dataset["types"])
    except TypesError as exc:
        return [f"Vertex types of {run.label}: not shown ({exc})", ""]
    width = int(dataset.get("num_features") or 0)
    lines = [f"Vertex types of {run.label} (`{run.config['shards']}`, {width} features per vertex, float32):", "",
             "| vertex type | vertices | feature bytes | features | train | val | test |",
             "|---|---:|---:|---|---:|---:|---:|"]
    for name, origin, nbytes in zip(types.names, types.feature_origin, types.feature_bytes(width)):
        target = name == types.target
        split = [f"{int(dataset.get(k, 0)):,}" if target else "-" for k in ("num_train", "num_val", "num_test")]
        lines.append(f"| {name}{' (target)' if target else ''} | {types.count(name):,} | {format_size(nbytes)} | "
                     f"{origin} | " + " | ".join(split) + " |")
    return lines + [""]

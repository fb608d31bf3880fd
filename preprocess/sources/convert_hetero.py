"""A PyG ``HeteroData`` as the heterogeneous bundle layout (preprocess/sources/bundle_hetero.py).

    from granndis_hpc.preprocess.sources.convert import save_bundle
    save_bundle("dblp.npz", data)                        # data: a HeteroData (e.g. torch_geometric.datasets.DBLP)
    save_bundle("mag.npz", data, target_type="paper")    # when several vertex types have y

Read from the HeteroData: every node type's ``x`` (a type without ``x`` is stored by its ``num_nodes`` and
gets derived features at build time), every edge type's ``edge_index``, and the target type's ``y`` and
``train_mask`` / ``val_mask`` / ``test_mask`` (stored as id arrays).  The target type is the one type
with ``y`` unless ``target_type`` names it.  PyG is never imported: a HeteroData is recognised by its
``node_types``, ``edge_types`` and ``metadata()``.
"""
from __future__ import annotations

import numpy as np

from granndis_hpc.preprocess.sources.bundle_hetero import EDGE_PREFIX
from granndis_hpc.preprocess.sources.canonical import DataError, as_array
from granndis_hpc.preprocess.sources.hetero import SPLIT_NAMES, choose_target


def is_pyg_hetero(obj) -> bool:
    return callable(getattr(obj, "metadata", None)) and hasattr(obj, "node_types") and hasattr(obj, "edge_types")


def _name(name, what, origin) -> str:
    if not isinstance(name, str) or not name or "__" in name:
        raise DataError(f"{origin}: {what} {name!r} cannot be stored (names must be non-empty and hold no '__', "
                        "which separates a relation's parts). Fix: rename it in the HeteroData")
    return name


def _split_ids(store, split: str, n: int, target: str, given, origin) -> np.ndarray:
    if given is not None:
        return as_array(given, f"{split}_idx", origin).astype(np.int64, copy=False)
    mask = store.get(f"{split}_mask") if hasattr(store, "get") else getattr(store, f"{split}_mask", None)
    if mask is None:
        raise DataError(f"{origin}: the target type {target!r} has no {split}_mask. Fix: set data[{target!r}]."
                        f"{split}_mask (boolean, one per vertex), or pass train_idx=, val_idx=, test_idx=")
    mask = as_array(mask, f"data[{target!r}].{split}_mask", origin)
    if mask.dtype != np.bool_ or mask.shape != (n,):
        raise DataError(f"{origin}: data[{target!r}].{split}_mask has dtype {mask.dtype} and shape {mask.shape}, "
                        f"not a boolean mask over its {n} vertices. Fix: store one boolean per vertex")
    return np.flatnonzero(mask).astype(np.int64)


def from_pyg_hetero(data, target_type=None, train_idx=None, val_idx=None, test_idx=None,
                    origin="save_bundle") -> dict:
    """The heterogeneous bundle arrays of a HeteroData, in the order of its node and edge types."""
    out = {}
    for t in data.node_types:
        _name(t, "node type", origin)
        store = data[t]
        x = store.get("x") if hasattr(store, "get") else getattr(store, "x", None)
        if x is not None:
            x = as_array(x, f"data[{t!r}].x", origin)
            if x.ndim != 2:
                raise DataError(f"{origin}: data[{t!r}].x has shape {x.shape}. Fix: one feature row per vertex")
            out[f"x_{t}"] = x.astype(np.float32, copy=False)
        else:
            n = getattr(store, "num_nodes", None)
            if n is None:
                raise DataError(f"{origin}: node type {t!r} has neither x nor num_nodes. Fix: set data[{t!r}]."
                                "num_nodes")
            out[f"num_nodes_{t}"] = np.int64(n)
    for s, r, d in data.edge_types:
        for part, what in ((s, "node type"), (r, "relation"), (d, "node type")):
            _name(part, what, origin)
        ei = as_array(data[s, r, d].edge_index, f"data[{(s, r, d)!r}].edge_index", origin)
        if ei.ndim != 2 or ei.shape[0] != 2:
            raise DataError(f"{origin}: data[{(s, r, d)!r}].edge_index has shape {ei.shape}. Fix: store [2, E]")
        out[f"{EDGE_PREFIX}{s}__{r}__{d}"] = ei.astype(np.int64, copy=False)
    labelled = [t for t in data.node_types
                if (data[t].get("y") if hasattr(data[t], "get") else getattr(data[t], "y", None)) is not None]
    target_type = choose_target(labelled, target_type, origin, option="target_type=",
                                no_labels_fix="set y on the target type")
    store = data[target_type]
    y = as_array(store.y, f"data[{target_type!r}].y", origin)
    out[f"y_{target_type}"] = y
    given = dict(zip(SPLIT_NAMES, (train_idx, val_idx, test_idx)))
    if any(v is not None for v in given.values()) and any(v is None for v in given.values()):
        raise DataError(f"{origin}: give all of train_idx, val_idx and test_idx, or none. Fix: pass the three")
    for split in SPLIT_NAMES:
        out[f"{split}_{target_type}"] = _split_ids(store, split, y.shape[0], target_type, given[split], origin)
    return out

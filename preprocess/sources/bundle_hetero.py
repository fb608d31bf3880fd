"""The heterogeneous bundle: one .npz / .h5 file with arrays per vertex type and per relation.

Keys (``<type>``, ``<rel>``: names without ``__``):

    x_<type>                          [count, F] features of a type (types without: derived, see below)
    num_nodes_<type>                  scalar vertex count of a type without x_<type>
    edge_index_<src>__<rel>__<dst>    [2, E] per-type ids: row 0 a <src> vertex, row 1 a <dst> vertex
    y_<target>                        [count] class ids of the target type (-1 = unlabelled)
    train_<target>, val_<target>, test_<target>   ids (or boolean masks) of the target type
    optional num_classes (scalar)

The vertex types take their global ids in the order of the x_ arrays in the file (then the types that
only have num_nodes_, then ones named only by relations); an HDF5 file lists its arrays by name, so
there the order is alphabetical.  When several types have y_, ``--target-type`` picks the one to learn.
A type without x_ gets the mean of its in-neighbours' features (preprocess/sources/hetero.py).
`convert.save_bundle` writes this layout from a PyG ``HeteroData``.
"""
from __future__ import annotations

import os
import zipfile
from typing import Dict, List

import numpy as np

from granndis_hpc.preprocess.sources.canonical import DataError
from granndis_hpc.preprocess.sources.hetero import SPLIT_NAMES, canonicalize_hetero, choose_target, split_relation_key

EDGE_PREFIX = "edge_index_"


def is_hetero_layout(keys) -> bool:
    """Whether a bundle's keys are the heterogeneous layout (x_<type> or edge_index_<relation>)."""
    return any(k.startswith("x_") or k.startswith(EDGE_PREFIX) for k in keys)


def bundle_keys(path) -> List[str]:
    """The array names of an .npz (its members, in file order) or the root datasets of an .h5 file,
    read from the directory / headers only ([] for a file that cannot be listed)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataError(f"{path}: file not found. Fix: check the path")
    try:
        if path.lower().endswith(".npz"):
            with zipfile.ZipFile(path) as zf:
                return [i.filename[:-4] for i in zf.infolist() if i.filename.endswith(".npy")]
        import h5py

        with h5py.File(path, "r") as f:
            return [k for k in f.keys() if isinstance(f[k], h5py.Dataset)]
    except (OSError, ValueError, zipfile.BadZipFile):
        return []  # a damaged file: the reader that follows names the defect


def _scalar_int(value, key, path) -> int:
    value = np.asarray(value)
    if value.size != 1 or not np.issubdtype(value.dtype, np.integer) or int(value.reshape(-1)[0]) < 0:
        raise DataError(f"{path}: {key} must be one non-negative integer, got {value!r}. Fix: store np.int64(count)")
    return int(value.reshape(-1)[0])


def hetero_parts(arrays: Dict[str, np.ndarray], keys: List[str], path, target_type=None) -> dict:
    """canonicalize_hetero's arguments from a heterogeneous bundle's arrays (keys in file order)."""
    order: List[str] = [k[2:] for k in keys if k.startswith("x_")]
    order += [k[len("num_nodes_"):] for k in keys if k.startswith("num_nodes_") and k[len("num_nodes_"):] not in order]
    relations, counts = {}, {}
    for key in keys:
        if not key.startswith(EDGE_PREFIX):
            continue
        rel = split_relation_key(key[len(EDGE_PREFIX):])
        if rel is None:
            raise DataError(f"{path}: array {key!r} is not named edge_index_<src>__<relation>__<dst>. Fix: name it "
                            "so, with type and relation names that hold no '__'")
        ei = arrays[key]
        if ei.ndim != 2 or ei.shape[0] != 2:
            raise DataError(f"{path}: {key} must have shape [2, E], got {ei.shape}. Fix: store np.stack([src, dst])")
        relations[rel] = (ei[0], ei[1])
        order += [t for t in (rel[0], rel[2]) if t not in order]
    if not relations:
        raise DataError(f"{path}: no edge_index_<src>__<relation>__<dst> arrays (found {sorted(arrays)}). Fix: a "
                        "heterogeneous bundle stores every relation's edges that way")
    features = {}
    for t in order:
        x = arrays.get(f"x_{t}")
        if x is not None:
            if x.ndim != 2:
                raise DataError(f"{path}: x_{t} must have shape [count, F], got {x.shape}. Fix: one row per vertex")
            features[t] = x
            counts[t] = x.shape[0]
        if f"num_nodes_{t}" in arrays:
            n = _scalar_int(arrays[f"num_nodes_{t}"], f"num_nodes_{t}", path)
            if t in counts and counts[t] != n:
                raise DataError(f"{path}: num_nodes_{t} = {n} but x_{t} has {counts[t]} rows. Fix: drop num_nodes_{t} "
                                "or make them agree")
            counts[t] = n
        if t not in counts:
            raise DataError(f"{path}: vertex type {t!r} has neither x_{t} nor num_nodes_{t}. Fix: store its "
                            f"features, or its vertex count as num_nodes_{t}")
    labelled = [t for t in order if f"y_{t}" in arrays]
    target_type = choose_target(labelled, target_type, path, no_labels_fix="store y_<target type>")
    missing = [f"{s}_{target_type}" for s in SPLIT_NAMES if f"{s}_{target_type}" not in arrays]
    if missing:
        raise DataError(f"{path}: missing {missing}. Fix: store the target type's split as train_/val_/test_"
                        f"{target_type} (ids or boolean masks)")
    num_classes = arrays.get("num_classes")
    return dict(counts={t: counts[t] for t in order}, features=features, relations=relations,
                labels=arrays[f"y_{target_type}"], target=target_type,
                splits={s: arrays[f"{s}_{target_type}"] for s in SPLIT_NAMES},
                num_classes=None if num_classes is None else _scalar_int(num_classes, "num_classes", path))


def load_hetero_bundle(path, keys, arrays, name, target_type=None, symmetrize=True, self_loops="remove"):
    """Canonicalise a heterogeneous bundle (its arrays already read) with canonicalize_hetero."""
    parts = hetero_parts(arrays, keys, path, target_type)
    return canonicalize_hetero(name, **parts, symmetrize=symmetrize, self_loops=self_loops, origin=path)

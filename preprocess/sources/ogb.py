"""OGB node-property-prediction datasets in the layout users download (no `ogb` package needed).

DIR (``--root``; either the dataset directory itself, e.g. ``.../ogbn_arxiv``, or its parent) holds

    raw/edge.csv.gz          src,dst per line (no header)        | or raw/data.npz with keys
    raw/node-feat.csv.gz     F floats per line                   |   edge_index [2,E], node_feat [N,F],
    raw/num-node-list.csv.gz one line: N                         |   num_nodes_list [1], (node_year ...)
    raw/node-label.csv.gz    one label per line (nan = unlabelled) | or raw/node-label.npz: node_label
    split/<scheme>/{train,valid,test}.csv.gz   one vertex id per line

<scheme> is "time" (arxiv, papers100M), "sales_ranking" (products) or "species" (proteins); the single
subdirectory of split/ is used unless ``split_scheme`` names one.  OGB's directed edges (arxiv,
papers100M) become undirected through the usual symmetrisation in `canonicalize`.

ogbn-proteins is multi-label (node-label.csv.gz: 112 0/1 columns, one binary task each) and has no node
features, only raw/edge-feat.csv.gz (8 columns per edge; data.npz: edge_feat).  Each vertex's features
are then the mean of its edges' features (every edge counted at both ends: the graph is undirected),
as PyG's ogbn-proteins examples derive them (``adj_t.mean(dim=1)`` over the edge attributes) and DGL's
average them; a dataset with neither node nor edge features is refused.

A heterogeneous dataset (ogbn-mag: raw/num-node-dict.csv.gz, raw/relations/...) is recognised by its
files and loaded by preprocess/sources/ogb_mag.py with its vertex types and relations.
"""
from __future__ import annotations

import os

import numpy as np

from granndis_hpc.preprocess.sources.canonical import DataError, canonicalize, index_to_mask
from granndis_hpc.preprocess.sources.bundle import read_npz
from granndis_hpc.preprocess.sources.csvgz import read_csv
from granndis_hpc.preprocess.sources.ogb_mag import is_hetero_dir, load_ogb_hetero

SPLIT_FILES = ("train", "valid", "test")


def find_dataset_dir(root, name) -> str:
    """``root`` if it holds raw/, else ``root/<name with - replaced by _>`` (OGB's own directory name)."""
    if root is None:
        raise DataError("ogb: no --root given. Fix: pass --root DIR, the downloaded dataset directory "
                        "(the one that contains raw/ and split/)")
    root = os.fspath(root)
    candidates = [root] + ([os.path.join(root, str(name).replace("-", "_"))] if name else [])
    for cand in candidates:
        if os.path.isdir(os.path.join(cand, "raw")):
            return cand
    raise DataError(f"{root}: no raw/ directory found (looked in {', '.join(candidates)}). Fix: pass "
                    "--root as the OGB dataset directory that contains raw/ and split/")


def _split_dir(base, split_scheme) -> str:
    split_root = os.path.join(base, "split")
    if not os.path.isdir(split_root):
        raise DataError(f"{split_root}: directory not found. Fix: the OGB download contains split/<scheme>/; "
                        "copy it next to raw/")
    if split_scheme:
        path = os.path.join(split_root, split_scheme)
        if not os.path.isdir(path):
            raise DataError(f"{path}: split scheme not found. Fix: choose one of "
                            f"{sorted(os.listdir(split_root))} with --split-scheme")
        return path
    schemes = sorted(d for d in os.listdir(split_root) if os.path.isdir(os.path.join(split_root, d)))
    if len(schemes) != 1:
        fix = "copy split/<scheme>/ from the download" if not schemes else "pick one with --split-scheme"
        raise DataError(f"{split_root}: {'no' if not schemes else 'several'} split schemes found "
                        f"{schemes}. Fix: {fix}")
    return os.path.join(split_root, schemes[0])


def _first_existing(*paths):
    for p in paths:
        if os.path.exists(p):
            return p
    return paths[0]


def _read_ids(split_dir, part):
    path = _first_existing(*(os.path.join(split_dir, f"{part}{ext}") for ext in (".csv.gz", ".csv")))
    return path, read_csv(path, dtype=np.int64, expected_cols=1)[:, 0]


def features_from_edges(n: int, src: np.ndarray, dst: np.ndarray, edge_feat: np.ndarray, path: str) -> np.ndarray:
    """float32 [n, F]: every vertex's mean over the features [E, F] of the edges it is an end of (both
    ends count each edge once; a vertex without edges gets zeros).  Summed in float64, column by column."""
    edge_feat = np.asarray(edge_feat)
    if edge_feat.ndim != 2 or edge_feat.shape[0] != np.asarray(src).shape[0]:
        raise DataError(f"{path}: edge features must have shape [E={np.asarray(src).shape[0]}, F], got "
                        f"{edge_feat.shape}. Fix: re-download the dataset")
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
        raise DataError(f"{path}: edge endpoints outside 0..{n - 1}. Fix: re-download the dataset")
    degree = np.bincount(src, minlength=n) + np.bincount(dst, minlength=n)
    out = np.empty((n, edge_feat.shape[1]), dtype=np.float32)
    for j in range(edge_feat.shape[1]):  # a few columns (proteins: 8); each a vectorised sum over the edges
        col = edge_feat[:, j].astype(np.float64)
        out[:, j] = (np.bincount(src, weights=col, minlength=n) + np.bincount(dst, weights=col, minlength=n)) \
            / np.maximum(degree, 1)
    return out


def _edge_feature_path(raw: str, base: str) -> str:
    path = os.path.join(raw, "edge-feat.csv.gz")
    if not os.path.exists(path):
        raise DataError(f"{raw}: neither node-feat.csv.gz nor edge-feat.csv.gz found ({base} has no node features "
                        "and no edge features to derive them from). Fix: copy raw/ of the download completely")
    return path


def load_ogb(root, name=None, split_scheme=None, target_type=None, symmetrize=True, self_loops="remove"):
    """Load an OGB node-property dataset from its raw files and canonicalise it."""
    base = find_dataset_dir(root, name)
    raw = os.path.join(base, "raw")
    name = name or os.path.basename(os.path.normpath(base)).replace("_", "-")
    if is_hetero_dir(base):
        return load_ogb_hetero(base, name, _split_dir(base, split_scheme), target_type, symmetrize=symmetrize,
                               self_loops=self_loops)
    if target_type is not None:
        raise DataError(f"{base}: --target-type {target_type} given, but the dataset has one vertex type. Fix: "
                        "leave --target-type out")
    npz = os.path.join(raw, "data.npz")
    if os.path.exists(npz):
        arrays = read_npz(npz, required=("edge_index", "num_nodes_list"), optional=("node_feat", "edge_feat"))
        n_list = np.asarray(arrays["num_nodes_list"]).reshape(-1)
        edge_index, features, origin = arrays["edge_index"], arrays.get("node_feat"), npz
        if features is None and arrays.get("edge_feat") is None:
            raise DataError(f"{npz}: holds neither node_feat nor edge_feat. Fix: re-download the dataset")
        if edge_index.ndim != 2 or edge_index.shape[0] != 2:
            raise DataError(f"{npz}: edge_index must have shape [2, E], got {edge_index.shape}. "
                            "Fix: re-download the dataset")
        src, dst = edge_index[0], edge_index[1]
        feat_path = npz
    else:
        n_path = os.path.join(raw, "num-node-list.csv.gz")
        n_list = read_csv(n_path, dtype=np.int64, expected_cols=1)[:, 0]
        origin = os.path.join(raw, "edge.csv.gz")
        edges = read_csv(origin, dtype=np.int64, expected_cols=2)
        src, dst = edges[:, 0], edges[:, 1]
    if n_list.size != 1 or n_list[0] < 1:
        raise DataError(f"{raw}: num-node-list must hold exactly one positive count (one graph), got "
                        f"{n_list.tolist()[:5]}. Fix: only single-graph node-prediction datasets are supported")
    n = int(n_list[0])
    if not os.path.exists(npz):
        feat_path = os.path.join(raw, "node-feat.csv.gz")
        if os.path.exists(feat_path):
            features = read_csv(feat_path, dtype=np.float32, expected_rows=n)
        else:  # ogbn-proteins: from the edge features (module docstring)
            feat_path = _edge_feature_path(raw, base)
            features = features_from_edges(n, src, dst, read_csv(feat_path, dtype=np.float32), feat_path)
    elif features is None:
        features = features_from_edges(n, src, dst, arrays["edge_feat"], npz)
    label_path = os.path.join(raw, "node-label.npz")
    if os.path.exists(label_path):
        labels = read_npz(label_path, required=("node_label",))["node_label"]
    else:
        label_path = os.path.join(raw, "node-label.csv.gz")
        labels = read_csv(label_path, dtype=np.float64, expected_rows=n)
    split_dir = _split_dir(base, split_scheme)
    masks = []
    for part in SPLIT_FILES:
        path, ids = _read_ids(split_dir, part)
        masks.append(index_to_mask(ids, n, f"{part} split", path))
    origins = {"*": origin, "edges": origin, "features": feat_path, "labels": label_path,
               "splits": split_dir}
    return canonicalize(name, n, src, dst, features, labels, *masks,
                        symmetrize=symmetrize, self_loops=self_loops, origin=origins)

"""Reddit (Hamilton et al., GraphSAGE) in the files DGL and PyG download (https://data.dgl.ai/dataset/reddit.zip).

DIR (``--root``) holds the two files, or is PyG's dataset root (files under DIR/raw/) or DGL's download
directory (files under DIR/reddit/ or DIR/reddit_self_loop/):

    reddit_data.npz    feature [N, 602] floats, label [N] class ids (41 classes),
                       node_types [N]: 1 = train, 2 = validation, 3 = test (the published split)
    reddit_graph.npz   the adjacency as SciPy's ``save_npz`` writes it (coo: row, col; csr/csc: indptr,
                       indices; with shape and format); DGL's self-loop variant is reddit_self_loop_graph.npz

Entry (i, j) is the edge i -> j, as both libraries read it (DGL's from_scipy, PyG's edge_index = [row, col]).
The .npz files are read without pickles (``allow_pickle=False``) and their declared sizes checked before
anything is inflated (bundle.read_npz); zip members cannot be memory-mapped, so they are read whole.
"""
from __future__ import annotations

import os

import numpy as np

from granndis_hpc.graph.csr import row_of_edges
from granndis_hpc.preprocess.sources.canonical import DataError, canonicalize
from granndis_hpc.preprocess.sources.bundle import read_npz

DATA_FILE = "reddit_data.npz"
GRAPH_FILES = ("reddit_graph.npz", "reddit_self_loop_graph.npz")
SPLIT_CODES = (1, 2, 3)  # node_types: train, validation, test
_SUBDIRS = ("", "raw", "reddit", "reddit_self_loop")


def find_reddit_dir(root) -> str:
    """The directory under ``root`` that holds reddit_data.npz (root itself, PyG's raw/ or DGL's reddit/)."""
    if root is None:
        raise DataError(f"reddit: no --root given. Fix: pass --root DIR, the directory holding {DATA_FILE} and "
                        f"{GRAPH_FILES[0]}")
    root = os.fspath(root)
    candidates = [os.path.join(root, sub) if sub else root for sub in _SUBDIRS]
    for cand in candidates:
        if os.path.isfile(os.path.join(cand, DATA_FILE)):
            return cand
    raise DataError(f"{os.path.join(root, DATA_FILE)}: file not found (looked in {', '.join(candidates)}). Fix: "
                    f"pass --root as the directory holding {DATA_FILE} and {GRAPH_FILES[0]} (unzipped reddit.zip)")


def read_sparse_npz(path):
    """(src, dst, shape) of the stored entries of a SciPy ``save_npz`` file, without SciPy and without
    pickles: entry (i, j) is the edge i -> j.  Formats coo, csr and csc (what save_npz writes for graphs)."""
    head = read_npz(path, required=("format", "shape"))
    fmt = head["format"]
    fmt = fmt.item() if fmt.size == 1 else fmt
    fmt = fmt.decode("ascii", "replace") if isinstance(fmt, bytes) else str(fmt)
    shape = tuple(int(s) for s in np.asarray(head["shape"]).reshape(-1))
    if len(shape) != 2:
        raise DataError(f"{path}: the sparse matrix has shape {shape}, not 2-D. Fix: save the N x N adjacency "
                        "with scipy.sparse.save_npz")
    if fmt == "coo":
        arrays = read_npz(path, optional=("row", "col", "coords"))
        if "row" in arrays and "col" in arrays:
            src, dst = arrays["row"], arrays["col"]
        elif "coords" in arrays and arrays["coords"].ndim == 2 and arrays["coords"].shape[0] == 2:
            src, dst = arrays["coords"][0], arrays["coords"][1]
        else:
            raise DataError(f"{path}: a coo matrix without row/col (found {sorted(arrays)}). Fix: save the "
                            "adjacency again with scipy.sparse.save_npz")
    elif fmt in ("csr", "csc"):
        arrays = read_npz(path, required=("indptr", "indices"))
        indptr, indices = arrays["indptr"], arrays["indices"]
        major = shape[0] if fmt == "csr" else shape[1]
        if (indptr.ndim != 1 or indices.ndim != 1 or indptr.size != major + 1 or indptr[0] != 0
                or indptr[-1] != indices.size or np.any(np.diff(indptr) < 0)):
            raise DataError(f"{path}: the {fmt} index arrays are inconsistent (indptr {indptr.shape}, indices "
                            f"{indices.shape}, shape {shape}). Fix: save the adjacency again with "
                            "scipy.sparse.save_npz")
        majors = row_of_edges(indptr.astype(np.int64))
        src, dst = (majors, indices) if fmt == "csr" else (indices, majors)
    else:
        raise DataError(f"{path}: sparse format {fmt!r} is not supported. Fix: save the adjacency as coo, csr "
                        "or csc (scipy.sparse.save_npz(path, adj.tocoo()))")
    if src.shape != dst.shape or src.ndim != 1:
        raise DataError(f"{path}: row and column arrays differ in shape ({src.shape} and {dst.shape}). "
                        "Fix: save the adjacency again with scipy.sparse.save_npz")
    return src, dst, shape


def check_node_types(path: str, node_types: np.ndarray) -> None:
    """Every vertex of the published split is in one of its three parts: a code outside 1-3 would leave
    the vertex in no split, silently."""
    bad = ~np.isin(node_types, SPLIT_CODES)
    if bad.any():
        where = np.flatnonzero(bad)
        shown = ", ".join(f"vertex {int(v)}: {int(node_types[v])}" for v in where[:5])
        raise DataError(f"{path}: {where.size} of {node_types.size} 'node_types' values are not 1 (train), 2 "
                        f"(validation) or 3 (test), e.g. {shown}; such a vertex would be in no split. Fix: use the "
                        f"file from reddit.zip")


def load_reddit(root, name=None, symmetrize=True, self_loops="remove"):
    """Load Reddit from its downloaded .npz files and canonicalise it."""
    base = find_reddit_dir(root)
    data_path = os.path.join(base, DATA_FILE)
    graph_path = next((os.path.join(base, f) for f in GRAPH_FILES if os.path.isfile(os.path.join(base, f))), None)
    if graph_path is None:
        raise DataError(f"{os.path.join(base, GRAPH_FILES[0])}: file not found. Fix: unzip reddit.zip completely "
                        f"({DATA_FILE} and {GRAPH_FILES[0]} side by side)")
    data = read_npz(data_path, required=("feature", "label", "node_types"))
    features, node_types = data["feature"], data["node_types"]
    if features.ndim != 2:
        raise DataError(f"{data_path}: 'feature' must have shape [N, F], got {features.shape}. Fix: use the "
                        "file from reddit.zip")
    n = features.shape[0]
    if node_types.shape != (n,) or not np.issubdtype(node_types.dtype, np.integer):
        raise DataError(f"{data_path}: 'node_types' must be {n} integers (1 train, 2 validation, 3 test), got "
                        f"shape {node_types.shape} dtype {node_types.dtype}. Fix: use the file from reddit.zip")
    src, dst, shape = read_sparse_npz(graph_path)
    if shape != (n, n):
        raise DataError(f"{graph_path}: the adjacency is {shape[0]} x {shape[1]} but {data_path} has {n} vertices. "
                        "Fix: use the two files of one download")
    check_node_types(data_path, node_types)
    masks = [node_types == code for code in SPLIT_CODES]
    origins = {"*": data_path, "edges": graph_path}
    return canonicalize(name or "reddit", n, src, dst, features, data["label"], *masks,
                        symmetrize=symmetrize, self_loops=self_loops, origin=origins)

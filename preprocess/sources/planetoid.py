"""Planetoid (Cora, CiteSeer, PubMed) from the raw `ind.NAME.*` files, split exactly as Kipf's GCN / PyG.

Files: x, y (the labelled training vertices), allx, ally (every non-test vertex with features),
tx, ty (test vertices, in the order of `test.index`), graph (dict vertex -> neighbour list) and
test.index (text, one id per line).

Standard ("public") split, identical to ``torch_geometric.datasets.Planetoid(split="public")``:
train = range(len(y)), val = range(len(y), len(y) + 500), test = the ids in test.index.

Vertex ``test.index[j]`` gets row ``tx[j]`` / ``ty[j]``.  CiteSeer's test ids have 15 gaps (vertices
in the graph without features or labels).  Exactly like PyG, those vertices get an all-zero feature
row and label ``argmax(zero row) = 0``, and they belong to *no* split (they are not in test.index), so
their label is never used for loss or accuracy.  Checked against PyG's published counts: Cora 2708
vertices / 10556 directed edges, CiteSeer 3327 / 9104 (after symmetrise, dedupe, no self loops).
"""
from __future__ import annotations

import itertools
import os

import numpy as np

from granndis_hpc.preprocess.sources.canonical import DataError, canonicalize, index_to_mask
from granndis_hpc.preprocess.sources import safe_pickle  # a submodule: importing it runs the package first, no cycle

NAMES = ("cora", "citeseer", "pubmed")
_PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph")
NUM_VAL = 500


def _read_test_index(path) -> np.ndarray:
    try:
        with open(path, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found. Fix: point --root at the directory holding the "
                        "ind.<name>.* files") from None
    tokens = text.split()
    try:
        idx = np.array([int(t) for t in tokens], dtype=np.int64)  # ~1000 lines: not a hot loop
    except ValueError:
        raise DataError(f"{path}: expected one integer vertex id per line. Fix: copy the original "
                        "file again") from None
    if idx.size == 0:
        raise DataError(f"{path}: file is empty. Fix: copy the original file again")
    return idx


def _labels_matrix(obj, path) -> np.ndarray:
    if not isinstance(obj, np.ndarray) or obj.ndim != 2 or obj.dtype == object:
        raise DataError(f"{path}: expected a 2-D one-hot label matrix, found {type(obj).__name__}"
                        f"{getattr(obj, 'shape', '')}. Fix: copy the original file again")
    return obj


def _edges_from_dict(graph, path):
    if not isinstance(graph, dict):
        raise DataError(f"{path}: expected a dict vertex -> neighbour list, found {type(graph).__name__}. "
                        "Fix: copy the original file again")
    try:
        keys = np.fromiter(graph.keys(), dtype=np.int64, count=len(graph))
        lengths = np.fromiter(map(len, graph.values()), dtype=np.int64, count=len(graph))
        # map/chain iterate in C: the pickled dict of lists is flattened without Python-level loops.
        dst = np.fromiter(itertools.chain.from_iterable(graph.values()), dtype=np.int64,
                          count=int(lengths.sum()))
    except (TypeError, ValueError, OverflowError) as exc:
        raise DataError(f"{path}: adjacency dict holds non-integer entries ({exc}). "
                        "Fix: copy the original file again") from None
    return np.repeat(keys, lengths), dst


def load_planetoid(root, name, symmetrize=True, self_loops="remove"):
    """Load ``ROOT/ind.NAME.*`` and canonicalise (see module docstring for the split)."""
    if name is None:
        raise DataError("planetoid: no --name given. Fix: pass --name cora|citeseer|pubmed")
    name = str(name).lower()
    if name not in NAMES:
        raise DataError(f"planetoid: unknown --name {name!r}. Fix: use one of {', '.join(NAMES)}")
    if root is None:
        raise DataError("planetoid: no --root given. Fix: pass --root DIR with the ind.<name>.* files")
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise DataError(f"{root}: not a directory. Fix: pass --root DIR with the ind.{name}.* files")
    path = {p: os.path.join(root, f"ind.{name}.{p}") for p in _PARTS + ("test.index",)}
    raw = {p: safe_pickle.load(path[p]) for p in _PARTS}
    x = safe_pickle.to_dense(raw["x"], path["x"])
    allx = safe_pickle.to_dense(raw["allx"], path["allx"])
    tx = safe_pickle.to_dense(raw["tx"], path["tx"])
    y, ally, ty = (_labels_matrix(raw[p], path[p]) for p in ("y", "ally", "ty"))
    test_index = _read_test_index(path["test.index"])

    widths = {p: m.shape[1] for p, m in (("x", x), ("allx", allx), ("tx", tx))}
    if len(set(widths.values())) != 1:
        raise DataError(f"{path['tx']}: feature widths differ between files {widths}. "
                        "Fix: the x/allx/tx files come from different datasets; copy them again")
    classes = {p: m.shape[1] for p, m in (("y", y), ("ally", ally), ("ty", ty))}
    if len(set(classes.values())) != 1:
        raise DataError(f"{path['ty']}: label widths differ between files {classes}. "
                        "Fix: the y/ally/ty files come from different datasets; copy them again")
    if ally.shape[0] != allx.shape[0] or ty.shape[0] != tx.shape[0] or tx.shape[0] != test_index.size:
        raise DataError(f"{path['test.index']}: row counts disagree (allx {allx.shape[0]}, ally "
                        f"{ally.shape[0]}, tx {tx.shape[0]}, ty {ty.shape[0]}, test.index {test_index.size}). "
                        "Fix: copy the original files again (one may be truncated)")
    n_known = allx.shape[0]
    if test_index.min() < n_known:
        raise DataError(f"{path['test.index']}: test ids start at {test_index.min()}, inside the "
                        f"{n_known} allx rows. Fix: copy the original file again")
    # Test vertices follow the allx block; CiteSeer's gaps make the block longer than tx (PyG rule).
    n = max(n_known + tx.shape[0], int(test_index.max()) + 1)
    features = np.zeros((n, allx.shape[1]), dtype=np.float32)
    features[:n_known] = allx
    onehot = np.zeros((n, ally.shape[1]), dtype=np.float32)
    onehot[:n_known] = ally
    features[test_index] = tx
    onehot[test_index] = ty
    labels = onehot.argmax(axis=1).astype(np.int64)  # zero rows -> class 0, exactly like PyG

    n_train = y.shape[0]
    train_mask = index_to_mask(np.arange(n_train), n, "train split", path["y"])
    val_mask = index_to_mask(np.arange(n_train, n_train + NUM_VAL), n, "val split", path["ally"])
    test_mask = index_to_mask(test_index, n, "test split", path["test.index"])
    src, dst = _edges_from_dict(raw["graph"], path["graph"])
    return canonicalize(name, n, src, dst, features, labels, train_mask, val_mask, test_mask,
                        num_classes=ally.shape[1], symmetrize=symmetrize, self_loops=self_loops,
                        origin={"*": path["graph"], "features": f"{path['allx']} / {path['tx']}",
                                "labels": f"{path['ally']} / {path['ty']}", "splits": path["test.index"]})

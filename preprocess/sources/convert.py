"""Hand a graph held in Python over to the build: write it as a bundle (`--source bundle --path FILE`).

    from granndis_hpc.preprocess.sources.convert import save_bundle
    save_bundle("products.npz", data)                         # a PyG Data object
    save_bundle("reddit.npz", g)                              # a DGL graph (ndata feat/label/*_mask)
    save_bundle("mine.npz", edge_index=ei, features=x, labels=y,
                train_mask=tr, val_mask=va, test_mask=te)     # NumPy arrays (or torch tensors)
    save_bundle("mine.h5", adjacency=A, features=x, labels=y,
                train_idx=tr_ids, val_idx=va_ids, test_idx=te_ids, num_classes=47)  # SciPy sparse

Edges are directed src -> dst (``edge_index[0]`` -> ``edge_index[1]``, PyG's and DGL's convention; entry
(i, j) of a SciPy adjacency is the edge i -> j); the build symmetrises and removes duplicates as usual.
PyG and DGL are never imported: a PyG ``Data`` is recognised by its ``edge_index`` and ``x`` attributes
and a DGL graph by ``edges()`` and ``ndata``, so nothing here depends on either library.  Tensors
become NumPy arrays through ``.detach().cpu().numpy()``.

`graph_arrays` gathers the same arrays without writing them (granndis_hpc.api builds from them in memory).

A PyG ``HeteroData`` is written in the heterogeneous bundle layout (preprocess/sources/convert_hetero.py,
docs/heterogeneous.md); ``target_type`` names the type to learn when several have ``y``.

Everything is validated before a byte is written (the same checks the build's loader makes: shapes,
ids in range, finite features, labels against the classes, disjoint splits); bad input raises
`DataError` saying what is wrong, and an existing file of that name is left untouched.  The file is
written to a temporary name and renamed into place.
"""
from __future__ import annotations

import os

import numpy as np

from granndis_hpc.fsutil import atomic_path
from granndis_hpc.preprocess.sources.canonical import DataError, as_array, canonicalize, index_to_mask
from granndis_hpc.preprocess.sources.convert_hetero import from_pyg_hetero, is_pyg_hetero

SPLITS = ("train", "val", "test")
DGL_KEYS = {"features": "feat", "labels": "label"}  # DGL's built-in datasets' ndata names


def _numpy(value, what):
    """A tensor or array-like as a NumPy array (no copy where possible)."""
    return None if value is None else as_array(value, what, "save_bundle")


def is_pyg(obj) -> bool:
    return hasattr(obj, "edge_index") and hasattr(obj, "x") and not hasattr(obj, "ndata")


def is_dgl(obj) -> bool:
    return hasattr(obj, "ndata") and callable(getattr(obj, "edges", None))


def from_pyg(data, target_type=None) -> dict:
    """The bundle arrays of a homogeneous PyG ``Data``: edge_index, x, y and train/val/test_mask; of a
    ``HeteroData``: the heterogeneous layout's x_<type>, edge_index_<src>__<rel>__<dst>, y_/train_/val_/
    test_<target>."""
    if is_pyg_hetero(data):
        return from_pyg_hetero(data, target_type)
    if getattr(data, "edge_index", None) is None or getattr(data, "x", None) is None:
        raise DataError("save_bundle: the PyG object has no edge_index or no x (a HeteroData, or a graph without "
                        "features). Fix: pass a homogeneous Data with x, or the arrays as keywords")
    arrays = {"edge_index": data.edge_index, "features": data.x, "labels": getattr(data, "y", None)}
    for split in SPLITS:
        arrays[f"{split}_mask"] = getattr(data, f"{split}_mask", None)
    num_nodes = getattr(data, "num_nodes", None)
    if isinstance(num_nodes, (int, np.integer)) and num_nodes != _numpy(data.x, "x").shape[0]:
        raise DataError(f"save_bundle: the PyG object has num_nodes={num_nodes} but x has "
                        f"{_numpy(data.x, 'x').shape[0]} rows. Fix: give every vertex a feature row")
    return arrays


def from_dgl(g, feature_key="feat", label_key="label") -> dict:
    """The bundle arrays of a homogeneous DGL graph: its edges and ndata[feature_key], ndata[label_key],
    ndata["train_mask"/"val_mask"/"test_mask"] (DGL's built-in datasets' names)."""
    ntypes = list(getattr(g, "ntypes", ["_N"]))
    if len(ntypes) != 1:
        raise DataError(f"save_bundle: the DGL graph has {len(ntypes)} node types {ntypes}; only homogeneous graphs "
                        "are supported. Fix: convert it with dgl.to_homogeneous, or pass the arrays as keywords")
    ndata = g.ndata
    keys = sorted(ndata.keys())
    for key in (feature_key, label_key):
        if key not in ndata:
            raise DataError(f"save_bundle: the DGL graph has no ndata[{key!r}] (it has {keys}). Fix: pass "
                            "feature_key=/label_key= to from_dgl, or the arrays as keywords")
    src, dst = g.edges()
    arrays = {"edge_index": np.stack([_numpy(src, "edges"), _numpy(dst, "edges")]),
              "features": ndata[feature_key], "labels": ndata[label_key]}
    for split in SPLITS:
        arrays[f"{split}_mask"] = ndata[f"{split}_mask"] if f"{split}_mask" in ndata else None
    num_nodes = g.num_nodes() if callable(getattr(g, "num_nodes", None)) else None
    if num_nodes is not None and num_nodes != _numpy(arrays["features"], "features").shape[0]:
        raise DataError(f"save_bundle: the DGL graph has {num_nodes} nodes but ndata[{feature_key!r}] has "
                        f"{_numpy(arrays['features'], 'features').shape[0]} rows. Fix: give every node a feature row")
    return arrays


def _edges_of(edge_index, adjacency):
    """(src, dst) from exactly one of edge_index [2, E] and a SciPy sparse adjacency."""
    if (edge_index is None) == (adjacency is None):
        raise DataError("save_bundle: give exactly one of edge_index [2, E] and adjacency (SciPy sparse). "
                        f"Fix: {'pass one of them' if edge_index is None else 'drop one of them'}")
    if adjacency is not None:
        if not hasattr(adjacency, "tocoo"):
            raise DataError(f"save_bundle: adjacency must be a SciPy sparse matrix, got {type(adjacency).__name__}. "
                            "Fix: scipy.sparse.csr_matrix(A), or pass edge_index")
        if adjacency.shape[0] != adjacency.shape[1]:
            raise DataError(f"save_bundle: adjacency must be square, got {adjacency.shape}. Fix: pass the "
                            "N x N adjacency of the graph")
        coo = adjacency.tocoo()
        return np.asarray(coo.row), np.asarray(coo.col), adjacency.shape[0]
    ei = _numpy(edge_index, "edge_index")
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise DataError(f"save_bundle: edge_index must have shape [2, E], got {ei.shape}. Fix: pass "
                        "np.stack([src, dst]) (an [E, 2] array transposed)")
    return ei[0], ei[1], None


def graph_arrays(graph=None, *, edge_index=None, adjacency=None, features=None, labels=None, train_mask=None,
                 val_mask=None, test_mask=None, train_idx=None, val_idx=None, test_idx=None, num_classes=None,
                 target_type=None, origin="save_bundle") -> dict:
    """The arrays of a graph held in Python, as `canonicalize` takes them: {num_vertices, src, dst,
    features, labels, train_mask, val_mask, test_mask, num_classes}.  The arguments are save_bundle's;
    shapes and the split's completeness are checked here, the rest by `canonicalize`.  `origin` names
    the caller in error messages.  A HeteroData gives `canonicalize_hetero`'s arguments instead: {counts,
    features, relations, labels, splits, target, num_classes}."""
    if is_pyg_hetero(graph):
        return hetero_arguments(graph, target_type, train_idx, val_idx, test_idx, num_classes, origin)
    given = {"edge_index": edge_index, "features": features, "labels": labels, "train_mask": train_mask,
             "val_mask": val_mask, "test_mask": test_mask}
    arrays = {}
    if graph is not None:
        if is_pyg(graph):
            arrays = from_pyg(graph)
        elif is_dgl(graph):
            arrays = from_dgl(graph)
        else:
            raise DataError(f"{origin}: {type(graph).__name__} is neither a PyG Data nor a DGL graph. Fix: pass "
                            "the arrays as keywords (edge_index=, features=, labels=, train_mask=, ...)")
        if adjacency is not None:
            arrays.pop("edge_index")
    arrays.update({k: v for k, v in given.items() if v is not None})
    ids = {f"{s}_idx": v for s, v in zip(SPLITS, (train_idx, val_idx, test_idx)) if v is not None}
    if ids:  # id arrays replace the object's masks
        for split in SPLITS:
            arrays.pop(f"{split}_mask", None)
    src, dst, adj_n = _edges_of(arrays.get("edge_index"), adjacency)
    for key in ("features", "labels"):
        if arrays.get(key) is None:
            raise DataError(f"{origin}: no {key}. Fix: pass {key}= (or a graph object that holds them)")
    x = _numpy(arrays["features"], "features")
    y = _numpy(arrays["labels"], "labels")
    if x.ndim != 2:
        raise DataError(f"{origin}: features must have shape [N, F], got {x.shape}. Fix: one row per vertex")
    n = x.shape[0]
    if adj_n is not None and adj_n != n:
        raise DataError(f"{origin}: the adjacency is {adj_n} x {adj_n} but features have {n} rows. Fix: pass "
                        "the arrays of one graph")
    split = ids or {k: arrays[k] for k in ("train_mask", "val_mask", "test_mask") if arrays.get(k) is not None}
    if len(split) != 3:
        raise DataError(f"{origin}: no complete train/val/test split (given: {', '.join(sorted(split)) or 'none'}). "
                        "Fix: pass all three as _mask or all three as _idx (e.g. train_idx=split['train'], ... from "
                        "OGB's get_idx_split())")
    if ids:
        masks = [index_to_mask(_numpy(ids[f"{s}_idx"], f"{s}_idx"), n, f"{s}_idx", origin) for s in SPLITS]
    else:
        masks = [_numpy(split[f"{s}_mask"], f"{s}_mask") for s in SPLITS]
    return {"num_vertices": n, "src": src, "dst": dst, "features": x, "labels": y, "num_classes": num_classes,
            **{f"{s}_mask": m for s, m in zip(SPLITS, masks)}}


def hetero_arguments(data, target_type=None, train_idx=None, val_idx=None, test_idx=None, num_classes=None,
                     origin="save_bundle") -> dict:
    """`canonicalize_hetero`'s arguments (but name) from a HeteroData, through the bundle layout's arrays."""
    from granndis_hpc.preprocess.sources.bundle_hetero import hetero_parts

    layout = from_pyg_hetero(data, target_type, train_idx, val_idx, test_idx, origin)
    parts = hetero_parts(layout, list(layout), origin, target_type)
    return {**parts, "num_classes": num_classes}


def _save_hetero(path, data, target_type, train_idx, val_idx, test_idx, num_classes) -> dict:
    """The heterogeneous layout's arrays of a HeteroData, checked as the build's loader checks them."""
    from granndis_hpc.preprocess.sources.hetero import canonicalize_hetero

    out = from_pyg_hetero(data, target_type, train_idx, val_idx, test_idx)
    a = hetero_arguments(data, target_type, train_idx, val_idx, test_idx, num_classes)
    canonicalize_hetero(os.path.basename(path), **a, symmetrize=False, self_loops="keep", origin="save_bundle")
    if num_classes is not None:
        out["num_classes"] = np.int64(num_classes)
    return out


def save_bundle(path, graph=None, *, edge_index=None, adjacency=None, features=None, labels=None,
                train_mask=None, val_mask=None, test_mask=None, train_idx=None, val_idx=None, test_idx=None,
                num_classes=None, target_type=None) -> str:
    """Write a graph as a bundle (.npz, or .h5/.hdf5) that ``--source bundle --path PATH`` reads; return PATH.

    ``graph``: a PyG ``Data`` or a DGL graph (see from_pyg / from_dgl), or None for the arrays alone;
    keywords given explicitly replace what the object holds.  Splits are boolean masks [N] or id
    arrays, one kind for all three.  ``num_classes`` defaults to the largest label + 1.  ``labels`` of
    shape [N, C] (C >= 2, entries 0/1) are multi-label targets: the set trains with binary cross-entropy."""
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".npz", ".h5", ".hdf5"):
        raise DataError(f"{path}: a bundle is .npz or .h5/.hdf5, got {ext or 'no extension'!r}. Fix: name the "
                        "file FILE.npz or FILE.h5")
    if is_pyg_hetero(graph):
        _write(path, ext, _save_hetero(path, graph, target_type, train_idx, val_idx, test_idx, num_classes))
        return path
    a = graph_arrays(graph, edge_index=edge_index, adjacency=adjacency, features=features, labels=labels,
                     train_mask=train_mask, val_mask=val_mask, test_mask=test_mask, train_idx=train_idx,
                     val_idx=val_idx, test_idx=test_idx, num_classes=num_classes)
    n, x, y = a["num_vertices"], a["features"], a["labels"]
    split_masks = [a[f"{s}_mask"] for s in SPLITS]
    # The loader's own checks, before anything is written (the canonical graph itself is not kept).
    canonicalize(os.path.basename(path), n, a["src"], a["dst"], x, y, *split_masks, num_classes=num_classes,
                 symmetrize=False, self_loops="keep", origin="save_bundle")
    labels = y.reshape(n, -1) if y.ndim == 2 and y.shape[1] > 1 else y.reshape(n)
    out = {"edge_index": np.stack([np.asarray(a["src"], np.int64), np.asarray(a["dst"], np.int64)]),
           "features": x.astype(np.float32, copy=False), "labels": labels}
    out.update({f"{s}_mask": np.asarray(m, dtype=bool) for s, m in zip(SPLITS, split_masks)})
    if num_classes is not None:
        out["num_classes"] = np.int64(num_classes)
    _write(path, ext, out)
    return path


def _write(path, ext, out: dict) -> None:
    """The arrays to `path` (.npz or HDF5) under a temporary name, renamed into place."""
    with atomic_path(path) as tmp:
        if ext == ".npz":
            with open(tmp, "wb") as f:
                np.savez(f, **out)
        else:
            import h5py
            with h5py.File(tmp, "w") as f:
                for key, value in out.items():
                    f[key] = value

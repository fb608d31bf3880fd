"""Canonicalisation: turn whatever a source produced into the one `Graph` every later stage expects.

What "canonical" means here (and why):

* ids are int64 and the graph is an *in-edge* CSR with sources sorted inside each row
  (granndis_hpc.graph.csr convention), so partitioners, halo builders and the engine agree;
* by default the graph is symmetrised (u->v implies v->u): GCN/SAGE training on citation and
  co-purchase graphs uses the undirected graph (PyG/DGL/OGB practice, and the GraNNDis artifact
  adds reverse edges), and METIS/ParMETIS require a symmetric adjacency anyway;
* duplicate edges are removed (raw Planetoid and OGB lists contain some);
* self loops are removed by default: the GCN layer adds its own (normalised) self term, so a stored
  loop would be counted twice.  ``keep`` keeps the ones in the data, ``add`` gives every vertex one.

Memory: a ~62 M-edge graph must fit comfortably, so edges are never held as Python objects.  Every
directed edge u->v becomes one int64 key ``v * N + u``; one in-place sort of the keys gives
destination-major order (exactly the in-edge CSR order), duplicates are then adjacent, row starts are
a binary search of the sorted keys, and ``key % N`` (in place) is the CSR ``indices`` array.  Peak
extra memory is the key array plus one byte per key for the keep-mask.
"""
from __future__ import annotations

import numpy as np

from granndis_hpc.graph.csr import Graph

SELF_LOOP_MODES = ("remove", "keep", "add")
# Feature preprocessing (`--normalize-features`): none, or row = every row divided by its sum (Kipf &
# Welling's GCN recipe, PyG's NormalizeFeatures on non-negative features), recorded in the manifest.
FEATURE_NORMALIZATIONS = ("none", "row")
# Largest N for which v * N + u cannot overflow int64 (floor(sqrt(2**63 - 1))).
MAX_VERTICES = 3_037_000_499
# Elementwise passes over big arrays run in chunks of this many entries so temporaries stay small.
_CHUNK = 1 << 23


class DataError(ValueError):
    """Bad input data.  The message names the file (or source), the problem, and how to fix it.

    Defined here (the lowest layer of the preprocessing stage) and re-exported as
    ``granndis_hpc.preprocess.sources.DataError`` so that canonicalisation and every source raise the same type.
    """


def as_array(value, what: str, origin: str) -> np.ndarray:
    """A tensor or array-like handed to a source as a NumPy array (no copy where possible); DataError
    naming `what` and `origin` for anything else."""
    if hasattr(value, "detach"):  # torch.Tensor, without importing torch
        value = value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{origin}: {what} is not an array ({type(value).__name__}: {exc}). Fix: pass a NumPy "
                        "array or a tensor") from None


def _fail(origin: str, problem: str, fix: str) -> DataError:
    return DataError(f"{origin}: {problem}. Fix: {fix}")


def _where(origin, field: str) -> str:
    """The file to blame for ``field``: ``origin`` is one name, or a dict field -> file ("*" = default)."""
    if isinstance(origin, dict):
        return str(origin.get(field, origin.get("*", "input")))
    return str(origin)


def index_to_mask(index, num_vertices: int, what: str, origin: str) -> np.ndarray:
    """bool [N] mask from an array of vertex ids (validated: integer, in range, no repeats)."""
    index = np.asarray(index)
    if index.ndim == 2 and index.shape[1] == 1:
        index = index[:, 0]  # a one-column CSV/array of ids
    if index.ndim != 1:
        raise _fail(origin, f"{what} must be a 1-D list of vertex ids, got shape {index.shape}",
                    "store one vertex id per entry")
    if index.size and not np.issubdtype(index.dtype, np.integer):
        if np.issubdtype(index.dtype, np.floating) and np.all(np.isfinite(index)) and \
                np.all(index == np.floor(index)):
            index = index.astype(np.int64)
        else:
            raise _fail(origin, f"{what} holds non-integer values (dtype {index.dtype})",
                        "store integer vertex ids")
    index = index.astype(np.int64, copy=False)
    if index.size and (index.min() < 0 or index.max() >= num_vertices):
        raise _fail(origin, f"{what} has vertex ids in [{index.min()}, {index.max()}] but the graph "
                    f"has {num_vertices} vertices (valid ids 0..{num_vertices - 1})",
                    "use 0-based ids of this graph")
    mask = np.zeros(num_vertices, dtype=bool)
    mask[index] = True
    if int(mask.sum()) != index.size:
        raise _fail(origin, f"{what} lists {index.size - int(mask.sum())} vertex ids more than once",
                    "remove the repeated ids")
    return mask


def _edge_keys(src, dst, n: int, symmetrize: bool, add_loops: bool) -> np.ndarray:
    """One int64 key v*n+u per directed edge u->v (plus reverses / loops), built without temporaries."""
    e = src.shape[0]
    total = e * (2 if symmetrize else 1) + (n if add_loops else 0)
    keys = np.empty(total, dtype=np.int64)
    for lo in range(0, e, _CHUNK):
        hi = min(lo + _CHUNK, e)
        s = src[lo:hi].astype(np.int64, copy=False)
        d = dst[lo:hi].astype(np.int64, copy=False)
        np.multiply(d, n, out=keys[lo:hi])
        keys[lo:hi] += s
        if symmetrize:
            np.multiply(s, n, out=keys[e + lo:e + hi])
            keys[e + lo:e + hi] += d
    if add_loops:
        # A loop v->v has key v*(n+1); duplicates with loops already in the data are removed later.
        np.multiply(np.arange(n, dtype=np.int64), n + 1, out=keys[total - n:])
    return keys


def _dedupe_sorted(keys: np.ndarray, n: int, drop_loops: bool) -> np.ndarray:
    """Unique keys of a sorted key array, optionally without self loops (key % (n+1) == 0)."""
    if keys.size == 0:
        return keys
    keep = np.empty(keys.shape[0], dtype=bool)
    keep[0] = True
    np.not_equal(keys[1:], keys[:-1], out=keep[1:])
    if drop_loops:
        # v*n + u == m*(n+1) with u, v < n holds exactly when u == v == m.
        for lo in range(0, keys.shape[0], _CHUNK):
            hi = min(lo + _CHUNK, keys.shape[0])
            keep[lo:hi] &= (keys[lo:hi] % (n + 1)) != 0
    return keys[keep]


def _check_edges(src, dst, n: int, origin: str):
    src, dst = np.asarray(src), np.asarray(dst)
    if src.ndim != 1 or dst.ndim != 1 or src.shape != dst.shape:
        raise _fail(origin, f"edge arrays must be two 1-D arrays of equal length, got src {src.shape} "
                    f"and dst {dst.shape}", "pass src and dst of shape [E] (edge_index[0], edge_index[1])")
    for arr, what in ((src, "source"), (dst, "destination")):
        if arr.size == 0:
            continue
        if not np.issubdtype(arr.dtype, np.integer):
            raise _fail(origin, f"edge {what} ids have dtype {arr.dtype}, not an integer type",
                        "store edge endpoints as integers")
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= n:
            raise _fail(origin, f"edge {what} ids span [{lo}, {hi}] but there are {n} vertices "
                        f"(valid ids 0..{n - 1})",
                        "renumber the edges to 0-based ids or give the correct vertex count")
    return src, dst


def _check_features(features, n: int, origin: str) -> np.ndarray:
    features = np.asarray(features)
    if features.ndim != 2 or features.shape[0] != n:
        raise _fail(origin, f"features must have shape [num_vertices={n}, F], got {features.shape}",
                    "store one feature row per vertex")
    if not (np.issubdtype(features.dtype, np.floating) or np.issubdtype(features.dtype, np.integer)
            or features.dtype == np.bool_):
        raise _fail(origin, f"features have non-numeric dtype {features.dtype}", "store numbers")
    features = features.astype(np.float32, copy=False)
    bad_total, first_bad = 0, None
    for lo in range(0, n, max(1, _CHUNK // max(1, features.shape[1]))):
        hi = min(n, lo + max(1, _CHUNK // max(1, features.shape[1])))
        bad_rows = ~np.isfinite(features[lo:hi]).all(axis=1)
        if bad_rows.any():
            bad_total += int(bad_rows.sum())
            if first_bad is None:
                first_bad = lo + int(np.flatnonzero(bad_rows)[0])
    if bad_total:
        raise _fail(origin, f"features of {bad_total} vertices contain NaN or infinite values "
                    f"(first: vertex {first_bad})",
                    "clean or impute those feature rows before preprocessing (e.g. replace by 0)")
    return features


def _check_multilabel(labels: np.ndarray, n: int, origin: str) -> np.ndarray:
    """Multi-label targets [n, C] (C >= 2 binary tasks): every entry 0 or 1 (a bool, integer or float
    array), stored as uint8 (shards/schema.py).  No entry may be missing: every vertex has all C."""
    if labels.shape[0] != n:
        raise _fail(origin, f"multi-label targets must have shape [num_vertices={n}, C], got {labels.shape}",
                    "store one row of C 0/1 entries per vertex")
    if labels.dtype != np.bool_ and not (np.issubdtype(labels.dtype, np.integer)
                                         or np.issubdtype(labels.dtype, np.floating)):
        raise _fail(origin, f"multi-label targets have dtype {labels.dtype}", "store 0/1 (or bool) entries")
    if labels.size and labels.dtype != np.bool_ and not np.all((labels == 0) | (labels == 1)):
        raise _fail(origin, f"multi-label targets [{n}, {labels.shape[1]}] hold values other than 0 and 1",
                    "store one 0/1 entry per vertex and task (a class id per vertex is a 1-D array)")
    return np.ascontiguousarray(labels, dtype=np.uint8)


def _check_labels(labels, n: int, origin: str) -> np.ndarray:
    """int64 [n] class ids (-1 = unlabelled), or uint8 [n, C] multi-label targets when C >= 2."""
    labels = np.asarray(labels)
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]  # OGB stores labels as [N, 1]
    if labels.ndim == 2 and labels.shape[1] >= 2:
        return _check_multilabel(labels, n, origin)
    if labels.ndim != 1 or labels.shape[0] != n:
        raise _fail(origin, f"labels must have shape [num_vertices={n}] (class ids) or [{n}, C] (multi-label), "
                    f"got {labels.shape}", "store one class id per vertex, or one row of C 0/1 entries")
    if np.issubdtype(labels.dtype, np.floating):
        # Float labels occur in OGB (papers100M stores NaN for unlabelled vertices): NaN -> -1.
        unlabelled = np.isnan(labels)
        finite = labels[~unlabelled]
        if not np.all(finite == np.floor(finite)) or not np.all(np.isfinite(finite)):
            raise _fail(origin, "labels hold non-integer values", "store integer class ids (NaN = unlabelled)")
        out = np.full(n, -1, dtype=np.int64)
        out[~unlabelled] = finite.astype(np.int64)
        return out
    if not np.issubdtype(labels.dtype, np.integer):
        raise _fail(origin, f"labels have dtype {labels.dtype}", "store integer class ids")
    return labels.astype(np.int64, copy=False)


def _check_mask(mask, n: int, what: str, origin: str) -> np.ndarray:
    mask = np.asarray(mask)
    if mask.shape != (n,):
        raise _fail(origin, f"{what} must have shape [{n}], got {mask.shape}",
                    "store one boolean per vertex (or give vertex id lists instead)")
    if mask.dtype != np.bool_:
        if not (np.issubdtype(mask.dtype, np.integer) and np.isin(mask, (0, 1)).all()):
            raise _fail(origin, f"{what} has dtype {mask.dtype} with values other than 0/1",
                        "store a boolean mask")
        mask = mask.astype(bool)
    return mask


def canonicalize(name, num_vertices, src, dst, features, labels, train_mask, val_mask, test_mask,
                 num_classes=None, symmetrize=True, self_loops="remove", *, origin=None) -> Graph:
    """Validate a raw graph and return it as a canonical `Graph` (see the module docstring).

    ``src``/``dst`` are the directed edges src -> dst (dst aggregates src).  ``labels`` may hold -1
    (or NaN for float labels) for unlabelled vertices, but only for vertices in no split.
    ``origin`` names the file or source in error messages (defaults to ``name``); it may also be a
    dict {"edges"|"features"|"labels"|"splits"|"*": file} when the parts come from different files.
    Every problem raises `DataError`.
    """
    origin = {"*": str(name), **origin} if isinstance(origin, dict) else (origin or str(name))
    where = {f: _where(origin, f) for f in ("*", "edges", "features", "labels", "splits")}
    origin = where["*"]
    if self_loops not in SELF_LOOP_MODES:
        raise _fail(origin, f"self_loops={self_loops!r} is not one of {SELF_LOOP_MODES}",
                    "choose remove, keep or add")
    if isinstance(num_vertices, (bool, np.bool_)) or not isinstance(num_vertices, (int, np.integer)):
        raise _fail(origin, f"num_vertices must be an integer, got {num_vertices!r}", "pass an int")
    n = int(num_vertices)
    if n < 1 or n > MAX_VERTICES:
        raise _fail(origin, f"num_vertices={n} is outside 1..{MAX_VERTICES}",
                    "give the true vertex count (graphs beyond 3e9 vertices need another key scheme)")
    src, dst = _check_edges(src, dst, n, where["edges"])
    features = _check_features(features, n, where["features"])
    labels = _check_labels(labels, n, where["labels"])
    masks = [_check_mask(m, n, w, where["splits"]) for m, w in
             ((train_mask, "train_mask"), (val_mask, "val_mask"), (test_mask, "test_mask"))]
    overlap = (masks[0].astype(np.int8) + masks[1] + masks[2]) > 1
    if overlap.any():
        raise _fail(where["splits"], f"{int(overlap.sum())} vertices are in more than one of train/val/test "
                    f"(first: vertex {int(np.flatnonzero(overlap)[0])})",
                    "make the splits disjoint (overlap leaks evaluation data into training)")

    if labels.ndim == 2:  # multi-label: the class count is the number of tasks
        if num_classes is not None and int(num_classes) != labels.shape[1]:
            raise _fail(where["labels"], f"num_classes={int(num_classes)} but the multi-label targets have "
                        f"{labels.shape[1]} columns", "leave num_classes out, or give the column count")
        num_classes = labels.shape[1]
    if num_classes is None:
        num_classes = int(labels.max()) + 1 if labels.size else 0
        num_classes = max(num_classes, 1)
    num_classes = int(num_classes)
    if labels.ndim == 2:
        pass  # 0/1 checked above; every vertex has all its targets
    elif labels.size and (labels.min() < -1 or labels.max() >= num_classes):
        raise _fail(where["labels"], f"labels span [{labels.min()}, {labels.max()}] but num_classes={num_classes} "
                    "(valid: 0..num_classes-1, or -1 for unlabelled)",
                    "fix the labels or pass the correct num_classes")
    unlabelled_in_split = (labels < 0) & (masks[0] | masks[1] | masks[2]) if labels.ndim == 1 else np.zeros(1, bool)
    if unlabelled_in_split.any():
        raise _fail(where["labels"], f"{int(unlabelled_in_split.sum())} unlabelled vertices (label -1/NaN) are in "
                    f"a train/val/test split (first: vertex {int(np.flatnonzero(unlabelled_in_split)[0])})",
                    "remove unlabelled vertices from the splits or give them labels")

    keys = _edge_keys(src, dst, n, symmetrize, add_loops=self_loops == "add")
    keys.sort()  # in place: destination-major, then source -> in-edge CSR order
    keys = _dedupe_sorted(keys, n, drop_loops=self_loops == "remove")
    # Row v owns keys in [v*n, (v+1)*n): row starts are a binary search, no per-edge row array.
    indptr = np.searchsorted(keys, np.arange(n + 1, dtype=np.int64) * n).astype(np.int64)
    np.remainder(keys, n, out=keys)  # keys become the CSR indices (sources) in place
    return Graph(name=str(name), indptr=indptr, indices=keys, features=features, labels=labels,
                 train_mask=masks[0], val_mask=masks[1], test_mask=masks[2], num_classes=num_classes)


def normalize_features(features: np.ndarray, how: str, origin: str = "features") -> np.ndarray:
    """Features preprocessed as `how` (FEATURE_NORMALIZATIONS); "none" returns them unchanged.

    "row" divides each row by its sum, so a bag-of-words row becomes word frequencies (Kipf & Welling's
    preprocess_features); an all-zero row stays zero.  Sums are taken in float64 and the rows scaled in
    place in float32 chunks, so no float64 copy of the whole matrix is made.  Negative entries are
    refused: a row sum is then no scale (it may be 0 or negative), and PyG's shift by the global minimum
    would change the features' meaning silently."""
    if how not in FEATURE_NORMALIZATIONS:
        raise _fail(origin, f"feature normalisation {how!r} is not one of {FEATURE_NORMALIZATIONS}",
                    "choose none or row")
    if how == "none":
        return features
    features = np.array(features, dtype=np.float32)  # a copy: the caller's array is not modified
    n, width = features.shape
    step = max(1, _CHUNK // max(1, width))
    for lo in range(0, n, step):
        rows = features[lo:lo + step]
        negative = (rows < 0).any(axis=1)
        if negative.any():
            raise _fail(origin, f"--normalize-features row needs non-negative features, but vertex "
                        f"{lo + int(np.flatnonzero(negative)[0])} has negative entries",
                        "build without --normalize-features, or shift/scale the features yourself")
        sums = rows.sum(axis=1, dtype=np.float64)
        inv = np.divide(1.0, sums, out=np.zeros_like(sums), where=sums > 0)
        rows *= inv.astype(np.float32)[:, None]
    return features

"""What a rank checks of the shard rows it reads, before anything indexes with them.

A server file's sha256 only says the file is the one the manifest lists; anyone who can write the file
can also rewrite the manifest's checksum.  The engine indexes arrays and sizes MPI rows with what it
reads, so a wrong feature width or dtype, an index out of range or a decreasing CSR pointer would
corrupt memory in a compiled kernel, hang an exchange or silently change results.  These checks are
the bounds and invariants that indexing relies on, vectorised and proportional to what the rank reads
(`granndis preprocess verify` checks the whole set, including what is not cheap: BFS hops,
cross-server consistency).  Every failure is a ShardError naming the file, the HDF5 dataset and the fix.
"""
from __future__ import annotations

import numpy as np

from granndis_hpc.graph.typed_features import TypedRows

from .schema import ShardError, manifest_datasets
from .typed_rows import flat_length, widths_of


def _fail(fpath: str, dataset: str, problem: str, manifest: dict) -> ShardError:
    name = manifest.get("dataset", {}).get("name", "?") if isinstance(manifest.get("dataset"), dict) else "?"
    return ShardError(f"{fpath}: dataset {dataset!r} {problem} (shard set of {name!r}: damaged, or edited after the "
                      f"build); run `granndis preprocess verify` on the set and rebuild it with `granndis "
                      f"preprocess build ... --overwrite`")


def check_file_layout(f, manifest: dict, fpath: str) -> None:
    """Dtypes and shapes of every dataset of an open server file, from the HDF5 headers (reads no data):
    the dtypes of schema.DATASETS, one length per row, CSR pointers one longer, features
    [rows, manifest num_features] float32; an inductive set's datasets too."""
    names = manifest_datasets(manifest)
    for name, (dtype, _) in names.items():
        if name not in f:
            raise _fail(fpath, name, "is missing", manifest)
        if f[name].dtype != dtype:
            raise _fail(fpath, name, f"has dtype {f[name].dtype}, the format stores {dtype}", manifest)
    n = f["vertices/global_id"].shape[0] if f["vertices/global_id"].ndim == 1 else -1
    G = int(manifest["gpus_per_server"])
    F = int(manifest["dataset"]["num_features"])
    C = int(manifest["dataset"]["num_classes"])
    types = widths_of(manifest)
    flat = (flat_length(types, f["vertices/global_id"][:]),) if types is not None and n >= 0 else None
    want = {"n": (n,), "n+1": (n + 1,), "G+1": (G + 1,), "G": (G,), "n,F": (n, F), "n,C": (n, C), "flat": flat,
            "nnz": (f["graph/indices"].shape[0],) if f["graph/indices"].ndim == 1 else None,
            "ni+1": (f["world/indptr"].shape[0],) if f["world/indptr"].ndim == 1 else None,
            "nnz_w": (f["world/src_global_id"].shape[0],) if f["world/src_global_id"].ndim == 1 else None}
    for name, (_, rule) in names.items():
        shape = tuple(f[name].shape)
        if shape != want[rule]:
            expected = "1-D" if want[rule] is None else str(list(want[rule]))
            what = {"n,F": f" ({F} features in the manifest)", "n,C": f" ({C} classes in the manifest)",
                    "flat": " (the sum of its rows' type widths in the manifest)"}.get(rule, "")
            raise _fail(fpath, name, f"has shape {list(shape)}, expected {expected}{what}", manifest)


def check_offsets(offsets: np.ndarray, inner_counts: np.ndarray, w_offsets: np.ndarray, n: int, manifest: dict,
                  fpath: str) -> None:
    """The per-GPU row ranges the slices are cut with (before anything is sliced with them)."""
    if offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0):
        raise _fail(fpath, "vertices/offsets", f"{offsets.tolist()} is not a partition of the file's {n} rows",
                    manifest)
    if np.any(inner_counts < 0) or np.any(inner_counts > np.diff(offsets)):
        raise _fail(fpath, "vertices/inner_counts", f"{inner_counts.tolist()} does not fit the GPUs' rows "
                    f"{np.diff(offsets).tolist()}", manifest)
    if not np.array_equal(w_offsets, np.concatenate([[0], np.cumsum(inner_counts)])):
        raise _fail(fpath, "world/offsets", "is not the cumulative sum of vertices/inner_counts", manifest)


def check_pointer(ptr: np.ndarray, total: int, dataset: str, manifest: dict, fpath: str) -> None:
    """A CSR pointer slice read from the file: inside [0, total] and non-decreasing."""
    if ptr.size and (ptr[0] < 0 or ptr[-1] > total or np.any(np.diff(ptr) < 0)):
        raise _fail(fpath, dataset, f"is not a CSR pointer over its {total} entries (must not decrease and must "
                    f"stay inside [0, {total}])", manifest)


def _in_range(a: np.ndarray, lo: int, hi: int, dataset: str, manifest: dict, fpath: str) -> None:
    if a.size and (int(a.min()) < lo or int(a.max()) >= hi):
        raise _fail(fpath, dataset, f"holds values in [{int(a.min())}, {int(a.max())}], outside [{lo}, {hi})", manifest)


def check_rank_slice(sl, manifest: dict, fpath: str, n_server: int) -> None:
    """Bounds and invariants of one rank's slice (shards.RankSlice) that the planner, the kernels and the
    loss rely on."""
    ds, pre = manifest["dataset"], manifest["preload"]
    V, C = int(ds["num_vertices"]), int(ds["num_classes"])
    world = int(manifest["servers"]) * int(manifest["gpus_per_server"])
    ni = int(sl.n_inner)
    _in_range(sl.indices, 0, n_server, "graph/indices", manifest, fpath)
    _in_range(sl.global_id, 0, V, "vertices/global_id", manifest, fpath)
    _in_range(sl.server_hop, 0, int(pre["hops"]) + 1, "vertices/hop", manifest, fpath)
    if np.any(sl.hop[:ni] != 0) or np.any(sl.hop[ni:] == 0) or np.any(np.diff(sl.hop) < 0):
        raise _fail(fpath, "vertices/hop", f"of GPU {sl.gpu}'s rows is not {ni} inner rows (hop 0) followed by "
                    f"preloaded rows in non-decreasing hop order", manifest)
    if sl.w_indptr.shape[0] != ni + 1:
        raise _fail(fpath, "world/indptr", f"has {sl.w_indptr.shape[0] - 1} rows for GPU {sl.gpu}, which has {ni} "
                    f"inner rows", manifest)
    _in_range(sl.w_src_global_id, 0, V, "world/src_global_id", manifest, fpath)
    _in_range(sl.w_src_rank, 0, world, "world/src_rank", manifest, fpath)
    if np.any(sl.in_degree[:ni] != np.diff(sl.w_indptr)) or np.any(sl.in_degree < np.diff(sl.indptr)):
        raise _fail(fpath, "graph/in_degree", "disagrees with the rows' stored in-edges", manifest)
    in_split = sl.train_mask | sl.val_mask | sl.test_mask
    if sl.labels.ndim == 2:  # multi-label: a 0/1 entry per class (check_file_layout checked the shape)
        _in_range(sl.labels, 0, 2, "labels", manifest, fpath + " (multi-label targets are 0 or 1)")
    else:
        _in_range(sl.labels[in_split], 0, C, "labels", manifest, fpath + f" (rows in a split, {C} classes)")
        _in_range(sl.labels, -1, C, "labels", manifest, fpath + " (-1 marks an unlabelled row)")
    if int(np.count_nonzero(sl.train_mask & sl.val_mask) + np.count_nonzero(sl.train_mask & sl.test_mask)
           + np.count_nonzero(sl.val_mask & sl.test_mask)):
        raise _fail(fpath, "split/*", "marks a row in more than one of train, val and test", manifest)
    bad = _non_finite_rows(sl.features)
    if bad:
        raise _fail(fpath, "features", f"holds NaN or infinite values in {bad} of GPU {sl.gpu}'s rows", manifest)


def check_server_graph(graph: dict, manifest: dict, fpath: str) -> None:
    """A server's whole subgraph as samplers read it (shards.read_server_graph)."""
    n = graph["hop"].shape[0]
    check_pointer(graph["indptr"], graph["indices"].shape[0], "graph/indptr", manifest, fpath)
    if graph["indptr"][0] != 0 or graph["indptr"][-1] != graph["indices"].shape[0]:
        raise _fail(fpath, "graph/indptr", "does not start at 0 and end at the number of stored edges", manifest)
    _in_range(graph["indices"], 0, n, "graph/indices", manifest, fpath)
    _in_range(graph["hop"], 0, int(manifest["preload"]["hops"]) + 1, "vertices/hop", manifest, fpath)
    _in_range(graph["global_id"], 0, int(manifest["dataset"]["num_vertices"]), "vertices/global_id", manifest, fpath)
    if "features" in graph:
        check_server_features(graph["features"], manifest, fpath)


def check_server_features(features, manifest: dict, fpath: str) -> None:
    """A server's feature rows as a batched mode holds them (shards.read_server_graph, read_server_features):
    a matrix, or a TypedRows at its types' own widths."""
    bad = _non_finite_rows(features)
    if bad:
        raise _fail(fpath, "features", f"holds NaN or infinite values in {bad} of the server's rows", manifest)


def _non_finite_rows(features) -> int:
    """Rows holding NaN or an infinite value (a matrix, or a TypedRows at its own widths)."""
    if isinstance(features, TypedRows):
        return 0 if features.all_finite() else int(np.count_nonzero(~features.finite_rows()))
    if np.all(np.isfinite(features)):
        return 0
    return int(np.count_nonzero(~np.isfinite(features).all(axis=1)))

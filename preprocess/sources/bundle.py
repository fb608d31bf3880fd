"""A generic graph bundle: one .npz or .h5 file with named arrays (the easy way to bring your own graph).

Keys (HDF5: datasets at the file root):

    edges     edge_index [2, E] (row 0 = source, row 1 = destination)
              or indptr [N+1] + indices [E], an in-edge CSR (indices = sources of each row's edges)
    features  [N, F] numbers
    labels    [N] integer class ids (-1 = unlabelled, allowed only outside the splits),
              or [N, C] 0/1 multi-label targets (C >= 2 binary tasks, every entry given)
    splits    train_mask, val_mask, test_mask (bool [N])  or  train_idx, val_idx, test_idx (ids)
    optional  num_classes (scalar)

A heterogeneous graph (typed vertices and relations: x_<type>, edge_index_<src>__<rel>__<dst>, y_<target>,
train_/val_/test_<target>) is recognised by its keys and loaded by preprocess/sources/bundle_hetero.py.

.npz files are read with ``allow_pickle=False``: a bundle can never execute code.
"""
from __future__ import annotations

import os
import zipfile

import numpy as np

from granndis_hpc.preprocess.sources.canonical import DataError, canonicalize, index_to_mask
from granndis_hpc.graph.csr import row_of_edges

EXPECTED_KEYS = ("edge_index | (indptr, indices)", "features", "labels",
                 "train_mask, val_mask, test_mask | train_idx, val_idx, test_idx", "[num_classes]")
_ALL_KEYS = ("edge_index", "indptr", "indices", "features", "labels", "train_mask", "val_mask",
             "test_mask", "train_idx", "val_idx", "test_idx", "num_classes")


def _missing(path, what) -> DataError:
    return DataError(f"{path}: {what}. Fix: a bundle needs the keys {'; '.join(EXPECTED_KEYS)}")


# Deflate (zip, gzip) cannot compress better than about 1032:1: a member that claims more holds less
# data than it says (a crafted header), or is a decompression bomb.
MAX_COMPRESSION_RATIO = 1032


def _available_memory() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 1 << 62  # unknown: no limit


def check_declared_sizes(path, members) -> None:
    """Before anything is allocated or inflated: `members` = (key, declared bytes from
    the array's header, bytes stored in the file, compressed?).  A stored member must hold exactly its
    declared bytes, a compressed one at most MAX_COMPRESSION_RATIO times fewer, and all together must
    fit in the memory available; else DataError with the numbers and the fix."""
    total = 0
    for key, declared, stored, compressed in members:
        total += declared
        if not compressed and stored < declared:
            raise DataError(f"{path}: array {key!r} declares {declared:,} bytes but the file stores {stored:,} for "
                            f"it (a truncated or crafted file). Fix: write it again with np.savez / h5py")
        if compressed and declared > MAX_COMPRESSION_RATIO * max(stored, 1):
            raise DataError(f"{path}: array {key!r} declares {declared:,} bytes from {stored:,} compressed bytes, "
                            f"more than deflate can produce ({MAX_COMPRESSION_RATIO}:1): a crafted header or a "
                            f"decompression bomb. Fix: write it again with np.savez_compressed / h5py")
    available = _available_memory()
    if total > available:
        raise DataError(f"{path}: its arrays declare {total / 2**30:.2f} GiB, more than the "
                        f"{available / 2**30:.2f} GiB of memory available. Fix: build on a machine with more "
                        f"memory, or check the file (a crafted header declares sizes it does not hold)")


def _npz_members(path) -> list:
    """(key, declared bytes, stored bytes, compressed?) of every .npy member, from the headers only."""
    out = []
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if not info.filename.endswith(".npy"):
                continue
            with zf.open(info) as fp:
                version = np.lib.format.read_magic(fp)
                reader = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                          else np.lib.format.read_array_header_2_0)
                shape, _, dtype = reader(fp)
                header = fp.tell()
            if dtype.hasobject:
                continue  # pickled objects: np.load(allow_pickle=False) refuses the member without reading it
            declared = int(np.prod(shape, dtype=object)) * dtype.itemsize + header
            compressed = info.compress_type != zipfile.ZIP_STORED
            out.append((info.filename[:-4], declared, info.compress_size if compressed else info.file_size,
                        compressed))
    return out


def read_npz(path, required=(), optional=()) -> dict:
    """The named arrays of an .npz (no pickles); a missing key or a damaged file is a DataError."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataError(f"{path}: file not found. Fix: check the path")
    try:
        check_declared_sizes(path, _npz_members(path))
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in required if k not in z.files]
            if missing:
                raise DataError(f"{path}: missing keys {missing} (found {sorted(z.files)}). "
                                f"Fix: the file must contain {list(required)}")
            return {k: z[k] for k in (*required, *optional) if k in z.files}
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise DataError(f"{path}: cannot read the .npz ({type(exc).__name__}: {exc}); it is truncated, "
                        "corrupted or holds pickled objects. Fix: write it again with np.savez "
                        "from plain numeric arrays") from None


def read_h5(path, keys) -> dict:
    """The root datasets among ``keys`` of an HDF5 file; a damaged file is a DataError."""
    import h5py

    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataError(f"{path}: file not found. Fix: check the path")
    try:
        with h5py.File(path, "r") as f:
            names = [k for k in keys if k in f and isinstance(f[k], h5py.Dataset)]
            check_declared_sizes(path, [(k, int(f[k].size) * f[k].dtype.itemsize, int(f[k].id.get_storage_size()),
                                         bool(f[k].compression)) for k in names
                                        if f[k].id.get_storage_size() or f[k].size])
            return {k: np.asarray(f[k][()]) for k in names}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: cannot read the HDF5 file ({type(exc).__name__}: {exc}); it is "
                        "truncated or not HDF5. Fix: write it again") from None


def _edges(arrays, path):
    if "edge_index" in arrays:
        ei = arrays["edge_index"]
        if ei.ndim != 2 or ei.shape[0] != 2:
            raise _missing(path, f"edge_index must have shape [2, E], got {ei.shape}")
        return ei[0], ei[1], None
    if "indptr" in arrays and "indices" in arrays:
        indptr, indices = arrays["indptr"], arrays["indices"]
        if indptr.ndim != 1 or indices.ndim != 1 or indptr.size < 2 or not np.issubdtype(indptr.dtype, np.integer):
            raise _missing(path, f"indptr/indices must be 1-D integer arrays, got {indptr.shape}/{indices.shape}")
        if indptr[0] != 0 or indptr[-1] != indices.size or np.any(np.diff(indptr) < 0):
            raise _missing(path, "indptr must start at 0, never decrease and end at len(indices)")
        return indices, row_of_edges(indptr.astype(np.int64)), indptr.size - 1
    raise _missing(path, f"no edges: neither edge_index nor indptr+indices (found {sorted(arrays)})")


def _splits(arrays, n, path):
    if all(k in arrays for k in ("train_mask", "val_mask", "test_mask")):
        return [arrays[k] for k in ("train_mask", "val_mask", "test_mask")]
    if all(k in arrays for k in ("train_idx", "val_idx", "test_idx")):
        return [index_to_mask(arrays[k], n, k, path) for k in ("train_idx", "val_idx", "test_idx")]
    raise _missing(path, f"no complete split: need train/val/test _mask or _idx (found {sorted(arrays)})")


def load_bundle(path, name=None, target_type=None, symmetrize=True, self_loops="remove"):
    """Load a .npz or .h5 bundle (keys above, or the heterogeneous layout) and canonicalise it."""
    from granndis_hpc.preprocess.sources.bundle_hetero import bundle_keys, is_hetero_layout, load_hetero_bundle

    if path is None:
        raise DataError("bundle: no --path given. Fix: pass --path FILE.npz or FILE.h5")
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".npz", ".h5", ".hdf5"):
        raise DataError(f"{path}: unknown bundle extension {ext!r}. Fix: use .npz or .h5/.hdf5")
    keys = bundle_keys(path)
    hetero = is_hetero_layout(keys)
    wanted = keys if hetero else _ALL_KEYS
    arrays = read_npz(path, optional=wanted) if ext == ".npz" else read_h5(path, wanted)
    name = name or os.path.splitext(os.path.basename(path))[0]
    if hetero:
        return load_hetero_bundle(path, keys, arrays, name, target_type, symmetrize=symmetrize,
                                  self_loops=self_loops)
    if target_type is not None:
        raise DataError(f"{path}: --target-type {target_type} given, but the bundle has one vertex type (no "
                        "x_<type> or edge_index_<src>__<rel>__<dst> arrays). Fix: leave --target-type out")
    for key in ("features", "labels"):
        if key not in arrays:
            raise _missing(path, f"missing key '{key}' (found {sorted(arrays)})")
    features = arrays["features"]
    if features.ndim != 2:
        raise _missing(path, f"features must have shape [N, F], got {features.shape}")
    n = features.shape[0]
    src, dst, csr_n = _edges(arrays, path)
    if csr_n is not None and csr_n != n:
        raise _missing(path, f"indptr describes {csr_n} vertices but features have {n} rows")
    masks = _splits(arrays, n, path)
    num_classes = arrays.get("num_classes")
    if num_classes is not None:
        if num_classes.size != 1 or not np.issubdtype(num_classes.dtype, np.integer):
            raise _missing(path, f"num_classes must be one integer, got {num_classes!r}")
        num_classes = int(num_classes.reshape(-1)[0])
    return canonicalize(name, n, src, dst, features, arrays["labels"], *masks, num_classes=num_classes,
                        symmetrize=symmetrize, self_loops=self_loops, origin=path)

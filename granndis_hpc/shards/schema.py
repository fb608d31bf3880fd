"""Names, types and shapes of shard format version 1 (docs/design.md §5, docs/shard-format.md).

One place that says what a server file holds, so the writer, the reader and `verify` cannot drift.
"""
from __future__ import annotations

import numpy as np

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"


class ShardError(ValueError):
    """A shard set is missing, damaged or does not fit the job; the message says how to fix it."""


def server_file_name(server: int) -> str:
    return f"server-{int(server):04d}.h5"


# Dataset name -> (dtype, shape rule).  Shape rules: "n" = one entry per row of the server file,
# "n+1" = CSR pointer over the rows, "G+1"/"G" = per GPU, "nnz" = per stored edge,
# "ni+1" = CSR pointer over the inner rows, "nnz_w" = per world-view edge, "n,F" = feature matrix,
# "flat" = every row's features at its own type's width, one after the other (FLAT_FEATURES).
DATASETS: dict[str, tuple[np.dtype, str]] = {
    "vertices/global_id": (np.dtype(np.int64), "n"),
    "vertices/owner": (np.dtype(np.int32), "n"),
    "vertices/hop": (np.dtype(np.int32), "n"),
    "vertices/offsets": (np.dtype(np.int64), "G+1"),
    "vertices/inner_counts": (np.dtype(np.int64), "G"),
    "graph/indptr": (np.dtype(np.int64), "n+1"),
    "graph/indices": (np.dtype(np.int64), "nnz"),
    "graph/in_degree": (np.dtype(np.int64), "n"),
    "features": (np.dtype(np.float32), "n,F"),
    "labels": (np.dtype(np.int64), "n"),
    "split/train": (np.dtype(bool), "n"),
    "split/val": (np.dtype(bool), "n"),
    "split/test": (np.dtype(bool), "n"),
    "world/offsets": (np.dtype(np.int64), "G+1"),
    "world/indptr": (np.dtype(np.int64), "ni+1"),
    "world/src_global_id": (np.dtype(np.int64), "nnz_w"),
    "world/src_rank": (np.dtype(np.int32), "nnz_w"),
    "world/src_in_degree": (np.dtype(np.int64), "nnz_w"),
}

# Written only by an inductive build (`--inductive`, manifest "inductive": true; docs/inductive.md): what
# the engine cannot derive from the rows it reads to train on the train-induced graph and evaluate on the
# train+validation-induced one.  graph/train_in_degree: every row's in-degree within the train-induced
# graph (its in-neighbours that are training vertices; the deepest preloaded rows lack their in-edges);
# world/src_split: the split of every world-view source (SPLIT_BITS), so a rank filters its world view.
INDUCTIVE_DATASETS: dict[str, tuple[np.dtype, str]] = {
    "graph/train_in_degree": (np.dtype(np.int64), "n"),
    "world/src_split": (np.dtype(np.uint8), "nnz_w"),
}
SPLIT_BITS = {"train": 1, "val": 2, "test": 4}

# Written by an inductive build beside INDUCTIVE_DATASETS (manifest "train_hop": true; a set built before it
# has none, and trains inductively only in fb, cob and mb): graph/train_hop, every row's hop within the
# train-induced graph, i.e. its BFS distance from the server's inner training rows over the file's edges
# between training rows (TRAIN_HOP_UNREACHED: not a training row, or not reached within the preload's hops).
# flx and eas train on the rows it reaches (engine/inductive.py), not on every training row of the preload.
TRAIN_HOP_DATASETS: dict[str, tuple[np.dtype, str]] = {"graph/train_hop": (np.dtype(np.uint8), "n")}
TRAIN_HOP_UNREACHED = 255

# A multi-label set (manifest dataset.multilabel: true; docs/datasets.md) stores its targets as a 0/1
# matrix [rows, num_classes] of uint8 (one byte per entry: ogbn-proteins' 112 tasks take 112 B a row,
# where int64 class ids would take 8 B per entry) in place of the int64 class ids.
MULTILABEL_LABELS = (np.dtype(np.uint8), "n,C")

# A heterogeneous set whose vertex types have different feature widths (the manifest's types record
# gives each type's "width"; shards/typed_rows.py) stores its features flat, each row at its own width.
FLAT_FEATURES = (np.dtype(np.float32), "flat")


def datasets_of(inductive: bool, multilabel: bool = False, train_hop: bool = False, flat: bool = False) -> dict:
    """Name -> (dtype, shape rule) of every dataset a server file of such a set holds (train_hop: an
    inductive set that holds TRAIN_HOP_DATASETS too; flat: FLAT_FEATURES)."""
    out = {**DATASETS, **INDUCTIVE_DATASETS} if inductive else dict(DATASETS)
    if inductive and train_hop:
        out.update(TRAIN_HOP_DATASETS)
    if multilabel:
        out["labels"] = MULTILABEL_LABELS
    if flat:
        out["features"] = FLAT_FEATURES
    return out


def is_flat(manifest: dict) -> bool:
    """Whether the set stores its features flat (FLAT_FEATURES: its vertex types' widths differ)."""
    types = manifest.get("dataset", {}).get("types")
    return isinstance(types, dict) and any("width" in t for t in types.get("vertex_types", ()) if isinstance(t, dict))


def manifest_datasets(manifest: dict) -> dict:
    """datasets_of the set the manifest describes."""
    return datasets_of(is_inductive(manifest), is_multilabel(manifest), has_train_hop(manifest), is_flat(manifest))


def is_inductive(manifest: dict) -> bool:
    """Whether the set was built with --inductive (it then holds INDUCTIVE_DATASETS)."""
    return manifest.get("inductive") is True


def datasets_in(arrays) -> dict:
    """datasets_of the set whose server file holds `arrays` (names -> data): which optional datasets it
    holds (labels' dtype aside), told by their presence."""
    features = arrays.get("features")
    return datasets_of(any(name in arrays for name in INDUCTIVE_DATASETS), False,
                       any(name in arrays for name in TRAIN_HOP_DATASETS),
                       features is not None and len(getattr(features, "shape", np.shape(features))) == 1)


def has_train_hop(manifest: dict) -> bool:
    """Whether an inductive set holds TRAIN_HOP_DATASETS (built with --inductive since they were added)."""
    return is_inductive(manifest) and manifest.get("train_hop") is True


def row_block_rows(manifest: dict) -> int:
    """Rows per locality block the set's rows are ordered by inside a (GPU, hop) class
    (preprocess/partition/row_blocks.py); 0: by global id (sets built without blocks, or before them)."""
    return int(manifest.get("row_block_rows", 0))


def is_multilabel(manifest: dict) -> bool:
    """Whether the set holds multi-label targets (labels [rows, num_classes] of 0/1)."""
    return manifest.get("dataset", {}).get("multilabel") is True


def split_code(train, val, test) -> np.ndarray:
    """uint8 split code per vertex from the three masks (SPLIT_BITS)."""
    code = np.asarray(train, dtype=np.uint8) * np.uint8(SPLIT_BITS["train"])
    code |= np.asarray(val, dtype=np.uint8) * np.uint8(SPLIT_BITS["val"])
    code |= np.asarray(test, dtype=np.uint8) * np.uint8(SPLIT_BITS["test"])
    return code


# Features are chunked by whole rows so that a rank's contiguous row slice touches few chunks.
FEATURE_CHUNK_BYTES = 1 << 20


def feature_chunk_rows(num_rows: int, num_features: int) -> int:
    row_bytes = max(1, num_features) * 4
    return int(max(1, min(max(num_rows, 1), FEATURE_CHUNK_BYTES // row_bytes)))


def expected_shape(rule: str, n: int, g: int, nnz: int, n_inner: int, nnz_w: int, f: int, c: int = -1,
                   flat: int = -1) -> tuple:
    return {
        "flat": (flat,),
        "n,C": (n, c),
        "n": (n,),
        "n+1": (n + 1,),
        "G+1": (g + 1,),
        "G": (g,),
        "nnz": (nnz,),
        "ni+1": (n_inner + 1,),
        "nnz_w": (nnz_w,),
        "n,F": (n, f),
    }[rule]


def check_server_arrays(arrays: dict, gpus_per_server: int, where: str) -> None:
    """Raise ShardError unless `arrays` has every dataset with the right dtype and consistent shapes (flat
    features: their length is the rows' widths', which the builder packs them to; verify checks it)."""
    labels = arrays.get("labels")  # an array, or a writer's StreamedDataset (which has a shape too)
    multilabel = labels is not None and len(getattr(labels, "shape", np.shape(labels))) == 2
    names = datasets_in(arrays)
    if multilabel:
        names["labels"] = MULTILABEL_LABELS
    missing = sorted(set(names) - set(arrays))
    if missing:
        raise ShardError(f"{where}: missing datasets {missing}")
    n = int(np.shape(arrays["vertices/global_id"])[0])
    nnz = int(np.shape(arrays["graph/indices"])[0])
    n_inner = int(np.shape(arrays["world/indptr"])[0]) - 1
    nnz_w = int(np.shape(arrays["world/src_global_id"])[0])
    feats = np.shape(arrays["features"])
    f = int(feats[1]) if len(feats) == 2 else -1
    c = int(getattr(labels, "shape", np.shape(labels))[1]) if multilabel else -1
    for name, (dtype, rule) in names.items():
        a = arrays[name]
        want = expected_shape(rule, n, gpus_per_server, nnz, n_inner, nnz_w, f, c, int(feats[0]))
        if tuple(np.shape(a)) != want:
            raise ShardError(f"{where}: dataset {name} has shape {tuple(np.shape(a))}, expected {want}")
        got = a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype
        if got != dtype:
            raise ShardError(f"{where}: dataset {name} has dtype {got}, expected {dtype}")

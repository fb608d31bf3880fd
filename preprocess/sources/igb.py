"""IGB (Illinois Graph Benchmark), homogeneous: the paper-cites-paper graph in the layout IGB's download
scripts write (https://github.com/IllinoisGraphBenchmark/IGB-Datasets, igb/dataloader.py).

DIR (``--root``) is the ``processed`` directory, the size directory holding it (``.../small``) or IGB's
root holding ``<--name>/processed`` (``--name tiny|small|medium|large|full``):

    processed/paper/node_feat.npy                    float32 [N, 1024]
    processed/paper/node_label_19.npy                labels, 19 classes     (--num-classes 19, the default)
    processed/paper/node_label_2K.npy                labels, 2983 classes   (--num-classes 2983)
    processed/paper__cites__paper/edge_index.npy     [E, 2] integer pairs: column 0 cites column 1

The files are memory-mapped (only the pages a pass touches are read), and `IgbSource` hands each build
rank its share of them for the distributed build (preprocess/build/sliced.py).  The large and full downloads store
node_feat.npy and the label files as raw float32 without a .npy header (IGB's own loader maps them with
np.memmap); a file without the .npy magic is read that way, its row count from its size.

The split is IGB's loader's: the first 60 % of the vertices train, the next 20 % validate, the rest test
(int(0.6 N), int(0.2 N)); on the full graph these fractions apply to its labelled prefix (IGB_FULL_LABELLED)
and the vertices after it are in no split.  IGB's loader reads the edges as given (citing -> cited) and
re-adds self loops; here the usual canonicalisation applies (``--no-symmetrize``, ``--self-loops add``).
"""
from __future__ import annotations

import os
from typing import Optional

import numpy as np

from granndis_hpc.preprocess.sources.canonical import DataError, _check_labels, canonicalize

LABEL_FILES = {19: "node_label_19.npy", 2983: "node_label_2K.npy"}
FEATURE_WIDTH = 1024  # of the headerless feature files (IGB's loader assumes it too)
TRAIN_FRACTION, VAL_FRACTION = 0.6, 0.2
# The full graph's paper count and its labelled prefix per label set (from IGB's loader).
IGB_FULL_VERTICES = 269_346_174
IGB_FULL_LABELLED = {19: 227_130_858, 2983: 157_675_969}


def find_processed_dir(root, name=None) -> str:
    """The ``processed`` directory under ``root`` (root itself, root/processed, root/NAME/processed)."""
    if root is None:
        raise DataError("igb: no --root given. Fix: pass --root DIR, IGB's download directory (holding "
                        "<size>/processed/) with --name SIZE, or the processed/ directory itself")
    root = os.fspath(root)
    candidates = [root, os.path.join(root, "processed")] + ([os.path.join(root, name, "processed")] if name else [])
    for cand in candidates:
        if os.path.isdir(os.path.join(cand, "paper")):
            return cand
    raise DataError(f"{root}: no IGB processed/paper/ directory found (looked in {', '.join(candidates)}). "
                    "Fix: pass --root as the processed/ directory, its parent, or IGB's root with --name SIZE")


def _is_npy(path) -> bool:
    with open(path, "rb") as f:
        return f.read(6) == b"\x93NUMPY"


def open_array(path, raw_width=None):
    """A read-only memory map of the .npy file at ``path``; a file without the .npy magic is raw float32
    (IGB's large/full layout) with ``raw_width`` columns, or 1-D when None.  DataError naming the file."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: file not found. Fix: download it with IGB's scripts, or check --root/--name")
    try:
        if _is_npy(path):
            return np.load(path, mmap_mode="r", allow_pickle=False)
        size = os.path.getsize(path)
        row_bytes = 4 * (raw_width or 1)
        if size == 0 or size % row_bytes:
            raise DataError(f"{path}: neither a .npy file nor raw float32 rows of {row_bytes} bytes ({size} bytes). "
                            "Fix: download the file again")
        arr = np.memmap(path, dtype=np.float32, mode="r")
        return arr.reshape(-1, raw_width) if raw_width else arr
    except DataError:
        raise
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"{path}: cannot read it ({type(exc).__name__}: {exc}); it is truncated or damaged. "
                        "Fix: download the file again") from None


def labelled_rows(labels, labelled: int, lo: int, hi: int) -> np.ndarray:
    """labels[lo:hi], those past the labelled prefix (the full graph's unlabelled tail, in no split) NaN
    whatever the file holds there."""
    rows = labels[lo:hi]
    if hi <= labelled:
        return rows
    rows = np.array(rows, dtype=np.float64)
    rows[max(labelled - lo, 0):] = np.nan
    return rows


def labelled_prefix(n: int, num_classes: int) -> int:
    """How many leading vertices IGB's split covers: all n, or the full graph's labelled prefix."""
    return IGB_FULL_LABELLED[num_classes] if n == IGB_FULL_VERTICES else n


def igb_split(n: int, labelled: int, lo: int = 0, hi: Optional[int] = None):
    """IGB's train/val/test masks of vertices lo..hi-1 (default: all n): contiguous 60/20/20 % of the
    first ``labelled`` vertices."""
    n_train, n_val = int(labelled * TRAIN_FRACTION), int(labelled * VAL_FRACTION)
    ids = np.arange(lo, n if hi is None else hi)
    return ids < n_train, (ids >= n_train) & (ids < n_train + n_val), (ids >= n_train + n_val) & (ids < labelled)


class IgbFiles:
    """IGB's three files opened as read-only memory maps, their shapes checked against each other."""

    def __init__(self, root, name=None, num_classes=19):
        if num_classes not in LABEL_FILES:
            raise DataError(f"igb: --num-classes {num_classes} is not an IGB label set. Fix: use 19 or 2983")
        base = find_processed_dir(root, name)
        self.feat_path = os.path.join(base, "paper", "node_feat.npy")
        self.label_path = os.path.join(base, "paper", LABEL_FILES[num_classes])
        self.edge_path = os.path.join(base, "paper__cites__paper", "edge_index.npy")
        self.features = open_array(self.feat_path, raw_width=FEATURE_WIDTH)
        if self.features.ndim != 2:
            raise DataError(f"{self.feat_path}: features must have shape [N, F], got {self.features.shape}. "
                            "Fix: download the file again")
        n = self.features.shape[0]
        labels = open_array(self.label_path)
        if labels.shape != (n,) and labels.shape != (n, 1):
            raise DataError(f"{self.label_path}: {labels.shape[0] if labels.ndim else 0} labels for the {n} vertices "
                            f"of {self.feat_path} (shape {labels.shape}). Fix: use the files of one IGB size")
        self.labels = labels.reshape(n)
        self.edges = open_array(self.edge_path)
        if self.edges.ndim != 2 or self.edges.shape[1] != 2:
            raise DataError(f"{self.edge_path}: edge_index must have shape [E, 2] (IGB's layout), got "
                            f"{self.edges.shape}. Fix: download the file again")
        self.base, self.num_vertices, self.num_classes = base, n, num_classes
        self.labelled = labelled_prefix(n, num_classes)
        parent = os.path.basename(os.path.dirname(os.path.normpath(base)))
        self.name = f"igb-{name or parent or 'igb'}"

    def labels_of(self, lo: int, hi: int) -> np.ndarray:
        """Labels of vertices lo..hi-1 for canonicalisation (labelled_rows)."""
        return labelled_rows(self.labels, self.labelled, lo, hi)


class IgbSource:
    """IGB's files as a sliced source (preprocess/build/sliced.py) for the distributed build: build rank r of
    P reads rows split_ranges(E, P)[r:r+2] of edge_index.npy and the vertex rows it is given, straight
    from the memory maps; nothing else of the files is touched on that rank."""

    def __init__(self, root, name=None, num_classes=19):
        self.files = IgbFiles(root, name, num_classes)
        self.name, self.num_vertices = self.files.name, self.files.num_vertices
        self.num_features, self.num_classes = int(self.files.features.shape[1]), num_classes
        self.canonical = None  # raw edges: the build canonicalises them

    def edge_pieces(self, rank: int, size: int):
        from granndis_hpc.preprocess.formats.chunked import split_ranges

        b = split_ranges(self.files.edges.shape[0], size)
        block = self.files.edges[int(b[rank]):int(b[rank + 1])]
        return [(self.files.edge_path, block[:, 0], block[:, 1])]

    def nodes(self, lo: int, hi: int) -> dict:
        f = self.files
        labels = f.labels_of(lo, hi)
        origin = {"labels": f.label_path, "splits": f.base}
        masks = igb_split(f.num_vertices, f.labelled, lo, hi)
        # The same label checks as the whole-graph load (integer values, the label set's range, none
        # unlabelled in a split), on this rank's rows, naming the label file.
        checked = _check_labels(labels, hi - lo, f.label_path)
        in_split = masks[0] | masks[1] | masks[2]
        bad = in_split & ((checked < 0) | (checked >= f.num_classes))
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise DataError(f"{origin['labels']}: {int(bad.sum())} vertices of the split have labels outside "
                            f"0..{f.num_classes - 1} (first: vertex {lo + first}, label {checked[first]}). Fix: use "
                            f"--num-classes to match {os.path.basename(f.label_path)}, or download it again")
        return {"features": [(f.feat_path, f.features[lo:hi])], "labels": [(f.label_path, checked)],
                **{k: [(f.base, m)] for k, m in zip(("train_mask", "val_mask", "test_mask"), masks)}}


def load_igb(root, name=None, num_classes=19, symmetrize=True, self_loops="remove"):
    """Load IGB's homogeneous paper graph (memory-mapped) and canonicalise it."""
    f = IgbFiles(root, name, num_classes)
    masks = igb_split(f.num_vertices, f.labelled)
    origins = {"*": f.base, "edges": f.edge_path, "features": f.feat_path, "labels": f.label_path}
    return canonicalize(f.name, f.num_vertices, f.edges[:, 0], f.edges[:, 1], f.features,
                        f.labels_of(0, f.num_vertices), *masks, num_classes=num_classes, symmetrize=symmetrize,
                        self_loops=self_loops, origin=origins)

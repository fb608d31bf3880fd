"""IGB (Illinois Graph Benchmark), homogeneous: the paper-cites-paper graph in the layout IGB's download
scripts write (https://github.com/IllinoisGraphBenchmark/IGB-Datasets, igb/dataloader.py).

DIR (``--root``) is the ``processed`` directory, the size directory holding it (``.../small``) or IGB's
root holding ``<--name>/processed`` (``--name tiny|small|medium|large|full``):

    processed/paper/node_feat.npy                    float32 [N, 1024]
    processed/paper/node_label_19.npy                labels, 19 classes     (--num-classes 19, the default)
    processed/paper/node_label_2K.npy                labels, 2983 classes   (--num-classes 2983)
    processed/paper__cites__paper/edge_index.npy     [E, 2] integer pairs: column 0 cites column 1

The files are memory-mapped (only the pages a pass touches are read).  The large and full downloads store
node_feat.npy and the label files as raw float32 without a .npy header (IGB's own loader maps them with
np.memmap); a file without the .npy magic is read that way, its row count from its size.

The split is IGB's loader's: the first 60 % of the vertices train, the next 20 % validate, the rest test
(int(0.6 N), int(0.2 N)); on the full graph these fractions apply to its labelled prefix (IGB_FULL_LABELLED)
and the vertices after it are in no split.  IGB's loader reads the edges as given (citing -> cited) and
re-adds self loops; here the usual canonicalisation applies (``--no-symmetrize``, ``--self-loops add``).
"""
from __future__ import annotations

import os

import numpy as np

from preprocess.canonical import DataError, canonicalize

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


def labelled_prefix(n: int, num_classes: int) -> int:
    """How many leading vertices IGB's split covers: all n, or the full graph's labelled prefix."""
    return IGB_FULL_LABELLED[num_classes] if n == IGB_FULL_VERTICES else n


def igb_split(n: int, labelled: int):
    """IGB's train/val/test masks: contiguous 60/20/20 % of the first ``labelled`` vertices."""
    n_train, n_val = int(labelled * TRAIN_FRACTION), int(labelled * VAL_FRACTION)
    ids = np.arange(n)
    return ids < n_train, (ids >= n_train) & (ids < n_train + n_val), (ids >= n_train + n_val) & (ids < labelled)


def load_igb(root, name=None, num_classes=19, symmetrize=True, self_loops="remove"):
    """Load IGB's homogeneous paper graph (memory-mapped) and canonicalise it."""
    if num_classes not in LABEL_FILES:
        raise DataError(f"igb: --num-classes {num_classes} is not an IGB label set. Fix: use 19 or 2983")
    base = find_processed_dir(root, name)
    feat_path = os.path.join(base, "paper", "node_feat.npy")
    label_path = os.path.join(base, "paper", LABEL_FILES[num_classes])
    edge_path = os.path.join(base, "paper__cites__paper", "edge_index.npy")
    features = open_array(feat_path, raw_width=FEATURE_WIDTH)
    if features.ndim != 2:
        raise DataError(f"{feat_path}: features must have shape [N, F], got {features.shape}. Fix: download "
                        "the file again")
    n = features.shape[0]
    labels = open_array(label_path)
    if labels.shape != (n,) and labels.shape != (n, 1):
        raise DataError(f"{label_path}: {labels.shape[0] if labels.ndim else 0} labels for the {n} vertices of "
                        f"{feat_path} (shape {labels.shape}). Fix: use the files of one IGB size")
    edges = open_array(edge_path)
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise DataError(f"{edge_path}: edge_index must have shape [E, 2] (IGB's layout), got {edges.shape}. "
                        "Fix: download the file again")
    labelled = labelled_prefix(n, num_classes)
    masks = igb_split(n, labelled)
    if labelled < n:  # the unlabelled tail is in no split and may hold any label value
        labels = np.array(labels.reshape(-1), dtype=np.float64)
        labels[labelled:] = np.nan
    parent = os.path.basename(os.path.dirname(os.path.normpath(base)))
    dataset = f"igb-{name or parent or 'igb'}"
    origins = {"*": base, "edges": edge_path, "features": feat_path, "labels": label_path}
    return canonicalize(dataset, n, edges[:, 0], edges[:, 1], features, labels, *masks, num_classes=num_classes,
                        symmetrize=symmetrize, self_loops=self_loops, origin=origins)

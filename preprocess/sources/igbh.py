"""IGBH, the heterogeneous Illinois Graph Benchmark, in the layout IGB's download scripts write
(https://github.com/IllinoisGraphBenchmark/IGB-Datasets, igb/dataloader.py, IGBHeteroDGLDataset).

DIR (``--root``) is the ``processed`` directory, the size directory holding it, or IGB's root holding
``<--name>/processed`` (as for the homogeneous ``igb`` source):

    processed/<type>/node_feat.npy                  [count, 1024] features of each vertex type
                                                    (paper, author, institute, fos; large and full add
                                                    journal, conference)
    processed/paper/node_label_19.npy               paper labels, 19 classes (--num-classes 19, default)
    processed/paper/node_label_2K.npy               paper labels, 2983 classes (--num-classes 2983)
    processed/<src>__<rel>__<dst>/edge_index.npy    [E, 2] per-type ids: column 0 a <src>, column 1 a <dst>
                                                    (paper__cites__paper, paper__written_by__author,
                                                    author__affiliated_to__institute, paper__topic__fos,
                                                    paper__published__journal, paper__venue__conference)

Every vertex type and relation directory present is read; the types take their ids in the order paper,
author, institute, fos, journal, conference (others after, by name).  The files are memory-mapped;
the large and full downloads' headerless paper and author features and labels are read as raw float32
(preprocess/sources/igb.py, `open_array`).  The target type is paper.  The split takes IGB's fractions
(60 % train, 20 % validation, the rest test) of the labelled papers as contiguous id ranges, as the
homogeneous ``igb`` source does, so that every build of a download has the same split (IGB's own
heterogeneous loader draws the same fractions with an unseeded permutation).  Reverse relations are
added by the usual symmetrisation (``rev_written_by`` and so on, IGB's own names for them).

`IgbhSource` is the sliced opener of the distributed build (preprocess/sources/hetero_sliced.py): each
build rank reads 1/P of the edge rows and its vertices' rows; the graph and its digest are the
whole-graph load's.
"""
from __future__ import annotations

import os

import numpy as np

from granndis_hpc.graph.hetero import Relation
from granndis_hpc.preprocess.sources.canonical import DataError
from granndis_hpc.preprocess.sources.hetero import canonicalize_hetero, split_relation_key
from granndis_hpc.preprocess.sources.hetero_sliced import TypedSource
from granndis_hpc.preprocess.sources.igb import (FEATURE_WIDTH, LABEL_FILES, find_processed_dir, igb_split,
                                                 labelled_prefix, labelled_rows, open_array)

TYPE_ORDER = ("paper", "author", "institute", "fos", "journal", "conference")
TARGET = "paper"


def _layout(base):
    """(vertex types in id order, {relation key: edge_index.npy path}) of a processed/ directory."""
    entries = sorted(os.listdir(base))
    typed = [d for d in entries if os.path.isfile(os.path.join(base, d, "node_feat.npy"))]
    types = [t for t in TYPE_ORDER if t in typed] + [t for t in typed if t not in TYPE_ORDER]
    relations = {}
    for d in entries:
        key = split_relation_key(d)
        path = os.path.join(base, d, "edge_index.npy")
        if key is not None and os.path.isfile(path):
            relations[key] = path
    if TARGET not in types or not relations:
        raise DataError(f"{base}: no IGBH layout (vertex types with node_feat.npy: {types}; relation "
                        f"directories with edge_index.npy: {sorted('__'.join(k) for k in relations)}). Fix: pass "
                        "--root as the processed/ directory of an IGBH download (use --source igb for IGB's "
                        "homogeneous paper graph)")
    return types, relations


class IgbhFiles:
    """An IGBH download's files opened as read-only memory maps, their shapes checked against each other."""

    def __init__(self, root, name=None, num_classes=19):
        if num_classes not in LABEL_FILES:
            raise DataError(f"igbh: --num-classes {num_classes} is not an IGB label set. Fix: use 19 or 2983")
        base = find_processed_dir(root, name)
        types, relation_paths = _layout(base)
        self.features, self.counts, self.origin = {}, {}, {"*": base}
        for t in types:
            path = os.path.join(base, t, "node_feat.npy")
            x = open_array(path, raw_width=FEATURE_WIDTH)
            if x.ndim != 2:
                raise DataError(f"{path}: features must have shape [count, F], got {x.shape}. Fix: download it again")
            self.features[t], self.counts[t], self.origin[f"features:{t}"] = x, int(x.shape[0]), path
        self.edges = {}
        for key, path in relation_paths.items():
            edges = open_array(path)
            if edges.ndim != 2 or edges.shape[1] != 2:
                raise DataError(f"{path}: edge_index must have shape [E, 2] (IGB's layout), got {edges.shape}. "
                                "Fix: download the file again")
            self.edges[key] = edges
            self.origin[f"edges:{'__'.join(key)}"] = path
        self.label_path = os.path.join(base, TARGET, LABEL_FILES[num_classes])
        labels = open_array(self.label_path)
        n = self.counts[TARGET]
        if labels.shape not in ((n,), (n, 1)):
            raise DataError(f"{self.label_path}: shape {labels.shape} for the {n} papers of "
                            f"{self.origin['features:paper']}. Fix: use the files of one IGBH size")
        self.labels, self.labelled = labels.reshape(n), labelled_prefix(n, num_classes)
        self.origin.update(labels=self.label_path, splits=base)
        self.base, self.num_classes = base, num_classes
        parent = os.path.basename(os.path.dirname(os.path.normpath(base)))
        self.name = f"igbh-{name or parent or 'igbh'}"
        widths = {t: int(x.shape[1]) for t, x in self.features.items()}
        if len(set(widths.values())) > 1:
            raise DataError(f"{base}: the vertex types' features have different widths {widths}. Fix: use the "
                            "files of one IGBH download")
        self.num_features = widths[TARGET]

    def labels_of(self, lo: int, hi: int) -> np.ndarray:
        """Papers lo..hi-1's labels (igb.labelled_rows: the unlabelled tail NaN)."""
        return labelled_rows(self.labels, self.labelled, lo, hi)


class IgbhSource(TypedSource):
    """IGBH as a sliced source for the distributed build: build rank r of P reads the r-th of P contiguous
    runs of the relations' edge_index.npy rows (one after another) and the feature and label rows of the
    vertices it is given, straight from the memory maps."""

    def __init__(self, root, name=None, num_classes=19):
        self.files = f = IgbhFiles(root, name, num_classes)
        super().__init__(f.name, f.counts, list(f.edges), set(f.counts), TARGET, f.num_features, num_classes,
                         origin=f.base)

    def relation_pieces(self, rank: int, size: int):
        from granndis_hpc.preprocess.formats.chunked import split_ranges

        sizes = [int(e.shape[0]) for e in self.files.edges.values()]
        ends = np.cumsum([0, *sizes])
        b = split_ranges(int(ends[-1]), size)
        lo, hi = int(b[rank]), int(b[rank + 1])
        for i, (key, edges) in enumerate(self.files.edges.items()):
            s, e = max(lo - int(ends[i]), 0), min(hi - int(ends[i]), sizes[i])
            if s < e:
                block = np.asarray(edges[s:e])
                yield self.files.origin[f"edges:{'__'.join(key)}"], Relation(*key), block[:, 0], block[:, 1]

    def stored_rows(self, t: str, lo: int, hi: int):
        return [(self.files.origin[f"features:{t}"], self.files.features[t][lo:hi])]

    def target_rows(self, lo: int, hi: int) -> dict:
        f = self.files
        masks = igb_split(f.counts[TARGET], f.labelled, lo, hi)
        return {"labels": [(f.label_path, f.labels_of(lo, hi))],
                **{m: [(f.base, x)] for m, x in zip(("train_mask", "val_mask", "test_mask"), masks)}}


def load_igbh(root, name=None, num_classes=19, symmetrize=True, self_loops="remove"):
    """Load an IGBH download (memory-mapped) and canonicalise it with its vertex types and relations."""
    f = IgbhFiles(root, name, num_classes)
    relations = {key: (e[:, 0], e[:, 1]) for key, e in f.edges.items()}
    masks = igb_split(f.counts[TARGET], f.labelled)
    return canonicalize_hetero(f.name, f.counts, f.features, relations, f.labels_of(0, f.counts[TARGET]),
                               dict(zip(("train", "val", "test"), masks)), TARGET, num_classes=num_classes,
                               symmetrize=symmetrize, self_loops=self_loops, origin=f.origin)

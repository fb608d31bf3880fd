"""OGB's heterogeneous node-property datasets (ogbn-mag) in the layout users download, no `ogb` package.

DIR (``--root``, the dataset directory ``.../ogbn_mag`` or its parent with ``--name ogbn-mag``) holds

    raw/num-node-dict.csv.gz                   header: the vertex types; one row: their counts
    raw/triplet-type-list.csv.gz               one relation per line: src_type,relation,dst_type
    raw/relations/<src>___<rel>___<dst>/edge.csv.gz    src,dst per line (per-type ids)
    raw/relations/<src>___<rel>___<dst>/num-edge-list.csv.gz  one line: the edge count (checked if present)
    raw/node-feat/<type>/node-feat.csv.gz      F floats per line, for the types that have features (paper)
    raw/nodetype-has-label.csv.gz              header: the types; one row: True/False
    raw/node-label/<type>/node-label.csv.gz    one class id per line
    split/<scheme>/<type>/{train,valid,test}.csv.gz   one per-type vertex id per line (scheme: time)

(OGB's read_csv_heterograph_raw and read_node_label_hetero read the same files.)  The vertex types take
their ids in OGB's order (type names sorted: author, field_of_study, institution, paper), the relations
too.  The labelled type is the target (``--target-type`` picks one where several are).  Types without
features (ogbn-mag's authors, institutions and fields of study) get the mean of their neighbours'
features, as the usual ogbn-mag baselines do (preprocess/sources/hetero.py): authors and fields of study
from their papers, institutions from their authors.  node_year and other extra files are not read.
"""
from __future__ import annotations

import gzip
import os
import zlib
from typing import List

import numpy as np

from granndis_hpc.preprocess.sources.canonical import DataError
from granndis_hpc.preprocess.sources.csvgz import read_csv
from granndis_hpc.preprocess.sources.hetero import canonicalize_hetero, choose_target

SPLIT_FILES = (("train", "train"), ("val", "valid"), ("test", "test"))
MAX_TEXT_BYTES = 1 << 20  # the small text tables (type names, triplets); anything larger is not one


def is_hetero_dir(base) -> bool:
    """Whether an OGB dataset directory holds a heterogeneous graph (raw/num-node-dict.csv.gz)."""
    return os.path.exists(os.path.join(base, "raw", "num-node-dict.csv.gz"))


def read_text_rows(path) -> List[List[str]]:
    """The comma-separated fields of a small (gzipped) text table, line by line; DataError naming the file."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataError(f"{path}: file not found. Fix: copy raw/ and split/ of the OGB download completely")
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            data = f.read(MAX_TEXT_BYTES + 1)
        if len(data) > MAX_TEXT_BYTES:
            raise DataError(f"{path}: more than {MAX_TEXT_BYTES} bytes, not one of OGB's small tables. Fix: "
                            "download the dataset again")
        text = data.decode("utf-8")
    except DataError:
        raise
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read it ({type(exc).__name__}: {exc}); it is truncated or damaged. "
                        "Fix: download it again") from None
    return [[field.strip() for field in line.split(",")] for line in text.splitlines() if line.strip()]


def _header_table(path) -> dict:
    """{column: value} of a two-line table (a header, then one row)."""
    rows = read_text_rows(path)
    if len(rows) != 2 or len(rows[0]) != len(rows[1]):
        raise DataError(f"{path}: expected a header of type names and one row of values, got {len(rows)} lines. "
                        "Fix: only single-graph datasets are supported; download it again")
    return dict(zip(rows[0], rows[1]))


def _counts(raw) -> dict:
    path = os.path.join(raw, "num-node-dict.csv.gz")
    table = _header_table(path)
    try:
        counts = {t: int(v) for t, v in table.items()}
    except ValueError:
        raise DataError(f"{path}: the vertex counts {list(table.values())} are not integers. Fix: download it "
                        "again") from None
    return {t: counts[t] for t in sorted(counts)}  # OGB's order of the types


def _relations(raw, counts) -> dict:
    path = os.path.join(raw, "triplet-type-list.csv.gz")
    triplets = sorted(tuple(row) for row in read_text_rows(path))
    relations = {}
    for triplet in triplets:
        if len(triplet) != 3:
            raise DataError(f"{path}: line {','.join(triplet)!r} is not src_type,relation,dst_type. Fix: download "
                            "it again")
        sub = os.path.join(raw, "relations", "___".join(triplet))
        edges = read_csv(os.path.join(sub, "edge.csv.gz"), dtype=np.int64, expected_cols=2)
        count_path = os.path.join(sub, "num-edge-list.csv.gz")
        if os.path.exists(count_path):
            declared = read_csv(count_path, dtype=np.int64, expected_cols=1)[:, 0]
            if declared.size != 1 or int(declared[0]) != edges.shape[0]:
                raise DataError(f"{sub}: edge.csv.gz has {edges.shape[0]} edges, num-edge-list.csv.gz says "
                                f"{declared.tolist()[:3]}. Fix: download the dataset again")
        relations[triplet] = (edges[:, 0], edges[:, 1])
    return relations


def _target(raw, counts, target_type) -> str:
    path = os.path.join(raw, "nodetype-has-label.csv.gz")
    if os.path.exists(path):
        labelled = [t for t, v in _header_table(path).items() if v.lower() == "true"]
    else:
        labelled = sorted(t for t in counts if os.path.isdir(os.path.join(raw, "node-label", t)))
    return choose_target(labelled, target_type, raw, no_labels_fix="copy raw/node-label/ of the download")


def _split_ids(split_dir, file) -> np.ndarray:
    gz, plain = (os.path.join(split_dir, f"{file}{ext}") for ext in (".csv.gz", ".csv"))
    path = plain if os.path.exists(plain) and not os.path.exists(gz) else gz
    return read_csv(path, dtype=np.int64, expected_cols=1)[:, 0]


def load_ogb_hetero(base, name, split_root, target_type=None, symmetrize=True, self_loops="remove"):
    """Load a heterogeneous OGB dataset directory (module docstring) and canonicalise it; ``split_root``
    is its split/<scheme> directory."""
    raw = os.path.join(base, "raw")
    counts = _counts(raw)
    relations = _relations(raw, counts)
    features, origin = {}, {"*": base, "edges": os.path.join(raw, "relations")}
    for t in counts:
        path = os.path.join(raw, "node-feat", t, "node-feat.csv.gz")
        if os.path.exists(path):
            features[t] = read_csv(path, dtype=np.float32, expected_rows=counts[t])
            origin[f"features:{t}"] = path
    for triplet in relations:
        origin[f"edges:{'__'.join(triplet)}"] = os.path.join(raw, "relations", "___".join(triplet), "edge.csv.gz")
    target = _target(raw, counts, target_type)
    label_path = os.path.join(raw, "node-label", target, "node-label.csv.gz")
    labels = read_csv(label_path, dtype=np.float64, expected_rows=counts[target])
    split_dir = os.path.join(split_root, target)
    splits = {part: _split_ids(split_dir, file) for part, file in SPLIT_FILES}
    origin.update(labels=label_path, splits=split_dir, features=os.path.join(raw, "node-feat"))
    return canonicalize_hetero(name, counts, features, relations, labels, splits, target, symmetrize=symmetrize,
                               self_loops=self_loops, origin=origin)

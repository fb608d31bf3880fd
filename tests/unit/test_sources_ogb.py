"""OGB source: a miniature in the downloaded layout (gzip CSV and the data.npz variant) against an
independent reference, directory/scheme discovery, and damaged files."""
import gzip
import os

import numpy as np
import pytest

from granndis_hpc.preprocess.sources import load
from granndis_hpc.preprocess.sources.canonical import DataError
from granndis_hpc.preprocess.sources import csvgz


def make_raw(seed=0, n=157, e=611, f=5, c=6):
    """A random directed graph with duplicates, loops, NaN-labelled vertices outside the splits."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    src[:20], dst[:20] = src[20:40], dst[20:40]
    src[-2:] = dst[-2:]
    feats = rng.standard_normal((n, f)).astype(np.float32)
    labels = rng.integers(0, c, n).astype(np.float64)
    perm = rng.permutation(n)
    train, valid, test, unlabelled = perm[:50], perm[50:80], perm[80:140], perm[140:]
    labels[unlabelled] = np.nan
    return dict(n=n, src=src, dst=dst, feats=feats, labels=labels, train=train, valid=valid, test=test, c=c)


def reference(raw):
    """Dense symmetric adjacency without loops, labels with -1 for NaN, masks from id lists."""
    n = raw["n"]
    a = np.zeros((n, n), bool)
    a[raw["dst"], raw["src"]] = True
    a |= a.T
    np.fill_diagonal(a, False)
    labels = np.where(np.isnan(raw["labels"]), -1, np.nan_to_num(raw["labels"])).astype(np.int64)
    masks = []
    for part in ("train", "valid", "test"):
        m = np.zeros(n, bool)
        m[raw[part]] = True
        masks.append(m)
    return a, labels, masks


def check_against_reference(g, raw):
    a, labels, masks = reference(raw)
    rows = np.repeat(np.arange(g.num_vertices), np.diff(g.indptr))
    got = np.zeros_like(a)
    got[rows, g.indices] = True
    assert g.num_vertices == raw["n"] and g.num_edges == a.sum() and np.array_equal(got, a)
    assert np.array_equal(g.features, raw["feats"])
    assert np.array_equal(g.labels, labels) and g.num_classes == raw["c"]
    for got_mask, want in zip((g.train_mask, g.val_mask, g.test_mask), masks):
        assert np.array_equal(got_mask, want)


def write_ogb(base, raw, scheme="time", npz=False):
    (base / "raw").mkdir(parents=True)
    (base / "split" / scheme).mkdir(parents=True)
    if npz:
        np.savez(base / "raw" / "data.npz", edge_index=np.stack([raw["src"], raw["dst"]]),
                 node_feat=raw["feats"], num_nodes_list=np.array([raw["n"]]),
                 node_year=np.zeros((raw["n"], 1), np.int64), num_edges_list=np.array([raw["src"].size]))
        np.savez(base / "raw" / "node-label.npz", node_label=raw["labels"][:, None])
    else:
        np.savetxt(base / "raw" / "edge.csv.gz", np.stack([raw["src"], raw["dst"]], 1), fmt="%d", delimiter=",")
        np.savetxt(base / "raw" / "node-feat.csv.gz", raw["feats"], fmt="%.9g", delimiter=",")
        np.savetxt(base / "raw" / "node-label.csv.gz", raw["labels"][:, None], fmt="%.17g", delimiter=",")
        np.savetxt(base / "raw" / "num-node-list.csv.gz", [raw["n"]], fmt="%d")
        np.savetxt(base / "raw" / "num-edge-list.csv.gz", [raw["src"].size], fmt="%d")
    for part in ("train", "valid", "test"):
        np.savetxt(base / "split" / scheme / f"{part}.csv.gz", raw[part], fmt="%d")
    return base


@pytest.mark.parametrize("npz", [False, True])
def test_miniature_matches_reference(tmp_path, npz):
    raw = make_raw()
    write_ogb(tmp_path / "ogbn_mini", raw, npz=npz)
    # --root may be the dataset directory or its parent (OGB's own download root).
    g = load("ogb", name="ogbn-mini", root=tmp_path)
    check_against_reference(g, raw)
    assert g.name == "ogbn-mini"
    g2 = load("ogb", root=tmp_path / "ogbn_mini")
    check_against_reference(g2, raw)


def test_small_blocks_parse_like_one_block(tmp_path, monkeypatch):
    raw = make_raw(seed=1)
    write_ogb(tmp_path / "d", raw)
    monkeypatch.setattr(csvgz, "BLOCK_BYTES", 97)  # many blocks cut mid-line
    check_against_reference(load("ogb", root=tmp_path / "d"), raw)


def test_split_scheme_discovery(tmp_path):
    raw = make_raw(seed=2)
    base = write_ogb(tmp_path / "d", raw, scheme="sales_ranking")
    (base / "split" / "time").mkdir()
    with pytest.raises(DataError, match=r"split: several split schemes found \['sales_ranking', "
                                        r"'time'\].*--split-scheme"):
        load("ogb", root=base)
    check_against_reference(load("ogb", root=base, split_scheme="sales_ranking"), raw)
    with pytest.raises(DataError, match=r"split/nope: split scheme not found"):
        load("ogb", root=base, split_scheme="nope")


def test_missing_root_or_raw(tmp_path):
    with pytest.raises(DataError, match=r"no raw/ directory found.*ogbn_x"):
        load("ogb", name="ogbn-x", root=tmp_path)
    with pytest.raises(DataError, match=r"no --root"):
        load("ogb", name="ogbn-x")


def test_truncated_gzip_named(tmp_path):
    raw = make_raw(seed=3, n=2000, e=20000)
    base = write_ogb(tmp_path / "d", raw)
    path = base / "raw" / "edge.csv.gz"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"edge\.csv\.gz: cannot decompress.*truncated or corrupted"):
        load("ogb", root=base)


def test_corrupted_gzip_named(tmp_path):
    raw = make_raw(seed=3)
    base = write_ogb(tmp_path / "d", raw)
    path = base / "raw" / "node-feat.csv.gz"
    data = bytearray(path.read_bytes())
    data[len(data) // 2: len(data) // 2 + 16] = b"\x00" * 16
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"node-feat\.csv\.gz: "):
        load("ogb", root=base)


@pytest.mark.parametrize("fname,content,pattern", [
    ("edge.csv.gz", b"0,1\n2,x\n", r"edge\.csv\.gz: malformed CSV"),
    ("edge.csv.gz", b"0,1\n2,3,4\n", r"edge\.csv\.gz: malformed CSV"),
    ("edge.csv.gz", b"0,1\n2,999\n", r"edge\.csv\.gz: edge destination ids span \[1, 999\]"),
    ("node-label.csv.gz", b"1\n", r"node-label\.csv\.gz: 1 rows, expected 157"),
    ("num-node-list.csv.gz", b"157\n3\n", r"num-node-list must hold exactly one"),
])
def test_bad_files_named(tmp_path, fname, content, pattern):
    raw = make_raw(seed=4)
    base = write_ogb(tmp_path / "d", raw)
    with gzip.open(base / "raw" / fname, "wb") as fh:
        fh.write(content)
    with pytest.raises(DataError, match=pattern):
        load("ogb", root=base)


def test_nan_features_and_bad_labels_named(tmp_path):
    raw = make_raw(seed=5)
    raw["feats"][7, 2] = np.nan
    base = write_ogb(tmp_path / "a", raw)
    with pytest.raises(DataError, match=r"node-feat\.csv\.gz: features of 1 vertices contain NaN.*vertex 7"):
        load("ogb", root=base)
    raw = make_raw(seed=5)
    raw["labels"][raw["train"][0]] = np.nan  # unlabelled vertex inside the train split
    base = write_ogb(tmp_path / "b", raw)
    with pytest.raises(DataError, match=r"node-label\.csv\.gz: 1 unlabelled vertices"):
        load("ogb", root=base)
    raw = make_raw(seed=5)
    raw["train"] = np.append(raw["train"], 10_000)
    base = write_ogb(tmp_path / "c", raw)
    with pytest.raises(DataError, match=r"train\.csv\.gz: train split has vertex ids in \[\d+, 10000\]"):
        load("ogb", root=base)


def test_missing_split_file_named(tmp_path):
    base = write_ogb(tmp_path / "d", make_raw(seed=6))
    os.remove(base / "split" / "time" / "valid.csv.gz")
    with pytest.raises(DataError, match=r"valid\.csv\.gz: file not found"):
        load("ogb", root=base)

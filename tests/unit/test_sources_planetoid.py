"""Planetoid source: real Cora/CiteSeer counts (PyG's), a miniature with CiteSeer-like gaps checked
against an independent reference, and the restricted unpickler against crafted and truncated pickles."""
import collections
import os
import pickle
import shutil

import numpy as np
import pytest
import scipy.sparse as sp

from granndis_hpc.preprocess.sources import load
from granndis_hpc.preprocess.sources.canonical import DataError
from granndis_hpc.preprocess.sources import safe_pickle
from granndis_hpc.preprocess.sources.planetoid import load_planetoid

PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph")


# ---------------------------------------------------------------- real data (tests/data; fails when absent)

@pytest.mark.parametrize("name,n,f,c,split,edges", [
    ("cora", 2708, 1433, 7, (140, 500, 1000), 10556),
    ("citeseer", 3327, 3703, 6, (120, 500, 1000), 9104),
])
def test_real_counts_match_pyg(planetoid_root, name, n, f, c, split, edges):
    g = load("planetoid", name=name, root=planetoid_root)
    assert (g.num_vertices, g.num_features, g.num_classes) == (n, f, c)
    assert (g.train_mask.sum(), g.val_mask.sum(), g.test_mask.sum()) == split
    assert g.num_edges == edges  # = 2 x undirected edges after symmetrise + dedupe, no self loops
    rows = np.repeat(np.arange(n), np.diff(g.indptr))
    assert not np.any(rows == g.indices)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # plain pickle names scipy.sparse.csr
def test_real_against_plain_pickle_reference(planetoid_root):
    """Our loader (restricted unpickler, vectorised) against a plain-pickle reference of Kipf's recipe."""
    name = "citeseer"
    raw = {}
    for p in PARTS:  # the real files are trusted here, so the ordinary unpickler is the reference
        with open(planetoid_root / f"ind.{name}.{p}", "rb") as fh:
            raw[p] = pickle.load(fh, encoding="latin1")
    test_idx = np.loadtxt(planetoid_root / f"ind.{name}.test.index", dtype=np.int64)
    g = load_planetoid(planetoid_root, name)
    allx, tx = raw["allx"].toarray(), raw["tx"].toarray()
    assert np.array_equal(g.features[: allx.shape[0]], allx)
    assert np.array_equal(g.features[test_idx], tx)
    gaps = np.setdiff1d(np.arange(allx.shape[0], g.num_vertices), test_idx)
    assert gaps.size == 15  # CiteSeer's isolated test-range vertices: zero rows, label 0, no split
    assert not g.features[gaps].any() and not g.labels[gaps].any()
    in_split = g.train_mask | g.val_mask | g.test_mask
    assert not in_split[gaps].any()
    assert np.array_equal(g.labels[test_idx], raw["ty"].argmax(1))
    assert np.array_equal(g.labels[: allx.shape[0]], raw["ally"].argmax(1))
    pairs = {(u, v) for u, nbrs in raw["graph"].items() for v in nbrs if u != v}
    pairs |= {(v, u) for u, v in pairs}
    rows = np.repeat(np.arange(g.num_vertices), np.diff(g.indptr))
    assert set(zip(g.indices.tolist(), rows.tolist())) == pairs


def test_truncated_real_pickle(planetoid_root, tmp_path):
    for p in PARTS + ("test.index",):
        shutil.copy(planetoid_root / f"ind.cora.{p}", tmp_path)
    path = tmp_path / "ind.cora.allx"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"ind\.cora\.allx: not a readable Planetoid pickle.*truncated"):
        load("planetoid", name="cora", root=tmp_path)


# ---------------------------------------------------------------- miniature with CiteSeer-like gaps

def write_miniature(root, name="citeseer", seed=0):
    """Planetoid-format files for a random graph: 600 known vertices (12 train, the next 500 val) and a
    43-id test block holding 40 test vertices and 3 gaps (like CiteSeer's 15)."""
    rng = np.random.default_rng(seed)
    n_known, n_test, gaps, f, c = 600, 40, 3, 9, 4
    n = n_known + n_test + gaps
    test_ids = rng.permutation(np.setdiff1d(np.arange(n_known, n), rng.choice(np.arange(n_known, n - 1), gaps,
                                                                              replace=False)))
    feats = (rng.random((n, f)) < 0.3).astype(np.float32)
    labels = rng.integers(0, c, n)
    onehot = np.eye(c, dtype=np.int32)[labels]
    graph = collections.defaultdict(list)
    src, dst = rng.integers(0, n, 900), rng.integers(0, n, 900)
    for u, v in zip(src.tolist(), dst.tolist()):  # test-side writer: building the Python dict is the point
        graph[u].append(v)
    n_train = 12
    objs = dict(x=sp.csr_matrix(feats[:n_train]), y=onehot[:n_train], allx=sp.csr_matrix(feats[:n_known]),
                ally=onehot[:n_known], tx=sp.csr_matrix(feats[test_ids]), ty=onehot[test_ids], graph=graph)
    for p, obj in objs.items():
        with open(root / f"ind.{name}.{p}", "wb") as fh:
            pickle.dump(obj, fh, protocol=2)
    (root / f"ind.{name}.test.index").write_text("\n".join(map(str, test_ids)) + "\n")
    return dict(n=n, n_known=n_known, test_ids=test_ids, feats=feats, labels=labels, src=src, dst=dst,
                n_train=n_train, c=c)


def test_miniature_matches_reference(tmp_path):
    ref = write_miniature(tmp_path)
    g = load("planetoid", name="citeseer", root=tmp_path)
    n, known, test_ids = ref["n"], ref["n_known"], ref["test_ids"]
    gaps = np.setdiff1d(np.arange(known, n), test_ids)
    present = np.ones(n, bool)
    present[gaps] = False
    exp_feats = np.where(present[:, None], ref["feats"], 0)
    exp_labels = np.where(present, ref["labels"], 0)
    assert g.num_vertices == n and g.num_classes == ref["c"]
    assert np.array_equal(g.features, exp_feats) and np.array_equal(g.labels, exp_labels)
    assert np.array_equal(np.flatnonzero(g.train_mask), np.arange(ref["n_train"]))
    assert np.array_equal(np.flatnonzero(g.val_mask), np.arange(ref["n_train"], ref["n_train"] + 500))
    assert np.array_equal(np.flatnonzero(g.test_mask), np.sort(test_ids))
    a = np.zeros((n, n), bool)
    a[ref["dst"], ref["src"]] = True
    a |= a.T
    np.fill_diagonal(a, False)
    rows = np.repeat(np.arange(n), np.diff(g.indptr))
    got = np.zeros((n, n), bool)
    got[rows, g.indices] = True
    assert np.array_equal(got, a) and g.num_edges == a.sum()


def test_missing_file_named(tmp_path):
    write_miniature(tmp_path, name="cora")
    os.remove(tmp_path / "ind.cora.ty")
    with pytest.raises(DataError, match=r"ind\.cora\.ty: file not found"):
        load("planetoid", name="cora", root=tmp_path)
    with pytest.raises(DataError, match=r"unknown --name 'reddit'"):
        load("planetoid", name="reddit", root=tmp_path)


@pytest.mark.parametrize("part", ["graph", "tx", "ally"])
def test_truncated_miniature_pickle_named(tmp_path, part):
    write_miniature(tmp_path, name="cora")
    path = tmp_path / f"ind.cora.{part}"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(DataError, match=rf"ind\.cora\.{part}: not a readable Planetoid pickle.*truncated"):
        load("planetoid", name="cora", root=tmp_path)


def test_mismatched_row_counts_named(tmp_path):
    write_miniature(tmp_path, name="cora")
    with open(tmp_path / "ind.cora.ty", "wb") as fh:
        pickle.dump(np.eye(4, dtype=np.int32)[np.zeros(7, int)], fh, protocol=2)
    with pytest.raises(DataError, match=r"ind\.cora\.test\.index: row counts disagree"):
        load("planetoid", name="cora", root=tmp_path)


# ---------------------------------------------------------------- crafted pickles execute nothing

class _SystemCall:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _EvalCall:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


@pytest.mark.parametrize("payload,refused", [(_SystemCall, r"(posix|os|nt)\.system"), (_EvalCall,
                                                                                       r"(__builtin__|builtins)\.eval")])
def test_crafted_pickle_refused_and_not_executed(tmp_path, payload, refused):
    write_miniature(tmp_path, name="cora")
    marker = tmp_path / "marker-created-by-pickle"
    # Sanity: the payload really would create the file with an ordinary unpickler.
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(payload(probe), protocol=2))
    assert probe.exists()
    # Hide the payload inside an otherwise valid-looking structure.
    with open(tmp_path / "ind.cora.x", "wb") as fh:
        pickle.dump([payload(marker)], fh, protocol=2)
    with pytest.raises(DataError, match=rf"ind\.cora\.x: the pickle wants to load '{refused}'.*nothing was executed"):
        load("planetoid", name="cora", root=tmp_path)
    assert not marker.exists()


class _CodecCall:
    def __reduce__(self):
        import codecs
        return (codecs.encode, (b"x" * 10, "zlib"))


def test_codec_global_only_for_latin1(tmp_path):
    path = tmp_path / "codec.pkl"
    path.write_bytes(pickle.dumps([_CodecCall()], protocol=2))
    with pytest.raises(DataError, match=r"codec\.pkl: not a readable Planetoid pickle.*'zlib' is not allowed"):
        safe_pickle.load(path)


def test_safe_pickle_object_arrays_refused(tmp_path):
    path = tmp_path / "obj.pkl"
    with open(path, "wb") as fh:
        pickle.dump(np.array([[{"a": 1}]], dtype=object), fh, protocol=2)
    with pytest.raises(DataError, match=r"obj\.pkl: expected a 2-D matrix"):
        safe_pickle.to_dense(safe_pickle.load(path), path)

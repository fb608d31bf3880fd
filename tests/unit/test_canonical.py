"""canonicalize(): CSR structure against a dense brute-force reference, and every validation error."""
import numpy as np
import pytest

from granndis_hpc.preprocess.sources.canonical import MAX_VERTICES, DataError, canonicalize, index_to_mask


def dense_reference(n, src, dst, symmetrize, self_loops):
    """Independent reference: a dense boolean in-adjacency A[v, u] = (edge u -> v)."""
    a = np.zeros((n, n), dtype=bool)
    a[dst, src] = True
    if symmetrize:
        a |= a.T
    diag = np.arange(n)
    if self_loops == "remove":
        a[diag, diag] = False
    elif self_loops == "add":
        a[diag, diag] = True
    return a


def dense_of(g):
    a = np.zeros((g.num_vertices, g.num_vertices), dtype=bool)
    rows = np.repeat(np.arange(g.num_vertices), np.diff(g.indptr))
    a[rows, g.indices] = True
    return a


def raw_graph(rng, n, e, f=3, classes=4):
    src = rng.integers(0, n, e)
    dst = rng.integers(0, n, e)
    # Force duplicates and self loops into every draw.
    src[: e // 5], dst[: e // 5] = src[e // 5: 2 * (e // 5)], dst[e // 5: 2 * (e // 5)]
    src[-3:] = dst[-3:]
    feats = rng.standard_normal((n, f))
    labels = rng.integers(0, classes, n)
    perm = rng.permutation(n)
    masks = [np.zeros(n, bool) for _ in range(3)]
    masks[0][perm[: n // 3]] = True
    masks[1][perm[n // 3: n // 2]] = True
    masks[2][perm[n // 2:]] = True
    return dict(num_vertices=n, src=src, dst=dst, features=feats, labels=labels, train_mask=masks[0],
                val_mask=masks[1], test_mask=masks[2])


@pytest.mark.parametrize("symmetrize", [True, False])
@pytest.mark.parametrize("self_loops", ["remove", "keep", "add"])
@pytest.mark.parametrize("seed,n,e", [(0, 7, 30), (1, 53, 400), (2, 131, 97), (3, 1, 4)])
def test_structure_matches_dense_reference(symmetrize, self_loops, seed, n, e):
    rng = np.random.default_rng(seed)
    raw = raw_graph(rng, n, e)
    g = canonicalize("t", symmetrize=symmetrize, self_loops=self_loops, **raw)
    ref = dense_reference(n, raw["src"], raw["dst"], symmetrize, self_loops)
    assert g.indptr.dtype == np.int64 and g.indices.dtype == np.int64
    assert g.indptr[0] == 0 and g.indptr[-1] == g.num_edges
    assert np.array_equal(dense_of(g), ref)
    assert g.num_edges == int(ref.sum())  # so no duplicates survived
    assert np.array_equal(g.in_degree(), ref.sum(axis=1))
    # Sources sorted strictly inside each row (sorted + no duplicates).
    rows = np.repeat(np.arange(n), np.diff(g.indptr))
    same_row = rows[1:] == rows[:-1]
    assert np.all(g.indices[1:][same_row] > g.indices[:-1][same_row])
    if symmetrize:
        assert np.array_equal(ref, ref.T)
    loops = np.count_nonzero(g.indices == rows)
    assert loops == {"remove": 0, "add": n}.get(self_loops, int(ref.diagonal().sum()))
    assert g.features.dtype == np.float32 and np.allclose(g.features, raw["features"])
    assert np.array_equal(g.labels, raw["labels"]) and g.num_classes == raw["labels"].max() + 1


def test_int32_and_empty_edges():
    rng = np.random.default_rng(5)
    raw = raw_graph(rng, 40, 200)
    g64 = canonicalize("t", **raw)
    raw32 = dict(raw, src=raw["src"].astype(np.int32), dst=raw["dst"].astype(np.int32))
    g32 = canonicalize("t", **raw32)
    assert np.array_equal(g64.indptr, g32.indptr) and np.array_equal(g64.indices, g32.indices)
    empty = canonicalize("t", **dict(raw, src=np.zeros(0, np.int64), dst=np.zeros(0, np.int64)))
    assert empty.num_edges == 0 and np.all(empty.indptr == 0)
    looped = canonicalize("t", self_loops="add", **dict(raw, src=np.zeros(0, np.int64), dst=np.zeros(0, np.int64)))
    assert np.array_equal(looped.indices, np.arange(40))


def test_float_labels_nan_are_unlabelled_outside_splits():
    rng = np.random.default_rng(6)
    raw = raw_graph(rng, 30, 60)
    labels = raw["labels"].astype(np.float64)
    raw["test_mask"][:] = False
    free = ~(raw["train_mask"] | raw["val_mask"])
    labels[np.flatnonzero(free)[:4]] = np.nan
    g = canonicalize("t", **dict(raw, labels=labels[:, None]), num_classes=4)
    assert np.count_nonzero(g.labels == -1) == 4 and g.labels.dtype == np.int64


def test_index_to_mask():
    m = index_to_mask(np.array([[3], [0]]), 5, "train split", "f.csv")
    assert m.tolist() == [True, False, False, True, False]
    with pytest.raises(DataError, match=r"f\.csv.*more than once"):
        index_to_mask([1, 1], 5, "train split", "f.csv")
    with pytest.raises(DataError, match=r"f\.csv.*\[0, 5\]"):
        index_to_mask([0, 5], 5, "train split", "f.csv")
    with pytest.raises(DataError, match=r"f\.csv.*non-integer"):
        index_to_mask([0.5], 5, "train split", "f.csv")


def _bad(**changes):
    raw = raw_graph(np.random.default_rng(7), 20, 50)
    raw.update(changes)
    return raw


@pytest.mark.parametrize("changes,pattern", [
    (dict(src=np.array([0, 20]), dst=np.array([1, 2])), r"source ids span \[0, 20\].*20 vertices"),
    (dict(src=np.array([0, 1]), dst=np.array([-1, 2])), r"destination ids span"),
    (dict(src=np.array([0, 1]), dst=np.array([1])), r"equal length"),
    (dict(src=np.array([0.0, 1.0]), dst=np.array([1.0, 2.0])), r"not an integer"),
    (dict(features=np.zeros((19, 3))), r"features must have shape \[num_vertices=20"),
    (dict(labels=np.arange(20) % 4 + np.eye(20, dtype=int)[3] * 9, num_classes=4), r"labels span \[0, 12\]"),
    (dict(labels=np.arange(20) % 4 - np.eye(20, dtype=int)[3] * 5), r"labels span \[-2, 3\]"),
    (dict(labels=np.zeros(21, int)), r"labels must have shape"),
    (dict(train_mask=np.ones(20, bool)), r"more than one of train/val/test"),
    (dict(val_mask=np.ones(19, bool)), r"val_mask must have shape"),
    (dict(num_vertices=0), r"num_vertices=0"),
    (dict(num_vertices=MAX_VERTICES + 1), r"outside"),
    (dict(self_loops="drop"), r"self_loops='drop'"),
])
def test_bad_input_raises_data_error_naming_origin(changes, pattern):
    kwargs = ("self_loops", "num_classes")
    raw = _bad(**{k: v for k, v in changes.items() if k not in kwargs})
    extra = {k: v for k, v in changes.items() if k in kwargs}
    with pytest.raises(DataError, match=pattern) as info:
        canonicalize("t", origin="my/file.npz", **raw, **extra)
    assert str(info.value).startswith("my/file.npz: ") and "Fix:" in str(info.value)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_features(bad):
    raw = _bad()
    raw["features"][13, 1] = bad
    with pytest.raises(DataError, match=r"feats\.csv: features of 1 vertices contain NaN or infinite.*vertex 13"):
        canonicalize("t", origin={"*": "edges.csv", "features": "feats.csv"}, **raw)


def test_unlabelled_vertex_in_split_rejected():
    raw = _bad()
    labels = raw["labels"].copy()
    labels[np.flatnonzero(raw["train_mask"])[0]] = -1
    with pytest.raises(DataError, match=r"lab\.csv: 1 unlabelled vertices.*split"):
        canonicalize("t", origin={"labels": "lab.csv"}, **dict(raw, labels=labels))

"""Bundle source (.npz / .h5): round trip to the same Graph as the OGB miniature, and bad bundles."""
import dataclasses

import h5py
import numpy as np
import pytest

from granndis_hpc.preprocess.sources import load
from granndis_hpc.preprocess.sources.canonical import DataError

from tests.unit.test_sources_ogb import check_against_reference, make_raw, write_ogb


def csr_in_edges(n, src, dst):
    """In-edge CSR of the raw edges as written by a user (unsorted rows, duplicates kept)."""
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, src[order]


def bundle_arrays(raw, form):
    labels = np.where(np.isnan(raw["labels"]), -1, np.nan_to_num(raw["labels"])).astype(np.int64)
    out = dict(features=raw["feats"], labels=labels, num_classes=np.int64(raw["c"]))
    if form == "edge_index+mask":
        out["edge_index"] = np.stack([raw["src"], raw["dst"]])
        for part, key in (("train", "train_mask"), ("valid", "val_mask"), ("test", "test_mask")):
            m = np.zeros(raw["n"], bool)
            m[raw[part]] = True
            out[key] = m
    else:  # csr+idx
        out["indptr"], out["indices"] = csr_in_edges(raw["n"], raw["src"], raw["dst"])
        out.update(train_idx=raw["train"], val_idx=raw["valid"], test_idx=raw["test"])
    return out


def write_bundle(path, arrays):
    if str(path).endswith(".npz"):
        np.savez(path, **arrays)
    else:
        with h5py.File(path, "w") as f:
            for k, v in arrays.items():
                f[k] = v
    return path


def graphs_equal(a, b):
    for field in dataclasses.fields(a):
        if field.name == "name":
            continue
        x, y = getattr(a, field.name), getattr(b, field.name)
        assert (np.array_equal(x, y) and x.dtype == y.dtype) if isinstance(x, np.ndarray) else x == y, field.name


def assert_reproducible_from_seed(load_fn, params, graph):
    """`graph` = load_fn(**params): the same parameters give the same graph, another seed another one
    (features, labels and edges all differ).  Shared by the synthetic generators' tests."""
    graphs_equal(load_fn(**params), graph)
    other = load_fn(**dict(params, seed=params.get("seed", 0) + 1))
    assert not np.array_equal(other.features, graph.features)
    assert not np.array_equal(other.labels, graph.labels)
    assert other.num_edges != graph.num_edges or not np.array_equal(other.indices, graph.indices)
    return other


def test_ogb_npz_h5_round_trip_to_same_graph(tmp_path):
    raw = make_raw(seed=11, n=211, e=900)
    ogb = load("ogb", root=write_ogb(tmp_path / "ogbn_rt", raw))
    check_against_reference(ogb, raw)
    for fname, form in (("a.npz", "edge_index+mask"), ("b.h5", "csr+idx"), ("c.npz", "csr+idx"),
                        ("d.h5", "edge_index+mask")):
        g = load("bundle", path=write_bundle(tmp_path / fname, bundle_arrays(raw, form)))
        check_against_reference(g, raw)
        graphs_equal(g, ogb)
        assert g.name == fname.split(".")[0]


def test_bundle_canonicalisation_options(tmp_path):
    raw = make_raw(seed=12)
    path = write_bundle(tmp_path / "g.npz", bundle_arrays(raw, "edge_index+mask"))
    directed = load("bundle", path=path, symmetrize=False, self_loops="keep")
    want = np.unique(raw["dst"] * raw["n"] + raw["src"])  # independent: distinct directed pairs
    rows = np.repeat(np.arange(raw["n"]), np.diff(directed.indptr))
    assert np.array_equal(rows * raw["n"] + directed.indices, want)


@pytest.mark.parametrize("ext", ["npz", "h5"])
@pytest.mark.parametrize("drop,pattern", [
    (("edge_index",), r"no edges: neither edge_index nor indptr\+indices"),
    (("features",), r"missing key 'features'"),
    (("labels",), r"missing key 'labels'"),
    (("test_mask",), r"no complete split"),
])
def test_missing_keys_list_expected(tmp_path, ext, drop, pattern):
    arrays = bundle_arrays(make_raw(seed=13), "edge_index+mask")
    for k in drop:
        arrays.pop(k)
    path = write_bundle(tmp_path / f"bad.{ext}", arrays)
    with pytest.raises(DataError, match=rf"bad\.{ext}: {pattern}.*Fix: a bundle needs the keys edge_index"):
        load("bundle", path=path)


@pytest.mark.parametrize("change,pattern", [
    (dict(edge_index=np.zeros((3, 4), np.int64)), r"edge_index must have shape \[2, E\], got \(3, 4\)"),
    (dict(features=np.zeros(5)), r"features must have shape \[N, F\]"),
    (dict(labels=np.full(157, 9)), r"labels span \[9, 9\] but num_classes=6"),
    (dict(train_mask=np.ones(10, bool)), r"train_mask must have shape \[157\]"),
    (dict(num_classes=np.array([1.5])), r"num_classes must be one integer"),
])
def test_wrong_shapes_and_values(tmp_path, change, pattern):
    arrays = bundle_arrays(make_raw(seed=14), "edge_index+mask")
    arrays.update(change)
    path = write_bundle(tmp_path / "bad.npz", arrays)
    with pytest.raises(DataError, match=rf"bad\.npz: {pattern}"):
        load("bundle", path=path)


def test_bad_csr(tmp_path):
    arrays = bundle_arrays(make_raw(seed=15), "csr+idx")
    arrays["indptr"] = arrays["indptr"][::-1].copy()
    path = write_bundle(tmp_path / "bad.h5", arrays)
    with pytest.raises(DataError, match=r"bad\.h5: indptr must start at 0"):
        load("bundle", path=path)
    arrays = bundle_arrays(make_raw(seed=15), "csr+idx")
    arrays["indptr"] = arrays["indptr"][:-5]
    path = write_bundle(tmp_path / "short.npz", arrays)
    with pytest.raises(DataError, match=r"short\.npz: (indptr must start at 0|indptr describes 151 vertices)"):
        load("bundle", path=path)


@pytest.mark.parametrize("ext", ["npz", "h5"])
def test_truncated_files_named(tmp_path, ext):
    raw = make_raw(seed=16, n=3000, e=30000)
    path = write_bundle(tmp_path / f"t.{ext}", bundle_arrays(raw, "edge_index+mask"))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=rf"t\.{ext}: cannot read the"):
        load("bundle", path=path)


def test_pickled_npz_refused_and_other_errors(tmp_path):
    path = tmp_path / "obj.npz"
    arrays = bundle_arrays(make_raw(seed=17), "edge_index+mask")
    arrays["labels"] = np.array([{"x": 1}] * 157, dtype=object)
    np.savez(path, **arrays)
    with pytest.raises(DataError, match=r"obj\.npz: cannot read the \.npz.*pickled objects"):
        load("bundle", path=path)
    with pytest.raises(DataError, match=r"g\.txt: unknown bundle extension"):
        load("bundle", path=tmp_path / "g.txt")
    with pytest.raises(DataError, match=r"nothere\.npz: file not found"):
        load("bundle", path=tmp_path / "nothere.npz")
    with pytest.raises(DataError, match=r"no --path"):
        load("bundle")

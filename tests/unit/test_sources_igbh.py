"""IGBH's download layout (processed/<type>/node_feat.npy, processed/paper/node_label_*.npy,
processed/<src>__<rel>__<dst>/edge_index.npy [E, 2]) on tiny files written here: types in IGB's order,
relations with IGB's reverse names, labels and IGB's split fractions on the papers, raw float32 files."""
import numpy as np
import pytest

from granndis_hpc.preprocess.sources import load
from granndis_hpc.preprocess.sources.canonical import DataError

COUNTS = {"paper": 10, "author": 5, "institute": 2, "fos": 3}
EDGES = {"paper__cites__paper": [(1, 0), (2, 0), (3, 1), (9, 8)],
         "paper__written_by__author": [(0, 0), (1, 1), (2, 1), (5, 4)],
         "author__affiliated_to__institute": [(0, 0), (4, 1)],
         "paper__topic__fos": [(0, 2), (7, 1)]}
WIDTH = 1024  # IGB's feature width (the headerless files assume it)


def write_igbh(root, raw_float_types=()):
    """The tiny download under root/tiny/processed; `raw_float_types` get headerless float32 features."""
    rng = np.random.default_rng(0)
    base = root / "tiny" / "processed"
    feats = {}
    for t, n in COUNTS.items():
        (base / t).mkdir(parents=True)
        feats[t] = rng.random((n, WIDTH)).astype(np.float32)
        if t in raw_float_types:
            feats[t].tofile(base / t / "node_feat.npy")
        else:
            np.save(base / t / "node_feat.npy", feats[t])
    labels = rng.integers(0, 19, COUNTS["paper"]).astype(np.float32)
    np.save(base / "paper" / "node_label_19.npy", labels)
    for rel, pairs in EDGES.items():
        (base / rel).mkdir()
        np.save(base / rel / "edge_index.npy", np.array(pairs, dtype=np.int64))
    return base, feats, labels


@pytest.mark.parametrize("raw_types", [(), ("paper", "author")])
def test_igbh_layout_loads_with_types_relations_and_split(tmp_path, raw_types):
    base, feats, labels = write_igbh(tmp_path, raw_types)
    g = load("igbh", root=str(tmp_path), name="tiny")
    t = g.types
    assert g.name == "igbh-tiny" and t.names == ("paper", "author", "institute", "fos")
    assert t.offsets == (0, 10, 15, 17, 20) and t.target == "paper" and set(t.feature_origin) == {"stored"}
    assert sorted(r.name for r in t.relations) == ["affiliated_to", "cites", "rev_affiliated_to", "rev_topic",
                                                   "rev_written_by", "topic", "written_by"]
    start = dict(zip(t.names, t.offsets))
    expected = set()
    for rel, pairs in EDGES.items():
        s, _, d = rel.split("__")
        for u, v in pairs:
            expected |= {(u + start[s], v + start[d]), (v + start[d], u + start[s])}
    dst = np.repeat(np.arange(g.num_vertices), np.diff(g.indptr))
    assert set(zip(g.indices.tolist(), dst.tolist())) == expected
    np.testing.assert_array_equal(g.features[15:17], feats["institute"])
    np.testing.assert_array_equal(g.features[:10], feats["paper"])
    assert g.labels[:10].tolist() == labels.astype(int).tolist() and (g.labels[10:] == -1).all()
    assert g.num_classes == 19
    # IGB's fractions of the 10 papers: 6 train, 2 validation, 2 test.
    assert [np.flatnonzero(m).tolist() for m in (g.train_mask, g.val_mask, g.test_mask)] == \
        [[0, 1, 2, 3, 4, 5], [6, 7], [8, 9]]


def test_igbh_defects_are_named(tmp_path):
    base, _, _ = write_igbh(tmp_path)
    with pytest.raises(DataError, match="node_label_2K.npy: file not found"):
        load("igbh", root=str(base), num_classes=2983)
    np.save(base / "paper__topic__fos" / "edge_index.npy", np.array([[0, 1, 2]]))
    with pytest.raises(DataError, match=r"paper__topic__fos/edge_index.npy: edge_index must have shape \[E, 2\]"):
        load("igbh", root=str(base))
    np.save(base / "paper__topic__fos" / "edge_index.npy", np.array([[0, 7]]))
    with pytest.raises(DataError, match="paper__topic__fos/edge_index.npy.*valid ids 0..2"):
        load("igbh", root=str(base))


def test_the_homogeneous_layout_is_not_igbh(tmp_path):
    base = tmp_path / "processed" / "paper"
    base.mkdir(parents=True)
    np.save(base / "node_feat.npy", np.ones((2, 4), np.float32))
    with pytest.raises(DataError, match="--source igb for IGB's homogeneous"):
        load("igbh", root=str(tmp_path))


@pytest.mark.parametrize("symmetrize", [True, False])
def test_igbh_sliced_opener_gives_the_whole_graph_and_its_digest(tmp_path, symmetrize):
    from granndis_hpc.cluster.group import self_group
    from granndis_hpc.preprocess.build.pipeline import dataset_digest
    from granndis_hpc.preprocess.build.sliced import assemble, load_slice, slice_digest
    from granndis_hpc.preprocess.sources import sliced_source

    write_igbh(tmp_path, ("author",))
    whole = load("igbh", root=str(tmp_path), name="tiny", symmetrize=symmetrize)
    group = self_group()
    part = load_slice(group, sliced_source("igbh", root=str(tmp_path), name="tiny"), symmetrize=symmetrize)
    assert part.types == whole.types and slice_digest(group, part) == dataset_digest(whole)
    got = assemble(group, part)
    for field in ("indptr", "indices", "features", "labels", "train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(getattr(got, field), getattr(whole, field))

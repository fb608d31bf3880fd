"""The heterogeneous bundle layout: DBLP from tests/data (types, relations, labels, splits, and every
edge against the raw arrays), the choice of target type, and the layout's refusals."""
import hashlib
import pathlib

import numpy as np
import pytest

from granndis_hpc.preprocess.sources import load
from granndis_hpc.preprocess.sources.canonical import DataError

DBLP = pathlib.Path(__file__).resolve().parents[1] / "data" / "dblp-hetero" / "dblp.npz"
DBLP_SHA256 = "8eded621778198cbe4a8085f3ed354b91487e30391af6a9270e9f6f69c0b57b3"


def edge_set(graph):
    dst = np.repeat(np.arange(graph.num_vertices), np.diff(graph.indptr))
    return set(zip(graph.indices.tolist(), dst.tolist()))


def test_dblp_file_is_the_documented_one():
    assert hashlib.sha256(DBLP.read_bytes()).hexdigest() == DBLP_SHA256


def test_dblp_loads_with_its_types_relations_labels_and_splits():
    g = load("bundle", path=str(DBLP))
    t = g.types
    assert g.name == "dblp" and g.num_vertices == 7305
    assert t.names == ("author", "paper", "conference") and t.offsets == (0, 2957, 7285, 7305)
    assert len(t.relations) == 4 and t.target == "author" and set(t.feature_origin) == {"stored"}
    assert g.num_classes == 4 and g.num_features == 334
    assert (int(g.train_mask.sum()), int(g.val_mask.sum()), int(g.test_mask.sum())) == (600, 300, 2057)
    with np.load(DBLP) as z:
        raw = {k: z[k] for k in z.files}
    np.testing.assert_array_equal(g.labels[:2957], raw["y_author"])
    assert (g.labels[2957:] == -1).all()
    assert np.array_equal(np.flatnonzero(g.val_mask), np.sort(raw["val_author"]))
    np.testing.assert_array_equal(g.features[2957:7285], raw["x_paper"])
    # Independently: every raw edge, per-type ids offset by its type's start, in both directions.
    start = {"author": 0, "paper": 2957, "conference": 7285}
    expected = set()
    for key, ei in raw.items():
        if key.startswith("edge_index_"):
            s, _, d = key[len("edge_index_"):].split("__")
            pairs = list(zip((ei[0] + start[s]).tolist(), (ei[1] + start[d]).tolist()))
            expected |= set(pairs) | {(v, u) for u, v in pairs}
    assert edge_set(g) == expected and g.num_edges == len(expected)
    assert len(expected) == 19816  # the two directions are each other's reverse


def tiny_hetero(**extra):
    arrays = dict(x_item=np.eye(3, dtype=np.float32), num_nodes_user=np.int64(2),
                  edge_index_user__buys__item=np.array([[0, 1, 1], [0, 1, 2]]),
                  y_item=np.array([0, 1, 1]), train_item=np.array([0]), val_item=np.array([1]),
                  test_item=np.array([2]))
    arrays.update(extra)
    return arrays


def test_featureless_type_count_and_target_choice(tmp_path):
    path = tmp_path / "shop.npz"
    np.savez(path, **tiny_hetero())
    g = load("bundle", path=str(path))
    assert g.types.names == ("item", "user") and g.types.feature_origin == ("stored", "mean:rev_buys")
    np.testing.assert_allclose(g.features[4], [0, 0.5, 0.5])
    np.savez(path, **tiny_hetero(y_user=np.array([1, 0]), train_user=[0], val_user=[1], test_user=np.zeros(0, int)))
    with pytest.raises(DataError, match="--target-type"):
        load("bundle", path=str(path))
    assert load("bundle", path=str(path), target_type="user").types.target == "user"
    with pytest.raises(DataError, match="--target-type nobody has no labels"):
        load("bundle", path=str(path), target_type="nobody")


@pytest.mark.parametrize("change, message", [
    (dict(num_nodes_user=None), "neither x_user nor num_nodes_user"),
    (dict(edge_index_user__buys__item=np.array([0, 1])), r"shape \[2, E\]"),
    (dict(train_item=None), "missing.*train_item"),
])
def test_layout_refusals(tmp_path, change, message):
    arrays = {k: v for k, v in tiny_hetero(**change).items() if v is not None}
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(DataError, match=message):
        load("bundle", path=str(path))


def test_target_type_on_a_homogeneous_bundle_is_refused(tmp_path):
    path = tmp_path / "homo.npz"
    np.savez(path, edge_index=np.array([[0], [1]]), features=np.ones((2, 2)), labels=np.array([0, 1]),
             train_idx=[0], val_idx=[1], test_idx=np.zeros(0, int))
    assert load("bundle", path=str(path)).types is None
    with pytest.raises(DataError, match="leave --target-type out"):
        load("bundle", path=str(path), target_type="paper")


def test_types_of_different_widths_load_each_at_its_width(tmp_path):
    arrays = {k: v for k, v in tiny_hetero(x_user=np.full((2, 4), 3.0), num_nodes_user=None).items() if v is not None}
    np.savez(tmp_path / "widths.npz", **arrays)
    g = load("bundle", path=str(tmp_path / "widths.npz"))
    user = g.types.index("user")
    assert g.types.widths[user] == 4 and g.num_features == max(g.types.widths)
    lo, hi = g.types.id_range("user")
    assert (g.features[lo:hi, :4] == 3.0).all() and not g.features[lo:hi, 4:].any()

"""canonicalize_hetero: type-major ids, relations by endpoint types, symmetrisation per relation, derived
features, labels and splits on the target type, and the refusals (each a DataError with its fix)."""
import numpy as np
import pytest

from granndis_hpc.preprocess.sources.canonical import DataError
from granndis_hpc.preprocess.sources.hetero import canonicalize_hetero, neighbour_mean


def edge_set(graph):
    """{(src, dst)} of a canonical graph's in-edge CSR."""
    dst = np.repeat(np.arange(graph.num_vertices), np.diff(graph.indptr))
    return set(zip(graph.indices.tolist(), dst.tolist()))


def small(seed=0, **overrides):
    """3 papers (features), 2 authors, 1 venue (no features): writes, cites, published_in."""
    rng = np.random.default_rng(seed)
    args = dict(
        name="toy", counts={"paper": 3, "author": 2, "venue": 1},
        features={"paper": rng.random((3, 4)).astype(np.float32), "author": rng.random((2, 4)), "venue": None},
        relations={("author", "writes", "paper"): (np.array([0, 0, 1]), np.array([0, 1, 2])),
                   ("paper", "cites", "paper"): (np.array([1, 2]), np.array([0, 0])),
                   ("paper", "published_in", "venue"): (np.array([0, 1]), np.array([0, 0]))},
        labels=np.array([0, 1, 1]), splits={"train": [0], "val": [1], "test": [2]}, target="paper")
    args.update(overrides)
    return args


def test_types_ids_relations_and_edges():
    args = small()
    g = canonicalize_hetero(**args)
    t = g.types
    assert t.names == ("paper", "author", "venue") and t.offsets == (0, 3, 5, 6) and t.target == "paper"
    assert [str(r) for r in t.relations] == ["author__writes__paper", "paper__cites__paper",
                                              "paper__published_in__venue", "paper__rev_writes__author",
                                              "venue__rev_published_in__paper"]
    first = {"paper": 0, "author": 3, "venue": 5}
    expected = set()
    for (s, _, d), (src, dst) in args["relations"].items():
        for u, v in zip(src.tolist(), dst.tolist()):
            expected |= {(u + first[s], v + first[d]), (v + first[d], u + first[s])}
    assert edge_set(g) == expected
    assert g.labels.tolist() == [0, 1, 1, -1, -1, -1]
    assert np.flatnonzero(g.train_mask).tolist() == [0] and np.flatnonzero(g.test_mask).tolist() == [2]
    assert t.feature_origin == ("stored", "stored", "mean:published_in")
    # The venue's features: the mean of papers 0 and 1 (its in-neighbours over published_in).
    np.testing.assert_allclose(g.features[5], args["features"]["paper"][:2].mean(0), rtol=1e-6)
    np.testing.assert_array_equal(g.features[3:5], args["features"]["author"].astype(np.float32))


def test_without_symmetrisation_only_the_given_edges():
    g = canonicalize_hetero(**small(symmetrize=False))
    assert len(g.types.relations) == 3 and g.num_edges == 7


def test_reverse_edges_join_an_existing_opposite_relation():
    args = small()
    args["relations"][("paper", "written_by", "author")] = (np.array([2]), np.array([0]))
    g = canonicalize_hetero(**args)
    names = [r.name for r in g.types.relations]
    assert "rev_writes" not in names and "written_by" in names
    assert (2, 3) in edge_set(g) and (0, 3 + 0) in edge_set(g) and (3, 2) in edge_set(g)


def test_derived_features_chain_and_explicit_choice():
    rng = np.random.default_rng(1)
    x = rng.random((3, 2)).astype(np.float32)
    rel = {("author", "writes", "paper"): (np.array([0, 1, 1]), np.array([0, 1, 2])),
           ("author", "in", "inst"): (np.array([0, 1]), np.array([0, 0]))}
    g = canonicalize_hetero("c", {"paper": 3, "author": 2, "inst": 1}, {"paper": x}, rel, [0, 1, 0],
                            {"train": [0], "val": [1], "test": [2]}, "paper")
    assert g.types.feature_origin == ("stored", "mean:rev_writes", "mean:in")
    authors = np.stack([x[0], x[1:].mean(0)])
    np.testing.assert_allclose(g.features[3:5], authors, rtol=1e-6)
    np.testing.assert_allclose(g.features[5], authors.mean(0), rtol=1e-6)
    with pytest.raises(DataError, match="does not lead into it"):
        canonicalize_hetero("c", {"paper": 3, "author": 2, "inst": 1}, {"paper": x}, rel, [0, 1, 0],
                            {"train": [0], "val": [1], "test": [2]}, "paper", derive={"inst": "writes"})


def test_neighbour_mean_counts_a_repeated_edge_once_and_gives_zeros_to_the_isolated():
    x = np.array([[1.0, 0.0], [3.0, 2.0]], np.float32)
    out = neighbour_mean(np.array([0, 0, 1]), np.array([0, 0, 0]), 2, x)
    np.testing.assert_allclose(out, [[2.0, 1.0], [0.0, 0.0]])


@pytest.mark.parametrize("change, message", [
    (dict(relations={("paper", "a", "author"): ([0], [0]), ("paper", "b", "author"): ([1], [1])}),
     "both lead from 'paper' to 'author'.*Fix: merge"),
    (dict(features={"venue": np.ones((1, 4))}, relations={("paper", "cites", "paper"): ([0], [1])}),
     "no features and no relation"),
    (dict(target="nobody"), "target type 'nobody'"),
    (dict(relations={("paper", "cites", "paper"): ([0], [7])}), "valid ids 0..2.*per-type ids"),
    (dict(relations={("paper", "x", "user"): ([0], [0])}), "vertex type 'user'"),
    (dict(splits={"train": [0], "val": [0], "test": [2]}), "more than one of train/val/test"),
    (dict(labels=np.array([0, -1, 1])), "unlabelled vertices"),
    (dict(self_loops="add"), "relation from every type to itself"),
])
def test_refusals_say_what_and_how_to_fix(change, message):
    with pytest.raises(DataError, match=message):
        canonicalize_hetero(**small(**change))

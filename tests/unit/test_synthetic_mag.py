"""The typed synthetic graph with ogbn-mag's statistics (`--generator mag`): its counts scale with
--vertices, every edge has its relation, reverse relations are exact, the draw does not depend on how
many build ranks generate it, and a typed sliced source is checked like a whole typed graph."""
import numpy as np
import pytest
from mpi4py import MPI

from granndis_hpc.preprocess.sources import load, sliced_source
from granndis_hpc.preprocess.sources.canonical import DataError
from granndis_hpc.preprocess.sources.synthetic_mag import MAG_RELATIONS, MAG_SPLIT, MAG_TYPES, MAG_VERTICES, MagSource

N = 6000
OPTS = dict(generator="mag", vertices=N, seed=4)


@pytest.fixture(scope="module")
def graph():
    return load("synthetic", **OPTS)


def test_type_and_relation_counts_scale_with_the_vertices():
    for n in (N, 50_000, MAG_VERTICES):
        types = MagSource(vertices=n).types
        counts = [types.count(t) for t, _ in MAG_TYPES]
        assert sum(counts) == n
        assert all(abs(c - full * n / MAG_VERTICES) <= 1 for c, (_, full) in zip(counts, MAG_TYPES)), counts
    src = MagSource(vertices=N, seed=4)
    for r, (*_, full, _a, _b) in enumerate(MAG_RELATIONS):  # the edges drawn, before duplicates merge
        drawn = sum(src.chunk_edges(r, j)[0].shape[0] // 2 for rr, j in src.chunks if rr == r)
        assert abs(drawn - full * N / MAG_VERTICES) <= 1
    assert MagSource(vertices=MAG_VERTICES).edge_counts.sum() == sum(r[3] for r in MAG_RELATIONS)
    assert [str(r) for r in src.types.relations] == [
        "author__writes__paper", "paper__rev_writes__author", "paper__cites__paper",
        "author__affiliated_with__institution", "institution__rev_affiliated_with__author",
        "paper__has_topic__field_of_study", "field_of_study__rev_has_topic__paper"]


def test_every_edge_has_a_relation_and_reverses_are_exact(graph):
    t = graph.types
    dst = np.repeat(np.arange(graph.num_vertices, dtype=np.int64), np.diff(graph.indptr))
    kind = t.edge_type(graph.indices, dst)
    assert kind.min() >= 0 and np.all(np.bincount(kind, minlength=t.num_relations) > 0)
    n = graph.num_vertices
    names = [r.name for r in t.relations]
    for r, rel in enumerate(t.relations):
        rev = names.index(rel.name[4:]) if rel.name.startswith("rev_") else names.index("rev_" + rel.name) \
            if "rev_" + rel.name in names else r  # cites: its own reverse (symmetric)
        fwd = np.sort(graph.indices[kind == r] * n + dst[kind == r])
        back = np.sort(dst[kind == rev] * n + graph.indices[kind == rev])
        assert np.array_equal(fwd, back), rel


def test_labels_split_and_features_follow_ogbn_mag(graph):
    t = graph.types
    lo, hi = t.id_range("paper")
    assert np.all(graph.labels[hi:] == -1) and graph.labels[lo:hi].min() >= 0
    assert graph.num_classes == 349 and graph.num_features == 128
    papers = hi - lo
    for mask, full in zip((graph.train_mask, graph.val_mask, graph.test_mask), MAG_SPLIT):
        assert abs(int(mask.sum()) - full * papers / sum(MAG_SPLIT)) <= 2
    years = MagSource(vertices=N, seed=4).paper_year(np.arange(lo, hi))
    assert years[graph.train_mask[lo:hi]].max() < 2018
    assert set(years[graph.val_mask[lo:hi]].tolist()) == {2018}
    assert set(years[graph.test_mask[lo:hi]].tolist()) == {2019}
    # Communities make the labels learnable: cited papers mostly share the class.
    dst = np.repeat(np.arange(graph.num_vertices), np.diff(graph.indptr))
    cites = t.edge_type(graph.indices, dst) == t.relation_table()[0, 0]
    assert np.mean(graph.labels[graph.indices[cites]] == graph.labels[dst[cites]]) > 0.6
    assert t.feature_origin == ("stored",) * 4


def test_the_draw_is_the_same_for_any_number_of_ranks_and_follows_the_seed():
    src = sliced_source("synthetic", **OPTS)
    assert isinstance(src, MagSource)
    whole = np.concatenate([np.stack(e[1:]) for e in src.edge_pieces(0, 1)], axis=1)
    nodes = src.nodes(0, N)
    for size in (2, 3, 4):
        pieces = [np.stack([s, d]) for r in range(size) for _, s, d in src.edge_pieces(r, size)]
        assert np.array_equal(np.concatenate(pieces, axis=1), whole), size
        bounds = (np.arange(size + 1) * N) // size
        for f in nodes:
            parts = [src.nodes(int(bounds[r]), int(bounds[r + 1]))[f][0][1] for r in range(size)]
            assert np.array_equal(np.concatenate(parts), nodes[f][0][1]), (size, f)
    again = MagSource(vertices=N, seed=4)
    other = MagSource(vertices=N, seed=5)
    assert np.array_equal(again.chunk_edges(0, 0)[0], src.chunk_edges(0, 0)[0])
    assert not np.array_equal(other.chunk_edges(0, 0)[0], src.chunk_edges(0, 0)[0])


def test_too_few_vertices_are_refused():
    with pytest.raises(DataError, match="need at least"):
        MagSource(vertices=100)


def test_a_typed_slice_carries_the_types_and_the_whole_graph_digest(graph):
    from granndis_hpc.preprocess.build.sliced import load_slice, slice_digest
    from granndis_hpc.shards.content import dataset_digest

    part = load_slice(MPI.COMM_SELF, sliced_source("synthetic", **OPTS))
    assert part.types == graph.types
    assert slice_digest(MPI.COMM_SELF, part) == dataset_digest(graph)


def test_a_typed_slice_with_an_edge_no_relation_covers_is_refused():
    from granndis_hpc.preprocess.build.sliced import load_slice
    from tests.hetero_graphs import SlicedGraph, typed_graph

    source = SlicedGraph(typed_graph())
    author, field = source.types.offsets[1], source.types.offsets[2]
    plain = source.edge_pieces

    def with_bad_edge(rank, size):
        yield from plain(rank, size)
        yield "extra", np.array([author]), np.array([field])  # author -> field: no relation

    source.edge_pieces = with_bad_edge
    with pytest.raises(DataError, match="a pair no relation covers"):
        load_slice(MPI.COMM_SELF, source, symmetrize=False)

"""Preloaded halos: full k-hop against a brute-force BFS, EAS against a per-row reference, induced subgraphs.

References here are deliberately plain Python (sets, dicts, loops) on small graphs: they are written from
the definitions, not from the vectorised code under test.
"""
import numpy as np
import pytest

from granndis_hpc.graph.csr import csr_from_edges
from granndis_hpc.preprocess.build.halo import edge_keys, eas, full_khop, induced_subgraph


def random_graph(n, m, seed, symmetric):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    if symmetric:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    keys = np.unique(src * n + dst)
    src, dst = keys // n, keys % n
    keep = src != dst
    return csr_from_edges(src[keep], dst[keep], n)


def in_lists(indptr, indices):
    return [list(indices[indptr[v]:indptr[v + 1]]) for v in range(len(indptr) - 1)]


def bfs_reference(indptr, indices, inner, k):
    """hop of each vertex within k in-hops of `inner` (dict), by plain breadth-first search."""
    nbrs = in_lists(indptr, indices)
    hop = {int(v): 0 for v in inner}
    frontier = set(hop)
    for h in range(1, k + 1):
        nxt = set()
        for v in frontier:
            for u in nbrs[v]:
                if int(u) not in hop:
                    nxt.add(int(u))
        for u in nxt:
            hop[u] = h
        frontier = nxt
    return hop


def eas_reference(indptr, indices, inner, hops, fanout, select, seed):
    """EAS from its definition: per frontier row, best `fanout` unselected in-neighbours, all rows at once."""
    nbrs = in_lists(indptr, indices)
    hop = {int(v): 0 for v in inner}
    frontier = sorted(hop)
    for h in range(1, hops + 1):
        selected = set(hop)
        chosen = set()
        for v in frontier:
            cands = sorted({int(u) for u in nbrs[v] if int(u) not in selected})

            def rank(u):
                key = int(edge_keys(np.array([u]), np.array([v]), seed)[0])
                score = sum(1 for w in nbrs[u] if int(w) not in selected) if select == "degree" else 0
                return (-score, key)

            chosen.update(sorted(cands, key=rank)[:fanout])
        for u in chosen:
            hop[u] = h
        frontier = sorted(chosen)
    return hop


def as_dict(verts, hops):
    return dict(zip(verts.tolist(), hops.tolist()))


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_full_khop_equals_bfs(symmetric, k):
    n = 257  # uneven on purpose
    indptr, indices = random_graph(n, 600, seed=k, symmetric=symmetric)
    inner = np.random.default_rng(10 + k).choice(n, 31, replace=False)
    verts, hops = full_khop(indptr, indices, inner, k)
    assert as_dict(verts, hops) == bfs_reference(indptr, indices, inner, k)
    # sorted by (hop, id): the inner prefix first
    assert np.all(np.diff(hops) >= 0)
    assert np.all((np.diff(verts) > 0) | (np.diff(hops) > 0))


def test_full_khop_on_cora(cora):
    inner = np.flatnonzero(np.arange(cora.num_vertices) % 5 == 0)[:400]
    verts, hops = full_khop(cora.indptr, cora.indices, inner, 3)
    assert as_dict(verts, hops) == bfs_reference(cora.indptr, cora.indices, inner, 3)


@pytest.mark.parametrize("select", ["degree", "uniform"])
@pytest.mark.parametrize("hops,fanout", [(1, 1), (1, 3), (2, 2), (3, 1)])
def test_eas_equals_definition(select, hops, fanout):
    n = 203
    indptr, indices = random_graph(n, 900, seed=hops * 7 + fanout, symmetric=True)
    inner = np.arange(40, 90)
    verts, hop = eas(indptr, indices, inner, hops, fanout, select, seed=5)
    assert as_dict(verts, hop) == eas_reference(indptr, indices, inner, hops, fanout, select, seed=5)


@pytest.mark.parametrize("select", ["degree", "uniform"])
def test_eas_respects_h_and_f_and_keeps_inner_edges(select):
    n = 1500
    indptr, indices = random_graph(n, 12000, seed=3, symmetric=False)
    inner = np.random.default_rng(4).choice(n, 300, replace=False)
    h, f = 2, 2
    verts, hop = eas(indptr, indices, inner, h, f, select, seed=1)
    nbrs = in_lists(indptr, indices)
    assert hop.max() <= h
    assert set(verts[hop == 0].tolist()) == set(inner.tolist())
    # each frontier vertex contributed at most f vertices, each being one of its in-neighbours
    for t in range(1, h + 1):
        frontier = verts[hop == t - 1]
        new = set(verts[hop == t].tolist())
        reachable = {int(u) for v in frontier for u in nbrs[v]}
        assert new <= reachable
        assert len(new) <= f * len(frontier)
    # the induced subgraph keeps every edge among inner vertices
    sub_indptr, sub_indices = induced_subgraph(indptr, indices, verts)
    local = {int(v): i for i, v in enumerate(verts)}
    inner_set = set(inner.tolist())
    kept = {(int(verts[s]), int(verts[d])) for d in range(len(verts))
            for s in sub_indices[sub_indptr[d]:sub_indptr[d + 1]]}
    for d in inner_set:
        for s in nbrs[d]:
            if int(s) in inner_set:
                assert (int(s), d) in kept
    assert all(v in local for v in inner_set)


def test_eas_fanout_limit_is_per_frontier_vertex():
    # a star: inner vertex 0 has 10 external in-neighbours; fanout 3 keeps exactly 3 of them
    src = np.arange(1, 11)
    indptr, indices = csr_from_edges(src, np.zeros(10, dtype=np.int64), 11)
    verts, hop = eas(indptr, indices, np.array([0]), 1, 3, "uniform", seed=0)
    assert hop.tolist() == [0, 1, 1, 1]
    # another seed picks another (still size-3) subset: the choice is random, not "lowest ids"
    picks = {tuple(eas(indptr, indices, np.array([0]), 1, 3, "uniform", seed=s)[0].tolist()) for s in range(6)}
    assert len(picks) > 1 and all(len(p) == 4 for p in picks)


def test_eas_degree_rule_prefers_candidates_with_many_unselected_neighbours():
    # inner {0}; candidates 1 (3 unselected in-neighbours) and 2 (none): fanout 1 must take 1
    src = np.array([1, 2, 3, 4, 5])
    dst = np.array([0, 0, 1, 1, 1])
    indptr, indices = csr_from_edges(src, dst, 6)
    verts, hop = eas(indptr, indices, np.array([0]), 1, 1, "degree", seed=0)
    assert verts.tolist() == [0, 1]


@pytest.mark.parametrize("symmetric", [True, False])
def test_eas_with_large_fanout_equals_full(symmetric):
    n = 400
    indptr, indices = random_graph(n, 2500, seed=9, symmetric=symmetric)
    inner = np.arange(0, n, 7)
    max_deg = int(np.diff(indptr).max())
    for h in (1, 2, 3):
        full_v, full_h = full_khop(indptr, indices, inner, h)
        for select in ("degree", "uniform"):
            e_v, e_h = eas(indptr, indices, inner, h, max_deg, select, seed=2)
            np.testing.assert_array_equal(e_v, full_v)
            np.testing.assert_array_equal(e_h, full_h)


def test_eas_on_cora_keeps_inner_edges(cora):
    inner = np.arange(0, 700)
    verts, hop = eas(cora.indptr, cora.indices, inner, 1, 2, "degree", seed=0)
    assert as_dict(verts, hop) == eas_reference(cora.indptr, cora.indices, inner, 1, 2, "degree", seed=0)
    full_v, _ = full_khop(cora.indptr, cora.indices, inner, 1)
    assert set(verts.tolist()) < set(full_v.tolist())  # fanout 2 really samples


def test_induced_subgraph_brute_force():
    n = 120
    indptr, indices = random_graph(n, 500, seed=11, symmetric=False)
    verts = np.random.default_rng(1).permutation(n)[:50]
    sub_indptr, sub_indices = induced_subgraph(indptr, indices, verts)
    vset = set(verts.tolist())
    nbrs = in_lists(indptr, indices)
    pos = {int(v): i for i, v in enumerate(verts)}
    for i, v in enumerate(verts):
        want = sorted(pos[int(u)] for u in nbrs[v] if int(u) in vset)
        assert sub_indices[sub_indptr[i]:sub_indptr[i + 1]].tolist() == want


@pytest.fixture(scope="module")
def cora():
    from granndis_hpc.preprocess.sources import load
    from tests.conftest import require_planetoid
    return load("planetoid", name="cora", root=str(require_planetoid()))

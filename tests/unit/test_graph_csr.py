"""The shared graph helpers (granndis_hpc.graph.csr): owner lookup, rank within a segment, frontier
BFS.  Each against a plain-Python reference on random inputs."""
import numpy as np
import pytest

from granndis_hpc.graph.csr import bfs_hops, csr_from_edges, owner_of, rank_in_rows, segment_rank


def test_owner_of_finds_the_block_of_every_id():
    offsets = np.array([0, 3, 3, 7, 10])  # block 1 is empty
    ids = np.arange(10)
    want = [0, 0, 0, 2, 2, 2, 2, 3, 3, 3]
    assert owner_of(offsets, ids).tolist() == want
    assert owner_of(offsets, np.array([9, 0, 3])).tolist() == [3, 0, 2]


@pytest.mark.parametrize("grouped", [False, True])
def test_segment_rank_counts_earlier_equal_keys(grouped):
    key = np.random.default_rng(1).integers(0, 9, 400)
    if grouped:
        key = np.sort(key)
    seen = {}
    want = []
    for k in key.tolist():
        want.append(seen.get(k, 0))
        seen[k] = seen.get(k, 0) + 1
    assert segment_rank(key).tolist() == want
    assert segment_rank(np.zeros(0, np.int64)).tolist() == []


def test_rank_in_rows_numbers_the_entries_of_each_row():
    assert rank_in_rows(np.array([0, 3, 3, 5, 6])).tolist() == [0, 1, 2, 0, 1, 0]
    assert rank_in_rows(np.array([0])).tolist() == []


def _reference_bfs(indptr, indices, sources, max_hop):
    hop = {int(v): 0 for v in sources}
    frontier = set(hop)
    for h in range(1, max_hop + 1):
        nxt = {int(u) for v in frontier for u in indices[indptr[v]:indptr[v + 1]]} - set(hop)
        hop.update({u: h for u in nxt})
        frontier = nxt
    out = np.full(indptr.shape[0] - 1, -1)
    for v, h in hop.items():
        out[v] = h
    return out


@pytest.mark.parametrize("seed", range(4))
def test_bfs_hops_equals_a_plain_bfs(seed):
    rng = np.random.default_rng(seed)
    n = 300
    src, dst = rng.integers(0, n, 900), rng.integers(0, n, 900)
    indptr, indices = csr_from_edges(src, dst, n)
    sources = rng.choice(n, 7, replace=False)
    for k in (0, 1, 2, 5):
        np.testing.assert_array_equal(bfs_hops(indptr, indices, sources, k), _reference_bfs(indptr, indices, sources,
                                                                                            k))


def test_bfs_hops_follows_the_expand_rule_and_ignores_reached_vertices():
    # path 0 <- 1 <- 2 <- 3 (in-edges): an expand rule that also proposes reached vertices
    indptr, indices = csr_from_edges(np.array([1, 2, 3]), np.array([0, 1, 2]), 4)
    calls = []

    def expand(frontier, hop_of):
        calls.append(frontier.tolist())
        return np.concatenate([frontier + 1, np.array([0])])  # vertex 0 is already reached

    assert bfs_hops(indptr, indices, [0], 2, expand).tolist() == [0, 1, 2, -1]
    assert calls == [[0], [1]]

"""Owner assignment: inner vertices keep their METIS GPU; preloaded ones follow their consumers; rebalance."""
import numpy as np

from granndis_hpc.graph.csr import csr_from_edges
from granndis_hpc.preprocess.build.halo import full_khop, induced_subgraph
from granndis_hpc.preprocess.partition.owners import assign_owners, rebalance


def server_subgraph(seed, n=600, m=3000, inner_n=150, hops=2):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = src != dst
    keys = np.unique(src[keep] * n + dst[keep])
    indptr, indices = csr_from_edges(keys // n, keys % n, n)
    inner = rng.choice(n, inner_n, replace=False)
    verts, hop = full_khop(indptr, indices, inner, hops)
    sub_indptr, sub_indices = induced_subgraph(indptr, indices, verts)
    return verts, hop, sub_indptr, sub_indices


def majority_reference(sub_indptr, sub_indices, hop, owner_prev, G, u):
    """Votes of u: owners of the hop(u)-1 rows that u feeds (plain loops)."""
    votes = np.zeros(G)
    for w in range(len(hop)):
        if hop[w] != hop[u] - 1:
            continue
        if u in sub_indices[sub_indptr[w]:sub_indptr[w + 1]]:
            votes[owner_prev[w]] += 1
    return votes


def test_inner_keep_gpu_and_preloaded_follow_majority():
    G = 3
    verts, hop, ip, ix = server_subgraph(0)
    inner_gpu = np.random.default_rng(1).integers(0, G, verts.shape[0]).astype(np.int32)
    owner = assign_owners(ip, ix, hop, inner_gpu, G, tolerance=np.inf)  # no rebalancing
    np.testing.assert_array_equal(owner[hop == 0], inner_gpu[hop == 0])
    assert owner.min() >= 0 and owner.max() < G
    for u in np.flatnonzero(hop > 0)[:80]:
        votes = majority_reference(ip, ix, hop, owner, G, u)
        assert votes.max() > 0  # u was reached through some row one hop closer
        assert votes[owner[u]] == votes.max()


def test_rebalance_moves_only_preloaded_rows_to_the_target():
    G = 4
    hop = np.array([0] * 10 + [1] * 50 + [2] * 20, dtype=np.int32)
    owner = np.zeros(hop.shape[0], dtype=np.int32)
    owner[:10] = np.arange(10) % G
    new = rebalance(owner, hop, G, tolerance=0.10)
    np.testing.assert_array_equal(new[hop == 0], owner[hop == 0])
    load = np.bincount(new, minlength=G)
    assert load.max() <= int(np.ceil(hop.shape[0] / G))
    # deepest rows move first: every hop-2 row left GPU 0 before any hop-1 row did
    moved = new != owner
    assert moved[hop == 2].all()


def test_rebalance_cannot_move_inner_rows():
    G = 2
    hop = np.array([0] * 9 + [1], dtype=np.int32)
    owner = np.array([0] * 9 + [0], dtype=np.int32)
    new = rebalance(owner, hop, G)
    assert new.tolist() == [0] * 9 + [1]


def test_assign_owners_balanced_within_tolerance_when_possible():
    G = 4
    verts, hop, ip, ix = server_subgraph(3, n=2000, m=9000, inner_n=400, hops=2)
    inner_gpu = (np.arange(verts.shape[0]) % G).astype(np.int32)
    owner = assign_owners(ip, ix, hop, inner_gpu, G)
    load = np.bincount(owner, minlength=G)
    assert load.max() <= 1.10 * hop.shape[0] / G + 1

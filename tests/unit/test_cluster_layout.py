"""Pure helpers of the cluster layer: count checks, block layouts, buckets, the all-reduce byte model."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from granndis_hpc.cluster import ClusterError, agree, allreduce_bytes_model, plan_buckets
from granndis_hpc.cluster.layout import block_rows, check_counts, offsets_of


def test_check_counts_accepts_integer_sequences():
    out = check_counts([0, 3, np.int32(2)], 3, "send_counts")
    assert out.dtype == np.int64 and out.tolist() == [0, 3, 2]


@pytest.mark.parametrize("counts,peers,match", [
    ([1, 2], 3, "one entry per peer"),
    ([1, -2, 0], 3, "non-negative"),
    ([1.5, 0, 0], 3, "integers"),
    ([2**31, 0, 0], 3, "split the exchange"),
])
def test_check_counts_rejects_bad_counts(counts, peers, match):
    with pytest.raises(ClusterError, match=match):
        check_counts(counts, peers, "send_counts")


def _reference_rows(counts, peers):
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    parts = [np.arange(offsets[p], offsets[p] + counts[p]) for p in peers]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@pytest.mark.parametrize("seed", range(20))
def test_block_rows_matches_a_loop_reference(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 9))
    counts = rng.integers(0, 5, size=n) * (rng.random(n) > 0.3)
    peers = rng.permutation(n)[: rng.integers(0, n + 1)]
    if rng.random() < 0.5:
        peers = np.sort(peers)
    sel = block_rows(offsets_of(counts), counts, peers)
    got = np.arange(int(counts.sum()))[sel]
    np.testing.assert_array_equal(got, _reference_rows(counts, peers))


def test_block_rows_gives_a_slice_for_adjacent_blocks():
    counts = np.array([2, 0, 3, 1])
    assert block_rows(offsets_of(counts), counts, np.array([1, 2, 3])) == slice(2, 6)
    assert isinstance(block_rows(offsets_of(counts), counts, np.array([3, 0])), np.ndarray)


def test_plan_buckets_packs_consecutive_tensors_per_dtype():
    f, i = torch.float32, torch.int64
    sizes = [40, 40, 100, 30, 8, 8]
    dtypes = [f, f, f, i, f, i]
    assert plan_buckets(sizes, dtypes, 96) == [[0, 1], [2], [3, 5], [4]]
    assert plan_buckets(sizes, dtypes, 10**9) == [[0, 1, 2, 4], [3, 5]]


def _ring_bytes(n, esize, servers):
    """Independent simulation of a ring all-reduce: who sends which chunk in each step."""
    sizes = [len(c) for c in np.array_split(np.arange(n), servers)]
    sent = np.zeros(servers, dtype=np.int64)
    for step in range(servers - 1):          # reduce-scatter
        for r in range(servers):
            sent[r] += sizes[(r - step) % servers] * esize
    for step in range(servers - 1):          # all-gather of the reduced chunk each rank owns
        for r in range(servers):
            sent[r] += sizes[(r + 1 - step) % servers] * esize
    return sent


@pytest.mark.parametrize("n,servers,group", [(10, 3, 2), (7, 4, 1), (5, 1, 4), (1, 5, 3), (0, 2, 2), (1000, 2, 8)])
def test_allreduce_model_matches_ring_and_star_counts(n, servers, group):
    esize = 4
    payload = n * esize
    per_rank = {(s, l): allreduce_bytes_model(n, esize, servers, group, s, l)
                for s in range(servers) for l in range(group)}
    ring = _ring_bytes(n, esize, servers) if servers > 1 else np.zeros(1, dtype=np.int64)
    for (s, l), model in per_rank.items():
        assert model["inter"] == (ring[s] if l == 0 else 0)
        assert model["intra"] == (0 if group == 1 else (group - 1) * payload if l == 0 else payload)
    assert sum(m["inter"] for m in per_rank.values()) == 2 * (servers - 1) * payload
    assert sum(m["intra"] for m in per_rank.values()) == 2 * servers * (group - 1) * payload


def test_agree_passes_and_fails_with_the_message():
    agree(MPI.COMM_SELF, True, "unused")
    with pytest.raises(ClusterError, match=r"rank 0: shard file missing") as info:
        agree(MPI.COMM_SELF, False, "shard file missing")
    assert info.value.collective is (MPI.COMM_WORLD.Get_size() == 1)


def test_plan_layer_buckets_cuts_only_between_layers_and_bounds_the_count():
    from granndis_hpc.cluster.layout import plan_layer_buckets
    f, i = torch.float32, torch.int64
    # the backward's order: a tiny last layer (c), then b, then a large first layer (a)
    sizes = [8, 4, 30, 30, 60, 60]
    units = ["c", "c", "b", "b", "a", "a"]
    # target 50: c alone (12 + b's 60 > 50), b (60), a (120): never a layer split, though b and a exceed it
    assert plan_layer_buckets(sizes, [f] * 6, units, 50) == [[0, 1], [2, 3], [4, 5]]
    # target 80: c and b together (72), then a
    assert plan_layer_buckets(sizes, [f] * 6, units, 80) == [[0, 1, 2, 3], [4, 5]]
    assert plan_layer_buckets(sizes, [f] * 6, units, 10**9) == [[0, 1, 2, 3, 4, 5]]
    # a dtype change closes a bucket even inside a layer
    assert plan_layer_buckets(sizes, [f, f, f, i, f, f], units, 10**9) == [[0, 1, 2], [3], [4, 5]]
    # many equal layers: two consecutive buckets always exceed the target, so at most 2 * total / target + 1
    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(1, 40))
        sizes = rng.integers(1, 100, size=n).tolist()
        units = np.cumsum(rng.random(n) < 0.4).tolist()
        target = int(rng.integers(1, 400))
        buckets = plan_layer_buckets(sizes, [f] * n, units, target)
        assert sum(buckets, []) == list(range(n))
        assert all(units[b[0] - 1] != units[b[0]] for b in buckets[1:])  # cut only where the layer changes
        held = [sum(sizes[j] for j in b) for b in buckets]
        assert all(x + y > target for x, y in zip(held, held[1:]))
        assert len(buckets) <= 2 * sum(sizes) / target + 1
    with pytest.raises(ClusterError):
        plan_layer_buckets([1], [f], ["a"], 0)


def test_layer_of_names_the_indexed_module_or_the_owner():
    from granndis_hpc.cluster.gradsync import layer_of
    assert layer_of("convs.2.lin_self.weight") == "convs.2"
    assert layer_of("norms.0.bias") == "norms.0"
    assert layer_of("out_norm.weight") == "out_norm"
    assert layer_of("head.weight") == "head"
    assert layer_of("weight") == ""

"""Runtime samplers against brute-force definitions on random graphs."""
import numpy as np
import pytest

from granndis_hpc.graph.csr import csr_from_edges
from granndis_hpc.graph.sampler import CoBatchSampler, SamplerError, induced_batch, sample_dependency


def _graph(n=200, m=1500, seed=0):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    key = np.unique(src * n + dst)
    return csr_from_edges(key // n, key % n, n)


def _edges(indptr, indices, v):
    return set(indices[indptr[v]:indptr[v + 1]].tolist())


@pytest.mark.parametrize("fanout", [-1, 1, 3])
def test_dependency_sample_matches_definition(fanout):
    indptr, indices = _graph()
    targets = np.array([5, 17, 42, 99])
    L = 3
    sg = sample_dependency(indptr, indices, targets, L, fanout, np.random.default_rng(1))
    assert np.all(np.diff(sg.hop) >= 0)  # sorted by hop
    np.testing.assert_array_equal(np.sort(sg.vertices[sg.hop == 0]), targets)
    hop_of = dict(zip(sg.vertices.tolist(), sg.hop.tolist()))
    for i, (v, h) in enumerate(zip(sg.vertices, sg.hop)):
        kept = sg.indices[sg.indptr[i]:sg.indptr[i + 1]].tolist()
        if h == L:
            assert kept == []  # no layer computes hop-L rows
            continue
        full = _edges(indptr, indices, v)
        assert set(kept) <= full and len(set(kept)) == len(kept)
        assert len(kept) == (len(full) if fanout < 0 else min(fanout, len(full)))
        assert all(hop_of[u] <= h + 1 for u in kept)  # the planner's prefix rule holds
    # Every non-target vertex is some kept edge's source one hop closer to the targets.
    sources = {(u, hop_of[v]) for i, v in enumerate(sg.vertices)
               for u in sg.indices[sg.indptr[i]:sg.indptr[i + 1]].tolist()}
    for v, h in zip(sg.vertices.tolist(), sg.hop.tolist()):
        if h > 0:
            assert (v, h - 1) in sources


def test_induced_batch_is_the_induced_subgraph():
    indptr, indices = _graph()
    targets = np.array([1, 2, 3, 50, 60, 70, 120])
    sg = induced_batch(indptr, indices, targets)
    assert np.all(sg.hop == 0)
    for i, v in enumerate(sg.vertices):
        want = _edges(indptr, indices, v) & set(targets.tolist())
        assert set(sg.indices[sg.indptr[i]:sg.indptr[i + 1]].tolist()) == want


def test_cobatches_partition_training_vertices_and_are_reproducible():
    indptr, indices = _graph()
    train = np.arange(0, 200, 3)
    s = CoBatchSampler(indptr, indices, train, batches=4, layers=2, fanout=5, seed=7, server=1)
    batches = s.epoch_targets(3)
    assert len(batches) == 4
    np.testing.assert_array_equal(np.sort(np.concatenate(batches)), train)
    again = CoBatchSampler(indptr, indices, train, batches=4, layers=2, fanout=5, seed=7, server=1)
    a, b = s.sample(batches[0], 3, 0), again.sample(again.epoch_targets(3)[0], 3, 0)
    np.testing.assert_array_equal(a.vertices, b.vertices)
    np.testing.assert_array_equal(a.indices, b.indices)
    assert not np.array_equal(s.epoch_targets(4)[0], batches[0])


@pytest.mark.parametrize("kwargs,needle", [
    (dict(batches=0), "batches-per-epoch"), (dict(batches=1000), "batches-per-epoch"),
    (dict(fanout=0), "fanout"), (dict(kind="ladies"), "sampler")])
def test_bad_sampler_options(kwargs, needle):
    indptr, indices = _graph()
    args = dict(batches=2, layers=2, fanout=5)
    args.update(kwargs)
    with pytest.raises(SamplerError, match=needle):
        CoBatchSampler(indptr, indices, np.arange(10), **args)


def test_server_without_training_vertices_says_what_to_do():
    indptr, indices = _graph()
    with pytest.raises(SamplerError, match=r"holds no training vertices.*--mode flx or fb") as info:
        CoBatchSampler(indptr, indices, np.arange(0), batches=1, layers=2, fanout=5)
    assert "<= 0" not in str(info.value)


class _FewDraws:
    """A generator whose 'random' draws take only a few values: ties inside a row are frequent."""

    def __init__(self, seed, values):
        self._rng, self._values = np.random.default_rng(seed), values

    def integers(self, low, high, size, dtype):
        return self._rng.integers(0, self._values, size, dtype=dtype)


@pytest.mark.parametrize("values", [1 << 32, 3])
def test_row_sampling_keeps_the_fanout_smallest_draws_as_an_argsort_would(values):
    """sample_row_positions keeps, per row, the edges whose draws come first in an arg-sort of
    (row, draw): the threshold path (no sort of positions) and, on ties at a threshold, the arg-sort
    itself give exactly that set."""
    from granndis_hpc.graph.csr import rank_in_rows
    from granndis_hpc.graph.sampler import sample_row_positions

    rng = np.random.default_rng(1)
    indptr = np.concatenate([[0], np.cumsum(rng.integers(0, 12, 300))]).astype(np.int64)
    rows = np.sort(rng.choice(300, 120, replace=False)).astype(np.int64)
    for fanout in (1, 4, 20):
        out_ip, pos = sample_row_positions(indptr, rows, fanout, _FewDraws(7, values))
        # Reference: the arg-sort of the same draws (the sampler's definition).
        counts = indptr[rows + 1] - indptr[rows]
        sub_ip = np.concatenate([[0], np.cumsum(counts)])
        all_pos = np.concatenate([np.arange(indptr[r], indptr[r + 1]) for r in rows]).astype(np.int64)
        row_of = np.repeat(np.arange(rows.size, dtype=np.int64), counts)
        key = (row_of << 32) | _FewDraws(7, values).integers(0, 1 << 32, all_pos.size, dtype=np.int64)
        keep = np.sort(np.argsort(key)[rank_in_rows(sub_ip) < fanout])
        np.testing.assert_array_equal(out_ip, np.concatenate([[0], np.cumsum(np.minimum(counts, fanout))]))
        np.testing.assert_array_equal(pos, all_pos[keep])  # (ties: the same arg-sort decides)

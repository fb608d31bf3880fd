"""Partitioning helpers (serial): symmetric adjacency, edge cut, random/METIS partitions, GPU split."""
import os

import numpy as np
import pytest
import scipy.sparse as sp

from granndis_hpc.graph.csr import Graph, csr_from_edges
from granndis_hpc.preprocess.partition.metis import metis_part
from granndis_hpc.preprocess.partition.twolevel import (balance, edge_cut, fill_empty_parts, induced_symmetric,
                                  random_partition, symmetric_adjacency)
from granndis_hpc.preprocess.build.slices import vtxdist_for


def community_graph(n, communities, m, p_out, seed, directed=False):
    rng = np.random.default_rng(seed)
    comm = rng.integers(0, communities, n)
    src, dst = rng.integers(0, n, 4 * m), rng.integers(0, n, 4 * m)
    keep = (comm[src] == comm[dst]) | (rng.random(4 * m) < p_out)
    src, dst = src[keep][:m], dst[keep][:m]
    if not directed:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    keys = np.unique(src * n + dst)
    src, dst = keys // n, keys % n
    indptr, indices = csr_from_edges(src, dst, n)
    return indptr, indices, comm


def scipy_symmetric(indptr, indices, n):
    a = sp.csr_matrix((np.ones(indices.shape[0]), indices, indptr), shape=(n, n))  # row = dst, col = src
    s = ((a + a.T) > 0).astype(np.int8).tolil()
    s.setdiag(0)
    s = s.tocsr()
    s.eliminate_zeros()
    s.sort_indices()
    return s


@pytest.mark.parametrize("directed", [False, True])
def test_symmetric_adjacency_slices_match_scipy(directed):
    n = 311
    indptr, indices, _ = community_graph(n, 3, 1500, 0.1, seed=1, directed=directed)
    # add self loops: they must be dropped
    dst = np.repeat(np.arange(n), np.diff(indptr))
    loops = np.arange(0, n, 10)
    indptr, indices = csr_from_edges(np.concatenate([indices, loops]), np.concatenate([dst, loops]), n)
    ref = scipy_symmetric(indptr, indices, n)
    vtxdist = vtxdist_for(n, 3)
    for r in range(3):
        lo, hi = int(vtxdist[r]), int(vtxdist[r + 1])
        xadj, adjncy = symmetric_adjacency(indptr, indices, lo, hi)
        np.testing.assert_array_equal(xadj, ref.indptr[lo:hi + 1] - ref.indptr[lo])
        np.testing.assert_array_equal(adjncy, ref.indices[ref.indptr[lo]:ref.indptr[hi]])


def test_edge_cut_and_balance_reference():
    n = 97
    indptr, indices, _ = community_graph(n, 2, 300, 0.3, seed=2, directed=True)
    parts = np.random.default_rng(0).integers(0, 3, n)
    cut = 0
    for v in range(n):
        for u in indices[indptr[v]:indptr[v + 1]]:
            cut += parts[u] != parts[v]
    assert edge_cut(indptr, indices, parts) == cut
    sizes = [np.sum(parts == p) for p in range(3)]
    assert balance(parts, 3) == pytest.approx(max(sizes) / (n / 3))


def test_random_partition_balanced_and_seeded():
    p = random_partition(1001, 4, seed=3)
    assert sorted(np.bincount(p).tolist()) == [250, 250, 250, 251]
    np.testing.assert_array_equal(p, random_partition(1001, 4, seed=3))
    assert not np.array_equal(p, random_partition(1001, 4, seed=4))


def test_metis_two_constraints_balance_training_vertices():
    # Training vertices all in one of two communities: a vertex-only partition would cut between the
    # communities and put every training vertex on one part.  Two constraints must balance both.
    n = 2000
    indptr, indices, comm = community_graph(n, 2, 20000, 0.02, seed=0)
    train = (comm == 0) & (np.random.default_rng(1).random(n) < 0.6)
    xadj, adjncy = symmetric_adjacency(indptr, indices, 0, n)
    one, ncon1 = metis_part(xadj, adjncy, 2, None)
    assert ncon1 == 1
    assert balance(one, 2, train.astype(float)) > 1.8  # the trap is real
    w = np.stack([np.ones(n, dtype=np.int64), train.astype(np.int64)], axis=1)
    two, ncon2 = metis_part(xadj, adjncy, 2, w)
    assert ncon2 == 2
    assert balance(two, 2) <= 1.05
    assert balance(two, 2, train.astype(float)) <= 1.05


def test_metis_cut_far_below_random():
    n = 3000
    indptr, indices, _ = community_graph(n, 8, 15000, 0.02, seed=5)
    xadj, adjncy = symmetric_adjacency(indptr, indices, 0, n)
    parts, _ = metis_part(xadj, adjncy, 4, None)
    assert balance(parts, 4) <= 1.05
    assert edge_cut(indptr, indices, parts) < 0.4 * edge_cut(indptr, indices, random_partition(n, 4, 0))


def test_fill_empty_parts():
    parts = np.array([0, 0, 0, 0, 2, 2])
    fixed = fill_empty_parts(parts, 4)
    assert np.all(np.bincount(fixed, minlength=4) >= 1)
    assert np.count_nonzero(fixed != parts) == 2


def test_induced_symmetric_and_the_metis_gpu_split():
    n = 1200
    indptr, indices, comm = community_graph(n, 6, 7000, 0.05, seed=7, directed=True)
    rng = np.random.default_rng(2)
    inner = np.sort(rng.choice(n, 700, replace=False))
    xadj, adjncy = induced_symmetric(indptr, indices, inner)
    ref = scipy_symmetric(indptr, indices, n)[inner][:, inner]
    ref.sort_indices()
    np.testing.assert_array_equal(xadj, ref.indptr)
    np.testing.assert_array_equal(adjncy, ref.indices)
    train = np.zeros(n, dtype=bool)
    train[rng.choice(n, 300, replace=False)] = True
    g = Graph("t", indptr, indices, np.zeros((n, 1), np.float32), np.zeros(n, np.int64), train,
              np.zeros(n, bool), np.zeros(n, bool), 1)
    from mpi4py import MPI

    from granndis_hpc.cluster import as_group
    from granndis_hpc.preprocess.partition.gpu_split import split_servers_over_gpus
    from granndis_hpc.preprocess.partition.twolevel import WholeGraphAccess

    group = as_group(MPI.COMM_SELF)
    server_of = np.ones(n, dtype=np.int32)
    server_of[inner] = 0  # server 0: the inner vertices; METIS on its writer (rank 0 of 1)
    gpu_of, cons = split_servers_over_gpus(group, WholeGraphAccess(group, g), server_of, train, 3, "metis", 0)
    gpu, constraints = gpu_of[inner], cons[0]
    assert constraints == ["vertices", "train"]
    assert gpu.shape == inner.shape and set(gpu.tolist()) == {0, 1, 2}
    assert balance(gpu, 3) <= 1.05
    assert balance(gpu, 3, train[inner].astype(float)) <= 1.10


def test_refine_balance_caps_parts_and_prefers_cheap_moves():
    from granndis_hpc.preprocess.partition.twolevel import refine_balance

    n = 3000
    indptr, indices, comm = community_graph(n, 4, 15000, 0.02, seed=8)
    parts = comm.copy()  # communities are the natural parts, but of random sizes
    parts[(comm == 1) & (np.arange(n) % 3 == 0)] = 0  # make part 0 oversized
    assert balance(parts, 4) > 1.1
    fixed, moved = refine_balance(indptr, indices, parts, 4, max_ratio=1.03)
    assert balance(fixed, 4) <= 1.03
    changed = fixed != parts
    assert moved == int(changed.sum())
    # only vertices of over-full parts moved, only into parts that had room
    load = np.bincount(parts, minlength=4)
    cap = int(np.floor(1.03 * n / 4))
    assert np.all(load[parts[changed]] > cap) and np.all(load[fixed[changed]] < cap)
    # the gain-ordered choice cuts fewer edges than moving the same vertices' count at random
    rng = np.random.default_rng(0)
    naive = parts.copy()
    for p in np.flatnonzero(load > cap):
        victims = rng.choice(np.flatnonzero(parts == p), load[p] - cap, replace=False)
        naive[victims] = np.repeat(np.flatnonzero(load < cap), np.maximum(cap - load[load < cap], 0))[:victims.size]
    assert edge_cut(indptr, indices, fixed) < edge_cut(indptr, indices, naive)
    already, none_moved = refine_balance(indptr, indices, fixed, 4, max_ratio=1.03)
    assert none_moved == 0 and np.array_equal(already, fixed)


def test_refine_balance_moves_the_boundary_not_islands():
    """A path 0-1-...-99 split at 60: part 0 is 9 vertices over the cap.  Moving the 9 vertices next to
    the cut keeps the cut at one edge; moving far vertices (no neighbour in part 1) would make islands
    whose preloaded halos the other server must hold."""
    from granndis_hpc.preprocess.partition.twolevel import refine_balance

    n = 100
    src = np.concatenate([np.arange(n - 1), np.arange(1, n)])
    dst = np.concatenate([np.arange(1, n), np.arange(n - 1)])
    order = np.lexsort((src, dst))
    indices = src[order]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    parts = (np.arange(n) >= 60).astype(np.int64)
    fixed, moved = refine_balance(indptr, indices, parts, 2, max_ratio=1.03)
    assert balance(fixed, 2) <= 1.03 and moved == 9
    assert edge_cut(indptr, indices, fixed) == edge_cut(indptr, indices, parts) == 2  # one edge, both directions
    assert np.array_equal(np.flatnonzero(fixed != parts), np.arange(51, 60))


def test_gpu_split_groups_and_their_slices():
    """Concurrent GPU splits only with ParMETIS, 2 <= S <= P and every server at least as many inner
    vertices as its block has ranks; the blocks are contiguous and cover the ranks; slices_dist gives a
    server's rows to its block only, in balanced slices (the sequential path's dists are its special
    cases: all ranks, or the writer alone)."""
    import numpy as np

    from granndis_hpc.preprocess.partition.gpu_split import gpu_split_dist, gpu_split_groups, slices_dist

    np.testing.assert_array_equal(gpu_split_groups(np.array([500, 400]), 8, "parmetis"), [0, 4, 8])
    np.testing.assert_array_equal(gpu_split_groups(np.array([5, 4, 3]), 8, "parmetis"), [0, 2, 5, 8])
    np.testing.assert_array_equal(gpu_split_groups(np.array([9, 9]), 2, "parmetis"), [0, 1, 2])
    assert gpu_split_groups(np.array([500, 400]), 1, "parmetis") is None  # P < S
    assert gpu_split_groups(np.array([900]), 8, "parmetis") is None  # one server: all ranks anyway
    assert gpu_split_groups(np.array([500, 3]), 8, "parmetis") is None  # a server smaller than its block
    assert gpu_split_groups(np.array([500, 400]), 8, "metis") is None
    np.testing.assert_array_equal(slices_dist(10, 8, 4, 4), [0, 0, 0, 0, 0, 2, 5, 7, 10])
    np.testing.assert_array_equal(slices_dist(10, 8, 0, 4), [0, 2, 5, 7, 10, 10, 10, 10, 10])
    np.testing.assert_array_equal(slices_dist(10, 5, 2, 2), [0, 0, 0, 5, 10, 10])
    np.testing.assert_array_equal(gpu_split_dist(10, 4, "parmetis", 1), vtxdist_for(10, 4))
    np.testing.assert_array_equal(gpu_split_dist(10, 4, "metis", 1), [0, 0, 10, 10, 10])


def test_heap_thresholds_during_a_parmetis_call():
    """parmetis._heap_for_call: inside it an allocation of 2 MiB that no free heap chunk can serve is
    mmapped (glibc's mallinfo2 counts it in hblkhd), after it the same allocation lives in the heap again
    (the thresholds the dynamic rule settles at, 32 MiB); GRANNDIS_SCOTCH_MMAP_MIB=0 leaves malloc alone,
    a bad value is refused.  In a fresh interpreter: glibc serves a request from a free chunk that fits
    whatever the threshold, and a long test process has such chunks."""
    import subprocess
    import sys

    code = r"""
import ctypes, os, sys
import numpy as np
from granndis_hpc.preprocess.partition.parmetis import PartitionerError, _heap_for_call, libc_malloc_info

libc = libc_malloc_info()
if libc is None:
    sys.exit(3)

def mmapped_by(n):
    before = libc.mallinfo2().hblkhd
    a = np.ones(n, dtype=np.uint8)
    grew = libc.mallinfo2().hblkhd - before
    del a
    return grew

size = 2 << 20
libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD as numpy's arrays leave glibc's dynamic one
assert mmapped_by(size) == 0
with _heap_for_call():
    inside = mmapped_by(size)
after = mmapped_by(size)
print(inside, after)
os.environ["GRANNDIS_SCOTCH_MMAP_MIB"] = "x"
try:
    with _heap_for_call():
        pass
except PartitionerError as exc:
    assert "GRANNDIS_SCOTCH_MMAP_MIB must be" in str(exc)
else:
    sys.exit(4)
"""
    def run(mib):
        env = dict(os.environ, GRANNDIS_SCOTCH_MMAP_MIB=mib)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        if r.returncode == 3:
            pytest.skip("not glibc")
        assert r.returncode == 0, r.stderr[-2000:]
        return [int(x) for x in r.stdout.split()]

    inside, after = run("1")
    assert inside >= 2 << 20 and after == 0, (inside, after)
    assert run("0") == [0, 0]  # off: the 32 MiB threshold set above holds inside too

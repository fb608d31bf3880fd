"""preprocess/partition/locality.py under `mpirun -n 4`: the order with locality that every ParMETIS call with
P >= 2 sees.  The distributed order equals a plain sequential reference of its definition
for P = 1, 2, 4, on a graph with several components and vertices without neighbours (so the restarts
and the last region run); part_kway_with_locality's parts are ParMETIS' parts of the relabelled
graph mapped back."""
import numpy as np
import pytest
from mpi4py import MPI

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD


def _graph():
    """Two copies of a 3000-vertex local graph side by side, a few isolated vertices, ids shuffled:
    (indptr, indices) of the symmetric graph without self loops."""
    from granndis_hpc.preprocess.partition.twolevel import symmetric_adjacency
    from granndis_hpc.preprocess.sources import load

    g = load("synthetic", generator="local", vertices=3000, features=1, avg_degree=8, seed=2)
    m = g.num_vertices
    rows = np.repeat(np.arange(m), np.diff(g.indptr))
    src = np.concatenate([g.indices, g.indices + m])
    dst = np.concatenate([rows, rows + m])
    n = 2 * m + 7  # the last 7 without an edge
    perm = np.random.default_rng(4).permutation(n)
    src, dst = perm[src], perm[dst]
    order = np.lexsort((src, dst))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return symmetric_adjacency(indptr, src[order], 0, n) + (n,)


def _reference(xadj, adjncy, n, region_vertices, restart):
    """The order's definition, sequentially on the whole graph, one vertex at a time."""
    deg = np.diff(xadj)
    k = max(1, n // region_vertices)
    seeds = sorted(set(((np.arange(k) * n) // k).tolist()))
    region = {v: i for i, v in enumerate(seeds)}
    level = {v: 0 for v in seeds}
    frontier = [v for v in seeds if deg[v] > 0]
    depth, next_region = 0, len(seeds)
    while True:
        if not frontier:
            new = [v for v in range(n) if v not in region and deg[v] > 0][:restart]
            if not new:
                break
            for v in new:
                region[v], level[v] = next_region, depth
            next_region += 1
            frontier = new
            continue
        best = {}
        for u in frontier:
            for x in adjncy[xadj[u]:xadj[u + 1]].tolist():
                if x not in region:
                    best[x] = min(best.get(x, region[u]), region[u])
        depth += 1
        for x, r in best.items():
            region[x], level[x] = r, depth
        frontier = sorted(best)
    for v in range(n):
        if v not in region:
            region[v], level[v] = next_region, 0
    ranked = sorted(range(n), key=lambda v: (region[v], level[v], v))
    new_of_old = np.empty(n, dtype=np.int64)
    new_of_old[ranked] = np.arange(n)
    return new_of_old


@pytest.mark.timeout(120)
def test_order_equals_reference_for_every_p(monkeypatch):
    from granndis_hpc.cluster import as_group
    from granndis_hpc.preprocess.partition import locality
    from granndis_hpc.preprocess.build.slices import vtxdist_for

    monkeypatch.setattr(locality, "REGION_VERTICES", 1000)
    monkeypatch.setattr(locality, "RESTART_SEEDS", 3)
    xadj, adjncy, n = _graph()
    ref = _reference(xadj, adjncy, n, 1000, 3)
    assert np.array_equal(np.sort(ref), np.arange(n))
    for P in (1, 2, 4):
        comm = WORLD.Split(0 if WORLD.rank < P else MPI.UNDEFINED, WORLD.rank)
        if comm == MPI.COMM_NULL:
            continue
        group = as_group(comm)
        dist = vtxdist_for(n, P)
        lo, hi = dist[group.rank], dist[group.rank + 1]
        got = locality.locality_order(group, dist, xadj[lo:hi + 1] - xadj[lo], adjncy[xadj[lo]:xadj[hi]], n)
        np.testing.assert_array_equal(got, ref)
        comm.Free()
    # the point of it: far fewer edges across 4 slices than in the original ids
    rows = np.repeat(np.arange(n), np.diff(xadj))
    d = vtxdist_for(n, 4)
    across = lambda a, b: np.mean(np.searchsorted(d, a, side="right") != np.searchsorted(d, b, side="right"))  # noqa: E731
    assert across(ref[rows], ref[adjncy]) < 0.6 * across(rows, adjncy)  # 0.40 against 0.75


@pytest.mark.timeout(120)
def test_part_kway_with_locality_maps_parts_back():
    from granndis_hpc.cluster import as_group
    from granndis_hpc.preprocess.partition.locality import locality_order
    from granndis_hpc.preprocess.partition.parmetis import load_parmetis, parmetis_part_kway
    from granndis_hpc.preprocess.partition.twolevel import _as_idx, part_kway_with_locality, symmetric_keys
    from granndis_hpc.preprocess.build.slices import keys_to_adjacency, vtxdist_for

    group = as_group(WORLD)
    pm = load_parmetis()
    xadj, adjncy, n = _graph()
    P, rank = group.size, group.rank
    dist = vtxdist_for(n, P)
    lo, hi = dist[rank], dist[rank + 1]
    w = (np.arange(n) % 3 + 1)[:, None].astype(np.int64)  # unequal weights: they must travel with their rows
    mine = _as_idx(pm, xadj[lo:hi + 1] - xadj[lo], adjncy[xadj[lo]:xadj[hi]])
    got = group.allgatherv(part_kway_with_locality(pm, group, dist, [*mine, w[lo:hi]], 4, 7), np.diff(dist))
    # Reference: the relabelled graph built here from the whole adjacency, ParMETIS on it, mapped back.
    new = locality_order(group, dist, xadj[lo:hi + 1] - xadj[lo], adjncy[xadj[lo]:xadj[hi]].astype(np.int64), n)
    rows = np.repeat(np.arange(n), np.diff(xadj))
    keys = symmetric_keys(new[rows], new[adjncy], n)
    keys = keys[(keys >= lo * n) & (keys < hi * n)]
    w_new = np.empty_like(w)
    w_new[new] = w
    part_new = parmetis_part_kway(pm, group, dist, *_as_idx(pm, *keys_to_adjacency(keys, n, lo, hi)), 4,
                                  w_new[lo:hi], 7)
    np.testing.assert_array_equal(got, group.allgatherv(part_new, np.diff(dist))[new])
    assert set(got.tolist()) == {0, 1, 2, 3}

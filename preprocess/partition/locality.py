"""A vertex order with locality for the distributed partitioner.

Why: PT-Scotch's CPU per call grows with its number of processes because it numbers the ghost ends of
the edges that cross the ranks' `vtxdist` slices (dgraphGhst2's sorts, 40-45 % of a call), and with
ids that carry no locality (the synthetic generators', many real datasets') 1 - 1/P of the edges
cross (docs/performance/build-scaling.md).  Relabelled so that the vertices of one region of the graph are
consecutive, most edges stay inside a slice.

The order (a function of the graph alone, the same for any P, and the same from the whole graph and
from the slices, since both hand it the same symmetric adjacency): a multi-source breadth-first search
from `seeds_for(n)` (evenly spaced ids, one per REGION_VERTICES vertices), level-synchronous; a vertex
reached at a level joins the region of its lowest-numbered parent region there.  Components no seed
reaches get the smallest unreached ids as new seeds (up to RESTART_SEEDS per round).  The new ids
sort the vertices by (region, level, old id).  Per rank the search costs O((V + E) / P) work and one
small alltoallv and allreduce per level; the map old -> new is then allgathered (int64: 8 B per vertex
of the graph on every rank, like the build's other per-vertex arrays).
"""
from __future__ import annotations

import numpy as np

from granndis_hpc.graph.csr import csr_rows, owner_of

from granndis_hpc.preprocess.build.slices import keys_to_adjacency, shuffle_to_owners

REGION_VERTICES = 1 << 14  # one BFS seed per this many vertices
RESTART_SEEDS = 1024  # new seeds per round for the components no seed reached


def seeds_for(n: int) -> np.ndarray:
    k = max(1, n // REGION_VERTICES)
    return np.unique((np.arange(k, dtype=np.int64) * n) // k)


def _min_per_vertex(x: np.ndarray, region: np.ndarray):
    """Distinct x, each with the smallest region proposed for it."""
    order = np.lexsort((region, x))
    x, region = x[order], region[order]
    first = np.ones(x.shape[0], dtype=bool)
    first[1:] = x[1:] != x[:-1]
    return x[first], region[first]


def _unreached(region: np.ndarray, cursor: int, limit: int) -> np.ndarray:
    """Up to `limit` local rows not reached yet (region -1), smallest first, from `cursor` on (every row
    below it is reached), looking through windows that grow until enough are found."""
    found, start, width = [], cursor, 1 << 14
    while start < region.shape[0] and sum(f.shape[0] for f in found) < limit:
        found.append(np.flatnonzero(region[start:start + width] == -1) + start)
        start += width
        width *= 2
    return np.concatenate(found)[:limit] if found else np.zeros(0, dtype=np.int64)


def locality_order(group, dist: np.ndarray, xadj: np.ndarray, adjncy: np.ndarray, n: int) -> np.ndarray:
    """Collective: the new id of every vertex (int64 [n], on every rank; a bijection of [0, n)).

    (xadj, adjncy): this rank's rows dist[rank]..dist[rank+1]-1 of the symmetric adjacency without
    self loops, global column ids (partition_servers' input to ParMETIS)."""
    rank, P = group.rank, group.size
    lo, hi = int(dist[rank]), int(dist[rank + 1])
    m = hi - lo
    # region of this rank's rows: -1 not reached yet; -2 no neighbour (never reached: one last region)
    region = np.where(np.diff(xadj) == 0, -2, -1).astype(np.int64)
    level = np.zeros(m, dtype=np.int64)
    seeds = seeds_for(n)
    mine = seeds[(seeds >= lo) & (seeds < hi)]
    region[mine - lo] = np.searchsorted(seeds, mine)
    next_region = int(seeds.shape[0])
    frontier = (mine - lo)[np.diff(xadj)[mine - lo] > 0]  # local rows reached at the current level
    depth, cursor = 0, 0
    while True:
        if int(group.allreduce_sum(np.array([frontier.shape[0]], dtype=np.int64))[0]) == 0:
            # Nothing left to expand: the smallest unreached ids (of any rank) start one new region.
            cand = _unreached(region, cursor, RESTART_SEEDS)
            cursor = int(cand[0]) if cand.shape[0] else m
            counts = group.allgather_object(int(cand.shape[0]))
            if sum(counts) == 0:
                break
            new = np.sort(group.allgatherv(cand + lo, counts))[:RESTART_SEEDS]
            frontier = new[(new >= lo) & (new < hi)] - lo
            region[frontier], level[frontier] = next_region, depth
            next_region += 1
            continue
        # Expand: every neighbour of a frontier row is proposed the row's region; its owner keeps the
        # unreached ones, each with the smallest region proposed.
        sub_indptr, nbrs = csr_rows(xadj, adjncy, frontier)
        proposed = np.repeat(region[frontier], np.diff(sub_indptr))
        nbrs, proposed = _min_per_vertex(nbrs, proposed)  # sorted by vertex: in owner order
        pairs = group.alltoallv(np.stack([nbrs, proposed], axis=1), np.bincount(owner_of(dist, nbrs), minlength=P))
        del sub_indptr, nbrs, proposed
        x, r = _min_per_vertex(pairs[:, 0] - lo, pairs[:, 1])
        fresh = region[x] == -1
        depth += 1
        frontier = x[fresh]
        region[frontier], level[frontier] = r[fresh], depth
    region[region == -2] = next_region
    # New ids: by (region, level, old id).  This rank's rows of one (region, level) class get
    # consecutive ids, after those of the same class on lower ranks (their old ids are lower).
    cls = region * (int(group.allreduce_max(np.array([depth], dtype=np.int64))[0]) + 1) + level
    del region, level
    mine = np.unique(cls)
    classes = np.unique(group.allgatherv(mine, group.allgather_object(int(mine.shape[0]))))
    idx = np.searchsorted(classes, cls)
    del cls
    per_rank = group.allgatherv_rows(np.bincount(idx, minlength=classes.shape[0])[None, :].astype(np.int64),
                                     np.ones(P, dtype=np.int64))  # [P, classes]
    start = np.zeros(classes.shape[0], dtype=np.int64)
    np.cumsum(per_rank.sum(axis=0)[:-1], out=start[1:])
    start += per_rank[:rank].sum(axis=0)
    order = np.argsort(idx, kind="stable")  # rows ascend within a class: old id order
    ordered = idx[order]
    new_local = np.empty(m, dtype=np.int64)
    new_local[order] = start[ordered] + np.arange(m, dtype=np.int64) - np.searchsorted(ordered, ordered)
    return group.allgatherv(new_local, np.diff(dist))


def renumbered_adjacency(group, dist: np.ndarray, xadj: np.ndarray, adjncy: np.ndarray, new_of_old: np.ndarray,
                         n: int):
    """Collective: (xadj, adjncy) of this rank's rows dist[rank]..dist[rank+1]-1 of the same symmetric
    graph in the new ids (one alltoallv of its entries to the owners of their new rows)."""

    lo = int(dist[group.rank])
    rows = np.repeat(new_of_old[lo:lo + xadj.shape[0] - 1], np.diff(xadj))
    keys = rows * n
    del rows
    keys += new_of_old[adjncy]
    keys = shuffle_to_owners(group, keys, np.asarray(dist, dtype=np.int64), n)
    return keys_to_adjacency(keys, n, lo, int(dist[group.rank + 1]))

"""Which vertices a server holds: its inner vertices plus a preloaded halo.

- Flexible Preloading (`full_khop`): the k-hop IN-neighbourhood of the inner vertices, with the hop at
  which each vertex was first reached (frontier BFS over the in-edge CSR, one vectorised step per hop).
- Expansion-aware Sampling (`eas`): only the expansion outside the server is sampled.  At each hop,
  each frontier vertex adds at most `fanout` of its in-neighbours that are neither inner nor already
  selected.  `select="degree"` (the paper's rule) prefers candidates with many in-neighbours that are
  not yet selected (they open the most new dependencies, i.e. are the most "important" expansion);
  `select="uniform"` picks uniformly.  Ties and uniform picks use a hash of (seed, source, destination),
  so the result does not depend on the number of ranks or on array order.  All frontier vertices of a
  hop choose at once, against the selection made before that hop.

The server subgraph is the subgraph induced on the selected vertices (`induced_subgraph`), so edges
among inner vertices are never dropped.  With fanout >= the largest in-degree EAS equals full_khop.
"""
from __future__ import annotations

import numpy as np

from granndis_hpc.graph.csr import bfs_hops, csr_from_edges, csr_rows, row_of_edges, segment_rank

EAS_SELECT_RULES = ("degree", "uniform")


# numpy 2.4's np.unique is ~50x slower than a sort on large int64 arrays (measured: 13 s against
# 0.2 s for 4M values), so the hot paths use these instead.
def unique_sorted(a: np.ndarray, in_place: bool = False) -> np.ndarray:
    """Sorted distinct values of a (sort-based); in_place sorts `a` itself (saves a copy of it)."""
    s = a if in_place else np.sort(a)
    if in_place:
        s.sort()
    keep = np.ones(s.shape[0], dtype=bool)
    keep[1:] = s[1:] != s[:-1]
    return s[keep]


def unique_inverse(a: np.ndarray):
    """(sorted distinct values, index of each element of a in them)."""
    order = np.argsort(a, kind="stable")
    s = a[order]
    first = np.ones(s.shape[0], dtype=bool)
    first[1:] = s[1:] != s[:-1]
    inverse = np.empty(a.shape[0], dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    return s[first], inverse


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a well-mixed 64-bit hash of each uint64 (vectorised, wraps mod 2**64)."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def edge_keys(src: np.ndarray, dst: np.ndarray, seed: int) -> np.ndarray:
    """Deterministic pseudo-random uint64 key per edge (src -> dst) for a given seed."""
    with np.errstate(over="ignore"):
        h = _mix64(np.asarray(src, dtype=np.int64).astype(np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15))
        return _mix64(h ^ np.asarray(dst, dtype=np.int64).astype(np.uint64))


def _order_by_hop(num_vertices: int, hop_of: np.ndarray, max_hop: int):
    """(vertices sorted by (hop, global id), their hops) from a dense hop array (-1 = not selected)."""
    selected = np.flatnonzero(hop_of >= 0)
    hops = hop_of[selected]
    order = np.lexsort((selected, hops))
    return selected[order].astype(np.int64), hops[order].astype(np.int32)


def full_khop(indptr: np.ndarray, indices: np.ndarray, inner: np.ndarray, hops: int):
    """All vertices within `hops` in-hops of `inner`: (vertex ids, hop first reached), sorted by (hop, id)."""
    n = indptr.shape[0] - 1
    return _order_by_hop(n, bfs_hops(indptr, indices, inner, hops), hops)


def _unselected_in_degree(indptr, indices, vertices, selected: np.ndarray) -> np.ndarray:
    """For each vertex, how many of its in-neighbours are not selected yet."""
    sub_indptr, nbrs = csr_rows(indptr, indices, vertices)
    return np.bincount(row_of_edges(sub_indptr), weights=~selected[nbrs], minlength=vertices.shape[0]).astype(np.int64)


def eas_choose(src: np.ndarray, dst: np.ndarray, fanout: int, seed: int, score=None) -> np.ndarray:
    """EAS' choice among candidate edges src -> dst (sources not yet selected): at most `fanout` sources
    per destination, by `score` descending (the degree rule; None: uniform), ties and uniform picks by
    the hash of (seed, source, destination).  Shared by eas and the distributed build
    (dist_server.select_halo), which must choose alike."""
    keys = edge_keys(src, dst, seed)
    order = np.lexsort((keys, dst)) if score is None else np.lexsort((keys, -score, dst))
    src, dst = src[order], dst[order]
    # A repeated edge (multigraph input) must not take two of the row's `fanout` slots.
    first = np.ones(src.shape[0], dtype=bool)
    first[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
    src, dst = src[first], dst[first]
    # Position of each candidate inside its destination row after sorting (dst is grouped).
    return src[segment_rank(dst) < fanout]


def eas(indptr: np.ndarray, indices: np.ndarray, inner: np.ndarray, hops: int, fanout: int,
        select: str = "degree", seed: int = 0):
    """Expansion-aware Sampling: (vertex ids, hop first reached), sorted by (hop, id)."""
    if select not in EAS_SELECT_RULES:
        raise ValueError(f"unknown EAS selection rule {select!r}; use one of {EAS_SELECT_RULES}")
    n = indptr.shape[0] - 1

    def expand(frontier, hop_of):
        """The sampled in-neighbours of one hop: at most `fanout` unselected ones per frontier vertex."""
        if fanout <= 0:
            return np.zeros(0, dtype=np.int64)
        selected = hop_of >= 0
        sub_indptr, src = csr_rows(indptr, indices, frontier)
        dst = frontier[row_of_edges(sub_indptr)]
        keep = ~selected[src]
        src, dst = src[keep], dst[keep]
        if src.size == 0:
            return src
        score = None
        if select == "degree":
            cand, inverse = unique_inverse(src)
            score = _unselected_in_degree(indptr, indices, cand, selected)[inverse]
        return eas_choose(src, dst, fanout, seed, score)

    return _order_by_hop(n, bfs_hops(indptr, indices, inner, hops, expand), hops)


def induced_edges(indptr: np.ndarray, indices: np.ndarray, vertices: np.ndarray):
    """(source, destination) in local ids (local id i = vertices[i]) of every edge of the subgraph
    induced on `vertices`, grouped by destination (the rows of `vertices` in order).  The one body of
    induced_subgraph and partition.induced_symmetric."""
    n = indptr.shape[0] - 1
    local = np.full(n, -1, dtype=np.int64)
    local[vertices] = np.arange(vertices.shape[0], dtype=np.int64)
    sub_indptr, src = csr_rows(indptr, indices, vertices)
    # This is the build's largest temporary (every in-edge of every server row): hold at most two
    # edge-sized arrays besides the kept ones (the build's peak per rank was set here, 56 B per edge).
    src = local[src]
    del local
    keep = src >= 0
    src = src[keep]
    dst = row_of_edges(sub_indptr)[keep]
    return src, dst


def induced_subgraph(indptr: np.ndarray, indices: np.ndarray, vertices: np.ndarray):
    """In-edge CSR of the subgraph induced on `vertices` (local id i = vertices[i]); sources sorted in a row."""
    src, rows = induced_edges(indptr, indices, vertices)
    # One int64-key sort instead of a two-key lexsort: 10 s -> ~2 s for one server of a 1M-vertex graph.
    return csr_from_edges(src, rows, vertices.shape[0])

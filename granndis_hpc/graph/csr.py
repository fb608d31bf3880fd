"""The canonical in-memory graph and small CSR helpers shared by preprocessing and the engine.

Convention everywhere in granndis-hpc: graphs are stored as *in-edge* CSR.  For a vertex v,
``indices[indptr[v]:indptr[v+1]]`` are the sources u of the edges u -> v, i.e. the vertices whose
features v aggregates.  Ids are int64.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from .hetero import GraphTypes


@dataclass
class Graph:
    """A whole dataset after canonicalisation (what the partitioner and the tests' references see)."""

    name: str
    indptr: np.ndarray  # int64 [N+1], in-edge CSR
    indices: np.ndarray  # int64 [E], source ids
    features: np.ndarray  # float32 [N, F]
    labels: np.ndarray  # int64 [N], in [0, num_classes); multi-label: uint8 [N, num_classes] of 0/1
    train_mask: np.ndarray  # bool [N]
    val_mask: np.ndarray  # bool [N]
    test_mask: np.ndarray  # bool [N]
    num_classes: int
    # Vertex types and relations of a heterogeneous graph (graph/hetero.py); None: one type.
    types: Optional[GraphTypes] = None

    @property
    def num_vertices(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.features.shape[1])

    @property
    def multilabel(self) -> bool:
        """Whether the targets are multi-label (a 0/1 matrix) rather than one class id per vertex."""
        return self.labels.ndim == 2

    def in_degree(self) -> np.ndarray:
        return np.diff(self.indptr).astype(np.int64)


def csr_from_edges(src: np.ndarray, dst: np.ndarray, num_vertices: int):
    """In-edge CSR (indptr, indices) from edge arrays src -> dst; sources sorted inside each row."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    # One int64 key per edge (dst-major) and one sort: several times faster than lexsort on two keys.
    # Sources may be ids of another space than the rows (e.g. server ids of a sample's rows).
    base = max(int(num_vertices), int(src.max()) + 1 if src.size else 1, 1)
    key = dst * base
    key += src  # in place: one edge-sized temporary less
    key.sort()
    indptr = np.zeros(num_vertices + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_vertices), out=indptr[1:])
    key %= base  # in place: the sorted keys become the sources
    return indptr, key


def csr_rows(indptr: np.ndarray, indices: np.ndarray, rows: np.ndarray):
    """Sub-CSR of the given rows (in that order): (indptr, indices) rebased to start at 0. Vectorised."""
    sub_indptr, pos = csr_row_positions(indptr, rows)
    return sub_indptr, indices[pos]


def csr_row_positions(indptr: np.ndarray, rows: np.ndarray):
    """The given rows' entries (in that order) as positions into the CSR's `indices`: (sub_indptr, pos).
    Positions name edges of a fixed graph, so a subgraph can be kept as an index array over it."""
    rows = np.asarray(rows, dtype=np.int64)
    starts, ends = indptr[rows], indptr[rows + 1]
    counts = ends - starts
    sub_indptr = np.zeros(rows.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=sub_indptr[1:])
    # Gather positions start_i + (0..count_i-1) for every row without a Python loop.
    pos = np.arange(sub_indptr[-1], dtype=np.int64) - np.repeat(sub_indptr[:-1] - starts, counts)
    return sub_indptr, pos


def position_lookup(ids: np.ndarray):
    """A vectorised map from ids to their position in `ids` (unique ids, any order); -1 if absent."""
    ids = np.asarray(ids, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]

    def find(keys) -> np.ndarray:
        keys = np.asarray(keys, dtype=np.int64)
        if sorted_ids.size == 0:
            return np.full(keys.shape, -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(sorted_ids, keys), sorted_ids.size - 1)
        return np.where(sorted_ids[pos] == keys, order[pos], -1)
    return find


def row_of_edges(indptr: np.ndarray) -> np.ndarray:
    """For an in-edge CSR, the destination row of every edge (the COO row array)."""
    return np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int64), np.diff(indptr))


def owner_of(offsets: np.ndarray, ids) -> np.ndarray:
    """Which contiguous block each id falls in, for blocks given by their start offsets
    (`offsets[p] <= id < offsets[p+1]` -> p).  The one lookup of "which GPU's rows hold this row":
    rows of each GPU are contiguous in a server file (docs/design.md §5)."""
    return np.searchsorted(offsets, ids, side="right") - 1


def marked(ids: np.ndarray, n: int) -> np.ndarray:
    """Sorted distinct ids in [0, n) via a mask: O(n + len(ids)), faster than sorting big frontiers."""
    mask = np.zeros(n, dtype=bool)
    mask[ids] = True
    return np.flatnonzero(mask).astype(np.int64)


def rank_in_rows(indptr: np.ndarray) -> np.ndarray:
    """Position of every CSR entry inside its row (0, 1, ... per row): the one "rank within a
    segment" computation, for segments given by a pointer array."""
    indptr = np.asarray(indptr, dtype=np.int64)
    return np.arange(indptr[-1], dtype=np.int64) - np.repeat(indptr[:-1], np.diff(indptr))


def segment_rank(key: np.ndarray) -> np.ndarray:
    """For each element, how many earlier elements have the same key (its rank inside its segment,
    in order of appearance).  Keys already grouped (non-decreasing) take an O(n) path; any other
    order costs one stable sort.  With the CSR pointer at hand, rank_in_rows is cheaper."""
    key = np.asarray(key)
    n = key.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if np.all(key[1:] >= key[:-1]):
        start = np.ones(n, dtype=bool)
        start[1:] = key[1:] != key[:-1]
        return rank_in_rows(np.append(np.flatnonzero(start), n))
    order = np.argsort(key, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = segment_rank(key[order])
    return rank


def bfs_hops(indptr: np.ndarray, indices: np.ndarray, sources, max_hop: int, expand=None) -> np.ndarray:
    """Frontier BFS over an in-edge CSR: the hop at which each vertex is first reached from `sources`
    (0 for the sources, -1 beyond `max_hop` or never).  One vectorised step per hop.

    `expand(frontier, hop_of)` returns the vertices the sorted `frontier` reaches at the next hop
    (default: all their in-neighbours); ones already reached are dropped here.  Samplers pass their
    own rule (EAS, GraphSAGE fanout), so preprocessing, verification and the runtime sampler walk
    the graph the same way.
    """
    n = indptr.shape[0] - 1
    hop_of = np.full(n, -1, dtype=np.int32)
    frontier = marked(np.asarray(sources, dtype=np.int64), n)
    hop_of[frontier] = 0
    for h in range(1, max_hop + 1):
        if frontier.size == 0:
            break
        reached = csr_rows(indptr, indices, frontier)[1] if expand is None else expand(frontier, hop_of)
        frontier = marked(reached[hop_of[reached] < 0], n)
        hop_of[frontier] = h
    return hop_of

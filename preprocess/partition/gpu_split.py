"""The GPU split: each server's inner vertices over its GPUs (METIS on one rank, or ParMETIS over a
block of the build's ranks), the same for the whole-graph and the distributed build.

Split from partition.py, which partitions the graph over servers: this module only divides each server
the server partition gave, and takes its rows through an `access` object (partition.WholeGraphAccess,
dist_build.SlicedAccess), so both builds hand the partitioner the same slices and get the same split."""
from __future__ import annotations

from typing import Optional

import numpy as np

from granndis_hpc.cluster import as_group
from granndis_hpc.graph.csr import csr_rows, row_of_edges

from granndis_hpc.preprocess.partition.metis import metis_part
from granndis_hpc.preprocess.partition.parmetis import load_parmetis
from granndis_hpc.preprocess.partition.twolevel import (_as_idx, _weights, constraint_names, fill_empty_parts,
                                                       part_kway_with_locality, refine_balance_with)
from granndis_hpc.preprocess.build.slices import keys_to_adjacency, vtxdist_for

def gpu_split_is_parallel(m: int, ranks: int, method: str) -> bool:
    """Whether a server's GPU split (m inner vertices) runs ParMETIS over all ranks (every rank a
    non-empty slice) rather than METIS on its writer (the sequential path: gpu_split_groups is None)."""
    return method == "parmetis" and m >= ranks


def slices_dist(m: int, ranks: int, first: int, count: int) -> np.ndarray:
    """A dist over `ranks` ranks giving m rows in balanced contiguous slices to ranks first..first+count-1
    and none to the others."""
    dist = np.zeros(ranks + 1, dtype=np.int64)
    dist[first + 1:first + count + 1] = vtxdist_for(m, count)[1:]
    dist[first + count + 1:] = m
    return dist


def gpu_split_dist(m: int, ranks: int, method: str, writer: int) -> np.ndarray:
    """Which rank holds which rows of a server's inner subgraph (m vertices) for its GPU split on the
    sequential path: balanced contiguous slices over all ranks for ParMETIS, all on the writer (rank
    s % P) for METIS.  A function of (m, P, method, writer) only, so the whole-graph and the
    distributed build hand the partitioner the same slices and get the same split."""
    if gpu_split_is_parallel(m, ranks, method):
        return vtxdist_for(m, ranks)
    return slices_dist(m, ranks, writer, 1)


def gpu_split_groups(sizes: np.ndarray, ranks: int, method: str) -> np.ndarray | None:
    """The ranks of each server's concurrent GPU split: server s on ranks bounds[s]..bounds[s+1]-1
    (S + 1 bounds, contiguous blocks of P // S or P // S + 1 ranks), or None for the sequential path.

    Concurrent: with ParMETIS, 2 <= S <= P and every server at least as many inner vertices
    as its block has ranks, each server's split runs over its own block of P / S ranks, all at the
    same time, instead of one after another over all P.  PT-Scotch's CPU per call grows with its number
    of processes at equal graph size (its ghost-edge numbering, 1 - 1/P of the edges crossing the
    slices; docs/performance/build-scaling.md), so the splits cost less CPU in all and half the wall time.
    A function of (inner sizes, P, method) only: both builds take the same path and slices."""
    S = int(len(sizes))
    if method != "parmetis" or S < 2 or ranks < S:
        return None
    bounds = (np.arange(S + 1, dtype=np.int64) * ranks) // S
    if (np.asarray(sizes) < np.diff(bounds)).any():
        return None
    return bounds


def split_servers_over_gpus(comm, access, server_of: np.ndarray, train: np.ndarray, gpus: int, method: str,
                            seed: int):
    """Collective: the GPU of every vertex (int32 [N], on every rank) and {server: constraints} for the
    servers this rank writes (s % P == rank).  The one GPU split of both builds:
    `access.inner_keys(s, inner, dist)` gives this rank's rows dist[rank]..dist[rank+1]-1 of server s's
    symmetric inner adjacency as sorted distinct keys row*m+col (WholeGraphAccess from the whole graph,
    dist_build.SlicedAccess by a shuffle from the slices; the same keys).

    `method` parmetis: ParMETIS on the server's inner subgraph in balanced slices, then
    refine_balance_with over the same slices, as for the servers; the train constraint only with
    Karypis' ParMETIS (PT-Scotch balances one).  Where gpu_split_groups allows (2 <= S <= P), every
    server's split runs on its own block of ranks, all at once (_split_concurrently); otherwise one
    server after another over all P ranks, a server with fewer inner vertices than ranks by METIS on
    its writer.  metis and random: METIS on rank s % P (split_gpus), as before."""
    group = as_group(comm)
    P, rank, n = group.size, group.rank, server_of.shape[0]
    S = int(server_of.max()) + 1 if n else 0
    # A heterogeneous graph balances each vertex type over the GPUs too (twolevel._weights).
    kinds = _Kinds(getattr(access, "vertex_type", None), getattr(access, "vertex_names", ["vertices"]))
    if gpus == 1:
        return np.zeros(n, dtype=np.int32), {s: ["vertices"] for s in range(rank, S, P)}
    # Every rank holds this per-vertex array through every ParMETIS call below: one byte per vertex
    # of the graph while G < 128 (widened to int32 once, at the end).
    gpu_local = np.full(n, -1, dtype=np.int8 if gpus < 128 else np.int32)
    pm = None
    if method == "parmetis":
        with group.errors("loading ParMETIS for the GPU split"):
            pm = load_parmetis()
    bounds = gpu_split_groups(np.bincount(server_of, minlength=S), P, method)
    if bounds is not None:
        constraints = _split_concurrently(group, access, server_of, train, gpus, seed, pm, bounds, gpu_local, kinds)
    else:
        constraints = _split_in_turn(group, access, server_of, train, S, gpus, method, seed, pm, gpu_local, kinds)
    return group.allreduce_max(gpu_local).astype(np.int32), constraints


class _Kinds:
    """The vertex types a split balances (twolevel.typed_rows): their weights and constraint names."""

    def __init__(self, vertex_type, names):
        self.vertex_type, self.names = vertex_type, list(names)

    def weights(self, train: np.ndarray, rows: np.ndarray, two: bool, scotch: bool = False) -> np.ndarray:
        """_weights of the vertices `rows` (global ids) with training mask `train` (theirs)."""
        if self.vertex_type is None or scotch:  # PT-Scotch balances one constraint
            return _weights(train, two)
        return _weights(train, two, self.vertex_type[rows], len(self.names))

    def constraints(self, two: bool, scotch: bool = False) -> list:
        names = ["vertices"] if self.vertex_type is None or scotch else self.names
        return constraint_names(len(names) + bool(two), names)


def _split_constraints(pm, train_inner: np.ndarray, gpus: int) -> bool:
    """Whether a server's ParMETIS split balances training vertices too (Karypis' ParMETIS only)."""
    return (not pm.is_scotch) and int(train_inner.sum()) >= gpus


def _parmetis_split(pm, group, s: int, server_of, train, dist, adjacency: list, gpus: int, seed: int,
                    two: bool, kinds: Optional[_Kinds] = None) -> np.ndarray:
    """Collective over `group` (the ranks dist slices server s's m inner rows over, in its ranks'
    numbering): ParMETIS on this rank's rows dist[rank]..dist[rank+1]-1 (adjacency: a list [xadj,
    adjncy] in ParMETIS' idx_t (_as_idx), local row ids, local column ids, emptied here: the rows wait on disk during
    the call,
    part_kway_with_locality's `keep`), empty parts filled, then the balance refinement over the same
    slices.  Returns the GPU of each of the m inner vertices (on every rank of `group`)."""
    lo, hi = int(dist[group.rank]), int(dist[group.rank + 1])
    rows = np.flatnonzero(server_of == s)[lo:hi]
    kinds = kinds or _Kinds(None, ["vertices"])
    graph = [*adjacency, kinds.weights(train[rows], rows, two, pm.is_scotch)]
    adjacency.clear()
    with group.errors("ParMETIS_V3_PartKway (GPU split)"):
        local = part_kway_with_locality(pm, group, dist, graph, gpus, seed, keep=True)
    xadj, adjncy = graph  # the rows again, for counts_of
    del graph
    parts = fill_empty_parts(group.allgatherv(local, np.diff(dist)), gpus)

    def counts_of(cand, p):
        a, b = np.searchsorted(cand, [lo, hi])
        sub_indptr, nbrs = csr_rows(xadj, adjncy, cand[a:b] - lo)
        local_counts = np.bincount(row_of_edges(sub_indptr) * gpus + p[nbrs],
                                   minlength=(b - a) * gpus).reshape(b - a, gpus)
        return group.allgatherv_rows(local_counts.astype(np.int64), np.diff(np.searchsorted(cand, dist)))

    parts, _ = refine_balance_with(counts_of, parts, gpus)
    return parts


def _split_concurrently(group, access, server_of, train, gpus: int, seed: int, pm, bounds, gpu_local,
                        kinds: _Kinds) -> dict:
    """Every server's ParMETIS split at the same time, server s on ranks bounds[s]..bounds[s+1]-1
    (gpu_split_groups).  The inner keys of every server are first shuffled (collectively, over all
    ranks) to that server's block only, so a rank holds one server's rows: n/P of them, as in the
    server partition's call.  The blocks then call ParMETIS on their own communicators; every rank
    enters access.released() (collective over all) once around them."""
    P, rank, S = group.size, group.rank, bounds.shape[0] - 1
    mine = int(np.searchsorted(bounds, rank, side="right")) - 1  # the server whose split this rank runs
    first, count = int(bounds[mine]), int(bounds[mine + 1] - bounds[mine])
    held = None
    for s in range(S):
        m = int(np.count_nonzero(server_of == s))
        keys = access.inner_keys(s, np.flatnonzero(server_of == s), slices_dist(m, P, int(bounds[s]),
                                                                               int(bounds[s + 1] - bounds[s])))
        if s == mine:
            held = keys
        del keys
    m = int(np.count_nonzero(server_of == mine))
    dist = vtxdist_for(m, count)  # the block's slices in its own ranks' numbering (the same rows)
    lo, hi = int(dist[rank - first]), int(dist[rank - first + 1])
    # In ParMETIS' idx_t at once: the int64 rows are not held beside their copy through the call.
    adjacency = list(_as_idx(pm, *keys_to_adjacency(held, m, lo, hi)))  # in place on held; emptied below
    del held
    two = {s: _split_constraints(pm, train[server_of == s], gpus) for s in range(S)}
    with access.released(), group.errors("partitioning servers over GPUs (ParMETIS, one block of ranks each)"):
        try:
            with group.subgroups(mine) as block, block.errors(f"the GPU split of server {mine}"):
                gpu_local[server_of == mine] = _parmetis_split(pm, block, mine, server_of, train, dist,
                                                               adjacency, gpus, seed, two[mine], kinds)
        finally:
            # A block that finishes first waits here asleep, failed or not, before the collectives that
            # follow (Open MPI's blocking collectives spin, and that CPU would count).
            group.idle_barrier()
    return {s: kinds.constraints(two[s], pm.is_scotch) for s in range(rank, S, P)}


def _split_in_turn(group, access, server_of, train, S: int, gpus: int, method: str, seed: int, pm,
                   gpu_local, kinds: _Kinds) -> dict:
    """The servers one after another, each ParMETIS split over all P ranks (gpu_split_dist's balanced
    slices), or METIS on the writer for metis/random and for a server with fewer inner vertices than
    ranks; rounds of P servers, whose METIS splits run together (one per writer)."""
    P, rank = group.size, group.rank
    constraints = {}
    for j in range(-(-S // P)):
        pending = {}
        for s in range(j * P, min((j + 1) * P, S)):
            inner = np.flatnonzero(server_of == s)  # int64 already: no copy
            m, writer = inner.shape[0], s % P
            dist = gpu_split_dist(m, P, method, writer)
            lo, hi = int(dist[rank]), int(dist[rank + 1])
            keys = access.inner_keys(s, inner, dist)
            xadj, adjncy = keys_to_adjacency(keys, m, lo, hi)
            del keys
            if not gpu_split_is_parallel(m, P, method):
                if rank == writer:  # METIS: the writer holds every row
                    pending[s] = (inner, xadj, adjncy)
                continue
            del inner  # 8 B per inner vertex of the server, found again after the call
            adjacency = list(_as_idx(pm, xadj, adjncy))  # not the int64 rows beside their copy in the call
            del xadj, adjncy
            two = _split_constraints(pm, train[server_of == s], gpus)
            with access.released():
                parts = _parmetis_split(pm, group, s, server_of, train, dist, adjacency, gpus, seed, two, kinds)
            gpu_local[server_of == s] = parts
            if rank == writer:
                constraints[s] = kinds.constraints(two, pm.is_scotch)
        with group.errors("partitioning servers over GPUs"):
            for s, (inner, xadj, adjncy) in pending.items():
                gpu_local[inner], constraints[s] = split_gpus(xadj, adjncy, train[inner], gpus, kinds, inner)
        del pending
        group.idle_barrier()  # the ranks without a METIS split here wait, asleep, for those that have one
    return constraints


def split_gpus(xadj: np.ndarray, adjncy: np.ndarray, train: np.ndarray, gpus: int, kinds: _Kinds | None = None,
               inner: np.ndarray | None = None) -> tuple[np.ndarray, list]:
    """METIS split of one server's inner vertices into `gpus` parts, from its symmetric inner adjacency
    (xadj, adjncy) and training mask: balanced on vertices and, when the server has at least one
    training vertex per GPU, on training vertices too.  Returns (gpu of each inner vertex as int32,
    constraints used)."""
    if gpus == 1:
        return np.zeros(train.shape[0], dtype=np.int32), ["vertices"]
    two = int(train.sum()) >= gpus
    kinds = kinds or _Kinds(None, ["vertices"])
    parts, ncon = metis_part(xadj, adjncy, gpus, kinds.weights(train, inner, two))
    parts = fill_empty_parts(parts, gpus)
    return parts.astype(np.int32), constraint_names(ncon, kinds.constraints(False))

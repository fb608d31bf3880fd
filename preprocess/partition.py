"""Two-level partitioning: S servers (ParMETIS, METIS or random), then G GPUs per server (ParMETIS
on each server's own block of P / S ranks, all servers at once, or over all ranks one server after
another; or METIS on one rank).  Every ParMETIS call with P >= 2 sees the graph relabelled in an
order with locality (preprocess/locality.py, part_kway_with_locality), mapped back after it.

Partitioners see the symmetric version of the graph without self loops (u~v if u->v or v->u), which is
what (Par)METIS requires.  The edge cut is computed here on the canonical graph: the number of directed
edges u->v whose endpoints are on different parts (PT-Scotch reports 0).
"""
from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field

import numpy as np

from granndis_hpc.cluster import as_group
from granndis_hpc.graph.csr import csr_rows, owner_of, row_of_edges, segment_rank

from .halo import induced_edges, unique_sorted
from .parmetis import load_parmetis, metis_part, parmetis_part_kway

PARTITIONERS = ("parmetis", "metis", "random")


@dataclass
class ServerPartition:
    parts: np.ndarray  # int32 [N] server of every vertex
    name: str
    library: str
    constraints: list = field(default_factory=list)
    edge_cut: int = 0
    edge_cut_fraction: float = 0.0
    vertex_balance: float = 1.0  # max part size / average
    train_balance: float = 1.0  # max training vertices per part / average
    rebalanced_vertices: int = 0  # moved by refine_balance after the partitioner

    def manifest_entry(self) -> dict:
        return {"name": self.name, "library": self.library, "constraints": list(self.constraints),
                "edge_cut": int(self.edge_cut), "edge_cut_fraction": float(self.edge_cut_fraction),
                "vertex_balance": float(self.vertex_balance), "train_balance": float(self.train_balance),
                "rebalanced_vertices": int(self.rebalanced_vertices)}


def symmetric_adjacency(indptr: np.ndarray, indices: np.ndarray, lo: int, hi: int):
    """(xadj, adjncy) of rows lo..hi-1 of the symmetrised graph without self loops; global column ids.

    Every edge of the slice becomes one int64 key (local row * n + column), built in place: the keys
    of both directions are the largest arrays of the partition phase (at 2.45M vertices, 2 ranks, this
    function held 51 B per edge of the graph and set the build's peak; now 17, same output)."""
    n = indptr.shape[0] - 1
    # In-edges of the slice: row r (local) <- indices[e].
    rows = row_of_edges(indptr[lo:hi + 1] - indptr[lo])
    cols = indices[indptr[lo]:indptr[hi]]
    keep = cols != rows + lo
    key_in = rows[keep]
    del rows
    key_in *= n
    key_in += cols[keep]
    # Out-edges of the slice: edges whose source lies in [lo, hi), found by one pass over all edges;
    # their rows come from a binary search of the edge positions (no edge-sized row array of the graph).
    pos = np.flatnonzero((indices >= lo) & (indices < hi))
    dst = np.searchsorted(indptr, pos, side="right") - 1
    src = indices[pos]
    del pos
    keep = src != dst
    key_out = src[keep]
    del src
    key_out -= lo
    key_out *= n
    key_out += dst[keep]
    del dst, keep
    keys = np.concatenate([key_in, key_out])
    del key_in, key_out
    # The keys' rows are local (lo subtracted above): rows 0..hi-lo-1.
    return keys_to_adjacency(unique_sorted(keys, in_place=True), n, 0, hi - lo)


def edge_cut(indptr: np.ndarray, indices: np.ndarray, parts: np.ndarray) -> int:
    return int(np.count_nonzero(parts[indices] != parts[row_of_edges(indptr)]))


def balance(parts: np.ndarray, nparts: int, weights: np.ndarray | None = None) -> float:
    """max part weight / average part weight (1.0 = perfect)."""
    load = np.bincount(parts, weights=weights, minlength=nparts).astype(np.float64)
    mean = load.sum() / nparts
    return float(load.max() / mean) if mean > 0 else 1.0


def random_partition(n: int, nparts: int, seed: int) -> np.ndarray:
    """Seeded, balanced: part sizes differ by at most one."""
    perm = np.random.default_rng(seed).permutation(n)
    parts = np.empty(n, dtype=np.int64)
    parts[perm] = np.arange(n) % nparts
    return parts


def fill_empty_parts(parts: np.ndarray, nparts: int) -> np.ndarray:
    """(Par)METIS may leave a part empty on tiny or disconnected graphs: give each one vertex of the largest."""
    parts = parts.copy()
    for p in range(nparts):  # loop over parts, not vertices
        load = np.bincount(parts, minlength=nparts)
        if load[p] == 0:
            donor = int(np.argmax(load))
            parts[np.flatnonzero(parts == donor)[-1]] = p
    return parts


def in_neighbour_part_counts(indptr: np.ndarray, indices: np.ndarray, rows: np.ndarray, parts: np.ndarray,
                             nparts: int) -> np.ndarray:
    """int64 [len(rows), nparts]: how many in-neighbours of each row lie in each part."""
    sub_indptr, nbrs = csr_rows(indptr, indices, rows)
    return np.bincount(row_of_edges(sub_indptr) * nparts + parts[nbrs],
                       minlength=rows.shape[0] * nparts).reshape(rows.shape[0], nparts)


def refine_balance(indptr: np.ndarray, indices: np.ndarray, parts: np.ndarray, nparts: int,
                   max_ratio: float = 1.03, rounds: int = 64):
    """refine_balance_with over a whole in-edge CSR (see there)."""
    return refine_balance_with(lambda cand, p: in_neighbour_part_counts(indptr, indices, cand, p, nparts),
                               parts, nparts, max_ratio, rounds)


def refine_balance_with(counts_of, parts: np.ndarray, nparts: int, max_ratio: float = 1.03, rounds: int = 64):
    """Move vertices out of parts above max_ratio x average, best edge-cut gain first.

    PT-Scotch's ParMETIS layer lands at ~5 % vertex imbalance whatever ubvec says (measured on Cora,
    4 parts: 1.046-1.050 for ubvec 1.01-1.05), so this greedy pass brings every part under the cap.
    The gain of moving v from p to q is (#neighbours of v in q) - (#neighbours in p), counted over
    in-edges (the neighbours of a symmetric graph); only vertices with a neighbour in the receiving
    part move while there are any.  Returns (parts, number of vertices moved).
    `counts_of(candidates, parts)` gives those neighbour counts (int64 [len(candidates), nparts]): from
    the whole graph, or collectively from the build ranks' slices (dist_build), with the same result.
    """
    parts = parts.copy()
    n = parts.shape[0]
    cap = max(int(np.floor(max_ratio * n / nparts)), -(-n // nparts))
    moved_total = 0
    for _ in range(rounds):  # usually 1-3 rounds (it stops once balanced), each vectorised over vertices
        load = np.bincount(parts, minlength=nparts)
        over = load > cap
        if not over.any():
            break
        room = np.maximum(cap - load, 0)
        cand = np.flatnonzero(over[parts])
        counts = counts_of(cand, parts)  # neighbour counts per (candidate, part)
        gain = counts - counts[np.arange(cand.shape[0]), parts[cand]][:, None]
        gain[:, room == 0] = np.iinfo(np.int64).min // 2  # only parts with room can receive
        target = np.argmax(gain, axis=1)
        best = gain[np.arange(cand.shape[0]), target]
        ok = room[target] > 0
        # Move only vertices that already have a neighbour in the receiving part (the boundary): a
        # vertex moved into a part it does not touch becomes an island whose whole k-hop ball joins
        # the other server's preload (measured: 1997 such moves raised a 2-hop preload from 1.37 to
        # 1.52 rows per vertex).  Islands only when no boundary vertex is left to move.
        touches = counts[np.arange(cand.shape[0]), target] > 0
        if (ok & touches).any():
            ok &= touches
        cand, target, best = cand[ok], target[ok], best[ok]
        order = np.lexsort((cand, -best))
        cand, target = cand[order], target[order]
        # accept at most `room` per target, then at most `excess` per source, best gain first
        accept = segment_rank(target) < room[target]
        cand, target = cand[accept], target[accept]
        excess = np.maximum(load - cap, 0)
        accept = segment_rank(parts[cand]) < excess[parts[cand]]
        if not accept.any():
            break
        parts[cand[accept]] = target[accept]
        moved_total += int(accept.sum())
    return parts, moved_total


def _weights(train_mask: np.ndarray, two_constraints: bool) -> np.ndarray:
    if not two_constraints:
        return np.ones((train_mask.shape[0], 1), dtype=np.int64)
    return np.stack([np.ones(train_mask.shape[0], dtype=np.int64), train_mask.astype(np.int64)], axis=1)


def _as_idx(pm, xadj: np.ndarray, adjncy: np.ndarray):
    """The adjacency in ParMETIS' idx_t, the int64 arrays dropped: parmetis_part_kway then passes them
    as they are instead of holding a converted copy beside them during the call (8 B per edge less
    with a 32-bit idx_t, at the partition phase's peak)."""
    return xadj.astype(pm.idx_dtype, copy=False), adjncy.astype(pm.idx_dtype, copy=False)


def vtxdist_for(n: int, size: int) -> np.ndarray:
    """Contiguous, balanced slices of the global ids, one per rank."""
    return (np.arange(size + 1, dtype=np.int64) * n) // size


def part_kway_with_locality(pm, group, dist: np.ndarray, graph: list, nparts: int, seed: int,
                            keep: bool = False) -> np.ndarray:
    """parmetis_part_kway on the same graph relabelled by preprocess/locality.locality_order (P >= 2):
    the part of each of this rank's rows dist[rank]..dist[rank+1]-1, in the caller's ids.

    graph: a list [xadj, adjncy, vwgt] of those rows (xadj, adjncy in ParMETIS' idx_t; vwgt int
    [rows, ncon]), emptied here, so that the caller's arrays are freed once the relabelled copy
    exists, before the call.  keep: the caller needs its rows again after the call (the GPU split's
    balance refinement): the list then holds [xadj, adjncy] again on return, the adjacency having
    waited in a temporary file during the call (sliced.spilled; at P = 1 they are the call's own).

    The relabelled graph has the same slices' sizes (dist) but most of its edges inside one slice
    (the 2.45M local graph, P = 8: 21.5 % across slices instead of 87.5 %), and PT-Scotch's work on the
    ghost ends of crossing edges is most of its growth with P (docs/performance/build-scaling.md).  One
    process (P = 1: PT-Scotch is sequential, no ghosts) calls it on the graph as it is.  Costs one
    search (O((V + E) / P) per rank) and one alltoallv of the adjacency and of the weights; during the
    call only the relabelled rows, their weights and this rank's new ids (4 B per row below 2^31
    vertices) are ours, the map of the whole graph (8 B per vertex) and the caller's weights being
    dropped before it (measured by tracing every live array)."""
    xadj, adjncy, vwgt = graph
    graph.clear()
    if group.size == 1:
        parts = parmetis_part_kway(pm, group, dist, xadj, adjncy, nparts, vwgt, seed)
        if keep:
            graph.extend([xadj, adjncy])
        return parts
    from .locality import locality_order, renumbered_adjacency
    from .sliced import spilled

    n, lo, hi = int(dist[-1]), int(dist[group.rank]), int(dist[group.rank + 1])
    adjncy64 = adjncy.astype(np.int64, copy=False)
    new_of_old = locality_order(group, dist, xadj, adjncy64, n)
    nx, na = _as_idx(pm, *renumbered_adjacency(group, dist, xadj, adjncy64, new_of_old, n))
    del adjncy64
    # The weights of the rows each rank holds in the new ids: sent to their owners with their new ids.
    mine = new_of_old[lo:hi].astype(np.int32 if n < 2 ** 31 else np.int64)
    del new_of_old
    order = np.argsort(mine)
    rows = np.concatenate([mine[order, None], np.asarray(vwgt, dtype=np.int64)[order]], axis=1)
    del vwgt
    got = group.alltoallv(rows, np.bincount(owner_of(dist, mine[order]), minlength=group.size))
    del rows, order
    got = got[np.argsort(got[:, 0])]
    weights = np.ascontiguousarray(got[:, 1:], dtype=pm.idx_dtype)
    del got
    kept = _Kept(xadj, adjncy) if keep else None
    del xadj, adjncy
    with spilled(group, kept, ("adjncy",)) if keep else contextlib.nullcontext():
        local = parmetis_part_kway(pm, group, dist, nx, na, nparts, weights, seed)
        del nx, na, weights
    if keep:
        graph.extend([kept.xadj, kept.adjncy])
    return group.allgatherv(local, np.diff(dist))[mine]


@dataclass
class _Kept:
    """The caller's rows that part_kway_with_locality hands back (`adjncy` on disk during the call)."""
    xadj: np.ndarray
    adjncy: np.ndarray | None  # None while on disk


class WholeGraphAccess:
    """What server partitioning reads of a graph, from a whole in-memory Graph (every rank holds it)."""

    def __init__(self, group, graph):
        self.group, self.graph = group, graph
        self.num_vertices, self.num_edges, self.train = graph.num_vertices, graph.num_edges, graph.train_mask

    def adjacency(self, dist: np.ndarray):
        """(xadj, adjncy) of this rank's rows dist[rank]..dist[rank+1]-1 of the symmetric graph."""
        lo, hi = int(dist[self.group.rank]), int(dist[self.group.rank + 1])
        if hi <= lo:
            return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return symmetric_adjacency(self.graph.indptr, self.graph.indices, lo, hi)

    def inner_keys(self, s: int, inner: np.ndarray, dist: np.ndarray) -> np.ndarray:
        """This rank's rows dist[rank]..dist[rank+1]-1 of server s's symmetric inner adjacency (sorted
        distinct keys row*m+col, local ids; split_servers_over_gpus), cut from the whole subgraph's."""
        lo, hi = int(dist[self.group.rank]), int(dist[self.group.rank + 1])
        if hi <= lo:
            return np.zeros(0, dtype=np.int64)
        m = inner.shape[0]
        keys = symmetric_keys(*induced_edges(self.graph.indptr, self.graph.indices, inner), m)
        a, b = np.searchsorted(keys, [lo * m, hi * m])
        return keys[a:b].copy() if (a, b) != (0, keys.shape[0]) else keys

    def released(self):
        """Context for the partitioner's call (dist_build.SlicedAccess moves its slice's edges to disk
        there); the whole graph stays in memory."""
        return contextlib.nullcontext()

    def part_counts(self, cand: np.ndarray, parts: np.ndarray, nparts: int) -> np.ndarray:
        return in_neighbour_part_counts(self.graph.indptr, self.graph.indices, cand, parts, nparts)

    def edge_cut(self, parts: np.ndarray) -> int:
        return edge_cut(self.graph.indptr, self.graph.indices, parts)


def partition_servers(comm, graph, nparts: int, method: str, seed: int) -> ServerPartition:
    """Collective over `comm` (an MPI communicator or a cluster.Group): the server of every vertex,
    identical on every rank.  `graph`: a Graph, or an access object (WholeGraphAccess's methods; the
    distributed build passes dist_build.SlicedAccess, which reads the ranks' slices, same result)."""
    group = as_group(comm)
    access = graph if hasattr(graph, "part_counts") else WholeGraphAccess(group, graph)
    n = access.num_vertices
    train = access.train
    if method not in PARTITIONERS:
        raise ValueError(f"unknown partitioner {method!r}; use one of {PARTITIONERS}")
    if nparts == 1:
        parts, library, constraints = np.zeros(n, dtype=np.int64), "none", ["vertices"]
    elif method == "random":
        parts, library, constraints = random_partition(n, nparts, seed), "numpy", ["vertices"]
    elif method == "metis":
        # Every row to rank 0 (collective for a sliced graph), which runs METIS alone.
        xadj, adjncy = access.adjacency(np.array([0] + [n] * group.size, dtype=np.int64))
        result = None
        with group.errors("METIS partitioning on rank 0"):  # the other ranks would wait in the bcast
            if group.rank == 0:
                use_train = int(train.sum()) >= nparts
                result = metis_part(xadj, adjncy, nparts, _weights(train, use_train))
        del xadj, adjncy
        parts, ncon = group.bcast_object(result)
        library = "metis (pymetis)"
        constraints = ["vertices", "train"][:ncon]
    else:
        vtxdist = vtxdist_for(n, group.size)
        with group.errors("ParMETIS partitioning"):  # a rank without the library must not hang the others
            pm = load_parmetis()
            lo, hi = int(vtxdist[group.rank]), int(vtxdist[group.rank + 1])
            # PT-Scotch ignores a second constraint (docs/design.md §8): balance vertices only there.
            two = (not pm.is_scotch) and int(train.sum()) >= nparts
        # Emptied by the call (its docstring): not held here through it.
        graph = [*_as_idx(pm, *access.adjacency(vtxdist)), _weights(train[lo:hi], two)]
        # Collective inside the library: every rank reaches it (or none, after the check above); a
        # non-OK return code is agreed on before the allgather below.
        with access.released(), group.errors("ParMETIS_V3_PartKway"):
            local = part_kway_with_locality(pm, group, vtxdist, graph, nparts, seed)
        parts = group.allgatherv(local, np.diff(vtxdist))
        library = pm.describe()
        constraints = ["vertices", "train"] if two else ["vertices"]
    parts = fill_empty_parts(np.asarray(parts, dtype=np.int64), nparts)
    parts, moved = refine_balance_with(lambda cand, p: access.part_counts(cand, p, nparts), parts, nparts)
    cut = access.edge_cut(parts)
    return ServerPartition(
        parts=parts.astype(np.int32), name=method, library=library, constraints=constraints, edge_cut=cut,
        rebalanced_vertices=moved,
        edge_cut_fraction=cut / max(access.num_edges, 1), vertex_balance=balance(parts, nparts),
        train_balance=balance(parts, nparts, train.astype(np.float64)))


def partition_digest(server_of: np.ndarray, gpu_of: np.ndarray, servers: int, gpus_per_server: int) -> str:
    """sha256 (hex) of a two-level partition, independent of timestamps, paths and file layout.

    Hashed: servers and gpus_per_server as two little-endian int64, then the owner (global rank
    server * gpus_per_server + gpu) of every vertex in global-id order as little-endian int32.  Two
    builds have the same digest exactly when every vertex is inner on the same GPU of the same server.
    """
    owner = np.asarray(server_of, dtype=np.int64) * int(gpus_per_server) + np.asarray(gpu_of, dtype=np.int64)
    h = hashlib.sha256(np.array([servers, gpus_per_server], dtype="<i8").tobytes())
    h.update(owner.astype("<i4").tobytes())
    return h.hexdigest()


def symmetric_keys(src: np.ndarray, dst: np.ndarray, m: int) -> np.ndarray:
    """Sorted distinct keys row*m+col of the symmetric adjacency (no self loops) of edges src -> dst
    among m vertices (local ids)."""
    keep = src != dst
    src, dst = src[keep], dst[keep]
    return unique_sorted(np.concatenate([dst * m + src, src * m + dst]), in_place=True)


def adjacency_from_keys(keys: np.ndarray, m: int):
    """(xadj, adjncy) of the sorted distinct keys row*m+col."""
    rows, cols = np.divmod(keys, m)
    xadj = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=m), out=xadj[1:])
    return xadj, cols


def induced_symmetric(indptr: np.ndarray, indices: np.ndarray, vertices: np.ndarray):
    """Symmetric adjacency (no self loops) of the subgraph induced on `vertices`, in local ids."""
    m = vertices.shape[0]
    return adjacency_from_keys(symmetric_keys(*induced_edges(indptr, indices, vertices), m), m)


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


def keys_to_adjacency(keys: np.ndarray, m: int, lo: int, hi: int):
    """(xadj, adjncy) of rows lo..hi-1 from their sorted distinct keys row*m+col (in place on keys)."""
    xadj = np.searchsorted(keys, np.arange(lo, hi + 1, dtype=np.int64) * m).astype(np.int64)
    np.remainder(keys, m, out=keys)
    return xadj, keys


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
        constraints = _split_concurrently(group, access, server_of, train, gpus, seed, pm, bounds, gpu_local)
    else:
        constraints = _split_in_turn(group, access, server_of, train, S, gpus, method, seed, pm, gpu_local)
    return group.allreduce_max(gpu_local).astype(np.int32), constraints


def _split_constraints(pm, train_inner: np.ndarray, gpus: int) -> bool:
    """Whether a server's ParMETIS split balances training vertices too (Karypis' ParMETIS only)."""
    return (not pm.is_scotch) and int(train_inner.sum()) >= gpus


def _parmetis_split(pm, group, s: int, server_of, train, dist, adjacency: list, gpus: int, seed: int,
                    two: bool) -> np.ndarray:
    """Collective over `group` (the ranks dist slices server s's m inner rows over, in its ranks'
    numbering): ParMETIS on this rank's rows dist[rank]..dist[rank+1]-1 (adjacency: a list [xadj,
    adjncy] in ParMETIS' idx_t (_as_idx), local row ids, local column ids, emptied here: the rows wait on disk during the call,
    part_kway_with_locality's `keep`), empty parts filled, then the balance refinement over the same
    slices.  Returns the GPU of each of the m inner vertices (on every rank of `group`)."""
    lo, hi = int(dist[group.rank]), int(dist[group.rank + 1])
    graph = [*adjacency, _weights(train[np.flatnonzero(server_of == s)[lo:hi]], two)]
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


def _split_concurrently(group, access, server_of, train, gpus: int, seed: int, pm, bounds, gpu_local) -> dict:
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
                                                               adjacency, gpus, seed, two[mine])
        finally:
            # A block that finishes first waits here asleep, failed or not, before the collectives that
            # follow (Open MPI's blocking collectives spin, and that CPU would count).
            group.idle_barrier()
    return {s: ["vertices", "train"] if two[s] else ["vertices"] for s in range(rank, S, P)}


def _split_in_turn(group, access, server_of, train, S: int, gpus: int, method: str, seed: int, pm,
                   gpu_local) -> dict:
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
                parts = _parmetis_split(pm, group, s, server_of, train, dist, adjacency, gpus, seed, two)
            gpu_local[server_of == s] = parts
            if rank == writer:
                constraints[s] = ["vertices", "train"] if two else ["vertices"]
        with group.errors("partitioning servers over GPUs"):
            for s, (inner, xadj, adjncy) in pending.items():
                gpu_local[inner], constraints[s] = split_gpus(xadj, adjncy, train[inner], gpus)
        del pending
        group.idle_barrier()  # the ranks without a METIS split here wait, asleep, for those that have one
    return constraints


def split_gpus(xadj: np.ndarray, adjncy: np.ndarray, train: np.ndarray, gpus: int) -> tuple[np.ndarray, list]:
    """METIS split of one server's inner vertices into `gpus` parts, from its symmetric inner adjacency
    (xadj, adjncy) and training mask: balanced on vertices and, when the server has at least one
    training vertex per GPU, on training vertices too.  Returns (gpu of each inner vertex as int32,
    constraints used)."""
    if gpus == 1:
        return np.zeros(train.shape[0], dtype=np.int32), ["vertices"]
    two = int(train.sum()) >= gpus
    parts, ncon = metis_part(xadj, adjncy, gpus, _weights(train, two))
    parts = fill_empty_parts(parts, gpus)
    return parts.astype(np.int32), ["vertices", "train"][:ncon]

"""Two-level partitioning: S servers (ParMETIS, METIS or random), then G GPUs per server (ParMETIS
on each server's own block of P / S ranks, all servers at once, or over all ranks one server after
another; or METIS on one rank).  Every ParMETIS call with P >= 2 sees the graph relabelled in an
order with locality (preprocess/partition/locality.py, part_kway_with_locality), mapped back after it.

Partitioners see the symmetric version of the graph without self loops (u~v if u->v or v->u), which is
what (Par)METIS requires.  The edge cut is computed here on the canonical graph: the number of directed
edges u->v whose endpoints are on different parts (PT-Scotch reports 0).
"""
from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field

import numpy as np

from granndis_hpc.graph.csr import csr_rows, owner_of, row_of_edges, segment_rank

from granndis_hpc.preprocess.build.halo import induced_edges, unique_sorted
from granndis_hpc.preprocess.partition.locality import locality_order, renumbered_adjacency
from granndis_hpc.preprocess.partition.metis import metis_part
from granndis_hpc.preprocess.partition.parmetis import load_parmetis, parmetis_part_kway
from granndis_hpc.preprocess.build.slices import keys_to_adjacency, spilled, vtxdist_for

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

    def log_line(self, row_block_rows: int, blocks_s: float) -> str:
        """The build's partition phase line: this partition's quality and the locality blocks' time."""
        return (f"{self.name}: edge cut {self.edge_cut} ({100 * self.edge_cut_fraction:.2f}% of edges), vertex "
                f"balance {self.vertex_balance:.3f}, train balance {self.train_balance:.3f}"
                + (f"; locality blocks of {row_block_rows} rows {blocks_s:.2f} s" if row_block_rows else ""))


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


def _weights(train_mask: np.ndarray, two_constraints: bool, vertex_type: np.ndarray | None = None,
             num_types: int = 1) -> np.ndarray:
    """ParMETIS/METIS vertex weights [n, ncon]: one column of ones (every vertex counts), or, for a
    heterogeneous graph (`vertex_type`: each row's type index of `num_types`), one 0/1 column per vertex
    type, so that each type is balanced on its own; then the training vertices' column when
    `two_constraints`."""
    n = train_mask.shape[0]
    if vertex_type is None:
        cols = np.ones((n, 1), dtype=np.int64)
    else:
        cols = (np.asarray(vertex_type)[:, None] == np.arange(int(num_types))[None, :]).astype(np.int64)
    if not two_constraints:
        return cols
    return np.concatenate([cols, train_mask.astype(np.int64)[:, None]], axis=1)


class VertexTypeOfIds:
    """Each vertex's type index, computed from its global id when indexed (types own id ranges:
    granndis_hpc/graph/hetero.py), so that no per-vertex array is held: ``kinds[lo:hi]`` or
    ``kinds[ids]``."""

    def __init__(self, types):
        self.types = types

    def __getitem__(self, index) -> np.ndarray:
        if isinstance(index, slice):
            index = np.arange(*index.indices(self.types.num_vertices), dtype=np.int64)
        return self.types.vertex_type(index)


def typed_rows(types) -> tuple:
    """(each vertex's type index, a VertexTypeOfIds, and the vertex constraints' names) of a graph with
    `types` (GraphTypes), or (None, ["vertices"]) of a homogeneous one."""
    if types is None or types.num_types < 2:
        return None, ["vertices"]
    return VertexTypeOfIds(types), [f"vertices:{t}" for t in types.names]


def constraint_names(ncon: int, vertex_names: list) -> list:
    """The names of the first `ncon` constraints: the vertex columns, then train."""
    return (list(vertex_names) + ["train"])[:ncon]


def _as_idx(pm, xadj: np.ndarray, adjncy: np.ndarray):
    """The adjacency in ParMETIS' idx_t, the int64 arrays dropped: parmetis_part_kway then passes them
    as they are instead of holding a converted copy beside them during the call (8 B per edge less
    with a 32-bit idx_t, at the partition phase's peak)."""
    return xadj.astype(pm.idx_dtype, copy=False), adjncy.astype(pm.idx_dtype, copy=False)


def part_kway_with_locality(pm, group, dist: np.ndarray, graph: list, nparts: int, seed: int,
                            keep: bool = False) -> np.ndarray:
    """parmetis_part_kway on the same graph relabelled by preprocess/locality.locality_order (P >= 2):
    the part of each of this rank's rows dist[rank]..dist[rank+1]-1, in the caller's ids.

    graph: a list [xadj, adjncy, vwgt] of those rows (xadj, adjncy in ParMETIS' idx_t; vwgt int
    [rows, ncon]), emptied here, so that the caller's arrays are freed once the relabelled copy
    exists, before the call.  keep: the caller needs its rows again after the call (the GPU split's
    balance refinement): the list then holds [xadj, adjncy] again on return, the adjacency having
    waited in a temporary file during the call (slices.spilled; at P = 1 they are the call's own).

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
        self.vertex_type, self.vertex_names = typed_rows(getattr(graph, "types", None))

    def adjacency(self, dist: np.ndarray):
        """(xadj, adjncy) of this rank's rows dist[rank]..dist[rank+1]-1 of the symmetric graph."""
        lo, hi = int(dist[self.group.rank]), int(dist[self.group.rank + 1])
        if hi <= lo:
            return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return symmetric_adjacency(self.graph.indptr, self.graph.indices, lo, hi)

    def inner_keys(self, s: int, inner: np.ndarray, dist: np.ndarray, labels: np.ndarray | None = None) -> np.ndarray:
        """This rank's rows dist[rank]..dist[rank+1]-1 of server s's symmetric inner adjacency (sorted
        distinct keys row*m+col, local ids; split_servers_over_gpus), cut from the whole subgraph's.
        `inner` (the vertices labelled s: of server s, or of part s for row_blocks) says it all here."""
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
    from granndis_hpc.cluster import as_group  # on use: `preprocess --help`, info and verify start no MPI

    group = as_group(comm)
    access = graph if hasattr(graph, "part_counts") else WholeGraphAccess(group, graph)
    n = access.num_vertices
    train = access.train
    # A heterogeneous graph balances each vertex type (one constraint column each, from the access).
    vtype, vnames = getattr(access, "vertex_type", None), getattr(access, "vertex_names", ["vertices"])
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
                kinds = None if vtype is None else vtype[0:n]
                result = metis_part(xadj, adjncy, nparts, _weights(train, use_train, kinds, len(vnames)))
        del xadj, adjncy
        parts, ncon = group.bcast_object(result)
        library = "metis (pymetis)"
        constraints = constraint_names(ncon, vnames)
    else:
        vtxdist = vtxdist_for(n, group.size)
        with group.errors("ParMETIS partitioning"):  # a rank without the library must not hang the others
            pm = load_parmetis()
            lo, hi = int(vtxdist[group.rank]), int(vtxdist[group.rank + 1])
            # PT-Scotch ignores a second constraint (docs/design.md §8): balance vertices only there.
            two = (not pm.is_scotch) and int(train.sum()) >= nparts
        # Emptied by the call (its docstring): not held here through it.
        if pm.is_scotch:
            vtype, vnames = None, ["vertices"]
        graph = [*_as_idx(pm, *access.adjacency(vtxdist)),
                 _weights(train[lo:hi], two, None if vtype is None else vtype[lo:hi], len(vnames))]
        # Collective inside the library: every rank reaches it (or none, after the check above); a
        # non-OK return code is agreed on before the allgather below.
        with access.released(), group.errors("ParMETIS_V3_PartKway"):
            local = part_kway_with_locality(pm, group, vtxdist, graph, nparts, seed)
        parts = group.allgatherv(local, np.diff(vtxdist))
        library = pm.describe()
        constraints = constraint_names(len(vnames) + two, vnames)
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

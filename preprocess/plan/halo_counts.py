"""`preprocess plan` and `build --hops auto` from the build ranks' slices: every candidate set's row
counts without the whole graph, and without a server's edges, on any rank -- except the
co-batch samples (`count_build`), drawn on the server's graph assembled on its writer rank.

plan_sets.plan_options builds each candidate k-hop set on the whole graph (build.build_server, one
server per rank) and hands its arrays to the memory model.  The model reads only counts of those
arrays (memory_model/arrays.py HopCounts and WorldCounts); here the ranks count them together from
their slices of the canonical in-edge CSR (sliced.GraphSlice), with the distributed build's own steps:

* the partition: partition.partition_servers on dist_build.SlicedAccess and
  gpu_split.split_servers_over_gpus, as run_build_sliced partitions (the same server and GPU of every
  vertex as the whole-graph build, tests/mpi/test_dist_build.py);
* the halo of server s: dist_server.select_halo, the distributed BFS the sliced build expands halos
  with, run once to the deepest candidate; a k-hop preload is its truncation to hop <= k (a full BFS
  reaches a vertex at the same hop whatever the depth asked);
* the owner GPUs of each k-hop set: dist_server.assign_owners_sliced (owners depend on k: the
  rebalancing sees the k-hop rows);
* the counts: every rank counts, on its own rows of the set, the in-edges from inside the set (by
  owner and hop) and the distinct (reading GPU, source row) pairs across GPUs, shuffled to the owner of
  the source row to drop duplicates (one alltoallv); the histograms are summed (allreduce).  The world
  view (inner rows, the same for every k) is counted once for all servers the same way, with
  (reading rank, source) pairs.
* the EAS build and the one build of `plan --hops H` (`count_build`): the same steps with the build's
  own EAS selection (select_halo with preload eas); their co-batch options (cob) sample the first
  co-batch as the run does (memory_model.cobatch_server_arrays) on the server's file graph without
  features, which dist_server.server_graph assembles on the writer rank s % P from the rows' owners
  (the file's graph/indptr and graph/indices, made by the code that writes them); only the sample's
  counts (a few integers per GPU) leave the writer.

Memory per rank: its slice, the O(V) per-vertex arrays the sliced build keeps (server, GPU, in-degree,
train mask; hop and owner of the server being counted: 2 B per vertex) and the pair keys of its own
rows' in-edges (at most 8 B per edge of the slice, on the sender and again on the receiver; made in
blocks of EDGES_PER_BLOCK in-edges, de-duplicated per block).  Every rank gets every count, so every
rank ranks the options alike (no gather, no broadcast of the decision).  With co-batches the writer of
server s also holds that server's induced subgraph (8 B per edge and row) while it samples.  Measured:
docs/performance/hops-auto.md, docs/performance/build-scaling.md ("`preprocess plan` with EAS ...").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from granndis_hpc import memory_model as mm
from granndis_hpc.cluster import as_group
from granndis_hpc.graph.csr import csr_rows, row_of_edges

from granndis_hpc.preprocess.plan.build_memory import ServerLoad
from granndis_hpc.preprocess.build.distributed import SlicedAccess
from granndis_hpc.preprocess.build.dist_server import assign_owners_sliced, order_by_hop, select_halo
from granndis_hpc.preprocess.build.halo import unique_sorted
from granndis_hpc.preprocess.partition.gpu_split import split_servers_over_gpus
from granndis_hpc.preprocess.partition.twolevel import partition_servers
from granndis_hpc.preprocess.partition.row_blocks import part_of, row_blocks
from granndis_hpc.preprocess.build.slices import shuffle_to_owners


# In-edges handled per block when making pair keys: the temporaries stay ~40 B x this (160 MiB) whatever
# the slice, so a rank's peak is its slice plus the kept keys (8 B per distinct pair), not 5x its edges.
EDGES_PER_BLOCK = 1 << 22


def _pair_keys(part, rows: np.ndarray, pairs, width: int) -> np.ndarray:
    """Sorted distinct keys src*width + reader made from the in-edges of this rank's local `rows`
    (sorted), block by block: pairs(block rows, row index of each edge in the block, sources) ->
    (sources kept, their readers < width)."""
    deg = np.diff(part.indptr)[rows]
    cum = np.cumsum(deg)
    total = int(cum[-1]) if cum.size else 0
    cuts = np.concatenate([[0], np.searchsorted(cum, np.arange(1, -(-total // EDGES_PER_BLOCK)) * EDGES_PER_BLOCK),
                           [rows.shape[0]]]).astype(np.int64)
    out = []
    for a, b in zip(cuts[:-1], cuts[1:]):  # loop over blocks of rows, not over vertices
        block = rows[a:b]
        sub_indptr, src = csr_rows(part.indptr, part.indices, block)
        src, reader = pairs(block, row_of_edges(sub_indptr), src)
        keys = src.astype(np.int64) * width
        keys += reader
        del src, reader
        out.append(unique_sorted(keys, in_place=True))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _distinct_on_owner(group, part, keys: np.ndarray, width: int) -> np.ndarray:
    """Collective: the distinct keys src*width + reader over all ranks, each on the rank owning `src`
    (sorted there)."""
    return unique_sorted(shuffle_to_owners(group, keys, part.vtxdist, width), in_place=True)


def world_view_counts(group, part, server_of: np.ndarray, gpu_of: np.ndarray, S: int, G: int,
                      degree: np.ndarray, train: np.ndarray, keep: np.ndarray = None, pairs: bool = True):
    """Collective: (WorldCounts of every rank r = s*G + g, world_sent[r], n_train[r]) for all servers.

    A rank's world view holds its inner rows and their in-edges; its halo is the distinct sources owned
    by another rank (shard_rows' (owner rank, global id) pairs: the owner is a function of the id).
    keep: the world view of the graph induced by these vertices (every vertex when None); `degree` is
    then every vertex's in-degree within it.  pairs: whether to count the PeerCounts too (the partial
    payloads'; None where not)."""
    W = S * G
    rank_of = server_of.astype(np.int64) * G + gpu_of

    def remote(block, row, src):
        reader = rank_of[block + part.lo][row]
        other = rank_of[src] != reader
        if keep is not None:
            other &= keep[src]
        return src[other], reader[other]

    rows = np.arange(part.hi - part.lo, dtype=np.int64)
    keys = _pair_keys(part, rows if keep is None else rows[keep[part.lo:part.hi]], remote, W)
    got = _distinct_on_owner(group, part, keys, W)
    del keys
    u, r = got // W, got % W
    del got
    halo = np.bincount(r, minlength=W)
    across = server_of[u] != r // G
    inter = np.bincount(r[across], minlength=W)
    # The per-server route: of each row's readers on another server, the one that relays it (keys sorted
    # by row, then reader: a row's readers on one server are consecutive).
    u_x, key = u[across], u[across] * S + r[across] // G
    relayed = mm.relayed_by(key, u_x)
    once = np.bincount(r[across][relayed], minlength=W)
    peers = _peer_counts(group, part, rank_of, W, u, r, across, relayed, keep) if pairs else None
    sent = np.bincount(rank_of[u], minlength=W)
    first = np.ones(key.size, dtype=bool)  # and its send list on that route: a row once per reading server
    first[1:] = key[1:] != key[:-1]
    sent_once = np.bincount(rank_of[u[~across]], minlength=W) + np.bincount(rank_of[u_x[first]], minlength=W)
    del u, r, u_x, key
    halo, inter, once, sent, sent_once = np.split(group.allreduce_sum(
        np.concatenate([halo, inter, once, sent, sent_once]).astype(np.int64)), 5)
    if keep is not None:
        rank_of, degree, train = rank_of[keep], degree[keep], train[keep]
    n_inner = np.bincount(rank_of, minlength=W)
    nnz = np.bincount(rank_of, weights=degree, minlength=W).astype(np.int64)
    n_train = np.bincount(rank_of[train], minlength=W)
    world = [mm.WorldCounts(n_inner=int(n_inner[x]), nnz=int(nnz[x]), n_halo=int(halo[x]),
                            inter_halo=int(inter[x]), inter_once=int(once[x]), sent_once=int(sent_once[x]),
                            peers=None if peers is None else peers[x])
             for x in range(W)]  # loop over ranks
    return world, sent, n_train


def _peer_counts(group, part, rank_of: np.ndarray, W: int, u: np.ndarray, r: np.ndarray, across: np.ndarray,
                 relayed: np.ndarray, keep: Optional[np.ndarray] = None) -> List[mm.PeerCounts]:
    """Collective: every rank's memory_model.PeerCounts (fb's partial payloads, memory_model/payload.py), as
    shard_rows counts them from a set: from the distinct (row u, reading rank r) pairs this rank owns the
    rows and the relayed rows per (reader, owner); from its slice's in-edges the edges and the distinct
    (destination row, owner of a source) per (reader, owner); keep: of the graph induced by these vertices."""
    rows = np.bincount(r * W + rank_of[u], minlength=W * W)
    once = np.bincount(r[across][relayed] * W + rank_of[u[across]][relayed], minlength=W * W)
    edges = np.zeros(W * W, dtype=np.int64)

    def reached(block, row, src):
        reader, owner = rank_of[block + part.lo][row], rank_of[src]
        other = owner != reader
        if keep is not None:
            other &= keep[src]
        np.add(edges, np.bincount(reader[other] * W + owner[other], minlength=W * W), out=edges)
        return (block + part.lo)[row][other], owner[other]
    local = np.arange(part.hi - part.lo, dtype=np.int64)
    keys = _pair_keys(part, local if keep is None else local[keep[part.lo:part.hi]], reached, W)  # row x W + owner
    partials = np.bincount(rank_of[keys // W] * W + keys % W, minlength=W * W)
    total = group.allreduce_sum(np.concatenate([rows, partials, once, edges]).astype(np.int64))
    rows, partials, once, edges = (m.reshape(W, W) for m in np.split(total, 4))
    return [mm.PeerCounts(*(tuple(int(c) for c in m[x]) for m in (rows, partials, once, edges))) for x in range(W)]


def owned_rows(group, part, hop_of: np.ndarray, gpu_of: np.ndarray, G: int):
    """Collective: (global id, hop, owner GPU) of the server's rows `hop_of` >= 0, in (hop, id) order:
    the build's owner assignment (dist_server.assign_owners_sliced)."""
    verts, hops = order_by_hop(hop_of)
    return verts, hops, assign_owners_sliced(group, part, hop_of, verts, hops, gpu_of, G)


def server_hop_counts_sliced(group, part, hop_of: np.ndarray, gpu_of: np.ndarray, G: int,
                             owned=None) -> List[mm.HopCounts]:
    """Collective: memory_model.server_hop_counts of every GPU of the set whose rows are `hop_of` >= 0
    (the same dense array on every rank), from the slices.  owned: `owned_rows` of it, if made already."""
    n, lo = part.num_vertices, part.lo
    verts, hops, owner = owned if owned is not None else owned_rows(group, part, hop_of, gpu_of, G)
    width = int(hops.max(initial=0)) + 1
    own = np.bincount(owner.astype(np.int64) * width + hops, minlength=G * width).reshape(G, width)
    owner_of = np.full(n, -1, dtype=np.int8 if G < 128 else np.int32)
    owner_of[verts] = owner
    del verts, hops, owner
    nnz = np.zeros(G * width, dtype=np.int64)

    def crossing(block, row, src):
        """Counts the block's in-edges from inside the server by (owner, hop) of their row; returns
        the (source row, reading GPU) pairs of the edges that cross GPUs inside the server."""
        inside = hop_of[src] >= 0
        cell = owner_of[block + lo].astype(np.int64) * width + hop_of[block + lo]
        nnz[:] += np.bincount(cell[row[inside]], minlength=G * width)
        g_edge = owner_of[block + lo][row]
        cross = inside & (owner_of[src] != g_edge)
        return src[cross], g_edge[cross]

    keys = _pair_keys(part, np.flatnonzero(hop_of[lo:part.hi] >= 0), crossing, G)
    got = _distinct_on_owner(group, part, keys, G)
    del keys
    src, reader = got // G, (got % G).astype(np.int64)
    del got
    h_src = hop_of[src].astype(np.int64)
    halo = np.bincount(reader * width + h_src, minlength=G * width)
    sent = np.bincount(owner_of[src].astype(np.int64) * width + h_src, minlength=G * width)
    summed = group.allreduce_sum(np.concatenate([nnz, halo, sent]).astype(np.int64))
    nnz, halo, sent = (a.reshape(G, width) for a in np.split(summed, 3))
    return [mm.HopCounts(own=own[g], nnz=nnz[g], halo=halo[g], sent=sent[g]) for g in range(G)]


@dataclass
class Prepared:
    """What every set of a sliced plan shares: the partition and the world view's counts."""

    degree: np.ndarray  # in-degree of every vertex
    train: np.ndarray  # train mask of every vertex
    partition: object  # partition.partition_servers' result
    server_of: np.ndarray
    gpu_of: np.ndarray  # the GPU of every vertex in its server
    world: List[mm.WorldCounts]  # of every rank r = s*G + g
    world_sent: np.ndarray
    n_train: np.ndarray  # inner training vertices of every rank
    servers: int
    gpus: int
    block: np.ndarray | None = None  # the locality block of every vertex (row_blocks; None: id order)

    def min_train(self) -> int:
        """The smallest server's inner training vertices (modes.SetArrays.min_train)."""
        return int(np.bincount(self.server_of[self.train], minlength=self.servers).min())

    def rows(self, counts, layers: int, k: int, features: int, num_classes: int) -> List[mm.RankRows]:
        """RankRows of every rank with k preloaded layers on the server views `counts` (rank order)."""
        return [mm.rank_rows(r, int(self.n_train[r]), self.world[r], int(self.world_sent[r]),
                             counts[r] if k > 0 else None, layers, k, features, num_classes)
                for r in range(self.servers * self.gpus)]  # loop over ranks


def prepare(group, part, servers: int, gpus: int, partitioner: str, seed: int, row_block_rows: int = 0) -> Prepared:
    """Collective: the build's two-level partition from the slices (as dist_build.run_build_sliced
    partitions), its locality blocks (the files' row order, which the co-batch sampler draws in) and the
    world view's counts; the same on every rank."""
    group = as_group(group)
    S, G = int(servers), int(gpus)
    rows = np.diff(part.vtxdist)
    degree = group.allgatherv_rows(np.diff(part.indptr), rows)
    masks = {f: group.allgatherv_rows(getattr(part, f), rows) for f in ("train_mask", "val_mask", "test_mask")}
    access = SlicedAccess(group, part, masks["train_mask"])
    sp = partition_servers(group, access, S, partitioner, seed)
    server_of = access.server_of = sp.parts
    gpu_of, _ = split_servers_over_gpus(group, access, server_of, masks["train_mask"], G, partitioner, seed)
    block = row_blocks(group, access, part_of(server_of, gpu_of, G), S * G, row_block_rows)
    world, world_sent, n_train = world_view_counts(group, part, server_of, gpu_of, S, G, degree, masks["train_mask"])
    return Prepared(degree=degree, train=masks["train_mask"], partition=sp, server_of=server_of, gpu_of=gpu_of,
                    world=world, world_sent=world_sent, n_train=n_train, servers=S, gpus=G, block=block)


def server_order(group, S: int) -> List[int]:
    """The servers in the order plan_sets gathers them (rank s % P's servers, rank by rank)."""
    return sorted(range(S), key=lambda x: (x % group.size, x))


@dataclass
class Counted:
    """What full_preload_rows counts."""

    rows: Dict[int, List[mm.RankRows]]  # k -> RankRows of every rank (memory_model.shard_rows' on the set)
    loads: Dict[int, List[ServerLoad]]  # k >= 1 -> each server's rows and their in-edges (build_memory)
    partition: object  # partition.partition_servers' result
    gpu_of: np.ndarray  # the GPU of every vertex in its server
    counts: Dict[int, List[mm.HopCounts]] = None  # k >= 1 -> the server view of every rank (the k-hop file)
    induced: Dict[int, List[mm.HopCounts]] = None  # k >= 1 -> `induced`'s server views of every rank


def full_preload_rows(group, part, servers: int, gpus: int, layers: int, ks: Sequence[int], partitioner: str,
                      seed: int, features: int, num_classes: int, prep: Prepared = None, induced=None) -> Counted:
    """Collective: the Counted full preloads of the depths `ks` (k = 0: fb's world view), one build per
    depth; the same on every rank.  prep: `prepare`'s result, if made already.  induced(file hop_of,
    owned_rows of it, [k]) -> {k: HopCounts of the server's GPUs}: views derived from each k-hop file
    (preprocess/plan/induced_counts.py), kept in Counted.induced."""
    from granndis_hpc.preprocess.build.pipeline import BuildConfig

    group = as_group(group)
    S, G = int(servers), int(gpus)
    prep = prep or prepare(group, part, S, G, partitioner, seed)
    server_of, gpu_of, degree = prep.server_of, prep.gpu_of, prep.degree
    deepest = max([int(k) for k in ks] + [0])
    counts: Dict[int, List[mm.HopCounts]] = {k: [] for k in ks if k > 0}
    loads: Dict[int, List[ServerLoad]] = {k: [] for k in counts}
    derived: Dict[int, List[mm.HopCounts]] = {k: [] for k in counts}
    for s in range(S) if counts else ():  # (fb alone reads the world view only)
        inner = np.flatnonzero(server_of == s).astype(np.int64)
        hop_of = select_halo(group, part, inner, BuildConfig(out="", servers=S, gpus_per_server=G, layers=layers,
                                                             preload="full", hops=max(deepest, 1)))
        reached, last, last_k = int(hop_of.max(initial=0)), None, 0
        for k in sorted(counts):
            # Past the depth the BFS reached, a deeper preload is the same set (plan_sets reuses it too).
            if last is None or min(k, reached) != min(last_k, reached):
                truncated = np.where(hop_of <= k, hop_of, -1).astype(hop_of.dtype)
                rows_in = truncated >= 0
                load = ServerLoad(server=s, rows=int(np.count_nonzero(rows_in)),
                                  fetched_edges=int(degree[rows_in].sum()))
                owned = owned_rows(group, part, truncated, gpu_of, G)
                last, last_k = server_hop_counts_sliced(group, part, truncated, gpu_of, G, owned=owned), k
                del rows_in
            counts[k].extend(last)
            loads[k].append(load)
            if induced is not None:  # (an induced preload may grow past the depth the full one saturates at)
                derived[k].extend(induced(truncated, owned, [k])[k])
        del hop_of
    out = {k: prep.rows(counts.get(k), layers, k, features, num_classes) for k in ks}
    order = server_order(group, S)
    return Counted(rows=out, loads={k: [v[x] for x in order] for k, v in loads.items()}, partition=prep.partition,
                   gpu_of=gpu_of, counts=counts, induced=derived if induced is not None else None)


@dataclass
class CountedBuild:
    """One build (every server) counted from the slices: what one shard set's file would hold."""

    counts: List[mm.HopCounts]  # the server view of every rank r = s*G + g
    loads: List[ServerLoad]  # every server's rows and their in-edges, in server_order
    cobatches: Dict[int, Dict[int, tuple]]  # b -> memory_model.cobatch_counts of the first co-batch
    induced: Dict[int, List[mm.HopCounts]] = None  # k -> `induced`'s server views of every rank
    setup: Dict[int, object] = None  # server -> its co-batch set-up timed (count_build's time_setup)


def count_build(group, part, prep: Prepared, bcfg, layers: int, batches: Sequence[int] = (),
                sampling: mm.Sampling = None, induced=None, induced_ks: Sequence[int] = (),
                sampled_graph=None, time_setup=None) -> CountedBuild:
    """Collective: the build `bcfg` (preload full or eas, its hops) counted server by server with the
    sliced build's own steps: the halo (dist_server.select_halo: the k-hop BFS, or the EAS selection),
    the owners (dist_server.assign_owners_sliced), the server view's counts (server_hop_counts_sliced).

    For each co-batch count in `batches`, the first co-batch is sampled as the run samples it
    (memory_model.cobatch_server_arrays): the sampler draws from the server's whole subgraph, so that
    graph (no features, no world view) is assembled on the server's writer rank s % P
    (dist_server.server_graph) and only the sample's counts leave it; sampled_graph(graph) -> the graph
    sampled (an inductive run's: its train-induced edges).  induced, induced_ks: as full_preload_rows'
    hook, for each depth in induced_ks (CountedBuild.induced).  time_setup(server, graph) -> a co-batch's
    set-up timed on the server's graph (plan/cobatch_setup.py), called on the writer, one server at a time
    (the others wait in the next server's collectives): CountedBuild.setup, every server's."""
    from granndis_hpc.preprocess.build.dist_server import in_file_order, server_graph

    group = as_group(group)
    S, G = prep.servers, prep.gpus
    counts: List[mm.HopCounts] = []
    loads: Dict[int, ServerLoad] = {}
    mine: Dict[int, Dict[int, tuple]] = {int(b): {} for b in batches}
    derived: Dict[int, List[mm.HopCounts]] = {}
    timed: Dict[int, object] = {}
    for s in range(S):
        inner = np.flatnonzero(prep.server_of == s).astype(np.int64)
        hop_of = select_halo(group, part, inner, bcfg)
        rows_in = hop_of >= 0
        loads[s] = ServerLoad(server=s, rows=int(np.count_nonzero(rows_in)),
                              fetched_edges=int(prep.degree[rows_in].sum()))
        del rows_in
        owned = owned_rows(group, part, hop_of, prep.gpu_of, G)
        counts.extend(server_hop_counts_sliced(group, part, hop_of, prep.gpu_of, G, owned=owned))
        if induced is not None:
            for k, per_gpu in induced(hop_of, owned, induced_ks).items():
                derived.setdefault(k, []).extend(per_gpu)
        del hop_of
        if batches:
            verts, hop, owner = in_file_order(*owned, prep.server_of, prep.gpu_of, prep.block)
            del owned
            graph = server_graph(group, part, s % group.size, verts, hop, owner, prep.train, G)
            if graph is not None:  # what the run's loader reads beside (the co-batch's layout uses them)
                graph.update(global_id=verts.astype(np.int64), in_degree=prep.degree[verts].astype(np.int64))
            del verts, hop, owner
            with group.errors("sampling co-batches"):
                if graph is not None and sampled_graph is not None:
                    graph = sampled_graph(graph)
                if graph is not None:  # the writer: the sample's counts, one co-batch count at a time
                    for b in mine:
                        cob = mm.cobatch_server_arrays(graph, s, layers, b, sampling.fanout, sampling.sampler,
                                                       sampling.seed)
                        mine[b].update(mm.cobatch_counts([cob]))
                        del cob
                    if time_setup is not None:
                        timed[s] = time_setup(s, graph)
            del graph
    cobatches: Dict[int, Dict[int, tuple]] = {b: {} for b in mine}
    setup: Dict[int, object] = {}
    for part_counts, part_timed in (group.allgather_object((mine, timed)) if mine else ()):
        for b, by_rank in part_counts.items():
            cobatches[b].update(by_rank)
        setup.update(part_timed)
    return CountedBuild(counts=counts, loads=[loads[x] for x in server_order(group, S)], cobatches=cobatches,
                        induced=derived if induced is not None else None, setup=setup)

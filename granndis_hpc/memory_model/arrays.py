"""Row counts from shard arrays: the rows each rank of a shard set (or of a planned build) trains on,
by the same rules as engine/views.py and graph/planner.py, as memory_model/estimate.py's RankRows.

NumPy over arrays in memory: no file is read here (memory_model/shardsets.py reads shard sets,
preprocess/plan/command.py hands over the arrays of the builds it runs without writing them).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .estimate import LayerRows, MemoryModelError, PeerCounts, RankRows, ViewRows
from .payload import peer_counts


# ---------------------------------------------------------------------------------------------------
# Row counts from shard arrays (the same rules as engine/views.py and graph/planner.py)
@dataclass
class GpuArrays:
    """What the model reads of one rank's shard slice (shards.RankSlice has all of it)."""

    rank: int  # global rank = server * G + gpu
    gpu: int
    indptr: np.ndarray  # in-edge CSR of this GPU's rows, rebased to 0
    indices: np.ndarray  # sources as server-local ids
    w_indptr: np.ndarray  # world view of its inner rows
    w_src_rank: np.ndarray
    w_src_global_id: np.ndarray
    n_train: int  # inner training rows
    # An inductive set's (memory_model/induced_sets.py): the split code of the inner rows, of every world
    # source (world/src_split), and the slice's rows and in-edges (what a CPU rank holds of it).
    own_split: Optional[np.ndarray] = None
    w_src_split: Optional[np.ndarray] = None
    slice_size: Tuple[int, int] = (0, 0)


@dataclass
class ServerArrays:
    server: int
    hop: np.ndarray  # hop of every server-local id
    offsets: np.ndarray  # [G+1] row offsets of the GPUs
    gpus: List[GpuArrays]
    # The server's whole graph as shards.read_server_graph returns it (what the co-batch sampler
    # draws from); kept by server_arrays_from_build only.
    graph: Optional[Dict[str, np.ndarray]] = None
    train_hop: Optional[np.ndarray] = None  # an inductive set's graph/train_hop of every server-local id


def server_arrays_from_build(arrays: Dict[str, np.ndarray], server: int) -> ServerArrays:
    """From the datasets of one server file (granndis_hpc.preprocess.build.pipeline.build_server names) without
    features."""
    offsets = np.asarray(arrays["vertices/offsets"], dtype=np.int64)
    w_off = np.asarray(arrays["world/offsets"], dtype=np.int64)
    ip, ix = np.asarray(arrays["graph/indptr"], np.int64), arrays["graph/indices"]
    wip = np.asarray(arrays["world/indptr"], np.int64)
    hop = np.asarray(arrays["vertices/hop"], np.int64)
    train = np.asarray(arrays["split/train"], bool) & (hop == 0)
    G = offsets.shape[0] - 1
    gpus = []
    for g in range(G):  # loop over the server's GPUs
        lo, hi, wlo, whi = offsets[g], offsets[g + 1], w_off[g], w_off[g + 1]
        gpus.append(GpuArrays(
            rank=server * G + g, gpu=g, indptr=ip[lo:hi + 1] - ip[lo], indices=ix[ip[lo]:ip[hi]],
            w_indptr=wip[wlo:whi + 1] - wip[wlo], w_src_rank=arrays["world/src_rank"][wip[wlo]:wip[whi]],
            w_src_global_id=arrays["world/src_global_id"][wip[wlo]:wip[whi]],
            n_train=int(np.count_nonzero(train[lo:hi]))))
    graph = {"indptr": ip, "indices": np.asarray(ix, np.int64), "in_degree": arrays.get("graph/in_degree"),
             "hop": hop, "train": np.asarray(arrays["split/train"], bool), "offsets": offsets,
             "global_id": arrays.get("vertices/global_id")}
    return ServerArrays(server=server, hop=hop, offsets=offsets, gpus=gpus, graph=graph)


def gpu_arrays_from_slice(sl, **induced) -> GpuArrays:
    """From a shards.RankSlice.  induced: an inductive set's extra fields (memory_model/shardsets.py)."""
    n = int(sl.n_inner)
    return GpuArrays(rank=int(sl.server) * int(sl.gpus_per_server) + int(sl.gpu), gpu=int(sl.gpu),
                     indptr=sl.indptr, indices=sl.indices, w_indptr=sl.w_indptr, w_src_rank=sl.w_src_rank,
                     w_src_global_id=sl.w_src_global_id, n_train=int(np.count_nonzero(sl.train_mask[:n])), **induced)


def _world_halo_pairs(g: GpuArrays) -> np.ndarray:
    """Distinct (owner rank, global id) of this rank's world halo rows, sorted."""
    wr = np.asarray(g.w_src_rank, dtype=np.int64)
    wg = np.asarray(g.w_src_global_id, dtype=np.int64)
    other = wr != g.rank
    if not other.any():
        return np.zeros((0, 2), dtype=np.int64)
    return np.unique(np.stack([wr[other], wg[other]], axis=1), axis=0)


def world_reads(servers: Sequence[ServerArrays], world_size: int, once: bool = False) -> np.ndarray:
    """For every rank, how many of its inner rows the given servers' ranks read: summed over all
    servers (an all-reduce under MPI), it is every rank's world send-list length.  once: on the
    per-server route, where a row read by several ranks of another server is sent to it once."""
    out = np.zeros(int(world_size), dtype=np.int64)
    for s in servers:
        pairs = [_world_halo_pairs(g) for g in s.gpus]  # loop over ranks, not vertices
        if once:
            pairs = np.concatenate(pairs + [np.zeros((0, 2), np.int64)])
            across = pairs[:, 0] // len(s.gpus) != s.server
            pairs = [pairs[~across], np.unique(pairs[across], axis=0)]
        for p in pairs:
            out += np.bincount(p[:, 0], minlength=int(world_size))
    return out


@dataclass
class HopCounts:
    """One GPU's server view as counts by hop (index h = hop h): everything server_view_rows reads of
    the arrays.  Counted here from a set's arrays, or over the build ranks' slices without the server's
    edges on any rank (preprocess/plan/halo_counts.py): one definition of the rows makes both agree."""

    own: np.ndarray  # this GPU's rows at each hop
    nnz: np.ndarray  # in-edges (in the server subgraph) of those rows, by the row's hop
    halo: np.ndarray  # distinct rows of other GPUs that this GPU's rows read, by their hop
    sent: np.ndarray  # (peer GPU, own row) pairs, a peer's rows reading the row, by the row's hop


@dataclass
class WorldCounts:
    """One rank's world view as counts (shard_rows' world LayerRows)."""

    n_inner: int
    nnz: int  # in-edges of the inner rows
    n_halo: int  # distinct (owner rank, global id) of the in-neighbours other ranks own
    inter_halo: int  # of n_halo: owned by other servers
    inter_once: Optional[int] = None  # of inter_halo: those it relays on the per-server route (server_inter_once)
    sent_once: Optional[int] = None  # its world send-list length on the per-server route (world_reads once=True)
    peers: Optional[PeerCounts] = None  # per sending rank (memory_model/payload.py; None: not counted)


def _upto(a: np.ndarray, lim: int) -> int:
    """Sum of a[0..lim] (rows of hop <= lim)."""
    return int(np.asarray(a)[:max(int(lim), -1) + 1].sum())


def view_rows_from_counts(c: HopCounts, depth: int) -> ViewRows:
    """A server view planned for `depth` layers (planner.build_plan, all_active=False): layer l reads own
    and other-GPU rows of hop <= depth-l and computes own rows of hop <= depth-1-l (the rows of a GPU
    are in hop order, so those are prefixes)."""
    layers = []
    for l in range(int(depth)):
        lim_in, lim_out = depth - l, depth - 1 - l
        layers.append(LayerRows(n_own_in=_upto(c.own, lim_in), n_halo=_upto(c.halo, lim_in),
                                n_dst=_upto(c.own, lim_out), nnz=_upto(c.nnz, lim_out), n_send=_upto(c.sent, lim_in)))
    return ViewRows("server", int(np.sum(c.own)), int(np.sum(c.halo)), int(np.sum(c.sent)), tuple(layers))


def server_hop_counts(s: ServerArrays, gpu: int) -> HopCounts:
    """HopCounts of GPU `gpu` of a server's arrays."""
    offsets, hop = s.offsets, np.asarray(s.hop, dtype=np.int64)
    width = int(hop.max(initial=0)) + 1
    own_hop = hop[offsets[gpu]:offsets[gpu + 1]]
    ip = np.asarray(s.gpus[gpu].indptr, dtype=np.int64)
    src = np.asarray(s.gpus[gpu].indices, dtype=np.int64)
    owner = np.searchsorted(offsets, src, side="right") - 1
    halo = np.unique(src[owner != gpu])
    # What the other GPUs read from this one: the distinct own rows among each peer's halo sources.
    sent = []
    for g in s.gpus:  # loop over the server's GPUs, not over vertices
        if g.gpu == gpu:
            continue
        src_g = np.asarray(g.indices, dtype=np.int64)
        o = np.searchsorted(offsets, src_g, side="right") - 1
        sent.append(np.unique(src_g[o == gpu]))
    # One row per (peer, row) pair: a row two peers read is sent twice.
    sent = np.concatenate(sent) if sent else np.zeros(0, np.int64)
    return HopCounts(own=np.bincount(own_hop, minlength=width),
                     nnz=np.bincount(own_hop, weights=np.diff(ip), minlength=width).astype(np.int64),
                     halo=np.bincount(hop[halo], minlength=width), sent=np.bincount(hop[sent], minlength=width))


def server_view_rows(s: ServerArrays, gpu: int, depth: int) -> ViewRows:
    """GPU `gpu`'s server view planned for `depth` layers (view_rows_from_counts)."""
    return view_rows_from_counts(server_hop_counts(s, gpu), depth)


def world_counts(g: GpuArrays, server: int, gpus: int, inter_once: Optional[int] = None,
                 sent_once: Optional[int] = None, peers: Optional[PeerCounts] = None) -> WorldCounts:
    pairs = _world_halo_pairs(g)
    return WorldCounts(n_inner=int(np.asarray(g.w_indptr).shape[0] - 1), nnz=int(np.asarray(g.w_indptr)[-1]),
                       n_halo=int(pairs.shape[0]), inter_halo=int(np.count_nonzero(pairs[:, 0] // gpus != server)),
                       inter_once=inter_once, sent_once=sent_once, peers=peers)


def relayed_by(key: np.ndarray, gid: np.ndarray) -> np.ndarray:
    """Of distinct (reading rank, global id) pairs of rows read across servers, sorted by (key, reader)
    where key is one per (row, reading server): which pairs' reader relays the row on the per-server
    route (a row's readers on a server, by rank, take turns by its id: reader number gid mod readers,
    engine/halo_route.py choose_relays)."""
    new = np.ones(gid.size, dtype=bool)
    new[1:] = key[1:] != key[:-1]
    start = np.flatnonzero(new)
    group = np.cumsum(new) - 1
    size = np.diff(np.append(start, gid.size))
    return np.arange(gid.size) - start[group] == gid % size[group]


def server_inter_once(s: ServerArrays) -> Dict[int, int]:
    """rank -> rows it receives across servers on the per-server route (the rows it relays)."""
    G, readers, gids = len(s.gpus), [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for g in s.gpus:  # loop over the server's GPUs, not over vertices
        pairs = _world_halo_pairs(g)
        pairs = pairs[pairs[:, 0] // G != s.server]
        readers.append(np.full(pairs.shape[0], g.rank, dtype=np.int64))
        gids.append(pairs[:, 1])
    reader, gid = np.concatenate(readers), np.concatenate(gids)
    order = np.lexsort((reader, gid))
    chosen = relayed_by(gid[order], gid[order])  # one server's readers: the row is the key
    counts = np.bincount(reader[order][chosen], minlength=max([g.rank for g in s.gpus], default=0) + 1)
    return {g.rank: int(counts[g.rank]) for g in s.gpus}


def server_once_from(readers: Sequence[Tuple[int, np.ndarray]], server: int, gpus: int,
                     world_size: int) -> Dict[int, np.ndarray]:
    """rank -> rows it relays on the per-server route, per owner rank.  readers: (rank, its distinct
    (owner rank, global id) world halo rows) of every rank of server `server` (_world_halo_pairs)."""
    reader = np.concatenate([np.full(p.shape[0], r, np.int64) for r, p in readers] + [np.zeros(0, np.int64)])
    pairs = np.concatenate([p for _, p in readers] + [np.zeros((0, 2), np.int64)])
    across = pairs[:, 0] // int(gpus) != int(server)
    reader, owner, gid = reader[across], pairs[across, 0], pairs[across, 1]
    order = np.lexsort((reader, gid))
    chosen = relayed_by(gid[order], gid[order])
    out = {}
    for r, _ in readers:  # loop over the server's ranks, not over vertices
        mine = chosen & (reader[order] == r)
        out[r] = np.bincount(owner[order][mine], minlength=int(world_size))
    return out


def rank_rows(rank: int, n_train: int, world: WorldCounts, n_sent: int, server: Optional[HopCounts], layers: int,
              k: int, features: int, num_classes: int) -> RankRows:
    """RankRows of one rank from its counts: the world view (every layer alike) and, for k > 0, the
    server view planned for k layers."""
    wl = LayerRows(n_own_in=world.n_inner, n_halo=world.n_halo, n_dst=world.n_inner, nnz=world.nnz,
                   n_send=int(n_sent), inter_halo=world.inter_halo, inter_once=world.inter_once,
                   n_send_once=world.sent_once)
    view = ViewRows("world", world.n_inner, world.n_halo, int(n_sent), tuple([wl] * int(layers)),
                    inter_halo=world.inter_halo, inter_once=world.inter_once, peers=world.peers)
    return RankRows(rank=int(rank), features=int(features), num_classes=int(num_classes), n_inner=world.n_inner,
                    n_train=int(n_train), layers=int(layers), k=int(k), world=view,
                    server=view_rows_from_counts(server, int(k)) if k > 0 and server is not None else None)


def shard_rows(servers: Sequence[ServerArrays], layers: int, k: int, features: int, num_classes: int,
               world_sent: Optional[np.ndarray] = None, world_sent_once: Optional[np.ndarray] = None) -> List[RankRows]:
    """RankRows of every rank of the given servers for an L-layer model with k preloaded layers.

    The server arrays must hold a preload of at least k hops (k = 0 reads only the world view).
    world_sent: every rank's world send-list length (`world_reads` summed over all servers); computed
    from `servers` when they are all the servers."""
    if not 0 <= int(k) <= int(layers):
        raise MemoryModelError(f"k = {k} preloaded layers is outside 0..L = 0..{layers}")
    if world_sent is None:
        world_sent = world_reads(servers, sum(len(s.gpus) for s in servers))
        world_sent_once = world_reads(servers, sum(len(s.gpus) for s in servers), once=True)
    out = []
    P = int(np.asarray(world_sent).shape[0])
    for s in servers:
        G, once = len(s.gpus), server_inter_once(s)
        # fb's partial payloads: the world view per sending rank (memory_model/payload.py)
        once_from = server_once_from([(g.rank, _world_halo_pairs(g)) for g in s.gpus], s.server, G, P)
        for g in s.gpus:
            sent_once = None if world_sent_once is None else int(world_sent_once[g.rank])
            peers = peer_counts(g.rank, g.w_indptr, g.w_src_rank, g.w_src_global_id, P, once_from[g.rank])
            out.append(rank_rows(g.rank, g.n_train, world_counts(g, s.server, G, once[g.rank], sent_once, peers),
                                 int(world_sent[g.rank]),
                                 server_hop_counts(s, g.gpu) if k > 0 else None, layers, k, features, num_classes))
    return out


def cobatch_counts(cob: Sequence[ServerArrays]) -> Dict[int, Tuple[HopCounts, int]]:
    """rank -> (HopCounts of its share of a co-batch's sample, the co-batch targets on it): all that
    with_cobatch reads of the sampled arrays (preprocess/plan/halo_counts.py sends these, not the arrays)."""
    return {g.rank: (server_hop_counts(s, g.gpu), int(g.n_train)) for s in cob for g in s.gpus}


def with_cobatch(world_rows: Sequence[RankRows], cob) -> List[RankRows]:
    """RankRows of cooperative batching: each rank's co-batch view (all L layers) plus its world view
    (exact evaluation keeps it resident).  `cob`: the sampled ServerArrays, or their `cobatch_counts`."""
    counts = cob if isinstance(cob, dict) else cobatch_counts(cob)
    out = []
    for r in world_rows:
        c, n_train = counts[r.rank]
        view = view_rows_from_counts(c, r.layers)
        # The step's last layer computes the co-batch's targets on this GPU: they are its "inner" rows.
        out.append(replace(r, k=r.layers, server=replace(view, name="cobatch"), n_train=n_train,
                           n_inner=n_train))
    return out


def inductive_rank_rows(rank: int, worlds, server, layers: int, k: int, features: int, num_classes: int,
                        host_bytes: int = 0, server_file: Tuple[int, int] = (0, 0)):
    """RankRows of one rank of an inductive run from its counts.  worlds: (WorldCounts, send-list length)
    of the train-induced, the full and the train+validation-induced world views; server: HopCounts of
    the train-induced server view (k > 0).  Every row of the train-induced world view is a target."""
    (train, train_sent), *evaluation = worlds
    r = rank_rows(rank, train.n_inner, train, train_sent, server, layers, k, features, num_classes)
    views = tuple(rank_rows(rank, 0, w, sent, None, layers, 0, features, num_classes).world for w, sent in evaluation)
    return replace(r, evaluation=views, host_bytes=int(host_bytes),
                   server_file=(int(server_file[0]), int(server_file[1])))

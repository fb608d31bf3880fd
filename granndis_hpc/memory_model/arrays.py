"""Row counts from shard arrays: the rows each rank of a shard set (or of a planned build) trains on,
by the same rules as engine/views.py and graph/planner.py, as memory_model/estimate.py's RankRows.

NumPy over arrays in memory: no file is read here (memory_model/shardsets.py reads shard sets,
preprocess/plan.py hands over the arrays of the builds it runs without writing them).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence

import numpy as np

from .estimate import LayerRows, MemoryModelError, RankRows, ViewRows


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


@dataclass
class ServerArrays:
    server: int
    hop: np.ndarray  # hop of every server-local id
    offsets: np.ndarray  # [G+1] row offsets of the GPUs
    gpus: List[GpuArrays]
    # The server's whole graph as shards.read_server_graph returns it (what the co-batch sampler
    # draws from); kept by server_arrays_from_build only.
    graph: Optional[Dict[str, np.ndarray]] = None


def server_arrays_from_build(arrays: Dict[str, np.ndarray], server: int) -> ServerArrays:
    """From the datasets of one server file (preprocess.build.build_server names) without features."""
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
             "hop": hop, "train": np.asarray(arrays["split/train"], bool), "offsets": offsets}
    return ServerArrays(server=server, hop=hop, offsets=offsets, gpus=gpus, graph=graph)


def gpu_arrays_from_slice(sl) -> GpuArrays:
    """From a shards.RankSlice."""
    n = int(sl.n_inner)
    return GpuArrays(rank=int(sl.server) * int(sl.gpus_per_server) + int(sl.gpu), gpu=int(sl.gpu),
                     indptr=sl.indptr, indices=sl.indices, w_indptr=sl.w_indptr, w_src_rank=sl.w_src_rank,
                     w_src_global_id=sl.w_src_global_id, n_train=int(np.count_nonzero(sl.train_mask[:n])))


def _world_halo_pairs(g: GpuArrays) -> np.ndarray:
    """Distinct (owner rank, global id) of this rank's world halo rows, sorted."""
    wr = np.asarray(g.w_src_rank, dtype=np.int64)
    wg = np.asarray(g.w_src_global_id, dtype=np.int64)
    other = wr != g.rank
    if not other.any():
        return np.zeros((0, 2), dtype=np.int64)
    return np.unique(np.stack([wr[other], wg[other]], axis=1), axis=0)


def world_reads(servers: Sequence[ServerArrays], world_size: int) -> np.ndarray:
    """For every rank, how many of its inner rows the given servers' ranks read: summed over all
    servers (an all-reduce under MPI), it is every rank's world send-list length."""
    out = np.zeros(int(world_size), dtype=np.int64)
    for s in servers:
        for g in s.gpus:  # loop over ranks, not vertices
            out += np.bincount(_world_halo_pairs(g)[:, 0], minlength=int(world_size))
    return out


def server_view_rows(s: ServerArrays, gpu: int, depth: int) -> ViewRows:
    """GPU `gpu`'s server view planned for `depth` layers (planner.build_plan, all_active=False):
    layer l reads own and other-GPU rows of hop <= depth-l and computes own rows of hop <= depth-1-l."""
    offsets, hop = s.offsets, s.hop
    own_hop = hop[offsets[gpu]:offsets[gpu + 1]]
    ip = np.asarray(s.gpus[gpu].indptr, dtype=np.int64)
    src = np.asarray(s.gpus[gpu].indices, dtype=np.int64)
    owner = np.searchsorted(offsets, src, side="right") - 1
    halo = np.unique(src[owner != gpu])
    halo_hop = hop[halo]
    # What the other GPUs read from this one: the distinct own rows among each peer's halo sources.
    sent = []
    for g in s.gpus:  # loop over the server's GPUs, not over vertices
        if g.gpu == gpu:
            continue
        src_g = np.asarray(g.indices, dtype=np.int64)
        o = np.searchsorted(offsets, src_g, side="right") - 1
        sent.append(np.unique(src_g[o == gpu]))
    sent = np.concatenate(sent) if sent else np.zeros(0, np.int64)
    sent_hop = hop[sent]
    layers = []
    for l in range(int(depth)):
        lim_in, lim_out = depth - l, depth - 1 - l
        n_own_in = int(np.searchsorted(own_hop, lim_in, side="right"))
        n_dst = int(np.searchsorted(own_hop, lim_out, side="right"))
        layers.append(LayerRows(n_own_in=n_own_in, n_halo=int(np.count_nonzero(halo_hop <= lim_in)),
                                n_dst=n_dst, nnz=int(ip[n_dst]),
                                n_send=int(np.count_nonzero(sent_hop <= lim_in))))
    return ViewRows("server", int(own_hop.shape[0]), int(halo.shape[0]), int(sent.shape[0]), tuple(layers))


def shard_rows(servers: Sequence[ServerArrays], layers: int, k: int, features: int, num_classes: int,
               world_sent: Optional[np.ndarray] = None) -> List[RankRows]:
    """RankRows of every rank of the given servers for an L-layer model with k preloaded layers.

    The server arrays must hold a preload of at least k hops (k = 0 reads only the world view).
    world_sent: every rank's world send-list length (`world_reads` summed over all servers); computed
    from `servers` when they are all the servers."""
    if not 0 <= int(k) <= int(layers):
        raise MemoryModelError(f"k = {k} preloaded layers is outside 0..L = 0..{layers}")
    if world_sent is None:
        world_sent = world_reads(servers, sum(len(s.gpus) for s in servers))
    out = []
    for s in servers:
        G = len(s.gpus)
        for g in s.gpus:
            n_inner = int(np.asarray(g.w_indptr).shape[0] - 1)
            pairs = _world_halo_pairs(g)
            w_inter = int(np.count_nonzero(pairs[:, 0] // G != s.server))
            wl = LayerRows(n_own_in=n_inner, n_halo=int(pairs.shape[0]), n_dst=n_inner,
                           nnz=int(np.asarray(g.w_indptr)[-1]), n_send=int(world_sent[g.rank]), inter_halo=w_inter)
            world = ViewRows("world", n_inner, int(pairs.shape[0]), int(world_sent[g.rank]),
                             tuple([wl] * int(layers)), inter_halo=w_inter)
            server = server_view_rows(s, g.gpu, int(k)) if k > 0 else None
            out.append(RankRows(rank=g.rank, features=int(features), num_classes=int(num_classes),
                                n_inner=n_inner, n_train=g.n_train, layers=int(layers), k=int(k),
                                world=world, server=server))
    return out



def with_cobatch(world_rows: Sequence[RankRows], cob: Sequence[ServerArrays]) -> List[RankRows]:
    """RankRows of cooperative batching: each rank's co-batch view (all L layers) plus its world view
    (exact evaluation keeps it resident)."""
    by_rank = {g.rank: (s, g) for s in cob for g in s.gpus}
    out = []
    for r in world_rows:
        s, g = by_rank[r.rank]
        view = server_view_rows(s, g.gpu, r.layers)
        # The step's last layer computes the co-batch's targets on this GPU: they are its "inner" rows.
        out.append(replace(r, k=r.layers, server=replace(view, name="cobatch"), n_train=g.n_train,
                           n_inner=g.n_train))
    return out

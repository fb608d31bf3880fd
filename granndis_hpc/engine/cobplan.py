"""Per-co-batch plans as index arrays over one fixed per-rank structure (One-Hop Graph Masking).

The paper's engine keeps one fixed one-hop graph and exchange pattern per GPU and expresses each
co-batch as per-layer masks over it.  Here the fixed part is `ServerIndex`, built once per rank from
the server's preloaded graph (as `flx` builds its plan once): the server CSR, which GPU owns every
server vertex, the destination of every edge, which edges are self loops, the degrees, and the
server's features and global ids in host memory (a real loader keeps them there; nothing is read from
the shard file per co-batch).  A co-batch is a `Draw` (graph/sampler.py): the hop of every server
vertex in the sample and the positions of the kept edges in the server CSR.  From it a rank computes,
vectorised and in time proportional to the co-batch,

  - its rows: the sample's vertices it owns, in (hop, id) order, so that every layer's rows are a
    prefix (the planner's rule);
  - its kept in-edges, grouped by those rows, and where each source lives (own row or halo row);
  - its halo table: the peer-owned sources in (peer, hop, id) order, which is each peer's own row order;
  - what every peer will ask it for: every rank of a server draws the same sample from (seed, server,
    epoch, iteration), so it reads the peers' kept edges itself.  No count or key exchange: a plan
    needs no communication at all, and so can be built in a background thread while a step computes.

and hands them to the one planner (graph/planner.build_plan), which lays out every layer.  Degrees and
layer-0 input features of halo rows come from host memory too, so nothing static is exchanged per
co-batch; only the per-layer halo rows move (what the paper's Fig. 7c exchanges).

The cooperative (`cob`) and per-GPU (`mb`) splits differ only in which rows a rank takes: its own
share of the co-batch's dependency graph with halo rows from its server's peers, or the whole
dependency graph of its own targets with no halo.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, List, Union

import numpy as np
import torch

from granndis_hpc.engine import views
from granndis_hpc.graph import planner
from granndis_hpc.graph.sampler import Draw
from granndis_hpc.graph.typed_features import TypedRows
from granndis_hpc.nn.graph import LayerGraph


def clock() -> float:
    """CPU seconds of the calling thread: what a phase costs, apart from waiting for a core (on a
    shared or oversubscribed host the wall time of a loader thread says little about its work)."""
    return time.thread_time()


def _small_key(values: np.ndarray, bound: int) -> np.ndarray:
    """A sort key of small non-negative ints in the narrowest type: numpy sorts 16-bit keys stably
    with a radix sort (O(n)), wider ones with timsort."""
    return values.astype(np.int16 if bound < np.iinfo(np.int16).max else np.int64, copy=False)


class ServerIndex:
    """What one rank keeps of its server's preloaded graph, built once (never per co-batch)."""

    def __init__(self, graph: Dict[str, np.ndarray], layers: int, exact: bool):
        self.indptr = np.asarray(graph["indptr"], dtype=np.int64)
        self.indices = np.asarray(graph["indices"], dtype=np.int64)
        self.offsets = np.asarray(graph["offsets"], dtype=np.int64)
        self.n = self.indptr.shape[0] - 1
        self.gpus = self.offsets.shape[0] - 1
        self.layers, self.exact = int(layers), bool(exact)
        self.owner = np.repeat(np.arange(self.gpus, dtype=np.int64), np.diff(self.offsets))
        # Destination of every edge, and the owner of every edge's source: the per-edge lookups a plan
        # needs, computed once (int32: a server holds < 2^31 vertices).
        self.edge_dst = np.repeat(np.arange(self.n, dtype=np.int32), np.diff(self.indptr))
        self.src_owner = self.owner[self.indices].astype(np.int16 if self.gpus < 2**15 else np.int64)
        self.is_loop = self.indices == self.edge_dst
        self.edge_offsets = self.indptr[self.offsets]  # edges of GPU p's rows: [edge_offsets[p], edge_offsets[p+1])
        self.in_degree = np.asarray(graph["in_degree"], dtype=np.int64)
        self.global_id = np.asarray(graph["global_id"], dtype=np.int64)
        # A TypedRows where the types' widths differ: the server's rows at their own widths.
        features = graph["features"]
        self.features = features if isinstance(features, TypedRows) else np.asarray(features, dtype=np.float32)

    def order(self, hop: np.ndarray, by_owner: bool):
        """The sample's vertices sorted by (owner, hop, id) (by (hop, id) without by_owner), where each
        owner's block starts, and every vertex's position in its block (-1 outside the sample)."""
        verts = np.flatnonzero(hop >= 0)
        L1 = self.layers + 1
        key = hop[verts] + (self.owner[verts] * L1 if by_owner else 0)
        order = np.argsort(_small_key(key, L1 * self.gpus), kind="stable")  # verts are increasing: ids stay sorted
        sorted_v = verts[order]
        groups = self.gpus if by_owner else 1
        counts = np.bincount(self.owner[sorted_v], minlength=groups) if by_owner else np.array([sorted_v.size])
        start = np.zeros(groups + 1, dtype=np.int64)
        np.cumsum(counts, out=start[1:])
        pos = np.full(self.n, -1, dtype=np.int64)
        block = np.repeat(start[:-1], counts)
        pos[sorted_v] = np.arange(sorted_v.size, dtype=np.int64) - block
        return sorted_v, start, pos

    def edges_of(self, draw: Draw, p: int) -> np.ndarray:
        """Kept edges (positions) whose destination GPU p owns."""
        a, b = np.searchsorted(draw.edges, self.edge_offsets[[p, p + 1]])
        return draw.edges[a:b]

    def kept_degree(self, draw: Draw, ids: np.ndarray) -> np.ndarray:
        """Kept in-edges of each vertex (0 for vertices no layer computes)."""
        return (np.searchsorted(draw.edges, self.indptr[ids + 1]) - np.searchsorted(draw.edges, self.indptr[ids]))

    def kept_loops(self, draw: Draw, ids: np.ndarray) -> np.ndarray:
        """Kept self-loop edges (v -> v) of each vertex: what its degree counts as stored loops."""
        loops = draw.edges[self.is_loop[draw.edges]]
        return np.searchsorted(loops, self.indptr[ids + 1]) - np.searchsorted(loops, self.indptr[ids])


@dataclass
class HostPlan:
    """One rank's plan of one co-batch, host side: the planner's Plan plus the per-row data it needs."""

    plan: planner.Plan
    ids: np.ndarray  # server-local ids of the own rows, in row order
    halo_ids: np.ndarray  # server-local ids of the halo rows, in HaloTable order
    own_hop: np.ndarray
    degree: np.ndarray  # float32 [n_own]
    loops: np.ndarray  # float32 [n_own]: stored self loops of the own rows
    halo_degree: np.ndarray  # float32 [H]: degree minus stored loops (the halo row gets 0 loops)
    features: Union[np.ndarray, TypedRows]  # float32 [n_own, F], or at the rows' own widths
    halo_features: Union[np.ndarray, TypedRows]  # float32 [H, F], or at the rows' own widths
    row_ids: np.ndarray  # int64 [n_own]: dropout keys
    halo_row_ids: np.ndarray  # int64 [H]
    global_ids: np.ndarray  # int64 [n_own]: the rows' global vertex ids (a typed model's vertex types)
    halo_global_ids: np.ndarray  # int64 [H]


def _rows_and_edges(index: ServerIndex, draw: Draw, sorted_v, start, pos, block: int, edges: np.ndarray):
    """Own rows (block `block` of the order) and their kept in-edges grouped by row, in CSR."""
    ids = sorted_v[start[block]:start[block + 1]]
    dst = index.edge_dst[edges]
    # Kept edges are in position order, i.e. by destination id: a stable pass by the destination's hop
    # puts them in row order (hop, id) with each row's sources still in the server CSR's order.
    by_row = np.argsort(_small_key(draw.hop[dst], index.layers + 1), kind="stable")
    edges, dst = edges[by_row], dst[by_row]
    indptr = np.zeros(ids.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(pos[dst], minlength=ids.shape[0]), out=indptr[1:])
    return ids, edges, indptr


def _degrees(index: ServerIndex, draw: Draw, ids, indptr, edges, halo_ids):
    """Normalisation degrees of own and halo rows (global in exact plans, kept-neighbour counts in sampled
    ones) and the own rows' stored self loops, as views.View derives them."""
    row_of_edge = np.repeat(np.arange(ids.shape[0], dtype=np.int64), np.diff(indptr))
    loops = np.bincount(row_of_edge[index.is_loop[edges]], minlength=ids.shape[0]).astype(np.float32)
    if index.exact:
        degree, halo_degree = index.in_degree[ids], index.in_degree[halo_ids]
    else:
        degree, halo_degree = np.diff(indptr), index.kept_degree(draw, halo_ids)
    halo_degree = halo_degree - index.kept_loops(draw, halo_ids)
    return degree.astype(np.float32), loops, halo_degree.astype(np.float32)


def cooperative_plan(index: ServerIndex, draw: Draw, gpu: int, timings: Dict[str, float]) -> HostPlan:
    """`cob`: this GPU's rows of the co-batch, halo rows from the server's other GPUs, and the rows every
    peer will ask this GPU for, all from the shared draw (no communication)."""
    t0 = clock()
    G, hop = index.gpus, draw.hop
    sorted_v, start, pos = index.order(hop, by_owner=True)
    ids, edges, indptr = _rows_and_edges(index, draw, sorted_v, start, pos, gpu, index.edges_of(draw, gpu))
    src = index.indices[edges]
    is_own = index.src_owner[edges] == gpu
    need = np.zeros(index.n, dtype=bool)
    need[src[~is_own]] = True
    halo_ids = sorted_v[need[sorted_v]]  # (peer, hop, id): every peer's block in its own row order
    halo_at = np.full(index.n, -1, dtype=np.int64)
    halo_at[halo_ids] = np.arange(halo_ids.shape[0], dtype=np.int64)
    sources = planner.EdgeSources(own_pos=np.where(is_own, pos[src], -1), halo_index=np.where(is_own, -1, halo_at[src]))
    table = planner.HaloTable(peer=index.owner[halo_ids], key=halo_ids, hop=hop[halo_ids].astype(np.int64),
                              num_peers=G)
    # What each peer asks for: this GPU's sources of the peer's kept edges, in this GPU's row order (the
    # order of the peer's halo table), exactly what the peer computes above from the same draw.
    send_pos, send_counts = [], np.zeros(G, dtype=np.int64)
    for p in range(G):  # the server's GPUs, not vertices
        if p == gpu:
            continue
        pe = index.edges_of(draw, p)
        asked = np.zeros(ids.shape[0], dtype=bool)
        asked[pos[index.indices[pe[index.src_owner[pe] == gpu]]]] = True
        send_pos.append(np.flatnonzero(asked))
        send_counts[p] = send_pos[-1].shape[0]
    send_pos = np.concatenate(send_pos) if send_pos else np.zeros(0, dtype=np.int64)
    t1 = clock()
    timings["split"] = timings.get("split", 0.0) + t1 - t0
    out = _finish(index, draw, ids, edges, indptr, sources, table, send_pos, send_counts, halo_ids,
                  row_ids=index.global_id[ids], halo_row_ids=index.global_id[halo_ids])
    timings["plan"] = timings.get("plan", 0.0) + clock() - t1
    return out


def per_gpu_plan(index: ServerIndex, draw: Draw, timings: Dict[str, float]) -> HostPlan:
    """`mb`: the whole dependency graph of this GPU's targets, every row its own, nothing exchanged."""
    t0 = clock()
    sorted_v, start, pos = index.order(draw.hop, by_owner=False)
    ids, edges, indptr = _rows_and_edges(index, draw, sorted_v, start, pos, 0, draw.edges)
    src = index.indices[edges]
    sources = planner.EdgeSources(own_pos=pos[src], halo_index=np.full(src.shape[0], -1, dtype=np.int64))
    empty = np.zeros(0, dtype=np.int64)
    table = planner.HaloTable(peer=empty, key=empty, hop=empty, num_peers=1)
    t1 = clock()
    timings["split"] = timings.get("split", 0.0) + t1 - t0
    # Dropout keys by the server-local id, as mb always has (mb is not exact: no shape-independence lost).
    out = _finish(index, draw, ids, edges, indptr, sources, table, empty, np.zeros(1, dtype=np.int64), empty,
                  row_ids=ids, halo_row_ids=empty)
    timings["plan"] = timings.get("plan", 0.0) + clock() - t1
    return out


def _finish(index, draw, ids, edges, indptr, sources, table, send_pos, send_counts, halo_ids, row_ids,
            halo_row_ids) -> HostPlan:
    own_hop = draw.hop[ids].astype(np.int64)
    degree, loops, halo_degree = _degrees(index, draw, ids, indptr, edges, halo_ids)
    plan = planner.build_plan(own_hop, indptr, sources, table, send_pos, send_counts, index.layers,
                              all_active=False, complete_degree=degree if index.exact else None, group="server")
    return HostPlan(plan=plan, ids=ids, halo_ids=halo_ids, own_hop=own_hop, degree=degree, loops=loops,
                    halo_degree=halo_degree, features=_take(index.features, ids),
                    halo_features=_take(index.features, halo_ids),
                    row_ids=row_ids, halo_row_ids=halo_row_ids, global_ids=index.global_id[ids],
                    halo_global_ids=index.global_id[halo_ids])


def _take(features, ids):
    return features.take(ids) if isinstance(features, TypedRows) else np.take(features, ids, axis=0)


def _features_on(features, t, padded: bool):
    """A co-batch's feature rows on the device: a matrix, or rows at their own widths (TypedRows) for a
    model that projects each type.  padded: a model that reads the rows as they are (a homogeneous model
    on a set of several widths) takes them zero-padded, this co-batch's rows only."""
    if not isinstance(features, TypedRows):
        return t(features)
    if padded:
        return t(features.padded())
    return TypedRows([t(np.ascontiguousarray(b)) for b in features.blocks], t(features.row_type), features.width)


def _put(device, put):
    """put(array) -> a tensor on `device` (cob's loader stream, engine/cobstream.py), default torch.as_tensor."""
    return put or (lambda a, dtype=None: torch.as_tensor(a, dtype=dtype, device=device))


def layer_graphs(hp: HostPlan, device, put=None) -> List[LayerGraph]:
    """The plan's LayerGraphs on `device`, with the degrees and loops views.View would give them."""
    t = _put(device, put)

    own_degree, own_loops, halo_degree = t(hp.degree), t(hp.loops), t(hp.halo_degree)
    graphs = []
    for lp in hp.plan.layers:
        graphs.append(LayerGraph(
            n_dst=lp.n_dst, n_src=lp.n_src, indptr=t(lp.indptr), indices=t(lp.indices),
            dst_degree=own_degree[: lp.n_dst].contiguous(),
            src_degree=torch.cat([own_degree[: lp.n_own_in], halo_degree[t(lp.halo_rows)]]),
            src_loops=torch.cat([own_loops[: lp.n_own_in], own_loops.new_zeros(lp.n_src - lp.n_own_in)]),
            n_own=lp.n_own_in))
    return graphs


def assemble_view(hp: HostPlan, graphs, group, device, put=None, source_ids_on_graphs: bool = False,
                  static_features: bool = True) -> views.View:
    """A views.View of the plan whose static data (features, degrees, ids of halo rows) is already at hand.
    source_ids_on_graphs: every layer graph gets its source rows' global ids (engine/source_ids.py).
    static_features: the model reads the features as they are (False: it projects each type first,
    ModelContract.input_projection, so rows at their own widths stay so and the halo's are not sent)."""
    t = _put(device, put)
    if source_ids_on_graphs:
        own, halo = t(hp.global_ids), t(hp.halo_global_ids)
        for lp, graph in zip(hp.plan.layers, graphs):
            graph.source_ids = torch.cat([own[: lp.n_own_in], halo.index_select(0, t(lp.halo_rows))])
    halo_rows0 = t(hp.plan.layers[0].halo_rows)
    row_ids = t(hp.row_ids)
    source_ids = torch.cat([row_ids[: hp.plan.layers[0].n_own_in], t(hp.halo_row_ids).index_select(0, halo_rows0)])
    features = _features_on(hp.features, t, padded=static_features)
    halo_features = _features_on(hp.halo_features, t, padded=True) if static_features else None
    return views.View.assembled(hp.plan, group, device, features=features, halo_features=halo_features,
                                graphs=graphs, row_ids=row_ids, source_ids=source_ids, put=put)


def prepare_matrices(graphs, keys) -> None:
    """Build the graphs' aggregation matrices now (off the critical path) for the (layer, cache key)
    pairs the previous co-batch's graphs used (LayerGraph.cache_keys of its layer-`layer` graph): the
    kinds and dtypes the model aggregates each layer with, and only those."""
    for layer, key in keys:
        graphs[layer].prepare([key])

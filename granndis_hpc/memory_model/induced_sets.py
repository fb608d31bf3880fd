"""--mode auto on an inductive shard set: the rows an inductive run builds (engine/inductive.py), counted
from the set's own arrays with the counting code `preprocess plan --inductive` uses (arrays.py:
world_counts, world_reads, server_hop_counts, inductive_rank_rows; induced.slice_bytes), so the two
estimate the same views the same way.

- world views (`induced_world`): a rank's inner rows whose split has one of the graph's bits and their
  world edges from such sources (world/src_split): the train-induced one (fb, the world layers of flx;
  every row a target), the full one and the train+validation-induced one (evaluation);
- server views (`induced_server`, flx k and eas with k = L): each GPU's rows whose stored train-induced
  hop (graph/train_hop) is at most k, scheduled by that hop, and their edges from such rows;
- co-batches (cob): sampled on the server graph's edges between training vertices
  (`train_induced_edges`), as the run samples them.
A set built before graph/train_hop existed serves fb and cob only (flx and eas refuse it).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

import numpy as np

from granndis_hpc.graph.csr import row_of_edges
from granndis_hpc.shards import SPLIT_BITS

from .arrays import (GpuArrays, ServerArrays, _world_halo_pairs, inductive_rank_rows, server_hop_counts,
                     server_inter_once, server_once_from, world_counts, world_reads)
from .estimate import MemoryModelError, ModelSpec, PeerCounts, RankRows
from .induced import slice_bytes
from .mode_estimates import SetArrays
from .payload import peer_counts
from .typed_widths import held_width

TRAIN = SPLIT_BITS["train"]
TRAIN_VAL = SPLIT_BITS["train"] | SPLIT_BITS["val"]


def _filtered_csr(indptr: np.ndarray, keep_row: np.ndarray, keep_edge: np.ndarray) -> np.ndarray:
    """The indptr of the rows `keep_row` (a mask) with their edges `keep_edge` (a mask over all edges)."""
    edge_row = row_of_edges(np.asarray(indptr, dtype=np.int64))
    lens = np.bincount(edge_row[keep_edge], minlength=keep_row.shape[0])[keep_row]
    out = np.zeros(lens.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens, out=out[1:])
    return out


def induced_world(g: GpuArrays, bits: int) -> GpuArrays:
    """A rank's world view of the graph induced by the vertices whose split has one of `bits`
    (engine/inductive.world_rows): its inner rows in that graph (all of them targets: the train-induced
    graph's rows are its training vertices) and their in-edges from it."""
    keep_row = (np.asarray(g.own_split) & bits) != 0
    w_indptr = np.asarray(g.w_indptr, dtype=np.int64)
    keep_edge = keep_row[row_of_edges(w_indptr)] & ((np.asarray(g.w_src_split) & bits) != 0)
    return dataclasses.replace(g, w_indptr=_filtered_csr(w_indptr, keep_row, keep_edge),
                               w_src_rank=np.asarray(g.w_src_rank)[keep_edge],
                               w_src_global_id=np.asarray(g.w_src_global_id)[keep_edge],
                               n_train=int(np.count_nonzero(keep_row)))


def induced_server(s: ServerArrays, k: int) -> ServerArrays:
    """The train-induced graph's own k-hop preload within a server's file (engine/inductive.server_rows):
    each GPU's rows whose stored train-induced hop is at most k (hop: that hop), renumbered in the file's
    order (a GPU's rows stay contiguous), and their edges from such rows."""
    hop = np.asarray(s.train_hop, dtype=np.int64)  # shards.TRAIN_HOP_UNREACHED > k: not a row
    kept = hop <= int(k)
    new_id = np.cumsum(kept) - 1
    offsets = np.concatenate([[0], np.cumsum(kept)])[s.offsets]
    gpus = []
    for g in s.gpus:  # loop over the server's GPUs
        lo, hi = s.offsets[g.gpu], s.offsets[g.gpu + 1]
        src = np.asarray(g.indices, dtype=np.int64)
        keep_row = kept[lo:hi]
        keep_edge = keep_row[row_of_edges(np.asarray(g.indptr, dtype=np.int64))] & kept[src]
        gpus.append(dataclasses.replace(g, indptr=_filtered_csr(g.indptr, keep_row, keep_edge),
                                        indices=new_id[src[keep_edge]]))
    return ServerArrays(s.server, hop[kept], offsets, gpus)


def train_induced_edges(graph: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """A server graph (shards.read_server_graph's dict, or preprocess's counted one) with only the edges
    between training vertices: what an inductive co-batch is sampled from
    (engine/inductive.train_induced_graph)."""
    indptr = np.asarray(graph["indptr"], dtype=np.int64)
    train = np.asarray(graph["train"], dtype=bool)
    edge_row = row_of_edges(indptr)
    keep = train[edge_row] & train[graph["indices"]]
    new_indptr = np.zeros_like(indptr)
    np.cumsum(np.bincount(edge_row[keep], minlength=indptr.shape[0] - 1), out=new_indptr[1:])
    return {**graph, "indptr": new_indptr, "indices": np.asarray(graph["indices"])[keep]}


@dataclasses.dataclass
class InductiveSetArrays(SetArrays):
    """An inductive shard set's arrays (every server) as the modes' estimates read them: RankRows of the
    induced graphs' views (arrays.inductive_rank_rows), co-batches sampled on the train-induced edges."""

    multilabel_classes: int = 0  # the slice's labels are uint8 [rows, C] (induced.slice_bytes)
    _worlds: Optional[Dict[int, tuple]] = dataclasses.field(default=None, init=False, repr=False)

    def worlds(self) -> Dict[int, tuple]:
        """Per rank (by rank): (WorldCounts, send-list length) of the train-induced, the full and the
        train+validation-induced world views (counted once: every k shares them)."""
        if self._worlds is None:
            W = sum(len(s.gpus) for s in self.servers)
            per_graph = []
            for bits in (TRAIN, None, TRAIN_VAL):
                servers = self.servers if bits is None else [
                    dataclasses.replace(s, gpus=[induced_world(g, bits) for g in s.gpus]) for s in self.servers]
                sent, sent_once = world_reads(servers, W), world_reads(servers, W, once=True)
                once = {r: n for s in servers for r, n in server_inter_once(s).items()}
                # the train-induced view's counts per pair of ranks: the partial payloads of fb and flx train there
                peers: Dict[int, Optional[PeerCounts]] = {g.rank: None for s in servers for g in s.gpus}
                if bits == TRAIN:
                    for s in servers:  # loop over servers
                        G = len(s.gpus)
                        once_from = server_once_from([(g.rank, _world_halo_pairs(g)) for g in s.gpus], s.server, G, W)
                        peers.update({g.rank: peer_counts(g.rank, g.w_indptr, g.w_src_rank, g.w_src_global_id, W,
                                                          once_from[g.rank]) for g in s.gpus})
                per_graph.append({g.rank: (world_counts(g, s.server, len(s.gpus), once[g.rank], int(sent_once[g.rank]),
                                                        peers[g.rank]), int(sent[g.rank]))
                                  for s in servers for g in s.gpus})
            self._worlds = {r: tuple(p[r] for p in per_graph) for r in per_graph[0]}
        return self._worlds

    def rows(self, layers: int, k: int, m: ModelSpec) -> List[RankRows]:
        if k > 0 and any(s.train_hop is None for s in self.servers):
            raise MemoryModelError(f"{self.source}: --inductive with {k} preloaded layers needs the train-induced "
                                   f"hops (graph/train_hop), which this set was built without; rebuild it with "
                                   f"`granndis preprocess build ... --inductive --overwrite`")
        worlds, out = self.worlds(), []
        for s in self.servers:
            view = induced_server(s, k) if k > 0 else None
            # The server's file: what a co-batch samples and, with each rank's slice, what a CPU rank holds.
            file_edges = sum(int(np.asarray(g.indices).shape[0]) for g in s.gpus)
            for g in s.gpus:
                rows, edges = g.slice_size
                full = worlds[g.rank][1][0]
                host = slice_bytes(rows, edges, full.n_inner, full.nnz, int(s.hop.shape[0]), held_width(m),
                                   self.multilabel_classes)
                out.append(inductive_rank_rows(g.rank, worlds[g.rank], server_hop_counts(view, g.gpu) if view else None,
                                               layers, k, m.features, m.num_classes, host,
                                               (int(s.hop.shape[0]), file_edges)))
        return out

    def graphs(self) -> List[Dict[str, np.ndarray]]:
        return [train_induced_edges(g) for g in super().graphs()]

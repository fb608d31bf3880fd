"""`preprocess plan --inductive` (and `build --hops auto` of an inductive set): the rows an inductive run
builds, counted from the build ranks' slices (preprocess/plan/halo_counts.py's steps, on the induced graphs).

An inductive run (engine/inductive.py) trains on the train-induced graph and evaluates on the full and
the train+validation-induced graphs, all under the full graph's partition:
- world views: each rank's inner vertices of the induced graph and their in-edges from it
  (halo_counts.world_view_counts with `keep`), for the train-induced (training: fb, the world layers
  of flx), the full and the train+validation-induced graphs (evaluation);
- server views (flx k, eas): the train-induced graph's own preload of each server: the rows of the file
  within k hops (L for eas) of the server's inner training vertices over the file's edges between
  training vertices (`induced_hops`, the BFS the build's preload hop follows, restricted to training
  vertices and the file's rows), each scheduled by that hop and owned by the GPU the file gives it;
- co-batches (cob): sampled on the server graph's train-induced edges
  (memory_model.induced_sets.train_induced_edges), as the run samples them.
Every count is over dense per-vertex arrays and the slices' edges, vectorised; collective like the rest.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence

import numpy as np

from granndis_hpc import memory_model as mm
from granndis_hpc.graph.csr import csr_rows, row_of_edges
from granndis_hpc.memory_model.arrays import inductive_rank_rows
from granndis_hpc.memory_model.induced import slice_bytes

from granndis_hpc.preprocess.build.dist_server import _my_rows, _union, order_by_hop
from granndis_hpc.preprocess.plan.halo_counts import server_hop_counts_sliced, world_view_counts


def induced_hops(group, part, file_hop: np.ndarray, train: np.ndarray, depth: int) -> np.ndarray:
    """Collective: the hop of every row of a server's file (file_hop >= 0; hop 0: its inner vertices)
    from the server's inner training vertices in the train-induced graph, -1 for rows farther than
    `depth` hops or not reached (and for every other vertex).  A BFS from a row to its in-neighbours
    that are training vertices and rows of the file, as the build's preload hop is defined."""
    n = part.num_vertices
    hop = np.full(n, -1, dtype=np.int8 if depth < 127 else np.int32)
    hop[(file_hop == 0) & train] = 0
    usable = (file_hop >= 0) & train
    for t in range(1, int(depth) + 1):
        selected = hop >= 0
        _, src = csr_rows(part.indptr, part.indices, _my_rows(part, hop, t - 1))
        new = src[usable[src] & ~selected[src]]
        hop[_union(group, n, new) & ~selected] = t
    return hop


@dataclass
class InducedCounter:
    """The world views of the three graphs (counted once) and the server views' hook for the builds."""

    group: object
    part: object
    prep: object  # halo_counts.Prepared: the partition, the full world view
    worlds: List[tuple]  # per rank: ((WorldCounts, sent) of the train-induced, full, train+val-induced)
    multilabel_classes: int = 0

    @classmethod
    def count(cls, group, part, prep, multilabel_classes: int = 0) -> "InducedCounter":
        rows = np.diff(part.vtxdist)
        val = group.allgatherv_rows(part.val_mask, rows)
        edge_row = row_of_edges(part.indptr)
        per_graph = {}
        for name, keep in (("train", prep.train), ("train+val", prep.train | val)):
            degree = group.allgatherv_rows(
                np.bincount(edge_row, weights=keep[part.indices], minlength=part.hi - part.lo).astype(np.int64), rows)
            world, sent, _ = world_view_counts(group, part, prep.server_of, prep.gpu_of, prep.servers, prep.gpus,
                                               degree, prep.train, keep=keep, pairs=name == "train")
            per_graph[name] = (world, sent)
        # (the counts per pair of ranks of the train-induced view only, which the partial payloads train on,
        # memory_model/payload.py; the sets' own counts alike)
        worlds = [((per_graph["train"][0][r], int(per_graph["train"][1][r])),
                   (replace(prep.world[r], peers=None), int(prep.world_sent[r])),
                   (per_graph["train+val"][0][r], int(per_graph["train+val"][1][r])))
                  for r in range(prep.servers * prep.gpus)]  # loop over ranks
        return cls(group, part, prep, worlds, multilabel_classes)

    def server_counts(self, file_hop: np.ndarray, owned, ks: Sequence[int]) -> Dict[int, List[mm.HopCounts]]:
        """Collective: k -> HopCounts of every GPU of the server whose file rows are `file_hop` >= 0
        (owned: halo_counts.owned_rows of it, the file's owners), for the train-induced preload of k hops."""
        ks = [int(k) for k in ks if int(k) > 0]
        if not ks:
            return {}
        verts, _, owner = owned
        owner_of = np.full(self.part.num_vertices, -1, dtype=np.int32)
        owner_of[verts] = owner
        hop = induced_hops(self.group, self.part, file_hop, self.prep.train, max(ks))
        out = {}
        for k in ks:
            hop_k = np.where(hop <= k, hop, -1).astype(hop.dtype)
            v, h = order_by_hop(hop_k)
            out[k] = server_hop_counts_sliced(self.group, self.part, hop_k, self.prep.gpu_of, self.prep.gpus,
                                              owned=(v, h, owner_of[v]))
        return out

    def file_rows(self, rank: int, file_counts: Optional[List[mm.HopCounts]]):
        """((rows, edges) of the rank's slice, (rows, edges) of its server's file) of a set whose file rows
        are counted by `file_counts` (every rank's full HopCounts; None: the inner rows only)."""
        G = self.prep.gpus
        if file_counts is None:
            each = [(w.n_inner, w.nnz) for w in self.prep.world[rank // G * G:(rank // G + 1) * G]]
        else:
            each = [(int(np.sum(c.own)), int(np.sum(c.nnz))) for c in file_counts[rank // G * G:(rank // G + 1) * G]]
        return each[rank % G], tuple(int(x) for x in np.sum(each, axis=0))

    def host_bytes(self, rank: int, file_counts: Optional[List[mm.HopCounts]], features: float) -> int:
        """The rank's shard slice (shards.read_rank_slice) of the set; features: floats per row (rows held at
        their own widths: memory_model/typed_widths.py held_width)."""
        full = self.prep.world[rank]
        (rows, edges), (server_rows, _) = self.file_rows(rank, file_counts)
        return slice_bytes(rows, edges, full.n_inner, full.nnz, server_rows, features, self.multilabel_classes)

    def rows(self, server: Optional[List[mm.HopCounts]], file_counts: Optional[List[mm.HopCounts]], layers: int,
             k: int, features: int, num_classes: int, held: Optional[float] = None) -> List[mm.RankRows]:
        """RankRows of every rank (rank order) with k layers on the train-induced server views `server`;
        held: the slice's feature floats per row (None: features)."""
        held = features if held is None else held
        return [inductive_rank_rows(r, self.worlds[r], server[r] if k > 0 else None, layers, k, features, num_classes,
                                    self.host_bytes(r, file_counts, held), self.file_rows(r, file_counts)[1])
                for r in range(len(self.worlds))]  # loop over ranks

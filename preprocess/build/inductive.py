"""What an inductive build (`--inductive`) adds to every server file (docs/inductive.md).

The set keeps the full graph's partition, preloads and world view: evaluation needs the full graph
(test) and the train+validation-induced graph (validation), and training the train-induced one, which
are all subgraphs of the stored ones.  The engine derives each by filtering rows and edges
(granndis_hpc/engine/inductive.py); two things it cannot derive from the rows it reads are stored:

- graph/train_in_degree: the in-degree of every row within the train-induced graph (its in-neighbours
  that are training vertices).  A preloaded row at the deepest hop lacks its in-edges in the file, yet
  GCN normalises its messages by that degree.
- world/src_split: the split code of every world-view source (shards.SPLIT_BITS), so that each rank
  drops the edges from vertices outside the induced graph without asking their owners.
- graph/train_hop: every row's hop within the train-induced graph: its BFS distance from the server's
  inner training rows over the file's edges between training rows, as the preload's hop is defined over
  all of them (shards.TRAIN_HOP_UNREACHED beyond the preload's hops, and for rows that are no training
  vertex).  flx and eas train on the rows it reaches: the train-induced graph's own preload.  Rows at a
  hop below the preload's hold all their in-edges, so for a full preload the BFS over the file's edges
  is the BFS over the train-induced graph; an EAS file is its own closed graph.
"""
from __future__ import annotations

import numpy as np

from granndis_hpc.graph.csr import bfs_hops, csr_rows
from granndis_hpc.shards import TRAIN_HOP_UNREACHED, split_code


def train_in_degree(indptr: np.ndarray, indices: np.ndarray, train: np.ndarray) -> np.ndarray:
    """int64 [rows]: per row of an in-edge CSR (sources as global ids), its in-neighbours that are
    training vertices (one prefix sum over the edges, no per-row loop)."""
    per_edge = np.asarray(train, dtype=bool)[indices]
    total = np.zeros(per_edge.shape[0] + 1, dtype=np.int64)
    np.cumsum(per_edge, out=total[1:])
    del per_edge
    indptr = np.asarray(indptr, dtype=np.int64)
    return total[indptr[1:]] - total[indptr[:-1]]


def vertex_split_codes(train: np.ndarray, val: np.ndarray, test: np.ndarray) -> np.ndarray:
    """uint8 [N]: every vertex's split code (1 B per vertex)."""
    return split_code(train, val, test)


def _stored_hops(hop_of: np.ndarray) -> np.ndarray:
    """uint8: BFS hops (-1 = not reached) as graph/train_hop stores them."""
    return np.where(hop_of >= 0, hop_of, TRAIN_HOP_UNREACHED).astype(np.uint8)


def train_hops(indptr: np.ndarray, indices: np.ndarray, hop: np.ndarray, train: np.ndarray, depth: int) -> np.ndarray:
    """uint8 [rows]: graph/train_hop of a server file from its in-edge CSR (sources as file rows), its rows'
    hops and training flags: the BFS from the inner training rows along in-edges from training rows, `depth`
    hops deep (one vectorised step per hop)."""
    train = np.asarray(train, dtype=bool)
    if depth >= TRAIN_HOP_UNREACHED:
        raise ValueError(f"graph/train_hop stores hops below {TRAIN_HOP_UNREACHED}, the preload has {depth}")

    def expand(frontier, hop_of):
        src = csr_rows(indptr, indices, frontier)[1]
        return src[train[src]]
    inner = np.flatnonzero((np.asarray(hop) == 0) & train)
    return _stored_hops(bfs_hops(np.asarray(indptr, dtype=np.int64), indices, inner, int(depth), expand))


def train_hops_sliced(group, part, file_row: np.ndarray, verts: np.ndarray, hop: np.ndarray, train: np.ndarray,
                      depth: int) -> np.ndarray:
    """Collective (the distributed build, preprocess/build/dist_server.py): train_hops of the server whose rows are
    the global ids `verts` (file order; `hop` theirs, file_row: every vertex's row, -1 outside), from the
    rank slices of the graph.  The file's edges are the graph's between its rows, so each rank expands the
    frontier rows it holds and one max-allreduce of an N-byte mask per hop joins the new rows: the same hops
    as train_hops on the written file.  train: every vertex's training flag."""
    n = part.num_vertices
    hop_of = np.full(n, -1, dtype=np.int16)
    hop_of[verts[(np.asarray(hop) == 0) & train[verts]]] = 0
    candidate = (file_row >= 0) & np.asarray(train, dtype=bool)  # a row of the file and a training vertex
    for t in range(1, int(depth) + 1):
        front = np.flatnonzero(hop_of[part.lo:part.hi] == t - 1)
        src = csr_rows(part.indptr, part.indices, front)[1]
        mask = np.zeros(n, dtype=np.uint8)
        mask[src[candidate[src] & (hop_of[src] < 0)]] = 1
        new = group.allreduce_max(mask).view(bool)
        if not new.any():
            break
        hop_of[new] = t
    return _stored_hops(hop_of[verts])

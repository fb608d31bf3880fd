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
"""
from __future__ import annotations

import numpy as np

from granndis_hpc.shards import split_code


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

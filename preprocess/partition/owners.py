"""Which GPU of a server owns each of the server's vertices.

Rule (documented in docs/shard-format.md):
1. Inner vertices (hop 0) stay on the GPU METIS gave them; they never move, so the preloaded view and
   the world view agree on inner owners.
2. Hop by hop, a preloaded vertex u at hop t goes to the GPU that owns most of the hop t-1 vertices u
   feeds (its out-neighbours w, edges u -> w, that were reached one hop earlier): those are the rows
   that aggregate u, so this keeps the per-layer intra-server exchange small.  Ties go to the GPU with
   the fewest rows so far.
3. If the busiest GPU then holds more than (1 + tolerance) x the average number of rows, preloaded rows
   move from GPUs above ceil(average) to GPUs below it, deepest hop first (deep rows are active in the
   fewest layers), until every GPU is at most ceil(average) or has nothing left to move.
"""
from __future__ import annotations

import numpy as np

from granndis_hpc.graph.csr import row_of_edges

DEFAULT_TOLERANCE = 0.10


def assign_owners(indptr: np.ndarray, indices: np.ndarray, hop: np.ndarray, inner_gpu: np.ndarray,
                  gpus: int, tolerance: float = DEFAULT_TOLERANCE) -> np.ndarray:
    """Owner GPU (int32) of every vertex of a server subgraph (in-edge CSR in local ids).

    `inner_gpu[i]` is the METIS GPU of local vertex i when hop[i] == 0 (ignored otherwise).
    """
    n = hop.shape[0]
    owner = np.full(n, -1, dtype=np.int32)
    is_inner = hop == 0
    owner[is_inner] = inner_gpu[is_inner]
    dst = row_of_edges(indptr)  # edge e: indices[e] -> dst[e]
    src = indices
    max_hop = int(hop.max()) if n else 0
    for t in range(1, max_hop + 1):
        feeds = (hop[src] == t) & (hop[dst] == t - 1)
        u, g = src[feeds], owner[dst[feeds]]
        votes = np.bincount(u * gpus + g, minlength=n * gpus).reshape(n, gpus).astype(np.float64)
        load = np.bincount(owner[owner >= 0], minlength=gpus).astype(np.float64)
        # Tie-break in [0, 0.5): never beats a real vote difference, prefers the least loaded GPU.
        votes += 0.5 * (1.0 - load / (load.max() + 1.0))
        at_t = np.flatnonzero(hop == t)
        owner[at_t] = np.argmax(votes[at_t], axis=1).astype(np.int32)
    return rebalance(owner, hop, gpus, tolerance)


def rebalance(owner: np.ndarray, hop: np.ndarray, gpus: int, tolerance: float = DEFAULT_TOLERANCE) -> np.ndarray:
    """Move preloaded rows off GPUs holding more than (1+tolerance) x average rows (rule 3 above)."""
    n = owner.shape[0]
    load = np.bincount(owner, minlength=gpus)
    if n == 0 or load.max() <= (1.0 + tolerance) * n / gpus:
        return owner
    owner = owner.copy()
    target = -(-n // gpus)  # ceil(average)
    moved = []
    for g in np.flatnonzero(load > target):  # loop over GPUs, not vertices
        movable = np.flatnonzero((owner == g) & (hop > 0))
        movable = movable[np.lexsort((movable, -hop[movable]))]  # deepest hop first
        moved.append(movable[: min(load[g] - target, movable.shape[0])])
    pool = np.concatenate(moved) if moved else np.zeros(0, dtype=np.int64)
    deficit = np.maximum(target - load, 0)
    receivers = np.repeat(np.arange(gpus, dtype=np.int32), deficit)[: pool.shape[0]]
    owner[pool[: receivers.shape[0]]] = receivers
    return owner

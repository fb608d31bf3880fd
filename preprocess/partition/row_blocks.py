"""Locality blocks of every rank's rows: the order a server file keeps inside one (owner GPU, hop) class.

Why: a CSR product gathers one operand row per entry.  In global-id order (the synthetic generators'
ids and those of many real datasets carry no locality) those gathers land anywhere in the rank's whole
operand, which at realistic sizes does not stay in cache; with the rows of a METIS block of the rank's
subgraph consecutive, more entries of a row read rows of the same block (35 % against 2 % on the
100k-vertex synthetic graph).  Measured on one rank of it, 64 columns: the C product 1.2-1.56x faster,
the epoch 1.1-1.2x (docs/performance/single-rank.md).

Every part (one GPU of one server: part = server * G + gpu) with more than `block_rows` inner vertices
is split by METIS into ceil(m / block_rows) blocks of its symmetric inner subgraph; METIS runs on one
rank per part (rounds of P parts, part j of a round on rank j), from the same slices in the whole-graph
and the distributed build (gpu_split's `access.inner_keys`), so both write the same files.  A file then
orders a GPU's rows by (hop, home part, block, global id): the inner rows by block, the preloaded rows
grouped by the part and block they are inner rows of.
"""
from __future__ import annotations

import numpy as np

from granndis_hpc.preprocess.partition.gpu_split import slices_dist
from granndis_hpc.preprocess.partition.metis import metis_part
from granndis_hpc.preprocess.build.slices import keys_to_adjacency

DEFAULT_BLOCK_ROWS = 2048  # a block's operand rows at 64 float32 columns: 512 KiB, within a core's L2


def part_of(server_of: np.ndarray, gpu_of: np.ndarray, gpus: int) -> np.ndarray:
    """The part (server * G + gpu, int32) of every vertex."""
    part = server_of.astype(np.int32)
    part *= gpus
    part += gpu_of
    return part


def row_blocks(group, access, part: np.ndarray, parts: int, block_rows: int) -> np.ndarray | None:
    """Collective: the block of every vertex inside its part (int32 [N], the same on every rank; 0 in a
    part no larger than one block), or None with block_rows 0 (global-id order).

    part: the part (server * G + gpu) of every vertex (`part_of`); access: WholeGraphAccess or
    dist_build.SlicedAccess (inner_keys with `labels`)."""
    P, rank = group.size, group.rank
    if block_rows <= 0:
        return None
    block = np.zeros(part.shape[0], dtype=np.int32)
    split = np.flatnonzero(np.bincount(part, minlength=parts) > block_rows)
    for first in range(0, split.shape[0], P):
        this_round = split[first:first + P]
        # The vertices of this round's parts, grouped by part (two passes over the graph a round, not
        # one a part: a cluster has thousands of GPUs).
        members = np.flatnonzero((part >= this_round[0]) & (part <= this_round[-1]))
        members = members[np.isin(part[members], this_round)]
        members = members[np.argsort(part[members], kind="stable")]  # ids ascend inside a part
        bounds = np.searchsorted(part[members], np.append(this_round, this_round[-1] + 1))
        pending = None
        for writer, t in enumerate(this_round):
            inner = members[bounds[writer]:bounds[writer + 1]]
            m = inner.shape[0]
            keys = access.inner_keys(int(t), inner, slices_dist(m, P, writer, 1), labels=part)
            if rank == writer:
                pending = (inner, keys_to_adjacency(keys, m, 0, m))
            del keys
        del members
        with group.errors("ordering rows by locality blocks (METIS on each GPU's inner subgraph)"):
            if pending is not None:
                inner, (xadj, adjncy) = pending
                block[inner] = metis_part(xadj, adjncy, -(-inner.shape[0] // block_rows), None)[0]
        del pending
        group.idle_barrier()  # the ranks without a part this round wait asleep for those with one
    return group.allreduce_max(block)


def file_order(verts: np.ndarray, hop: np.ndarray, owner: np.ndarray, server_of: np.ndarray, gpu_of: np.ndarray,
               block: np.ndarray | None) -> np.ndarray:
    """The permutation that puts a server's rows (global ids `verts`, their hop and owner GPU) in file
    order: by (owner GPU, hop, home server, home GPU, block, global id); without blocks by (owner GPU,
    hop, global id)."""
    if block is None:
        return np.lexsort((verts, hop, owner))
    return np.lexsort((verts, block[verts], gpu_of[verts], server_of[verts], hop, owner))

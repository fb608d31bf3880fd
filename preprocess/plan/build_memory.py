"""Estimated peak memory of one rank of the distributed build (`preprocess plan`).

The build (preprocess/build/sliced.py, preprocess/build/distributed.py) holds, on rank r of P:

* always: the interpreter with numpy/scipy/h5py/mpi4py (BASE_BYTES);
* its slice: the in-edges of N/P rows (8 B each), their features (4F B per row) and labels/masks;
* load: the int64 keys of its raw edges (both directions when symmetrising) and their alltoallv copy:
  LOAD_BYTES_PER_KEY per key it reads (no per-vertex array of the graph exists yet);
* partition: only what the partitioner reads is in memory (dist_build.run_build_sliced): the slice's
  features and labels wait on disk for the whole phase and its edges during each ParMETIS call
  (slices.spilled), and the in-degrees and val/test masks are gathered after it.  The phase peaks at
  one of two moments (measured by tracing every live array, docs/performance/build-scaling.md):
  - building the slice's symmetric adjacency (SlicedAccess.adjacency): BASE_BYTES + KEY_BYTES_PER_EDGE
    per edge (int64 keys of both directions of every slice edge, their alltoallv copy and sort, beside
    the slice's edges) and PARTITION_ROW_BYTES per row of the slice; for ParMETIS on a symmetrised
    graph (`symmetric`, the build's default) the slice's own rows are that adjacency already, and only
    SYMMETRIC_ADJ_BYTES_PER_EDGE per edge are held (the edges, their row ids and the loop mask, then
    the int32 copy for the partitioner).  The peak at P = 1 and 2 with keys;
  - inside ParMETIS (PT-Scotch): SCOTCH_BASE_BYTES (the interpreter, libraries and MPI
    that are resident then: less than BASE_BYTES, whose Python heap PT-Scotch reuses; h5py is not
    loaded yet) +
    SCOTCH_BYTES_PER_EDGE per edge of the slice (PT-Scotch's own structures with our int32 relabelled
    adjacency: partition.part_kway_with_locality frees the original rows and the whole-graph map
    before the call) + PT-Scotch's band graph, gathered onto every process: scotch_vertex_bytes() per
    vertex of the WHOLE graph when every band is gathered (GRANNDIS_SCOTCH_BAND_GATHER=always), at
    most SCOTCH_GATHERED_BYTES_PER_ARC per arc of the gather limit (parmetis.SCOTCH_BAND_GATHER times
    the slice's arcs) by default, whichever is less.  The band term is PT-Scotch's, not ours: every
    array of ours alive at the call is ~1 B per vertex of the graph (the training mask) plus the
    slice's (PARTITION_VERTEX_BYTES, with the GPU split's server and GPU of every vertex).  The peak at
    P >= 4.  Before the call the relabelling (preprocess/partition/locality.py) holds the slice's int32 and int64
    rows, their int64 keys and the whole-graph map (8 B per vertex): below the call's peak at every
    size measured, so it has no term of its own.
  Then the GPU split: with ParMETIS on the concurrent path (gpu_split.gpu_split_groups: 2 <= S <= P)
  each server's split runs on its own block of P / S ranks, every rank holding n/P rows of one server
  (the same ParMETIS terms for n/S vertices and E/P slice edges); on the sequential path every rank
  holds 1/P of each server's inner subgraph (n/S vertices, E/(S P) slice edges); METIS
  instead gathers the whole adjacency on rank 0 (METIS_BYTES_PER_EDGE per edge of the graph there,
  the slice's edges staying in memory, 8 B each) and the writer rank splits its server alone
  (GPU_SPLIT_BYTES_PER_INNER_EDGE per edge of E/S).  Then the locality blocks (row_blocks.py): METIS
  on one rank per GPU, rank j of each round of P GPUs, on the GPU's inner subgraph (the same code as
  the METIS GPU split: GPU_SPLIT_BYTES_PER_INNER_EDGE per edge of E/(S G)), the slice's edges in memory;
* halos+write (preprocess/build/dist_server.py): every rank keeps PER_VERTEX_BYTES per vertex of the graph
  from the partition on (int8 server and GPU of every vertex, int32 in-degree, three bool split
  masks: 9 B) and takes part in every server's halo selection, owner votes and file, on its own rows:
  a few per-vertex arrays while a server is built (HALO_BYTES_PER_VERTEX: the int8 hop and owner of
  every vertex, the owners' allgathered copy, the int32 file row, the BFS's selected and union masks)
  and the server's per-row arrays (ROW_BYTES per row of the largest server: int64 global ids, int8
  hops and owners, and their sort); the writer of server s (rank s % P) adds its row offsets
  (WRITER_BYTES_PER_ROW) and one block of the file (dist_server.block_rows: whole feature chunks, at
  most ceil(rows / P) rows and dist_server.BLOCK_BYTES of features), whose features (received, then
  reordered: BLOCK_BYTES_PER_FEATURE per feature of a row) or in-edges (BLOCK_BYTES_PER_EDGE +
  BLOCK_PRODUCE_BYTES_PER_EDGE / P per in-edge of a row, the server's average: received, reordered,
  the transfer's buffers, and the writer's own share of the relabelling), whichever is larger, are
  alive at a time.  No rank holds a
  server's rows, and the writer's block is bounded in bytes whatever the server's size.  EAS uses the
  same terms (its scoring arrays are those of the frontier rows each rank owns, within the above at
  the sizes measured).  Measured by tracing every array alive at the phase's
  peak (docs/performance/build-scaling.md): at 800k, P = 8, a non-writer holds 75 MiB of arrays
  (its slice 57 MiB, per-vertex and per-row arrays the rest) beside 150-195 MiB of interpreter,
  libraries, MPI and heap kept from the partition phase.

The constants were fitted to bench/bench_build_scaling.py's per-phase peak RSS per rank (the
partition terms to the 2.45M builds at P = 1, 2, 4, 8 and to the traced RSS
inside the ParMETIS calls of 800k builds at P = 2, 4, 8; the load and halos+write terms
to the 2.45M full builds at P = 1 and 8 and the 800k full build at P = 8, the per-vertex and per-row
bytes counted from the dtypes of the arrays the trace found; the gathered band's bound
to the server call's peak at 2.45M P = 8 with the gather limit) (docs/performance/build-scaling.md, where
the estimate is checked against every measured rank).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

MIB = 1 << 20
BASE_BYTES = 150 * MIB
PER_VERTEX_BYTES = 9  # from the partition on, every rank: int8 server and GPU, int32 in-degree, 3 masks
PARTITION_VERTEX_BYTES = 6  # ours, on every rank: training mask, the GPU split's server and GPU ids
PARTITION_ROW_BYTES = 16
LOAD_BYTES_PER_KEY = 16  # the int64 key and its alltoallv copy
KEY_BYTES_PER_EDGE = 62  # building the slice's symmetric adjacency (keys, their shuffle, the edges)
SYMMETRIC_ADJ_BYTES_PER_EDGE = 17  # a symmetric slice's own rows: int64 edges and row ids, loop mask
# What is resident besides PT-Scotch's structures and ours during the call: the interpreter, libraries,
# MPI: 100 MiB (h5py is imported only at the write, ~13 MiB; PT-Scotch's
# freed arrays returned to the system during the call, parmetis._heap_for_call): refitted to the 2.45M
# P = 8 partition phase (0.491 / 0.499 GiB, two runs; docs/performance/build-scaling.md).
SCOTCH_BASE_BYTES = 100 * MIB
# PT-Scotch's, per vertex of the whole graph, on every rank (P >= 2): the band graph it gathers onto
# every process (docs/design.md §8), by the band's width (preprocess/parmetis.scotch_band_width).
# Fitted to the partition phase's peak at P = 8: width 1 (the build's default) at 800k (0.272 GiB) and
# 2.45M (0.62 GiB); width 3 (PT-Scotch's own) to the 800k P = 2/4/8 traces and 2.45M P = 1..8.
# Width 2 measured as 3 (800k P = 8: 0.342 against 0.343 GiB).
SCOTCH_VERTEX_BYTES = 200
SCOTCH_VERTEX_BYTES_NARROW_BAND = 96
SCOTCH_BYTES_PER_EDGE = 40  # PT-Scotch's structures and our int32 adjacency, per edge of the slice
# The band gathered only below SCOTCH_BAND_GATHER x the slice's arcs (the default): per arc of that
# limit, fitted to the server call's peak at 2.45M P = 8 (536 MiB; 800k P = 8: 221 measured, 256
# estimated, the band there being under the limit at more levels).
SCOTCH_GATHERED_BYTES_PER_ARC = 10.5
METIS_BYTES_PER_EDGE = 40
GPU_SPLIT_BYTES_PER_INNER_EDGE = 48  # the writer's METIS GPU split (metis, random): inner keys, METIS
HALO_BYTES_PER_VERTEX = 10  # int8 hop, owner and its allgathered copy; int32 file row; 2-3 bool masks
ROW_BYTES = 24  # int64 global id, int8 hop and owner, and the (owner, hop, id) sort's permutation
WRITER_BYTES_PER_ROW = 8  # the writer's int64 row offsets of the subgraph (graph/indptr)
BLOCK_BYTES_PER_FEATURE = 8  # float32, two copies (received, reordered)
# Per in-edge of a block's rows on the writer: received and reordered int64 (16 B) and what the write
# round holds besides (MPI's and HDF5's buffers: malloc'd bytes in use that no array of ours holds,
# found by tracing), fitted to the writer's rise at 800k P = 1 (trace) and 2.45M P = 8;
# plus the relabelling of the rows the writer owns itself (sources, file rows, row ids, sorted keys),
# 1/P of the block.
BLOCK_BYTES_PER_EDGE = 30
BLOCK_PRODUCE_BYTES_PER_EDGE = 31


def scotch_vertex_bytes() -> int:
    """PT-Scotch's bytes per vertex of the whole graph on every rank, for the band width the build uses."""
    from granndis_hpc.preprocess.partition.parmetis import scotch_band_width
    return SCOTCH_VERTEX_BYTES_NARROW_BAND if scotch_band_width() == 1 else SCOTCH_VERTEX_BYTES


def scotch_band_bytes(vertices: float, slice_edges: float, ranks: int) -> float:
    """PT-Scotch's band graph on every rank of a call on `vertices` vertices with `slice_edges` edges
    per rank: the whole graph's per-vertex term, bounded by the gather limit (module docstring); at
    one rank the limit is the whole graph (PT-Scotch is sequential there, no band is gathered)."""
    from granndis_hpc.preprocess.partition.parmetis import scotch_band_gather
    full = scotch_vertex_bytes() * vertices
    gather = scotch_band_gather()
    if gather is None or ranks < 2:
        return full
    return min(full, SCOTCH_GATHERED_BYTES_PER_ARC * gather * slice_edges)


@dataclass
class ServerLoad:
    """One server's file: its rows and the in-edges of those rows (global in-degrees)."""

    server: int
    rows: int
    fetched_edges: int


@dataclass
class BuildMemory:
    ranks: int
    per_rank: List[int]  # estimated peak bytes of every rank
    phases: List[Dict[str, int]] = field(default_factory=list)  # per rank: phase -> bytes

    @property
    def peak(self) -> int:
        return max(self.per_rank)

    def to_dict(self) -> dict:
        return {"ranks": self.ranks, "peak_bytes": self.peak, "per_rank": self.per_rank, "phases": self.phases}


def estimate_build_memory(num_vertices: int, num_edges: int, raw_keys: int, num_features: int,
                          servers: List[ServerLoad], ranks: int, partitioner: str = "parmetis",
                          eas: bool = False, symmetric: bool = True, row_block_parts: int = 0) -> BuildMemory:
    """Peak bytes per rank of a P-rank sliced build (module docstring).  raw_keys: int64 edge keys the
    load makes (raw edges, twice when symmetrising).  `eas` is recorded by the plan but changes no term
    (the EAS servers' own rows and in-edges come in `servers`); `symmetric`: the graph was symmetrised
    (the ParMETIS adjacency is then the slice's own rows); row_block_parts: the GPUs (S G) whose rows
    are ordered by locality blocks (0: --row-block-rows 0)."""
    from granndis_hpc.preprocess.build.dist_server import block_rows

    P, n, e, F = int(ranks), int(num_vertices), int(num_edges), int(num_features)
    per_rank, phases = [], []
    rows_max = max((s.rows for s in servers), default=0)
    for r in range(P):
        rows = (n * (r + 1)) // P - (n * r) // P
        edges = e * rows / max(n, 1)  # the slice's share of the edges (balanced on average)
        held = 8 * edges + (4 * F + 24) * rows
        mine = [s for s in servers if s.server % P == r]
        # The partition phase (docstring): the adjacency's keys, then the partitioner.  The server
        # partitioner's structures are freed before the GPU split.
        ours = PARTITION_VERTEX_BYTES * n + PARTITION_ROW_BYTES * rows
        own_rows = symmetric and partitioner == "parmetis"
        keys = BASE_BYTES + (SYMMETRIC_ADJ_BYTES_PER_EDGE if own_rows else KEY_BYTES_PER_EDGE) * edges + ours
        if partitioner == "parmetis":
            S = max(len(servers), 1)
            # The GPU split's slice: n/P rows of one server on its block (concurrent), else 1/P of each.
            split_edges = e / P if 2 <= S <= P else e / S / P
            call = SCOTCH_BASE_BYTES + ours + max(
                scotch_band_bytes(n, edges, P) + SCOTCH_BYTES_PER_EDGE * edges,
                scotch_band_bytes(n / S, split_edges, max(P // S, 1) if 2 <= S <= P else P)
                + SCOTCH_BYTES_PER_EDGE * split_edges)
            part = max(keys, call)
        else:  # METIS (metis, random): the edges stay in memory; rank 0 holds the whole adjacency
            gpu_split = GPU_SPLIT_BYTES_PER_INNER_EDGE * e / max(len(servers), 1) if mine else 0
            part = keys + 8 * edges + max(METIS_BYTES_PER_EDGE * e if partitioner == "metis" and r == 0 else 0,
                                          gpu_split)
        if r < row_block_parts:  # the locality blocks' METIS on one GPU's inner subgraph
            part = max(part, BASE_BYTES + ours + 8 * edges + GPU_SPLIT_BYTES_PER_INNER_EDGE * e / row_block_parts)
        ph = {"load": BASE_BYTES + held + LOAD_BYTES_PER_KEY * raw_keys / P, "partition": part}
        block = max((WRITER_BYTES_PER_ROW * s.rows + block_rows(s.rows, F, P)
                     * max(BLOCK_BYTES_PER_FEATURE * F, (BLOCK_BYTES_PER_EDGE + BLOCK_PRODUCE_BYTES_PER_EDGE / P)
                           * s.fetched_edges / max(s.rows, 1))
                     for s in mine), default=0)
        ph["halos+write"] = (BASE_BYTES + held + (PER_VERTEX_BYTES + HALO_BYTES_PER_VERTEX) * n
                             + ROW_BYTES * rows_max + block)
        ph = {k: int(v) for k, v in ph.items()}
        phases.append(ph)
        per_rank.append(max(ph.values()))
    return BuildMemory(ranks=P, per_rank=per_rank, phases=phases)


def smallest_fitting_ranks(budget: int, max_ranks: int = 1024, **kwargs) -> Optional[int]:
    """The smallest P whose estimated peak per rank fits `budget` (None when none up to max_ranks does:
    every rank holds PT-Scotch's SCOTCH_VERTEX_BYTES per vertex of the graph, the per-vertex arrays and
    the server's per-row arrays, and with METIS the writer of a server its GPU split, which do not
    shrink with P)."""
    for P in range(1, max_ranks + 1):
        if estimate_build_memory(ranks=P, **kwargs).peak <= budget:
            return P
    return None

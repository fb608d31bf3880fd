"""Estimated peak memory of one rank of the distributed build (`preprocess plan`, issue 17).

The build (preprocess/sliced.py, preprocess/dist_build.py) holds, on rank r of P:

* always: the interpreter with numpy/scipy/h5py/mpi4py (BASE_BYTES) and the per-vertex arrays every
  rank keeps (server and GPU of every vertex, in-degrees, split masks, the partitioner's parts:
  PER_VERTEX_BYTES per vertex of the graph);
* its slice: the in-edges of N/P rows (8 B each), their features (4F B per row) and labels/masks;
* load: the int64 keys of its raw edges (both directions when symmetrising), their alltoallv copy and
  the de-duplication mask: LOAD_BYTES_PER_KEY per key it reads;
* partition: only what the partitioner reads is in memory (dist_build.run_build_sliced): the slice's
  features and labels wait on disk for the whole phase and its edges during each ParMETIS call
  (sliced.spilled), and the in-degrees and val/test masks are gathered after it.  So the phase holds
  BASE_BYTES, PARTITION_VERTEX_BYTES per vertex of the graph (the training mask and what PT-Scotch
  and the source keep per vertex of the whole graph: fitted, not itemised),
  PARTITION_ROW_BYTES per row of the slice (its row offsets and masks), and the symmetric adjacency
  with ParMETIS' own structures for the slice (PARTITION_BYTES_PER_EDGE per edge of the slice); METIS
  instead gathers the whole adjacency on rank 0 (METIS_BYTES_PER_EDGE per edge of the graph there) and
  the slice's edges stay in memory (8 B each); then the GPU split: with ParMETIS every rank holds 1/P
  of each server's inner subgraph (PARTITION_BYTES_PER_EDGE per edge of E/(S P), below the server
  partition's term), with METIS the writer rank splits its server alone (GPU_SPLIT_BYTES_PER_INNER_EDGE
  per edge of E/S);
* halos+write (preprocess/dist_server.py): every rank takes part in every server's halo selection,
  owner votes and file, on its own rows: a few per-vertex arrays while a server is built
  (HALO_BYTES_PER_VERTEX: its hop, owner and file row of every vertex, the union masks) and the
  server's per-row arrays (ROW_BYTES per row of the largest server: global ids, hops, owners and their
  sort); the writer of server s (rank s % P) adds one block of the file, ceil(rows / P) rows with their
  features (fetched, then reordered: BLOCK_BYTES_PER_FEATURE per feature of a row) and their in-edges
  (BLOCK_BYTES_PER_EDGE per in-edge of a row, the server's average).  No rank holds a server's rows any
  more, so the writer's term shrinks as 1/P too.  EAS uses the same terms (its scoring arrays are
  those of the frontier rows each rank owns, within the above at the sizes measured).

The constants were fitted to bench/bench_build_scaling.py's per-phase peak RSS per rank (the
partition terms to 2.45M vertices at P = 1 and 8 and 800k at P = 8, after the spill)
(docs/bench-build-scaling.md, where the estimate is checked against the measurement).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

MIB = 1 << 20
BASE_BYTES = 150 * MIB
PER_VERTEX_BYTES = 64
PARTITION_VERTEX_BYTES = 120
PARTITION_ROW_BYTES = 16
LOAD_BYTES_PER_KEY = 8
PARTITION_BYTES_PER_EDGE = 58
METIS_BYTES_PER_EDGE = 40
GPU_SPLIT_BYTES_PER_INNER_EDGE = 48  # the writer's METIS GPU split (metis, random): inner keys, METIS
HALO_BYTES_PER_VERTEX = 8
ROW_BYTES = 24
BLOCK_BYTES_PER_FEATURE = 8  # float32, two copies (received, reordered)
BLOCK_BYTES_PER_EDGE = 16


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
                          eas: bool = False) -> BuildMemory:
    """Peak bytes per rank of a P-rank sliced build (module docstring).  raw_keys: int64 edge keys the
    load makes (raw edges, twice when symmetrising).  `eas` is recorded by the plan but changes no term
    (the EAS servers' own rows and in-edges come in `servers`)."""
    P, n, e, F = int(ranks), int(num_vertices), int(num_edges), int(num_features)
    per_rank, phases = [], []
    rows_max = max((s.rows for s in servers), default=0)
    for r in range(P):
        rows = (n * (r + 1)) // P - (n * r) // P
        edges = e * rows / max(n, 1)  # the slice's share of the edges (balanced on average)
        common = BASE_BYTES + PER_VERTEX_BYTES * n
        held = 8 * edges + (4 * F + 24) * rows
        mine = [s for s in servers if s.server % P == r]
        # The server partitioner's structures are freed before the GPU split.  ParMETIS: every rank
        # holds 1/P of each server's inner edges (E/S of them), one server at a time; METIS (metis,
        # random): the writer holds its server's.
        if partitioner == "parmetis":
            gpu_split = PARTITION_BYTES_PER_EDGE * e / max(len(servers), 1) / P
        else:
            gpu_split = GPU_SPLIT_BYTES_PER_INNER_EDGE * e / max(len(servers), 1) if mine else 0
        # The partition phase: features, labels (and with ParMETIS the edges) on disk (docstring).
        part_held = PARTITION_ROW_BYTES * rows + (0 if partitioner == "parmetis" else 8 * edges)
        ph = {"load": common + held + LOAD_BYTES_PER_KEY * raw_keys / P,
              "partition": BASE_BYTES + PARTITION_VERTEX_BYTES * n + part_held
              + max(PARTITION_BYTES_PER_EDGE * edges + (METIS_BYTES_PER_EDGE * e if partitioner == "metis" and r == 0
                                                        else 0), gpu_split)}
        block = max((-(-s.rows // P) * (BLOCK_BYTES_PER_FEATURE * F + BLOCK_BYTES_PER_EDGE * s.fetched_edges
                                         / max(s.rows, 1)) for s in mine), default=0)
        ph["halos+write"] = (common + held + HALO_BYTES_PER_VERTEX * n + ROW_BYTES * rows_max + block)
        ph = {k: int(v) for k, v in ph.items()}
        phases.append(ph)
        per_rank.append(max(ph.values()))
    return BuildMemory(ranks=P, per_rank=per_rank, phases=phases)


def smallest_fitting_ranks(budget: int, max_ranks: int = 1024, **kwargs) -> Optional[int]:
    """The smallest P whose estimated peak per rank fits `budget` (None when none up to max_ranks does:
    every rank holds the per-vertex arrays and the server's per-row arrays, and with METIS the writer
    of a server its GPU split, which do not shrink with P)."""
    for P in range(1, max_ranks + 1):
        if estimate_build_memory(ranks=P, **kwargs).peak <= budget:
            return P
    return None

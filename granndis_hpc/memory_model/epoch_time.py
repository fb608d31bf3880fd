"""An option's predicted epoch time from its exact rows and bytes and the measured rates (no torch, no MPI).

Which plan trains fastest depends on the graph, the model, the machine and the network: preloading (flx,
eas) trades inter-server bytes for more rows computed, which pays on a slow link between servers and
not on one machine.  `work` counts what an epoch does from the option's RankRows (every rank's), and
`seconds` prices it with `Rates`:

- compute: the busiest rank's sum over layers of  n_dst x row_s x w_in x w_out + nnz x edge_s x w_in
  (a layer's projection per computed row and its aggregation per edge, forward and backward, as
  memory_model/compute_rate.py measures them);
- inter-server: the busiest server's halo bytes (its ranks' inter-server halo rows at each exchanging
  layer's input width, forward and their gradients backward) plus its share of the gradient all-reduce
  (2 (S-1) x params x 4 bytes per step over S leaders), over inter_Bps;
- intra-server: the busiest rank's intra-server halo bytes over intra_Bps;
all times the co-batches per epoch (cob's rows are one co-batch's).  The total is their sum: the
additive model, an upper bound that overlapping the exchanges with compute only lowers
(report/linkmodel.py models the overlap of a run that has been measured).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import numpy as np

from granndis_hpc.units import FLOAT32_BYTES as F32

from .estimate import ModelSpec, RankRows, rank_halo_bytes


@dataclass(frozen=True)
class Rates:
    """Measured rates: link payload bytes/s (None: the job has no such link) and compute seconds per
    computed row per (w_in x w_out) and per edge per feature (w_in), forward and backward."""

    inter_Bps: Optional[float]
    intra_Bps: Optional[float]
    row_s: float
    edge_s: float


@dataclass(frozen=True, eq=False)
class Work:
    """What one epoch of an option does, exactly: per rank its row and edge units and intra-server halo
    bytes, per server its inter-server bytes (halo and gradient)."""

    row_units: np.ndarray  # per rank: sum over layers of n_dst x w_in x w_out
    edge_units: np.ndarray  # per rank: sum over layers of nnz x w_in
    intra_bytes: np.ndarray  # per rank
    inter_bytes: np.ndarray  # per server
    rows_computed: int  # all ranks, all layers, the epoch


def work(option_rows: Sequence[RankRows], m: ModelSpec, servers: int, batches: int = 1) -> Work:
    """The epoch's work of the option whose every rank's rows are `option_rows` (one co-batch's for cob:
    `batches` of them make the epoch, each an optimizer step)."""
    widths = np.asarray(m.widths(), dtype=np.float64)
    n_dst = np.array([[lr.n_dst for _, lr in r.training_layers()] for r in option_rows], dtype=np.float64)
    nnz = np.array([[lr.nnz for _, lr in r.training_layers()] for r in option_rows], dtype=np.float64)
    halo = np.array([rank_halo_bytes(r, m) for r in option_rows], dtype=np.float64).reshape(-1, 2)
    server = np.array([r.rank for r in option_rows]) // max(1, len(option_rows) // int(servers))
    inter = np.bincount(server, weights=halo[:, 0], minlength=int(servers))
    grad_per_server = 2 * (int(servers) - 1) * m.parameters() * F32 / int(servers)
    b = int(batches)
    return Work(row_units=b * n_dst @ (widths[:, 0] * widths[:, 1]), edge_units=b * nnz @ widths[:, 0],
                intra_bytes=b * halo[:, 1], inter_bytes=b * (inter + grad_per_server),
                rows_computed=int(b * n_dst.sum()))


def _wire(nbytes: float, rate: Optional[float], link: str) -> float:
    if nbytes <= 0:
        return 0.0
    if not rate:
        raise ValueError(f"{nbytes:,.0f} bytes cross the {link} link, whose rate is not measured")
    return float(nbytes / rate)


def seconds(w: Work, rates: Rates) -> Dict[str, float]:
    """{compute_s, inter_s, intra_s, total_s}: the additive model of `w`'s epoch (an upper bound)."""
    compute = float(np.max(w.row_units * rates.row_s + w.edge_units * rates.edge_s, initial=0.0))
    inter = _wire(float(np.max(w.inter_bytes, initial=0.0)), rates.inter_Bps, "inter-server")
    intra = _wire(float(np.max(w.intra_bytes, initial=0.0)), rates.intra_Bps, "intra-server")
    return {"compute_s": compute, "inter_s": inter, "intra_s": intra, "total_s": compute + inter + intra}


def predict(option_rows: Sequence[RankRows], m: ModelSpec, servers: int, batches: int, rates: Rates) -> dict:
    """The predicted epoch seconds of an option (`seconds` of its `work`), with the busiest server's
    inter-server and the busiest rank's intra-server bytes and the rows computed."""
    w = work(option_rows, m, servers, batches)
    return {**seconds(w, rates), "inter_bytes_max_server": int(np.max(w.inter_bytes, initial=0)),
            "intra_bytes_max_rank": int(np.max(w.intra_bytes, initial=0)), "rows_computed": w.rows_computed}

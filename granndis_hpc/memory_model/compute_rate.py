"""The compute rates --mode auto prices an option's rows and edges with (memory_model/epoch_time.py).

A layer's work is a projection of every computed row (w_in x w_out multiply-adds) and an aggregation
over every edge (w_in numbers).  Both are timed here on the machine that trains, forward and backward,
at the model's widths: a Linear on thousands of rows, and the sparse product the convs use
(nn/cpu_kernels.csr_matmul on the CPU, torch's on CUDA) on a random graph of the set's average degree,
with its transpose for the backward.  A trial is some millions of multiply-adds, so one pass over the
model's widths takes a fraction of a second on an idle machine.

On a machine shared with other jobs one pass can be 10x slower than the next (another job takes the
cores for a while), and the ranks of a job do not all see the same load.  So the rate is measured the
way an epoch pays for it: after an untimed warm-up pass (the C kernels load, the thread pools start),
every rank times REPEATS passes (each the best of TRIALS trials per layer width) and keeps their median,
which one slow or lucky pass does not move; the job's rate is the largest of the ranks' medians, as an
epoch waits for its slowest rank (`combine`, `measure_job`).
"""
from __future__ import annotations

import time
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

import torch

from granndis_hpc.nn.cpu_kernels import csr_matmul
from granndis_hpc.nn.sparse import coo_to_csr

ROW_UNITS = 1 << 22  # multiply-adds of one projection trial
EDGE_UNITS = 1 << 20  # edge x feature products of one aggregation trial
TRIALS = 2  # per layer width in one pass: the best (a busy machine only slows a trial down)
REPEATS = 5  # passes per rank: their median is the rank's rate


def _rows(units: int, per_row: int) -> int:
    # Narrow layers get more rows: a trial of microseconds would measure the scheduler, not the layer.
    return int(min(1 << 14, max(256, units // max(1, per_row))))


def _best(step, device: torch.device) -> float:
    step()  # untimed: allocations, kernel selection
    best = float("inf")
    for _ in range(TRIALS):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return max(best, 1e-9)


def row_seconds(w_in: int, w_out: int, device: torch.device) -> float:
    """Seconds per computed row per (w_in x w_out): a Linear's forward and backward."""
    n = _rows(ROW_UNITS, w_in * w_out)
    lin = torch.nn.Linear(w_in, w_out).to(device)
    x = torch.randn(n, w_in, device=device, requires_grad=True)

    def step():
        lin(x).sum().backward()
    return _best(step, device) / (n * w_in * w_out)


def _random_graph(n: int, degree: int, device: torch.device, seed: int = 0):
    """A random graph's adjacency and its transpose, as nn/graph.py builds them (nn/sparse.coo_to_csr)."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.arange(n).repeat_interleave(degree)
    cols = torch.randint(0, n, (n * degree,), generator=g)
    vals = torch.full((n * degree,), 1.0 / degree)
    rows, cols, vals = rows.to(device), cols.to(device), vals.to(device)
    return coo_to_csr(rows, cols, vals, (n, n)), coo_to_csr(cols, rows, vals, (n, n))


def edge_seconds(width: int, degree: float, device: torch.device) -> float:
    """Seconds per edge per feature: the aggregation's product forward and its transpose's backward."""
    d = int(min(64, max(1, round(degree))))
    n = _rows(EDGE_UNITS, d * width)
    a, at = _random_graph(n, d, device)
    h = torch.randn(n, width, device=device)
    mm = csr_matmul if device.type == "cpu" else torch.matmul

    def step():
        mm(at, mm(a, h))
    return _best(step, device) / (n * d * width)


def _once(widths: Sequence[Tuple[int, int]], degree: float, device: torch.device) -> Tuple[float, float]:
    """One pass: (row_s, edge_s), each the model's layers' seconds over their units (wide layers weigh most)."""
    distinct = sorted({(int(i), int(o)) for i, o in widths})
    row = sum(row_seconds(i, o, device) * i * o for i, o in distinct) / sum(i * o for i, o in distinct)
    ins = sorted({i for i, _ in distinct})
    edge = sum(edge_seconds(i, degree, device) * i for i in ins) / sum(ins)
    return float(row), float(edge)


Pass = Callable[[Sequence[Tuple[int, int]], float, torch.device], Tuple[float, float]]


def samples(widths: Sequence[Tuple[int, int]], degree: float, device: torch.device, repeats: int = REPEATS,
            once: Optional[Pass] = None) -> List[Tuple[float, float]]:
    """`repeats` timed passes (row_s, edge_s) after one untimed warm-up pass; `once` times one pass
    (default: the layers' products; a test injects its own timings)."""
    once = once or _once
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1 (got {repeats})")
    once(widths, degree, device)  # untimed: loads the C kernels, starts the thread pools, warms the caches
    passes = [once(widths, degree, device) for _ in range(int(repeats))]
    return [(float(row_s), float(edge_s)) for row_s, edge_s in passes]


def median_rates(passes: Sequence[Tuple[float, float]]) -> Tuple[float, float]:
    """A rank's rates: the median of its passes' row_s and, apart, of their edge_s."""
    a = np.asarray(passes, dtype=np.float64).reshape(-1, 2)
    return float(np.median(a[:, 0])), float(np.median(a[:, 1]))


def combine(per_rank: Sequence[Tuple[float, float]]) -> Tuple[float, float]:
    """The job's rates from every rank's (median) rates: the largest row_s and, apart, the largest
    edge_s (an epoch waits for its slowest rank)."""
    a = np.asarray(per_rank, dtype=np.float64).reshape(-1, 2)
    return float(a[:, 0].max()), float(a[:, 1].max())


def measure(widths: Sequence[Tuple[int, int]], degree: float, device: torch.device,
            repeats: int = REPEATS) -> Tuple[float, float]:
    """(row_s, edge_s) of a model whose convs have `widths` ((in, out) each) on a graph of `degree`
    average in-edges, on this process: the median of `repeats` passes after a warm-up."""
    return median_rates(samples(widths, degree, device, repeats))


def measure_job(widths: Sequence[Tuple[int, int]], degree: float, device: torch.device,
                allgather: Callable[[object], list], repeats: int = REPEATS, once: Optional[Pass] = None) -> dict:
    """Collective: every rank measures (`samples`) and the ranks' medians are combined (`combine`);
    `allgather` is the job's (every rank's object, in rank order).  Returns {row_s, edge_s, per_rank
    (each rank's median row_s and edge_s), method (how it was measured, for the decision)}."""
    mine = median_rates(samples(widths, degree, device, repeats, once))
    per_rank = [tuple(r) for r in allgather(mine)]
    row, edge = combine(per_rank)
    rows = [r for r, _ in per_rank]
    method = (f"compute rate on {device.type}: median of {repeats} passes after a warm-up on each of "
              f"{len(per_rank)} ranks, the slowest rank's kept (row_s over the ranks {min(rows):.3g}-{max(rows):.3g})")
    return {"row_s": row, "edge_s": edge, "per_rank": [list(r) for r in per_rank], "method": method}

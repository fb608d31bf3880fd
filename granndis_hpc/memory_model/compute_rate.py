"""The compute rates --mode auto prices an option's rows and edges with (memory_model/epoch_time.py).

A layer's work is a projection of every computed row (w_in x w_out multiply-adds) and an aggregation
over every edge (w_in numbers).  Both are timed here on the machine that trains, forward and backward,
at the model's widths: a Linear on thousands of rows, and the sparse product the convs use
(nn/cpu_kernels.csr_matmul on the CPU, torch's on CUDA) on a random graph of the set's average degree,
with its transpose for the backward.  A trial is some millions of multiply-adds, so the whole
measurement takes a fraction of a second on an idle machine; the best of a few trials is kept (a shared
machine only ever slows a trial down, though a busy one can slow them all).
"""
from __future__ import annotations

import time
from typing import Sequence, Tuple

import torch

from granndis_hpc.nn.cpu_kernels import csr_matmul
from granndis_hpc.nn.sparse import coo_to_csr

ROW_UNITS = 1 << 24  # multiply-adds of one projection trial
EDGE_UNITS = 1 << 22  # edge x feature products of one aggregation trial
TRIALS = 5


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


def measure(widths: Sequence[Tuple[int, int]], degree: float, device: torch.device) -> Tuple[float, float]:
    """(row_s, edge_s) of a model whose convs have `widths` ((in, out) each) on a graph of `degree`
    average in-edges: each the model's layers' seconds over their units, so wide layers weigh most."""
    distinct = sorted({(int(i), int(o)) for i, o in widths})
    # Untimed: the first product loads the C kernels and starts the thread pools (several times a trial).
    row_seconds(*distinct[0], device)
    edge_seconds(distinct[0][0], degree, device)
    row = sum(row_seconds(i, o, device) * i * o for i, o in distinct) / sum(i * o for i, o in distinct)
    ins = sorted({i for i, _ in distinct})
    edge = sum(edge_seconds(i, degree, device) * i for i in ins) / sum(ins)
    return float(row), float(edge)

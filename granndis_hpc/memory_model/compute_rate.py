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

The kernels are not all a training step runs: the step adds the bias, activation, dropout, loss, the
optimizer and Python's per-layer overhead to the projections and aggregations they time (counted as the
epoch counts them: kernel_seconds, each layer's projected rows). So `calibrate` times the model's real
training step (nn.models.build_model, forward, cross-entropy, backward, Adam) on a random graph of the
run's degree at n and 2n rows, the job's ranks stepping together as they do in training: the growth from
n to 2n is the per-row cost, which over the kernels' prediction for the same rows is `compute_scale`;
what is left at n rows is the step's fixed cost (`step_s`: optimizer, launches).

fb's world view computes its layers another way: the halo in flight (nn/rows.PendingRows), a layer
aggregates its own rows' edges and its halo rows' apart and combines them, and boundary-first it computes
the rows the next exchange sends, then the others, and merges them (nn/runner.py).  On the products-size
graph fb's measured compute is 1.13x flx k=3's, which the plain step alone does not see
(docs/performance/auto.md).  So `calibrate` also
times the step on that path (`training_step(overlapped=True)`: a halo in flight where the layer's sources
come through the exchange, and the rows the next exchange sends computed first) at the same sizes, in the
run's shape: the halo rows and the rows computed first per row of the baseline's (fb's) epoch
(choice.training_shape; fb on the 20,000-vertex demo graph: a halo of 1.97 rows a row, nearly every row
sent).  Its growth from n to 2n over the kernels' prediction is `overlap_scale`, and what its fixed cost
adds to the plain step's is `overlap_step_s` (the split's and merge's per-layer calls); each auto run's
reason, and the auto page's rates lines, give both.  The sizes are some thousand rows (CALIBRATION_UNITS;
products' model: 4,599), where a step's per-row cost comes nearer a run's, whose rows leave the caches; at
about a thousand rows the two paths' ratio scattered widely between calibrations.
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


def _degree(degree: float) -> int:
    """A random graph's in-edges a row (the kernels' trials, the calibration): the degree, rounded, in 1-64."""
    return int(min(64, max(1, round(degree))))


def _best(step, device: torch.device) -> float:
    step()  # untimed: allocations, kernel selection
    return max(min(_timed(step, device) for _ in range(TRIALS)), 1e-9)


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
    d = _degree(degree)
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


CALIBRATION_UNITS = 1 << 26  # projection multiply-adds of the calibration's smaller graph
CALIBRATION_REPEATS = 5  # timed steps per size, the two sizes interleaved: the fastest of each
CALIBRATION_BUDGET_S = 3.0  # no further repeat once the timed steps took this long


def _calibration_graph(n: int, degree: int, device: torch.device, seed: int = 1, n_halo: int = 0):
    """A random graph of n rows, `degree` in-edges each from the n rows and `n_halo` halo rows after them,
    as the model's layers read it (nn/graph.LayerGraph; with a halo, n_own = n: the own/halo split)."""
    from granndis_hpc.nn.graph import LayerGraph

    g = torch.Generator().manual_seed(seed)
    n_src = n + int(n_halo)
    indices = torch.randint(0, n_src, (n * degree,), generator=g)
    return LayerGraph(n_dst=n, n_src=n_src, indptr=torch.arange(0, n * degree + 1, degree), indices=indices,
                      dst_degree=torch.full((n,), float(degree)),
                      src_degree=torch.bincount(indices, minlength=n_src).to(torch.float32),
                      n_own=n if n_halo else None).to(device)


# The overlapped calibration's shape where the run's is not known (`preprocess plan` without options): a
# halo of one row per 16 rows at hand, a quarter of them boundary rows (sent first).
DEFAULT_SHAPE = (1.0 / 16.0, 0.25)
MAX_HALO_SHARE = 4.0  # at most this many halo rows per row at hand (the calibration's memory stays bounded)


def _shape(shape: Optional[Tuple[float, float]]) -> Tuple[float, float]:
    halo, first = DEFAULT_SHAPE if shape is None else shape
    return float(min(MAX_HALO_SHARE, max(0.0, halo))), float(min(1.0, max(0.0, first)))


def _shape_text(shape: Optional[Tuple[float, float]]) -> str:
    halo, first = _shape(shape)
    return (f"{halo:.3g} halo rows and {first:.0%} of the rows computed first per row"
            + (", the run's" if shape is not None else ""))


def _halo_rows(n: int, shape: Optional[Tuple[float, float]] = None) -> int:
    """The halo rows of the overlapped calibration at n rows at hand: the shape's share, at least one."""
    return max(1, int(round(n * _shape(shape)[0])))


def _boundary(n: int, shape: Optional[Tuple[float, float]], device: torch.device) -> torch.Tensor:
    """The shape's share of n rows, evenly spaced, at least one: the rows a split layer computes first."""
    count = max(1, min(n, int(round(n * _shape(shape)[1]))))
    return torch.unique(torch.linspace(0, n - 1, count, device=device).round().to(torch.int64))


def _world_gather(n: int, device: torch.device, exchanged: Callable[[int], bool],
                  shape: Optional[Tuple[float, float]] = None):
    """A gather as the world view's overlapped one calls the layers (engine/views.py), with the shape's
    halo rows after layer l's own rows (`_halo_rows`): where layer l's sources come through the exchange
    (`exchanged(l)`, the model's estimator's) the halo is handed over as in flight (PendingRows) and gets
    its gradient, as the exchange's backward reads it, and the layer before splits its rows boundary-first
    (RowSplit, the shape's share of the rows first, whose posting sends nothing); otherwise the halo is the
    static one, feature rows read at once without a gradient (SAGE's layer 0).  shape: (halo rows,
    boundary rows) per row at hand, the run's (choice.training_shape); None: DEFAULT_SHAPE."""
    from granndis_hpc.nn.rows import HaloGather, PendingRows, RowSplit

    n_halo = _halo_rows(n, shape)
    halos: dict = {}
    split = RowSplit(_boundary(n, shape, device), n)

    def rows(l: int, h: torch.Tensor):
        if l not in halos:
            halos[l] = torch.randn(n_halo, *h.shape[1:], device=device, dtype=h.dtype,
                                   requires_grad=exchanged(l))
        halo = halos[l]
        if not exchanged(l):
            return torch.cat([h, halo])
        halo.grad = None
        return PendingRows(h, lambda: halo, n_halo)
    return HaloGather(rows, boundary=lambda l: split if exchanged(l) else None,
                      post=lambda l, first: None), n_halo


def training_step(spec, n: int, degree: int, device: torch.device, overlapped: bool = False,
                  shape: Optional[Tuple[float, float]] = None) -> Callable[[], None]:
    """One training step of the model `spec` (a memory_model ModelSpec) on a random graph of n rows and
    `degree` in-edges each: forward, cross-entropy, backward and an Adam step, as the trainer runs it.
    overlapped: through the world view's overlapped path (`_world_gather` at `shape`; the graph's sources
    are the n rows and the halo's), as fb computes."""
    from granndis_hpc.nn.models import build_model

    model = build_model(spec.name, spec.features, spec.hidden, spec.num_classes, spec.layers + spec.linear_layers,
                        dropout=spec.dropout, norm=spec.norm, linear_layers=spec.linear_layers,
                        **dict(spec.options)).to(device)
    model.train()
    gather, n_halo = (_world_gather(n, device, lambda l: spec.estimator.exchanged(l, spec), shape) if overlapped
                      else (None, 0))
    graphs = [_calibration_graph(n, degree, device, n_halo=n_halo)] * model.num_layers
    g = torch.Generator().manual_seed(2)
    x = torch.randn(n, spec.features, generator=g).to(device)
    labels = torch.randint(0, spec.num_classes, (n,), generator=g).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x, graphs, gather=gather), labels).backward()
        opt.step()
    return step


def _timed(step, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def kernel_seconds(spec, n: int, degree: int, row_s: float, edge_s: float, overlapped: bool = False,
                   shape: Optional[Tuple[float, float]] = None) -> float:
    """What the kernels' rates predict the calibration's step at n rows costs, counted as epoch_time
    counts a run's layers: each conv's projected rows (the model's estimator's projected_rows) at its
    widths and its n x degree edges; overlapped, with the halo rows `training_step` adds after the n own
    ones at `shape` (`_halo_rows`), split (in flight) at the layers the exchange feeds."""
    from .estimate import LayerRows

    est = spec.estimator
    n_halo = _halo_rows(n, shape) if overlapped else 0
    layer = LayerRows(n_own_in=n, n_halo=n_halo, n_dst=n, nnz=n * degree)
    return float(sum(est.projected_rows(layer, i, o, overlapped and est.exchanged(l, spec)) * i * o * row_s
                     + n * degree * i * edge_s for l, (i, o) in enumerate(spec.widths())))


def fit_step(t_small: float, t_large: float, n: int, per_row_kernels: float) -> Tuple[float, float]:
    """(compute_scale, step_s) from the step's seconds at n and 2n rows: the growth per row over the
    kernels' prediction, and what is left at n rows (at least 0).  The scale is at least 1: the step
    runs every kernel timed and more, so a smaller growth is noise (a burst of load slowed the smaller
    graph's step).  A growth that noise made no larger than zero gives no slope: then the scale is the
    larger step's seconds over its kernels' prediction and the fixed cost 0 (the scale then holds it)."""
    if per_row_kernels <= 0:
        return 1.0, max(0.0, t_small)
    per_row = (t_large - t_small) / n
    if per_row <= 0:
        return max(1.0, t_large / (2 * n * per_row_kernels)), 0.0
    scale = max(1.0, per_row / per_row_kernels)
    return scale, max(0.0, t_small - scale * per_row_kernels * n)


class CalibrationFailed(RuntimeError):
    """A rank of the job could not build or run the model's step: every rank raises it with that rank's reason."""


def _agree_or_raise(gathered: list) -> bool:
    """Every rank's (over the budget, problem): CalibrationFailed with the first rank's problem, else
    whether any rank is over the budget."""
    problems = [p for _, p in gathered if p]
    if problems:
        raise CalibrationFailed(problems[0])
    return any(late for late, _ in gathered)


def calibrate(spec, degree: float, device: torch.device, row_s: float, edge_s: float,
              repeats: int = CALIBRATION_REPEATS, allgather: Optional[Callable[[object], list]] = None,
              shape: Optional[Tuple[float, float]] = None) -> dict:
    """{compute_scale, step_s, overlap_scale, overlap_step_s, rows, shape, step_small_s, step_large_s,
    overlapped_small_s, overlapped_large_s}: the model's real step (`training_step`) at n and 2n rows,
    plain and through the world view's overlapped path at `shape` (the run's halo and boundary rows per
    row: choice.training_shape; None: DEFAULT_SHAPE), each the fastest of `repeats` after an untimed
    one, the four interleaved (a burst of load slows them alike), against the kernels' rates (module
    docstring).

    allgather: the job's (measure_job's; None: this process alone).  Collective then: the ranks start
    every timed step together, as they compute a training step together: where ranks share cores (the
    emulated cluster's 4 ranks on 2), a rank timed while its peers wait has the cores to itself, which
    no training step has.  A rank that cannot build or run the step makes every rank raise
    CalibrationFailed with its reason (none is left waiting for it)."""
    gather = allgather or (lambda mine: [mine])
    widths = spec.widths()
    d = _degree(degree)
    n = int(min(1 << 14, max(1024, CALIBRATION_UNITS // max(1, sum(i * o for i, o in widths)))))
    problem = None
    try:
        steps = [training_step(spec, rows, d, device, overlapped, shape)
                 for overlapped in (False, True) for rows in (n, 2 * n)]
        for step in steps:
            step()  # untimed: allocations, the C kernels, the optimizer's state, the split matrices
    except Exception as exc:  # noqa: BLE001  (said on every rank; measure_job prices by the kernels alone)
        problem = f"{type(exc).__name__}: {exc}"
    _agree_or_raise(gather((False, problem)))
    best = [float("inf")] * len(steps)
    start = time.perf_counter()
    for _ in range(int(repeats)):
        for i, step in enumerate(steps):
            gather(None)  # together (docstring)
            try:  # a failure is said at the round's end, so that every rank makes the same collective calls
                best[i] = min(best[i], _timed(step, device))
            except Exception as exc:  # noqa: BLE001
                problem = problem or f"{type(exc).__name__}: {exc}"
        # every rank stops once one is over the budget (a loaded machine: enough for a bound)
        if _agree_or_raise(gather((time.perf_counter() - start > CALIBRATION_BUDGET_S, problem))):
            break
    # per row from n to 2n, each path's own count (the overlapped one projects its halo rows too)
    plain, over = ((kernel_seconds(spec, 2 * n, d, row_s, edge_s, o, shape)
                    - kernel_seconds(spec, n, d, row_s, edge_s, o, shape)) / n for o in (False, True))
    scale, fixed = fit_step(best[0], best[1], n, plain)
    over_scale, over_fixed = fit_step(best[2], best[3], n, over)
    # The overlapped path runs every product the plain one does and more: a smaller growth is noise.
    return {"compute_scale": scale, "step_s": fixed, "overlap_scale": max(scale, over_scale),
            "overlap_step_s": max(0.0, over_fixed - fixed), "rows": n, "shape": list(_shape(shape)),
            "step_small_s": best[0], "step_large_s": best[1], "overlapped_small_s": best[2],
            "overlapped_large_s": best[3]}


def measure_job(widths: Sequence[Tuple[int, int]], degree: float, device: torch.device,
                allgather: Callable[[object], list], repeats: int = REPEATS, once: Optional[Pass] = None,
                spec=None, calibration: Optional[Callable[..., dict]] = None,
                shape: Optional[Tuple[float, float]] = None) -> dict:
    """Collective: every rank measures (`samples`) and the ranks' medians are combined (`combine`); `allgather` is the
    job's (every rank's object, in rank order).  With `spec` (the model's ModelSpec) every rank then calibrates
    its real step against the job's rates, the ranks stepping together (`calibrate`, its overlapped path at
    `shape`; a test injects `calibration`) and the largest scale and fixed cost are kept, and the overlapped
    path's ratio to the plain step and its extra fixed cost, the ranks' median.  Returns {row_s, edge_s,
    degree (as given), per_rank (each rank's median row_s and edge_s), compute_scale, overlap_scale, step_s,
    overlap_step_s, calibration (per rank, or why there is none), method (how it was measured, for the
    decision)}."""
    mine = median_rates(samples(widths, degree, device, repeats, once))
    per_rank = [tuple(r) for r in allgather(mine)]
    row, edge = combine(per_rank)
    rows = [r for r, _ in per_rank]
    method = (f"compute rate on {device.type}: median of {repeats} passes after a warm-up on each of "
              f"{len(per_rank)} ranks, the slowest rank's kept (row_s over the ranks {min(rows):.3g}-{max(rows):.3g})")
    out: dict = {"row_s": row, "edge_s": edge, "degree": float(degree), "per_rank": [list(r) for r in per_rank],
                 "compute_scale": 1.0,
                 "overlap_scale": 1.0, "step_s": 0.0, "overlap_step_s": 0.0, "calibration": None, "method": method}
    if spec is None:
        return out
    try:
        cal: object = (calibration or calibrate)(spec, degree, device, row, edge, allgather=allgather, shape=shape)
    except CalibrationFailed as exc:  # a rank's model this step cannot build or run: priced by the kernels alone
        cal = str(exc)
    except Exception as exc:  # noqa: BLE001  (the same, raised by an injected calibration)
        cal = f"{type(exc).__name__}: {exc}"
    cals = allgather(cal)
    failed = [c for c in cals if not isinstance(c, dict)]
    if failed:  # every rank takes the same branch: the gathered list is the same everywhere
        out["calibration"] = f"not calibrated ({failed[0]}): the kernels' rates alone"
        out["method"] += "; " + out["calibration"]
        return out
    scales = [float(c["compute_scale"]) for c in cals]
    fixed = [float(c["step_s"]) for c in cals]
    # The overlapped path: each rank's ratio to its own plain step and its extra fixed cost, the median
    # over the ranks.  A rank's two paths are timed side by side, but ranks sharing cores disturb each
    # other's fits: on the products-size graph at 1 Gbit/s, 4 ranks on 2 cores, one start-up's ranks
    # measured ratios 1-2.05, their median 1.31 (docs/performance/auto.md).
    ratios = [float(c.get("overlap_scale", c["compute_scale"])) / max(float(c["compute_scale"]), 1e-12) for c in cals]
    overlap_fixed = [float(c.get("overlap_step_s", 0.0)) for c in cals]
    out.update(compute_scale=max(scales), step_s=max(fixed), overlap_scale=max(scales) * float(np.median(ratios)),
               overlap_step_s=float(np.median(overlap_fixed)), calibration=cals)
    out["method"] += (f"; calibrated on the model's training step at {cals[0]['rows']} and {2 * cals[0]['rows']} "
                      f"random-graph rows of {_degree(degree)} in-edges: compute x{max(scales):.3g} of the kernels' "
                      f"prediction (ranks {min(scales):.3g}-{max(scales):.3g}), {max(fixed):.3g} s fixed per step, "
                      f"the slowest rank's; the world view's overlapped path ({_shape_text(shape)}) "
                      f"x{float(np.median(ratios)):.3g} of that "
                      f"(ranks {min(ratios):.3g}-{max(ratios):.3g}) and +{float(np.median(overlap_fixed)):.3g} s "
                      f"a step, the ranks' median")
    return out

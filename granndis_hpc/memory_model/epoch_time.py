"""An option's predicted epoch time from its exact rows and bytes and the measured rates (no torch, no MPI).

Which plan trains fastest depends on the graph, the model, the machine and the network: preloading (flx,
eas) trades inter-server bytes for more rows computed, which pays on a slow link between servers and
not on one machine.  `work` counts what an epoch does from the option's RankRows (every rank's), and
`seconds` prices it with `Rates`:

- compute: per rank and layer  projected x row_s x w_in x w_out + nnz x edge_s x w_in  (a layer's
  projections and its aggregation per edge, forward and backward, as memory_model/compute_rate.py
  times its kernels; `projected` the rows its Linears read, the model's estimator's projected_rows:
  SAGE's two per computed row, and the source rows, halo included, where it projects them first, as
  fb's world layers do with the halo in flight: on the 20,000-vertex demo graph fb's halo is twice its
  own rows), times compute_scale (the model's real training step on a random graph over what the
  kernels predict for it: the step also runs bias, activation, dropout and the loss), or overlap_scale
  for a layer the run computes on the overlapped path (its halo in flight or its rows split
  boundary-first: estimate.overlapped_layers; fb's and flx's world layers by default), the same step's
  calibration on that path (memory_model/compute_rate.py).  A
  world-group exchange waits for every rank, so the layers between two of them form a segment whose
  slowest rank sets its time: compute is the sum over segments of the largest rank's segment seconds
  (a preload whose layers all stay inside the server is one segment: the slowest rank's whole step,
  which the gradient all-reduce then waits for);
- inter-server: each server's halo bytes (its ranks' inter-server halo rows at each exchanging layer's
  input width, forward and their gradients backward) plus its share of the gradient all-reduce
  (2 (S-1) x params x 4 bytes per step over S leaders) cross its link one way while the other way
  carries, at the same time, the rows and gradients the other servers exchange with it (estimated as
  their halo bytes over S - 1: exact for two servers) and the same share of the all-reduce: every such
  exchange is simultaneous both ways.  The bytes both directions carry at once move at inter_both_Bps
  (the rate each way with both leaders sending, measured at start-up: the one-way rate on a
  full-duplex link, about half of it where the two directions share one budget), the rest at
  inter_Bps; the busiest server's seconds are charged, less the gradient's hidden part (below);
- the gradient's overlap: a run that overlaps (all modes but under --no-overlap: ModelSpec.overlap is
  not empty) reduces its gradient in buckets while the backward computes the earlier layers
  (cluster/gradsync.py), so the gradient's share of the inter-server seconds (what the busiest server's
  seconds fall by without the all-reduce's bytes) is hidden behind the backward up to the backward's
  duration, and only the excess is charged; the last bucket's share is charged whole: the bucket of
  the first layer's parameters is final only when the backward ends (last_bucket_share: at least
  1/OVERLAP_BUCKETS of the gradient, the buckets' byte target, or the parameters that read the input
  features where they are more, as on Cora's 1,433 inputs).  The backward is the compute term's
  backward share: a projection's backward is two of its three products of one size (the input's
  gradient and the weight's), an aggregation's one of its two (the transposed product), so
  ROW_BACKWARD and EDGE_BACKWARD of the row and edge seconds, per segment the slowest rank's, times
  compute_scale.  For the gradient this is a lower bound: the share counts an input gradient the first
  layer does not compute, and the buckets move only while the backward's hooks poll them; a blocking
  run (--no-overlap) is charged the whole gradient;
- intra-server: the busiest rank's intra-server halo bytes over intra_Bps;
- fixed: what a step costs beyond rows, edges and bytes: every exchange round (an exchanging layer,
  forward and backward: world_round_s on the world group, server_round_s inside a server, as the start-up
  check times the run's own exchanges, overlapped or blocking as the run makes them:
  cluster/roundcheck.py; a layer that sends partial aggregates, a second world round for them where the
  world group blocks (overlapped, they travel beside the rows' round and add only their bytes); a world
  layer on the per-server route (--halo-route per-server, the default, with more than one server and more
  than one rank per server: engine/halo_route.py) adds a relay round inside the server, forward and
  backward: the relays forward the rows that crossed to the server's other readers, and return their
  gradients, over a blocking server-group exchange, priced at server_round_s, the server group's round on
  the run's path (blocking unless --overlap-halos all, where the relay's blocking round is priced at the
  overlapped one's cost)) and every optimizer step (step_s: the optimizer and the step's fixed compute, from
  the same calibration, and overlap_step_s more where a layer is on the overlapped path, plus a gradient
  all-reduce round, timed on the run's path too: a bucket's posting, its polls and its wait after compute
  where the run overlaps the gradient, else the blocking all-reduce), and for cob every co-batch's set-up
  (sampling it, splitting it over the server's GPUs, planning and laying it out: cobatch_s per co-batch and
  cobatch_row_s per row of the busiest rank's co-batch, as engine/cobsetup.py times it on the job's graph at
  start-up; the loader builds a co-batch while the previous step computes, which hides it only where the
  host has cores to spare) and every co-batch's all-reduce of its target count (targets_round_s: the loss is
  the mean over the targets of every server's co-batch, whose number each step sums over the world before
  its loss);
all times the co-batches per epoch (cob's rows are one co-batch's, each co-batch a step with its own
rounds).  The total is their sum: the additive model with the gradient's overlap credited, an upper
bound in its halo terms, which overlapping the halo exchanges with compute only lowers
(report/linkmodel.py models the overlap of a run that has been measured), and a lower bound in its
gradient term where the run overlaps the gradient (above).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from granndis_hpc.cluster.layout import OVERLAP_BUCKETS
from granndis_hpc.units import FLOAT32_BYTES as F32

from .estimate import ModelSpec, RankRows, overlapped_layers, rank_halo_bytes

# The backward's share of a layer's kernels (module docstring): a projection's backward is two products
# of the forward's size (the input's gradient and the weight's), an aggregation's one (the transpose's).
ROW_BACKWARD = 2.0 / 3.0
EDGE_BACKWARD = 1.0 / 2.0


@dataclass(frozen=True)
class Rates:
    """Measured rates: link payload bytes/s (None: the job has no such link), compute seconds per
    computed row per (w_in x w_out) and per edge per feature (w_in), forward and backward, and the
    fixed costs (module docstring): compute_scale (overlap_scale on the overlapped path; None: the same),
    seconds per optimizer step (overlap_step_s more with a layer on that path) and per exchange round.
    inter_both_Bps: the inter-server rate each way while both directions carry data (None: inter_Bps, a
    full-duplex link); cobatch_s, cobatch_row_s: seconds to set up a co-batch, fixed and per row of its
    dependency graph; targets_round_s: seconds of a batched step's all-reduce of its target count.  The
    fixed costs default to none (a plan priced without them: `preprocess plan` without the cluster)."""

    inter_Bps: Optional[float]
    intra_Bps: Optional[float]
    row_s: float
    edge_s: float
    compute_scale: float = 1.0
    step_s: float = 0.0
    world_round_s: float = 0.0
    server_round_s: float = 0.0
    inter_both_Bps: Optional[float] = None
    cobatch_s: float = 0.0
    cobatch_row_s: float = 0.0
    targets_round_s: float = 0.0
    overlap_scale: Optional[float] = None
    overlap_step_s: float = 0.0


@dataclass(frozen=True, eq=False)
class Work:
    """What one epoch of an option does, exactly: per rank its row and edge units and intra-server halo
    bytes, per server its inter-server bytes (halo and gradient), and its exchange rounds and steps.
    segment_row_units / segment_edge_units: [segments, ranks], the units between two world-group
    exchanges (None: one segment, the per-rank totals).  inter_back_bytes: per server, the bytes its link
    carries the other way while its inter_bytes cross (None: nothing, a one-way transfer).  cobatches:
    the co-batches set up per epoch; cobatch_rows: their rows (the busiest rank's per co-batch, times
    their number); target_rounds: the all-reduces of a step's target count per epoch (one per co-batch).
    grad_bytes: per server, the gradient all-reduce's bytes within inter_bytes and, the same, within
    inter_back_bytes (None: none); grad_overlapped: the run reduces them during the backward;
    grad_last_share: the share of them in the bucket the backward finishes last (module docstring).
    relay_rounds: the server-group rounds of the per-server route (one per world round, module docstring).
    overlapped_row_units / overlapped_edge_units: [segments, ranks], of the segment units those of the
    layers on the overlapped path (None: none); overlapped_steps: the steps that have such layers."""

    row_units: np.ndarray  # per rank: sum over layers of the rows projected x w_in x w_out
    edge_units: np.ndarray  # per rank: sum over layers of nnz x w_in
    intra_bytes: np.ndarray  # per rank
    inter_bytes: np.ndarray  # per server
    rows_computed: int  # all ranks, all layers, the epoch
    world_rounds: int = 0  # world-group exchanges per epoch (forward and backward, every step)
    server_rounds: int = 0  # server-group exchanges per epoch
    relay_rounds: int = 0  # the per-server route's sharing exchanges inside a server per epoch
    steps: int = 1  # optimizer steps per epoch
    segment_row_units: Optional[np.ndarray] = None
    segment_edge_units: Optional[np.ndarray] = None
    inter_back_bytes: Optional[np.ndarray] = None
    cobatches: int = 0
    cobatch_rows: float = 0.0
    grad_bytes: Optional[np.ndarray] = None
    grad_overlapped: bool = False
    grad_last_share: float = 1.0
    target_rounds: int = 0
    overlapped_row_units: Optional[np.ndarray] = None
    overlapped_edge_units: Optional[np.ndarray] = None
    overlapped_steps: int = 0
    # per rank: sum over layers of n_dst x w_in, the computed rows at the aggregation's widths (edge_units
    # over it: the in-edges per row as the kernels count them, choice.training_degree; None: not counted)
    dst_units: Optional[np.ndarray] = None
    # (halo rows per computed row at the layers whose halo is in flight, rows computed first per computed row
    # at the layers split boundary-first), every rank's: the overlapped path's shape, at which compute_rate
    # calibrates it (choice.training_shape; None: no layer on that path)
    overlap_shape: Optional[Tuple[float, float]] = None


def segments(option_rows: Sequence[RankRows], m: ModelSpec) -> np.ndarray:
    """Each training layer's segment: a world-group exchange at layer l (its sources arrive from every
    rank, so every rank waits for the slowest) starts a new one."""
    views = [view for view, _ in option_rows[0].training_layers()]
    starts = [1 if l > 0 and view == "world" and m.estimator.exchanged(l) else 0 for l, view in enumerate(views)]
    return np.cumsum(starts)


def work(option_rows: Sequence[RankRows], m: ModelSpec, servers: int, batches: int = 1,
         halo_bytes: Optional[np.ndarray] = None, cobatches: int = 0, batched: bool = False,
         partial_layers: Sequence[bool] = ()) -> Work:
    """The epoch's work of the option whose every rank's rows are `option_rows` (one co-batch's for cob:
    `batches` of them make the epoch, each an optimizer step; `cobatches` of them set up per epoch;
    batched: a co-batch's mode, whose every step all-reduces its target count).
    halo_bytes: [rank, (inter, intra)] where they are not rank_halo_bytes' (fb's partial payloads,
    memory_model/payload.py); partial_layers: per training layer, whether it sends partial aggregates
    (on some pair of ranks: engine/partial.py), each such world layer a second world round after its rows',
    forward and backward, where the world group's exchanges block (--no-overlap), and no boundary-first
    split of the layer below it (its partials are sent from its own messages)."""
    widths = np.asarray(m.widths(), dtype=np.float64)
    n_dst = np.array([[lr.n_dst for _, lr in r.training_layers()] for r in option_rows], dtype=np.float64)
    nnz = np.array([[lr.nnz for _, lr in r.training_layers()] for r in option_rows], dtype=np.float64)
    halo = np.asarray(halo_bytes if halo_bytes is not None else [rank_halo_bytes(r, m) for r in option_rows],
                      dtype=np.float64).reshape(-1, 2)
    per_server = max(1, len(option_rows) // int(servers))
    server = np.array([r.rank for r in option_rows]) // per_server
    inter = np.bincount(server, weights=halo[:, 0], minlength=int(servers))
    # what the other servers exchange with each one, the other way at the same time (module docstring)
    back = (inter.sum() - inter) / max(1, int(servers) - 1)
    grad_per_server = 2 * (int(servers) - 1) * m.parameters() * F32 / int(servers)
    b = int(batches)
    # the layers whose halo is in flight (their sources split), which SAGE and GCN project first
    pending, split = overlapped_layers(option_rows[0], m)
    pending = [p and len(option_rows) > 1 for p in pending]
    sends_partials = list(partial_layers) + [False] * (len(pending) - len(partial_layers))
    split = [q and not sends_partials[l + 1] for l, q in enumerate(split)]
    projected = np.array([[m.estimator.projected_rows(lr, int(w[0]), int(w[1]), p)
                           for (_, lr), w, p in zip(r.training_layers(), widths, pending)] for r in option_rows],
                         dtype=np.float64)
    row_layer = b * projected * (widths[:, 0] * widths[:, 1])  # [ranks, layers]
    edge_layer = b * nnz * widths[:, 0]
    seg = segments(option_rows, m)
    onehot = (seg[:, None] == np.arange(int(seg.max()) + 1)[None, :]).astype(np.float64)  # [layers, segments]
    views = [view for view, _ in option_rows[0].training_layers()]
    exchanged = [m.estimator.exchanged(l) for l in range(len(views))]
    world = sum(1 for v, x in zip(views, exchanged) if x and v == "world") if len(option_rows) > 1 else 0
    # Blocking, a layer's partials are a world round after its rows'.  Overlapped (the world group in
    # m.overlap, the default) both are posted before the layer aggregates its own rows' edges and waited
    # for together (engine/partial.py): the partials' round adds bytes, not a latency of its own (Cora,
    # 3 runs an option at 4 rates, docs/performance/auto.md: partial and smaller within -79..+14 ms of fb's
    # epoch, where their partials' rounds were priced +13..+33 ms).
    partial = sum(1 for v, x, p in zip(views, exchanged, sends_partials) if p and x and v == "world")
    partial = partial if world and "world" not in m.overlap else 0
    inside = sum(1 for v, x in zip(views, exchanged) if x and v == "server") if per_server > 1 else 0
    # the per-server route shares every world layer's crossed rows inside the receiving server
    # (engine/halo_route.py; ExchangeGroup.per_server: more than one server, more than one rank in each)
    relayed = world if m.halo_route == "per-server" and per_server > 1 and int(servers) > 1 else 0
    # the layers computed on the overlapped path (halo in flight, or rows split boundary-first), priced
    # at overlap_scale: one rank has no peer, so no exchange to overlap
    on_path = np.array([p or q for p, q in zip(pending, split)], dtype=np.float64) * (len(option_rows) > 1)
    return Work(row_units=row_layer.sum(axis=1), edge_units=edge_layer.sum(axis=1),
                intra_bytes=b * halo[:, 1], inter_bytes=b * (inter + grad_per_server),
                inter_back_bytes=b * (back + grad_per_server),
                cobatches=int(cobatches), cobatch_rows=float(int(cobatches) * n_dst.sum(axis=1).max(initial=0.0)),
                target_rounds=b if batched else 0,
                rows_computed=int(b * n_dst.sum()), world_rounds=2 * b * (world + partial),
                server_rounds=2 * b * inside, relay_rounds=2 * b * relayed,
                steps=b, segment_row_units=(row_layer @ onehot).T, segment_edge_units=(edge_layer @ onehot).T,
                grad_bytes=np.full(int(servers), b * grad_per_server), grad_overlapped=bool(m.overlap),
                grad_last_share=last_bucket_share(m),
                overlapped_row_units=(row_layer @ (onehot * on_path[:, None])).T,
                overlapped_edge_units=(edge_layer @ (onehot * on_path[:, None])).T,
                overlapped_steps=b if on_path.any() else 0,
                dst_units=(b * n_dst * widths[:, 0]).sum(axis=1),
                overlap_shape=overlap_shape(option_rows, pending, split) if on_path.any() else None)


def overlap_shape(option_rows: Sequence[RankRows], pending: Sequence[bool],
                  split: Sequence[bool]) -> Tuple[float, float]:
    """(halo rows per computed row at the `pending` layers, rows computed first per computed row at the
    `split` layers: those layer l + 1 sends), summed over every rank: how much of the overlapped path's
    work is the halo's and the boundary's, where compute_rate calibrates that path.  A layer's send list
    counts a row once per peer reading it (LayerRows.n_send), so the rows computed first are taken as at
    most the rows computed: an upper bound of the distinct ones (fb's world layers on the 20,000-vertex
    demo graph: rank 0 sends 4,768 distinct rows of the 5,002 it computes, rows_per_layer in a run's
    metrics.jsonl, and the share is taken as 100 %)."""
    layers = [[lr for _, lr in r.training_layers()] for r in option_rows]
    halo = sum(ls[l].n_halo for ls in layers for l, p in enumerate(pending) if p)
    at_halo = sum(ls[l].n_dst for ls in layers for l, p in enumerate(pending) if p)
    first = sum(min(ls[l + 1].n_send, ls[l].n_dst) for ls in layers for l, q in enumerate(split) if q)
    at_split = sum(ls[l].n_dst for ls in layers for l, q in enumerate(split) if q)
    return halo / max(1, at_halo), first / max(1, at_split)


def last_bucket_share(m: ModelSpec) -> float:
    """The share of `m`'s gradient in the bucket the backward finishes last, which no compute hides
    (cluster/gradsync.py): at least 1/OVERLAP_BUCKETS (the buckets' byte target), or the parameters that
    read the input features where they are more: the parameter count less its value at input width 0,
    extrapolated from widths 1 and 2 (the count is affine in the input widths)."""
    def count(width: int) -> int:
        widths = None if m.type_widths is None else (width,) * len(m.type_widths)
        return replace(m, features=width, type_widths=widths).parameters()

    total = m.parameters()
    first = total - (2 * count(1) - count(2))
    return float(min(1.0, max(1.0 / OVERLAP_BUCKETS, first / max(total, 1))))


def _wire(nbytes: float, rate: Optional[float], link: str) -> float:
    if nbytes <= 0:
        return 0.0
    if not rate:
        raise ValueError(f"{nbytes:,.0f} bytes cross the {link} link, whose rate is not measured")
    return float(nbytes / rate)


def inter_seconds(w: Work, rates: Rates) -> float:
    """The inter-server wire seconds of `w` (module docstring): per server, the bytes both directions carry
    at once at inter_both_Bps and the rest at inter_Bps; the busiest server's."""
    out = np.asarray(w.inter_bytes, dtype=np.float64)
    back = np.zeros_like(out) if w.inter_back_bytes is None else np.asarray(w.inter_back_bytes, dtype=np.float64)
    if out.size == 0 or max(float(out.max()), float(back.max())) <= 0:
        return 0.0
    both = np.minimum(out, back)
    one_way = np.maximum(out, back) - both
    both_rate = rates.inter_both_Bps or rates.inter_Bps
    per_server = [_wire(float(b), both_rate, "inter-server") + _wire(float(o), rates.inter_Bps, "inter-server")
                  for b, o in zip(both, one_way)]
    return float(max(per_server))


def compute_seconds(w: Work, rates: Rates, row_share: float = 1.0, edge_share: float = 1.0) -> float:
    """The compute of `w` (module docstring): per segment the slowest rank, summed, each layer at its path's
    scale (compute_scale, or overlap_scale on the overlapped path);
    `row_share`, `edge_share`: the part of the row and edge seconds counted (the backward's: ROW_BACKWARD,
    EDGE_BACKWARD)."""
    row_s, edge_s = rates.row_s * row_share, rates.edge_s * edge_share
    if w.segment_row_units is None or w.segment_edge_units is None:
        per_segment = (w.row_units * row_s + w.edge_units * edge_s)[None, :]
    else:
        per_segment = w.segment_row_units * row_s + w.segment_edge_units * edge_s
    per_segment = rates.compute_scale * per_segment
    if w.overlapped_row_units is not None and w.overlapped_edge_units is not None:
        over = w.overlapped_row_units * row_s + w.overlapped_edge_units * edge_s
        scale = rates.compute_scale if rates.overlap_scale is None else rates.overlap_scale
        per_segment = per_segment + (scale - rates.compute_scale) * over
    return float(np.max(per_segment, axis=1, initial=0.0).sum())


def gradient_hidden_seconds(w: Work, rates: Rates) -> float:
    """The inter-server seconds of `w`'s gradient that its backward hides (module docstring): 0 for a
    blocking run, else the gradient's share of the busiest server's inter-server seconds less its last
    bucket's, at most the backward's compute seconds."""
    if not w.grad_overlapped or w.grad_bytes is None or float(np.max(w.grad_bytes, initial=0.0)) <= 0:
        return 0.0
    grad = np.asarray(w.grad_bytes, dtype=np.float64)
    back = None if w.inter_back_bytes is None else np.asarray(w.inter_back_bytes, dtype=np.float64) - grad
    halo_only = replace(w, inter_bytes=np.asarray(w.inter_bytes, dtype=np.float64) - grad, inter_back_bytes=back)
    gradient = inter_seconds(w, rates) - inter_seconds(halo_only, rates)
    hideable = gradient * (1.0 - w.grad_last_share)
    return float(max(0.0, min(hideable, compute_seconds(w, rates, ROW_BACKWARD, EDGE_BACKWARD))))


def seconds(w: Work, rates: Rates) -> Dict[str, float]:
    """{compute_s, inter_s, intra_s, fixed_s, total_s, gradient_hidden_s}: the additive model of `w`'s
    epoch; inter_s is charged less gradient_hidden_s, the gradient's seconds its backward hides."""
    compute = compute_seconds(w, rates)
    hidden = gradient_hidden_seconds(w, rates)
    inter = inter_seconds(w, rates) - hidden
    intra = _wire(float(np.max(w.intra_bytes, initial=0.0)), rates.intra_Bps, "intra-server")
    fixed = (w.steps * rates.step_s + w.overlapped_steps * rates.overlap_step_s + w.world_rounds * rates.world_round_s
             + (w.server_rounds + w.relay_rounds) * rates.server_round_s
             + w.cobatches * rates.cobatch_s + w.cobatch_rows * rates.cobatch_row_s
             + w.target_rounds * rates.targets_round_s)
    return {"compute_s": compute, "inter_s": inter, "intra_s": intra, "fixed_s": float(fixed),
            "total_s": compute + inter + intra + float(fixed), "gradient_hidden_s": hidden}


def predict(option_rows: Sequence[RankRows], m: ModelSpec, servers: int, batches: int, rates: Rates) -> dict:
    """The predicted epoch seconds of an option (`seconds` of its `work`), with the busiest server's
    inter-server and the busiest rank's intra-server bytes, the rows computed and the rounds and steps."""
    w = work(option_rows, m, servers, batches)
    return {**seconds(w, rates), "inter_bytes_max_server": int(np.max(w.inter_bytes, initial=0)),
            "intra_bytes_max_rank": int(np.max(w.intra_bytes, initial=0)), "rows_computed": w.rows_computed,
            "world_rounds": w.world_rounds, "server_rounds": w.server_rounds,
            "relay_rounds": w.relay_rounds, "steps": w.steps}

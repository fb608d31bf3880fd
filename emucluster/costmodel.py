"""Epoch-time summaries of a sweep, and the cost model that predicts them (stdlib only).

The model follows the paper's Eq. 1 / 5: an epoch is computation plus communication per link class,

    T(mode, round) = rows(mode) * c(mode, round) + B_intra(mode) / bw_intra + B_inter(mode) / bw_inter

- rows: the rows the mode computes per epoch, summed over layers, ranks and steps (the epoch record's
  rows_per_layer, exact).
- c(mode, round) = k(mode) * f(round): seconds per row.  k is the mode's own cost per row: one number
  for every mode does not fit, because a row costs what its aggregation reads (a co-batch's rows have
  2-3x more sources than rows) plus sampling and per-step work (measured: cob's row costs 3-4x fb's).
  f is the round's load factor: the machine is shared with other jobs, and one run computed 1x to 6x
  slower than the same run minutes earlier (docs/emulated-cluster.md, "When the model is off").  A sweep is run
  as rounds, one rate per round with every mode back to back, so every run of a round sees about the
  same load.  Both are fitted by least squares on log(compute) = log k + log f (weighted by the
  run's compute share of its epoch squared: how much its compute says), and each run is
  predicted *leave-one-out*: k from its mode's runs at the other rates, f from the other modes of its
  round; a run never predicts itself.  "Compute" of a run = its epoch less its wire time, so waiting
  for other ranks' compute on the 2 shared cores (a real part of an epoch here) is in it, and waiting
  for the link is not (it is the wire time): waiting is counted once.
- B_inter: the busiest server's inter-server bytes per epoch (the record's inter_bytes_per_server,
  halo + gradient, exact): each server sends over its own shaped egress at the same time, so an epoch
  waits for the server with the most to send.
- bw_inter: the round's MPI ping-pong bandwidth (the self-check), so TCP/IP overhead is in it, capped at
  the shaped rate's TCP payload (1448 of every 1514 bytes): the ping-pong's messages get a free tbf
  burst each, a long exchange does not.
- B_intra / bw_intra: the busiest rank's intra-server bytes over the round's shared-memory ping-pong
  bandwidth (small: a few hundredths of a second).

Overlap (`overlap_limit`, beside the additive form): granndis_hpc/report/linkmodel.py holds that model (the
product's `granndis report` shows it too): each exchange the run overlaps hides its wire time behind the
compute its order lets run meanwhile (the window), the rest is additive.  A run's
"compute" for the fit is its epoch less its wire time without overlap; with overlap the wire time is
partly hidden, so there the fit reads the run's own compute (the epoch less the seconds it waited).

`unshaped_model` keeps the previous model (the unshaped run's compute + intra + gradient-sync
seconds + total inter bytes / S / bw) for comparison on the same page: it counts waits for the link
twice (they are in the unshaped run's intra and gradient-sync seconds) and inherits that one run's load.
"""
from __future__ import annotations

import math
import statistics

from granndis_hpc.report.linkmodel import (TCP_PAYLOAD_SHARE, busiest_bytes, layer_counts,  # noqa: F401 (re-exported)
                                    link_bandwidth, overlap_limit, positive as _positive, wire_s)

PHASES = ("compute", "intra_comm", "inter_comm", "grad_sync", "sampling")
BYTE_KEYS = ("intra_halo", "inter_halo", "intra_grad", "inter_grad")
PAPER_SHARE = (0.44, 0.86)  # share of FB's epoch on inter-server communication measured in the paper
# The paper's AE cluster (10 GbE between servers), FLX speedup over FB.
PAPER_FLX_SPEEDUP = {"ogbn-arxiv": 1.79, "Reddit": 5.13, "ogbn-products": 3.98}


def summarize_run(records, steps=1):
    """Median per-epoch figures of a run's metrics.jsonl records, the first epoch left out.

    The first epoch pays one-off costs (TCP connections, allocator warm-up, first sampling).  With
    evaluation only on the last epoch its accuracy is the run's; evaluation is not in time_s.
    `steps`: steps per epoch (co-batches); the record counts the rows of the epoch's first step."""
    if not records:
        raise ValueError("a run with no epoch records")
    steady = records[1:] if len(records) > 1 else records
    med = lambda key: statistics.median(float(r.get(key, 0.0)) for r in steady)  # noqa: E731
    out = {"epoch_s": med("time_s"), "epochs_used": len(steady)}
    for p in PHASES:
        out[p] = med(p + "_s")
    last = steady[-1]
    out["bytes"] = {k: int(last.get("bytes", {}).get(k, 0)) for k in BYTE_KEYS}
    # Exact per-epoch counts of the cost model (absent in records of older versions: None).
    per_rank = last.get("rows_per_layer")
    out["rows"] = None if not per_rank else int(steps) * sum(sum(r["rows_computed"]) for r in per_rank)
    out["inter_bytes_max_server"], out["intra_bytes_max_rank"] = busiest_bytes(last)
    out["layer_counts"] = layer_counts(last)  # the overlap limit's per-layer counts (None: older records)
    # every rank's compute per layer and direction of the median epoch (linkmodel's per-rank timeline;
    # None: older records)
    out["layer_compute"] = sorted(steady, key=lambda r: r["time_s"])[(len(steady) - 1) // 2].get("layer_compute_s")
    tested = [r for r in records if r.get("test_acc") is not None]
    out["test_acc"] = float(tested[-1]["test_acc"]) if tested else None
    return out


def inter_bytes(run):
    return run["bytes"]["inter_halo"] + run["bytes"]["inter_grad"]


COMPUTE_FLOOR_S = 1e-3


def fit_mode_round(cells, leave_out=None, iterations=200):
    """Weighted least squares of log y[m, r] = a[m] + b[r] over the cells but `leave_out`.

    cells: {(mode, round): (log y, weight)}.  a[m]: the mode's log compute seconds at the first round's
    load, b[r]: the round's log load factor (b[first round] = 0 fixes the split).  Solved by alternating
    weighted means (each step is the exact minimiser for one side; it converges for a connected table).
    Returns ({mode: a}, {round: b})."""
    cells = {k: v for k, v in cells.items() if k != leave_out}
    modes, rounds = sorted({m for m, _ in cells}), sorted({r for _, r in cells})
    a, b = {m: 0.0 for m in modes}, {r: 0.0 for r in rounds}

    def mean(pairs):
        pairs = list(pairs)
        return sum(v * w for v, w in pairs) / sum(w for _, w in pairs)

    for _ in range(iterations):
        for m in modes:
            a[m] = mean((v - b[r], w) for (mm, r), (v, w) in cells.items() if mm == m)
        for r in rounds:
            b[r] = mean((v - a[m], w) for (m, rr), (v, w) in cells.items() if rr == r)
    shift = b[rounds[0]]
    return {m: x + shift for m, x in a.items()}, {r: x - shift for r, x in b.items()}


def model_sweep(rounds, servers):
    """Predict every run of a sweep from the others, in place; return the fit on all runs.

    rounds: [{"label", "rate_bps", "bw_Bps", "pingpong", "runs": {mode: summary}}], each one rate with every
    mode run back to back.  A run's compute (its epoch less its wire time) is predicted as its mode's
    compute at the reference load (from the mode's runs at the *other* rates) times the round's load
    factor (from the *other* modes of the round): leave-one-out, so a run never predicts itself.  Also
    adds the previous model (`unshaped_model`) for comparison."""
    modes = {m for rnd in rounds for m in rnd["runs"]}
    if len(rounds) < 2 or len(modes) < 2:
        raise ValueError("the cost model calibrates each run on the other modes of its round and on its mode's "
                         "runs in other rounds: it needs at least 2 modes and 2 rounds (rates, or the repeat)")
    cells, bw_of = {}, {}
    for i, rnd in enumerate(rounds):
        bw_inter, bw_intra = link_bandwidth(rnd), rnd["pingpong"].get("intra_Bps")
        bw_of[i] = (bw_inter, bw_intra)
        for mode, run in rnd["runs"].items():
            if run.get("rows") is None:
                raise ValueError(f"run {run.get('run_dir', mode)} has no rows_per_layer in its records; rerun it "
                                 f"with this version of granndis_hpc")
            run["wire_s"] = wire_s(run, bw_inter, bw_intra)
            # Compute = what is not on the wire; floored at 1 ms so that an over-predicted wire time keeps
            # a logarithm.  Weight (compute / epoch)^2: an error dT of the epoch moves log(compute) by
            # dT / compute, so a run that is mostly wire time (fb at slow rates) says little about its
            # compute, and an error of the wire model there must not set a mode's cost or a round's load.
            compute = max(run["compute"] + run["sampling"] if run.get("overlap") else run["epoch_s"] - run["wire_s"],
                          COMPUTE_FLOOR_S)
            cells[(mode, i)] = (math.log(compute), (compute / run["epoch_s"]) ** 2)
    for i, rnd in enumerate(rounds):
        for mode, run in rnd["runs"].items():
            a, b = fit_mode_round(cells, leave_out=(mode, i))
            compute = math.exp(a[mode] + b[i])
            run["cost_per_row_s"] = compute / run["rows"]
            run["predicted_s"] = compute + run["wire_s"]
            run["model_error"] = (run["predicted_s"] - run["epoch_s"]) / run["epoch_s"]
            # sweeps recorded before the overlap model have no layer count, before its counts none of them
            if run.get("layers") and (run.get("layer_counts") or not run.get("overlap")):
                run["overlap_limit_s"] = overlap_limit(run, compute, bw_of[i], servers)
                run["measured_over_limit"] = run["epoch_s"] / run["overlap_limit_s"]
    unshaped_model(rounds, servers)
    a, b = fit_mode_round(cells)
    rows = {m: rnd["runs"][m]["rows"] for rnd in rounds for m in rnd["runs"]}
    return {"cost_per_row_s": {m: math.exp(x) / rows[m] for m, x in a.items()},
            "load_factor": [math.exp(b[i]) for i in range(len(rounds))]}


def unshaped_model(rounds, servers, base_label="unshaped"):
    """The previous model, for comparison: C + T_intra of the mode's unshaped run + B_inter / S / bw."""
    base = next((r for r in rounds if r["label"] == base_label), None)
    if base is None:
        raise ValueError(f"the cost model needs the {base_label} run; include '{base_label}' in --rates")
    if servers < 2:
        raise ValueError("the cost model needs at least 2 servers")
    for rnd in rounds:
        for mode, run in rnd["runs"].items():
            b = base["runs"][mode]
            pred = (b["compute"] + b["sampling"] + b["intra_comm"] + b["grad_sync"]
                    + inter_bytes(run) / servers / _positive(rnd["bw_Bps"], "inter-server"))
            run["predicted_unshaped_s"] = pred
            run["model_error_unshaped"] = (pred - run["epoch_s"]) / run["epoch_s"]


def speedups(rate, baseline="fb"):
    """{mode: baseline epoch / mode epoch} at one rate (empty when the baseline did not run)."""
    runs = rate["runs"]
    if baseline not in runs:
        return {}
    return {m: runs[baseline]["epoch_s"] / r["epoch_s"] for m, r in runs.items() if r["epoch_s"] > 0}


def inter_share(run):
    """Share of an epoch spent on inter-server communication (halo; gradient sync is separate)."""
    return run["inter_comm"] / run["epoch_s"] if run["epoch_s"] > 0 else 0.0


def paper_like_rates(rates, baseline="fb", share=PAPER_SHARE):
    """Labels of the rates where the baseline spends the paper's share of its epoch on inter comm."""
    lo, hi = share
    return [r["label"] for r in rates if baseline in r["runs"] and lo <= inter_share(r["runs"][baseline]) <= hi]

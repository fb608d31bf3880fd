"""Epoch-time summaries of a sweep, and the cost model that predicts them (stdlib only).

The model follows the paper's Eq. 1 / 5: an epoch is computation plus communication per link class,

    T(mode, R) = c(R) * rows(mode) + B_intra(mode) / bw_intra(R) + B_inter(mode) / bw_inter(R)

- rows: the rows the mode computes per epoch, summed over layers, ranks and steps (the epoch record's
  rows_per_layer, exact).  Summed over ranks, not the busiest rank: here the 4 ranks share 2 cores
  (with other jobs), so an epoch's CPU time is everyone's rows, and a rank that reaches an exchange
  first waits for the others' compute.  That wait is part of the cost of a row on this machine.
- c(R): seconds per row, calibrated in the *same round* (every mode at one rate, back to back, minutes
  apart) by least squares over the round's *other* modes (leave-one-out: a run never predicts itself):
  c = sum(rows_i * y_i) / sum(rows_i^2), y_i = T_i - wire time_i.  A cost per row from one unshaped run
  at the start of the sweep cannot be used: the machine's load drifts during a sweep and the same run
  computed 0.13-0.45 s per epoch minutes apart (docs/cluster.md, "When the model is off").
- B_inter: the busiest server's inter-server bytes per epoch (the record's inter_bytes_per_server,
  halo + gradient, exact).  Each server sends over its own shaped egress at the same time, so the
  epoch waits for the server with the most to send, not for the average one.
- B_intra: the busiest rank's intra-server bytes (max_rank_bytes), over bw_intra, the shared-memory
  bandwidth the round's ping-pong measured.
- bw_inter(R): the inter-server bandwidth measured by MPI ping-pong at that rate (the self-check), so
  TCP/IP overhead (a 1500-byte frame carries 1448 payload bytes) is in it.

Waiting is counted once: the measured intra-comm and gradient-sync seconds (mostly waits for a slower
peer, including its inter-server transfer) are not terms of the model; they are in c (waits for
compute) or in the wire time (waits for the link).

`unshaped_model` keeps the previous model (the unshaped run's compute + intra + gradient-sync
seconds + total inter bytes / S / bw) for comparison on the same page.
"""
from __future__ import annotations

import statistics

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
    per_server, max_rank = last.get("inter_bytes_per_server"), last.get("max_rank_bytes")
    out["inter_bytes_max_server"] = None if per_server is None else int(max(per_server))
    out["intra_bytes_max_rank"] = None if max_rank is None else int(max_rank["intra_halo"] + max_rank["intra_grad"])
    tested = [r for r in records if r.get("test_acc") is not None]
    out["test_acc"] = float(tested[-1]["test_acc"]) if tested else None
    return out


def inter_bytes(run):
    return run["bytes"]["inter_halo"] + run["bytes"]["inter_grad"]


def _positive(bw, what):
    if bw is None or bw <= 0:
        raise ValueError(f"{what} bandwidth must be positive, got {bw!r}")
    return bw


def wire_s(run, bw_inter, bw_intra):
    """Seconds on the links: the busiest server's inter bytes and the busiest rank's intra bytes."""
    if run.get("inter_bytes_max_server") is None or run.get("intra_bytes_max_rank") is None:
        raise ValueError(f"run {run.get('run_dir', '?')} has no per-server / per-rank bytes in its records; "
                         f"rerun it with this version of granndis_hpc (the epoch record's inter_bytes_per_server "
                         f"and max_rank_bytes)")
    return (run["inter_bytes_max_server"] / _positive(bw_inter, "inter-server")
            + run["intra_bytes_max_rank"] / _positive(bw_intra, "intra-server"))


def cost_per_row(samples):
    """Least squares through the origin of y = c * rows over [(rows, y)]: c = sum(r y) / sum(r^2)."""
    den = sum(r * r for r, _ in samples)
    if den <= 0:
        raise ValueError("calibrating a cost per row needs at least one other run with rows computed")
    return sum(r * y for r, y in samples) / den


def model_round(rnd):
    """Add the prediction to every run of one round (one rate, every mode back to back), in place.

    c is calibrated by leave-one-out least squares over the round's other modes."""
    bw_inter, bw_intra = rnd["bw_Bps"], rnd["pingpong"].get("intra_Bps")
    runs = rnd["runs"]
    for mode, run in runs.items():
        if run.get("rows") is None:
            raise ValueError(f"run {run.get('run_dir', mode)} has no rows_per_layer in its records; rerun it "
                             f"with this version of granndis_hpc")
        run["wire_s"] = wire_s(run, bw_inter, bw_intra)
    for mode, run in runs.items():
        others = [(o["rows"], o["epoch_s"] - o["wire_s"]) for m, o in runs.items() if m != mode]
        run["cost_per_row_s"] = cost_per_row(others)
        run["predicted_s"] = run["cost_per_row_s"] * run["rows"] + run["wire_s"]
        run["model_error"] = (run["predicted_s"] - run["epoch_s"]) / run["epoch_s"]


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


def model_sweep(rounds, servers):
    """Both models on every round of a sweep, in place (rounds: [{"label", "bw_Bps", "pingpong", "runs"}])."""
    if len(next(iter(rounds))["runs"]) < 2:
        raise ValueError("the cost model calibrates each round on its other modes: run at least 2 modes")
    for rnd in rounds:
        model_round(rnd)
    unshaped_model(rounds, servers)


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

"""Epoch-time summaries of a sweep, and the cost model that predicts them (stdlib only).

The model follows the paper's Eq. 1 / 5: an epoch is computation plus communication per link class,

    T(mode, R) = C(mode) + T_intra(mode) + B_inter(mode) / (S * bw(R))

- C: the mode's measured compute seconds per epoch in the unshaped run (compute does not depend on the
  link; on CPU a rank waiting for the network is idle).
- T_intra: the unshaped run's intra-server communication and gradient-sync seconds.  The links inside a
  server are never shaped, so this term is the same at every rate; it is measured, not modelled from
  bytes, because on 2 shared cores it is dominated by waiting for the other ranks' compute, not by the
  shared-memory bandwidth (the ping-pong shows ~340 MB/s; an fb epoch's intra messages would take 0.03 s).
- B_inter: the ledger's inter-server bytes per epoch (halo + gradient, summed over ranks: exact).  Each
  of the S servers sends its share over its own egress at the same time, so the wire time is B / S over
  one egress (the partitions are balanced; the busiest server would add its imbalance).
- bw(R): the inter-server bandwidth measured by MPI ping-pong at that rate (the self-check), so TCP/IP
  overhead (a 1500-byte frame carries 1448 payload bytes) is in it; the nominal R is printed beside it.

A second, "pooled" prediction takes C and T_intra as the median over the mode's runs at the *other*
rates (leave-one-out, so the measured run never predicts itself).  Compute does not depend on the link,
so every run measures it; on a machine shared with other jobs one unshaped run can be caught by a load
spike (measured here: the same eas run took 0.25 s and 1.50 s per epoch minutes apart), and the median
of several runs is the better estimate of C.
"""
from __future__ import annotations

import statistics

PHASES = ("compute", "intra_comm", "inter_comm", "grad_sync", "sampling")
BYTE_KEYS = ("intra_halo", "inter_halo", "intra_grad", "inter_grad")
PAPER_SHARE = (0.44, 0.86)  # share of FB's epoch on inter-server communication measured in the paper
# The paper's AE cluster (10 GbE between servers), FLX speedup over FB.
PAPER_FLX_SPEEDUP = {"ogbn-arxiv": 1.79, "Reddit": 5.13, "ogbn-products": 3.98}


def summarize_run(records):
    """Median per-epoch figures of a run's metrics.jsonl records, the first epoch left out.

    The first epoch pays one-off costs (TCP connections, allocator warm-up, first sampling).  With
    evaluation only on the last epoch its accuracy is the run's; evaluation is not in time_s."""
    if not records:
        raise ValueError("a run with no epoch records")
    steady = records[1:] if len(records) > 1 else records
    med = lambda key: statistics.median(float(r.get(key, 0.0)) for r in steady)  # noqa: E731
    out = {"epoch_s": med("time_s"), "epochs_used": len(steady)}
    for p in PHASES:
        out[p] = med(p + "_s")
    last_bytes = steady[-1].get("bytes", {})
    out["bytes"] = {k: int(last_bytes.get(k, 0)) for k in BYTE_KEYS}
    tested = [r for r in records if r.get("test_acc") is not None]
    out["test_acc"] = float(tested[-1]["test_acc"]) if tested else None
    return out


def inter_bytes(run):
    return run["bytes"]["inter_halo"] + run["bytes"]["inter_grad"]


def predict(base, bw_Bps, servers):
    """Predicted epoch seconds of a mode from its unshaped run `base` at inter bandwidth bw (bytes/s)."""
    if bw_Bps is None or bw_Bps <= 0:
        raise ValueError(f"inter-server bandwidth must be positive, got {bw_Bps!r}")
    if servers < 2:
        raise ValueError("the cost model needs at least 2 servers")
    return (base["compute"] + base["sampling"] + base["intra_comm"] + base["grad_sync"]
            + inter_bytes(base) / servers / bw_Bps)


def local_terms(run):
    """C + T_intra of one run: everything in its epoch that does not cross the inter-server link."""
    return run["compute"] + run["sampling"] + run["intra_comm"] + run["grad_sync"]


def model_sweep(rates, servers, base_label="unshaped"):
    """Add predictions and errors to every run of a sweep, in place; return the list of rows.

    `rates`: [{"label", "rate_bps", "bw_Bps", "runs": {mode: summary}}]; the one labelled `base_label`
    supplies every mode's compute and intra terms."""
    base = next((r for r in rates if r["label"] == base_label), None)
    if base is None:
        raise ValueError(f"the cost model needs the {base_label} run (its compute seconds); include "
                         f"'{base_label}' in --rates")
    rows = []
    for rate in rates:
        for mode, run in rate["runs"].items():
            if mode not in base["runs"]:
                continue
            pred = predict(base["runs"][mode], rate["bw_Bps"], servers)
            run["predicted_s"] = pred
            run["model_error"] = (pred - run["epoch_s"]) / run["epoch_s"]
            others = [r["runs"][mode] for r in rates if r is not rate and mode in r["runs"]]
            pooled = None
            if others:
                pooled = (statistics.median(local_terms(o) for o in others)
                          + inter_bytes(run) / servers / rate["bw_Bps"])
                run["predicted_pooled_s"] = pooled
                run["model_error_pooled"] = (pooled - run["epoch_s"]) / run["epoch_s"]
            rows.append({"rate": rate["label"], "mode": mode, "measured_s": run["epoch_s"],
                         "predicted_s": pred, "error": run["model_error"], "predicted_pooled_s": pooled})
    return rows


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

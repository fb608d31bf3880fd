"""Overlap against --no-overlap, pair by pair, from bench_cluster.py sweeps (no runs; writes a page).

    python bench/overlap_pairs.py SWEEP.json [SWEEP.json ...] --out docs/bench-cluster-overlap-200k.md
    python bench/overlap_pairs.py --runs bench-out/cluster/runs ...   # a sweep stopped early: its run
                                                                        # directories (each has link.json)

For every round (link rate) of every sweep and every mode M whose `M-noovl` ran in the same round
(side by side): both epochs and their ratio, the exposed inter-server wait of each, the exact ledger
bytes (equal in a pair, checked), and two readings of the overlap cost model
(granndis_hpc/linkmodel.py: T = C + the wire time each exchange's window of compute cannot hide + W_grad,
modelling what the run overlaps and what cannot overlap):

- `meas / limit (per-rank)`: the overlapped run's epoch over its limit on the per-rank timeline (every
  rank's measured compute per layer and direction of its median epoch, the record's layer_compute_s:
  each exchange waits for the slowest rank of its group) and the round's measured link -- what
  `granndis report` shows; empty for records without layer_compute_s;
- `meas / limit (slowest rank's total)`: the same over the one-rank limit from the record's compute_s
  (the compute of the rank with the longest epoch, spread over the layers by rows: session 8's figure);
- `no-ovl / its limit (per-rank)`: the --no-overlap twin over its own additive limit on the per-rank
  timeline (every exchange blocking), and `no-ovl / additive (total)`: over its compute_s + wire;
- `best ratio`: the limit over the additive epoch of the *no-overlap* run's compute, i.e. the smallest
  overlapped / no-overlap ratio the model allows on this graph and link with the overlapped run's order
  (its overlapped groups and per-layer windows).  Where it is above a target ratio the target cannot
  be reached by overlapping alone.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

from harness import REPO, write_page  # first: puts bench/cluster on the path

from granndis_hpc.linkmodel import link_bandwidth, overlap_limit, overlapped_groups, wire_s  # noqa: E402

NOOVL = "-noovl"
REPEAT = "-repeat"
# A sweep without GRANNDIS_PROGRESS_POLL ran cluster/pending.py's default polling.
DEFAULT_POLL = "default (back-off 1 -> 4 ms)"


def own_compute(run):
    return run["compute"] + run["sampling"]


def pair_rows(sweep, servers=2):
    """One dict per (round, mode with a -noovl twin): the figures of the module docstring."""
    out = []
    for rnd in sweep["rates"] + sweep.get("repeat", []):
        bw = (link_bandwidth(rnd), rnd["pingpong"].get("intra_Bps"))
        for mode, ovl in rnd["runs"].items():
            base = rnd["runs"].get(mode + NOOVL)
            if mode.endswith(NOOVL) or base is None:
                continue
            wire = wire_s(base, *bw)
            # the slowest rank's total compute on one timeline (session 8's figure), and every rank's
            # per-layer compute on the per-rank timeline (where the records have it)
            limit_total = overlap_limit(ovl, own_compute(ovl), bw, servers)
            limit_own = overlap_limit(ovl, own_compute(ovl), bw, servers, per_rank=ovl.get("layer_compute"))
            c_base = own_compute(base)
            # the no-overlap run's compute under the overlapped run's order (its groups and counts), over
            # its additive epoch (both on the no-overlap run's per-rank timeline where it has one)
            groups = overlapped_groups(ovl.get("overlap", True), ovl.get("overlap_halos"))
            base_counts = dict(base, layer_counts=ovl.get("layer_counts"))
            additive = overlap_limit(base_counts, c_base, bw, servers, groups=set(), per_rank=base.get("layer_compute"))
            best = overlap_limit(base_counts, c_base, bw, servers, groups=groups,
                                 per_rank=base.get("layer_compute")) / additive
            out.append({"date": sweep["date"], "label": rnd["label"], "mode": mode, "loadavg_1min": rnd.get("loadavg_1min"),
                        "epoch_s": ovl["epoch_s"], "noovl_epoch_s": base["epoch_s"],
                        "ratio": ovl["epoch_s"] / base["epoch_s"],
                        "inter_wait_s": ovl["inter_comm"], "noovl_inter_wait_s": base["inter_comm"],
                        "compute_s": own_compute(ovl), "noovl_compute_s": c_base, "wire_s": wire,
                        "limit_own_s": limit_own, "over_limit_own": ovl["epoch_s"] / limit_own,
                        "per_rank": ovl.get("layer_compute") is not None, "over_limit_total": ovl["epoch_s"] / limit_total,
                        "over_limit_loo": ovl.get("measured_over_limit"),
                        "noovl_over_additive": base["epoch_s"] / (c_base + wire),
                        "noovl_over_limit_own": base["epoch_s"] / additive,
                        "best_ratio": best, "bytes": ovl["bytes"], "bytes_equal": ovl["bytes"] == base["bytes"]})
    return out


def sweep_of_runs(runs_dir):
    """A sweep-like dict from a sweep's run directories (RATE/MODE, each with metrics.jsonl, config.json
    and the link.json bench_cluster.py writes after every run): what a sweep stopped before the end of a
    round (its sweep.partial.json holds only the rounds it completed) still measured."""
    import bench_cluster
    from granndis_hpc.linkmodel import LINK_FILE

    rounds, load = [], {}
    for name in ("sweep.json", "sweep.partial.json"):  # the rounds' load averages, where the sweep wrote them
        path = os.path.join(os.path.dirname(os.path.abspath(runs_dir)), name)
        if os.path.exists(path) and not load:
            with open(path) as f:
                load = {r["label"]: r.get("loadavg_1min") for r in json.load(f).get("rates", [])}
    for label in sorted(os.listdir(runs_dir)):
        runs, link = {}, None
        for mode in sorted(os.listdir(os.path.join(runs_dir, label))):
            run_dir = os.path.join(runs_dir, label, mode)
            if not os.path.exists(os.path.join(run_dir, LINK_FILE)):
                continue  # a run that did not finish
            with open(os.path.join(run_dir, LINK_FILE)) as f:
                link = json.load(f)
            runs[mode] = dict(bench_cluster.costmodel.summarize_run(bench_cluster.read_records(run_dir),
                                                                    bench_cluster.steps_per_epoch(run_dir)),
                              run_dir=run_dir, **bench_cluster.run_config(run_dir))
        if runs:
            rounds.append({"label": label, "rate_bps": link["rate_bps"], "bw_Bps": link["bw_Bps"],
                           "loadavg_1min": load.get(label),
                           "pingpong": {"intra_Bps": link["intra_Bps"]}, "runs": runs})
    return {"date": "", "rates": rounds}


def page(rows, sources):
    lines = ["# Overlap against --no-overlap, side by side (issue 19)", "",
             f"From {', '.join(sources)} (bench/bench_cluster.py sweeps; this page: bench/overlap_pairs.py). "
             "Each row is one mode and its `--no-overlap` twin, run back to back in one round at one link rate. "
             "Times: the median epoch of the slowest rank; bytes: exact ledger counts per epoch, summed over ranks.", "",
             "| sweep | link | load | mode | overlap (s) | no-overlap (s) | ratio | inter wait ovl / no (s) | "
             "compute ovl / no (s) | wire (s) | meas / limit (per-rank) | meas / limit (slowest rank's total) | "
             "no-ovl / its limit (per-rank) | no-ovl / additive (total) | best ratio | inter halo B | inter grad B | bytes equal |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        own = f"{r['over_limit_own']:.2f}" if r.get("per_rank") else ""
        load = "" if r["loadavg_1min"] is None else f"{r['loadavg_1min']:.1f}"
        lines.append(f"| {r['source']} | {r['label']} | {load} | {r['mode']} | {r['epoch_s']:.3f} | {r['noovl_epoch_s']:.3f} | "
                     f"**{r['ratio']:.2f}x** | {r['inter_wait_s']:.3f} / {r['noovl_inter_wait_s']:.3f} | "
                     f"{r['compute_s']:.3f} / {r['noovl_compute_s']:.3f} | {r['wire_s']:.3f} | {own} | "
                     f"{r['over_limit_total']:.2f} | {r['noovl_over_limit_own']:.2f} | {r['noovl_over_additive']:.2f} | "
                     f"{r['best_ratio']:.2f} | {r['bytes']['inter_halo']:,} | "
                     f"{r['bytes']['inter_grad']:,} | {'yes' if r['bytes_equal'] else 'NO'} |")
    return lines + [""]


def summary(rows):
    """Per (link, mode, cluster shape, poll setting): how many pairs, the geometric mean of their
    ratios, and the smallest and largest ratio."""
    groups = {}
    for r in rows:  # a sweep's repeated unshaped round ("unshaped-repeat") counts with its rate
        label = r["label"][:-len(REPEAT)] if r["label"].endswith(REPEAT) else r["label"]
        groups.setdefault((label, r["mode"], r.get("shape", ""), r.get("poll", "")), []).append(r["ratio"])
    out = []
    for (label, mode, shape, poll), ratios in groups.items():
        gmean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        out.append({"label": label, "mode": mode, "shape": shape, "poll": poll, "pairs": len(ratios),
                    "geomean": gmean, "min": min(ratios), "max": max(ratios)})
    return out


def summary_lines(rows):
    lines = ["| link | mode | shape | progress polling | pairs | geometric mean | min | max |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for g in summary(rows):
        lines.append(f"| {g['label']} | {g['mode']} | {g['shape']} | {g['poll'] or DEFAULT_POLL} | {g['pairs']} | "
                     f"**{g['geomean']:.2f}x** | {g['min']:.2f}x | {g['max']:.2f}x |")
    return lines + [""]


def sweep_name(path):
    """A sweep's name on the page: its file's name, or its folder's for bench_cluster.py's sweep.json."""
    base = os.path.basename(path)
    if base in ("sweep.json", "sweep.partial.json"):
        return os.path.basename(os.path.dirname(os.path.abspath(path)))
    return base[:-5] if base.endswith(".json") else base


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweeps", nargs="*", help="sweep.json files of bench/bench_cluster.py")
    p.add_argument("--runs", action="append", default=[], help="a sweep's run directory (RATE/MODE/...)")
    p.add_argument("--runs-poll", default="",
                   help="the progress polling of the --runs sweeps, where not the default (a run directory "
                        "does not record it)")
    p.add_argument("--out", default=os.path.join(REPO, "docs", "bench-cluster-overlap-pairs.md"))
    args = p.parse_args(argv)
    rows, sources = [], []
    for path in args.sweeps:
        with open(path) as f:
            sweep = json.load(f)
        name = sweep_name(path)
        sources.append(name)
        shape = f"{sweep['graph']['servers']} x {sweep['graph']['ranks_per_server']}" if "graph" in sweep else ""
        rows += [dict(r, source=name, shape=shape, poll=sweep.get("progress_poll", "")) for r in pair_rows(sweep)]
    for path in args.runs:
        name = os.path.basename(os.path.dirname(os.path.abspath(path))) + "/" + os.path.basename(os.path.abspath(path))
        sources.append(name)
        sweep = sweep_of_runs(path)
        first = next(iter(sweep["rates"][0]["runs"].values()))["run_dir"] if sweep["rates"] else None
        shape = ""
        if first is not None:
            with open(os.path.join(first, "summary.json")) as f:
                s = json.load(f)
            shape = f"{s['servers']} x {s['ranks_per_server']}"
        rows += [dict(r, source=name, shape=shape, poll=args.runs_poll) for r in pair_rows(sweep)]
    if not rows:
        p.error("no mode ran beside its -noovl twin in these sweeps")
    lines = page(rows, sources)
    lines[4:4] = ["Summary over the sweeps (ratio = overlap / --no-overlap epoch):", "", *summary_lines(rows)]
    write_page(args.out, lines, "bench/overlap_pairs.py", argv, [], data=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Seconds per computed row of bench_cobatch.py's runs, the cost model's k(mode) at one load (not a test).

    python bench/cobatch_row_cost.py [--runs bench-out/cobatch/runs] [--which new]

bench/cluster/costmodel.py fits k(mode) = compute / rows over a sweep's rounds (its load factor f
normalises the rounds); within one bench_cobatch.py sweep every run sees about the same load, so
compute / rows of each run, its first epoch left out (costmodel.summarize_run), compares the modes'
costs per row directly: compute = the epoch less the wire phases, the wait for the co-batch included
(as the cost model counts it for runs with overlap).  Rows: every layer's computed rows, summed over
ranks and the epoch's co-batches (the first co-batch's count times the co-batches, as the sweep does).
"""
from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster"))
from harness import REPO, read_run  # noqa: E402

import costmodel  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default=os.path.join(REPO, "bench-out", "cobatch", "runs"))
    p.add_argument("--which", default="new")
    args = p.parse_args(argv)
    costs = {}
    for name in sorted(os.listdir(args.runs)):
        if not name.startswith(args.which + "-") or not os.path.exists(os.path.join(args.runs, name, "summary.json")):
            continue  # (another revision's, or a run not finished)
        _, records = read_run(os.path.join(args.runs, name))
        b = re.search(r"-b=(\d+)-", name)  # bench_cobatch's run directories: WHICH-MODE[-b=B-f=F]-REP
        batches = int(b.group(1)) if b else 1
        run = costmodel.summarize_run(records, steps=batches)
        compute = run["compute"] + run["sampling"]
        label = re.sub(r"^%s-|-\d+$" % args.which, "", name)
        costs[label] = (compute, run["rows"], compute / run["rows"])
    flx = costs.get("flx", (None, None, None))[2]
    print("| run | compute + wait (s) | rows per epoch | us per row | x flx |")
    print("|---|---:|---:|---:|---:|")
    for label, (compute, rows, k) in costs.items():
        print(f"| {label} | {compute:.2f} | {rows:,} | {k * 1e6:.2f} | {k / flx:.2f} |" if flx else
              f"| {label} | {compute:.2f} | {rows:,} | {k * 1e6:.2f} | - |")


if __name__ == "__main__":
    main()

"""Where an overlapped epoch's time goes, from the exchange traces of runs (GRANNDIS_EXCHANGE_TRACE=1;
granndis_hpc/cluster/trace.py).  No runs; prints a table (and --json the figures).

    python bench/exchange_trace.py RUN_DIR [RUN_DIR ...]

Per run and rank, over the training steps after the first epoch's (medians over steps): the step's
forward, backward and the rest (gradient sync, optimizer), and per exchange of the step in the order
posted (forward: layer 1, 2, ...; backward: the reverse) the window (post -> the caller starts waiting:
the compute that ran while it travelled) and the wait (wait start -> end: what was exposed).  A
blocking exchange (--no-overlap, a server view under --overlap-halos world) has no window; its wait is
its whole time.  Beside the model's window and wire per exchange (granndis_hpc/linkmodel.py), this says
whether the run posts late, waits early, or its transfer takes longer than the link needs.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys


def steps_of(events):
    """[[(event, t, id), ...] per training step]: the events between step_start and step_end."""
    steps, cur = [], None
    for ev, t, ident in events:
        if ev == "step_start":
            cur = [(ev, t, ident)]
        elif cur is not None:
            cur.append((ev, t, ident))
            if ev == "step_end":
                steps.append(cur)
                cur = None
    return steps


def step_figures(step):
    """One step: phases (forward, backward, rest) and per exchange (direction, window, wait)."""
    t0 = step[0][1]
    at = {ev: t for ev, t, _ in step if ev in ("backward", "backward_end", "step_end")}
    out = {"forward_s": at["backward"] - t0, "backward_s": at["backward_end"] - at["backward"],
           "rest_s": at["step_end"] - at["backward_end"], "exchanges": []}
    posted, started, block = {}, {}, None
    for ev, t, ident in step:
        if ev.startswith("post_"):
            posted[(ident, ev[5:])] = t
        elif ev.startswith("wait_start_"):
            started[(ident, ev[11:])] = t
        elif ev.startswith("wait_end_"):
            key = (ident, ev[9:])
            out["exchanges"].append({"dir": key[1], "window_s": started[key] - posted[key], "wait_s": t - started[key]})
        elif ev.startswith("block_") and ev.endswith("_start"):
            block = t
        elif ev.startswith("block_") and ev.endswith("_end"):
            out["exchanges"].append({"dir": ev.split("_")[1] + " (blocking)", "window_s": 0.0, "wait_s": t - block})
    return out


def run_figures(run_dir, skip_steps=1):
    """{rank: medians over the steps after the first `skip_steps`} of a run's traces."""
    out = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "exchange-trace-rank*.json"))):
        rank = int(path.rsplit("rank", 1)[1].split(".")[0])
        with open(path) as f:
            steps = [step_figures(s) for s in steps_of(json.load(f)["events"])][skip_steps:]
        if not steps:
            continue
        med = lambda xs: statistics.median(xs)  # noqa: E731
        n = min(len(s["exchanges"]) for s in steps)
        out[rank] = {k: med([s[k] for s in steps]) for k in ("forward_s", "backward_s", "rest_s")}
        out[rank]["exchanges"] = [{"dir": steps[0]["exchanges"][i]["dir"],
                                   "window_s": med([s["exchanges"][i]["window_s"] for s in steps]),
                                   "wait_s": med([s["exchanges"][i]["wait_s"] for s in steps])} for i in range(n)]
        out[rank]["steps"] = len(steps)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    every = {}
    for run_dir in args.runs:
        figs = run_figures(run_dir)
        every[run_dir] = figs
        print(f"## {run_dir}")
        for rank, f in figs.items():
            ex = "  ".join(f"{e['dir']}: {e['window_s'] * 1e3:.0f}/{e['wait_s'] * 1e3:.0f}" for e in f["exchanges"])
            print(f"rank {rank}: fwd {f['forward_s']:.3f} bwd {f['backward_s']:.3f} rest {f['rest_s']:.3f} s | "
                  f"exchanges window/wait ms: {ex}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(every, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""bench_auto.py's products-size graph: each option's epochs at every rate from one run (not a test).

A products-size run spends a minute or more reading its shards and ~20 s in its final evaluation, so,
as bench_products.py does, each option trains --epochs epochs at each rate in turn in one run, the link
re-shaped between them (bench_products.Reshaper), under the memory guard (bench_scale.MemoryGuard) and
with every rank's peak RSS polled (bench_products.RankPeaks); with --repeats N, N such runs per option,
the options in turn and then again, an option's epoch at a rate the median of its runs'.  auto's own runs
stay per rate (bench_auto.py): its link check runs at start-up.  The options are those auto's decision
lists (the table of its run that made the round's choice);
besides them, runs for the exact inter-server bytes alone: fb on the direct route (a halo row once per
reading rank) and, where auto does not offer them (products trains with input dropout, which partial
payloads do not support), fb with partial and smaller payloads with `--input-dropout 0` (the bytes do
not depend on dropout), once each.  A run whose 4 ranks auto's estimate puts above --memory-budget is not run
unless --over-estimate.
"""
from __future__ import annotations

import os
import shutil
import time

from auto_page import record_run
from bench_products import RankPeaks, Reshaper
from bench_scale import MemoryGuard
from harness import read_run

from emucluster import costmodel

PAYLOADS = ("partial", "smaller")


def byte_runs(offered):
    """(name, shard set, train arguments) of the runs made for their bytes: not among auto's options."""
    out = [("fb route=direct", "full", ["--mode", "fb", "--halo-route", "direct"])]
    return out + [(f"fb payload={p}, input dropout 0", "full", ["--mode", "fb", "--halo-payload", p,
                                                                 "--input-dropout", "0"])
                  for p in PAYLOADS if f"fb payload={p}" not in offered]


def run_reshaped(run, cmd, run_dir, args, log):
    """`cmd` (a train run of --epochs x len(--rates) epochs writing to run_dir) with the link re-shaped
    after every --epochs epochs: {rate: {epoch_s, epochs, bytes, ...}}, or {rate: {error}}."""
    shutil.rmtree(run_dir, ignore_errors=True)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    t, out = time.perf_counter(), {}
    with MemoryGuard(args.min_available_gib) as guard, RankPeaks(run_dir) as peaks, \
            Reshaper(metrics, args.rates, args.epochs) as reshaper:
        try:
            run(cmd, log, args.run_timeout + 60)
            _, recs = read_run(run_dir)
            seen = reshaper.seen
            # The last epoch's line is written after the final evaluation: its delay is that evaluation.
            final_eval = seen[-1] - seen[-2] - recs[-1]["time_s"] if len(seen) >= 2 else None
            for k, label in enumerate(args.rates):
                part = recs[k * args.epochs:(k + 1) * args.epochs]
                s = costmodel.summarize_run(part)
                out[label] = {"epoch_s": s["epoch_s"], "epochs": [float(r["time_s"]) for r in part],
                              "bytes": s["bytes"], "final_evaluation_s": final_eval}
        except (RuntimeError, OSError, ValueError, KeyError) as exc:  # recorded; the sweep goes on
            out = {label: {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
                   for label in args.rates}
    for label in args.rates:
        rec = out.setdefault(label, {"error": "no record"})
        if guard.fired is not None:
            rec["error"] = (f"stopped by the memory guard: MemAvailable {guard.fired:.2f} GiB < "
                            f"{args.min_available_gib} GiB")
        rec.update(peak_rss=[peaks.peaks.get(r, 0) for r in range(4)], run_wall_s=time.perf_counter() - t)
    return out


def sweep(data, graph, options, shards, train_cmd, run, args, log, save):
    """Every option of `options` (name, shard set, train arguments) --repeats runs over every rate, in turn,
    and the byte runs one; the results go into the rounds of `graph` in data["rates"], saved (`save()`) after
    each run."""
    rounds = {r["rate"]: r["graphs"][graph] for r in data["rates"] if graph in r["graphs"] and r["rate"] in args.rates}
    decided = next((g for g in (rounds.get(label) for label in args.rates) if g and g.get("predicted")), None)
    offered = set(decided["predicted"]) if decided else None
    chosen = [o for o in options if offered is None or o[0] in offered]  # all, where auto's run failed
    runs = [(o, True) for o in chosen] + [(o, False) for o in byte_runs(offered or ())]
    for g in rounds.values():
        g["options"] = [o[0] for o in chosen]
    n = args.repeats
    for (name, kind, extra), is_option, k in [(*r, k) for k in range(n) for r in runs if r[1] or k == 0]:
        est = (decided or {}).get("peak_bytes", {}).get(name)
        over = est is not None and 4 * est > args.memory_budget * 2**30
        if over and not args.over_estimate:
            result = {label: {"error": f"not run: auto's estimate {est / 2**30:.2f} GiB per rank, 4 ranks > "
                                       f"--memory-budget {args.memory_budget} GiB"} for label in args.rates}
        else:
            run_dir = os.path.join(args.work, "runs", "reshaped", graph, name.replace(" ", "").replace("=", "")
                                   .replace(",", "-") + ("" if n == 1 else f"-run{k + 1}"))
            result = run_reshaped(run, train_cmd(shards[graph, kind], extra, run_dir,
                                                 args.epochs * len(args.rates)), run_dir, args, log)
        for label, rec in result.items():
            g = rounds.get(label)
            if g is None:  # a rate whose link check failed
                continue
            if "error" in rec:
                g.setdefault("errors", {})[name] = ("" if n == 1 else f"run {k + 1} of {n}: ") + rec["error"]
            else:
                record_run(g, name, rec["epoch_s"], rec["epochs"], "measured" if is_option else "other")
                g.setdefault("bytes", {})[name] = rec["bytes"]
            # every run's wall and final evaluation; each rank's peak RSS over the runs
            seen = g.setdefault("runs", {}).setdefault(name, {"peak_rss": None, "run_wall_s": [],
                                                              "final_evaluation_s": []})
            if rec.get("peak_rss"):
                seen["peak_rss"] = [max(a, b) for a, b in zip(seen["peak_rss"] or rec["peak_rss"], rec["peak_rss"])]
            seen["run_wall_s"].append(rec.get("run_wall_s"))
            seen["final_evaluation_s"].append(rec.get("final_evaluation_s"))
            if over:
                g["runs"][name]["over_estimate"] = f"{est / 2**30:.2f} GiB per rank by auto's estimate"
        save()

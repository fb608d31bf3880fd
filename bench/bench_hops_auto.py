"""Per-rank memory of `build --hops auto`'s depth choice over P ranks (not a test).

`build --hops auto --memory-per-gpu X` estimates a full preload of every depth k = 1..L before it
builds.  It used to assemble the whole graph on every rank for that (sliced.assemble, then
plan_sets.plan_options on the Graph); it now counts from the ranks' slices (preprocess/plan/halo_counts.py).
For each P and each way, the driver runs one fresh job of this script's worker,
`mpirun -n P python bench/bench_hops_auto.py --worker ...`, which loads the ranks' slices of the
`--generator local` graph (sliced.load_slice, as `build` does), resets every rank's peak RSS (VmHWM),
runs the choice (plan.auto_hops) and records per rank: RSS before (the slice, and torch, which the
estimate's model code imports, loaded first), the choice's peak RSS, CPU and wall seconds, and the
decision (the same for both ways at one P; the ParMETIS partition, hence the estimate, depends on P).

  python bench/bench_hops_auto.py --vertices 300000 --ranks 1 2 4 --ways sliced assembled \\
      --json bench-out/bench-hops-auto.json --md bench-out/hops-auto.md

Run it alone on the machine: other jobs change the peak RSS it measures.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench_scale import MemoryGuard
from harness import REPO, mpi_env


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def worker(a) -> int:
    """One job: load the slices, then the depth choice one way; rank 0 writes every rank's record."""
    from granndis_hpc.cluster import as_group
    from granndis_hpc.preprocess.build.pipeline import _reset_peak_rss
    from granndis_hpc.preprocess.plan.command import PlanConfig, auto_hops
    from granndis_hpc.preprocess.build.sliced import assemble, load_slice
    from granndis_hpc.preprocess.sources.synthetic_chunks import SyntheticSource
    from granndis_hpc.units import parse_size

    from granndis_hpc import registry

    # The estimate's model code imports torch (~190 MiB of RSS per rank, the same both ways and for
    # every P): imported before the measurement, so the table shows what the choice's data costs.
    registry.MODELS.entry("sage").resolve("estimator")
    group = as_group(None)
    source = SyntheticSource(generator="local", vertices=a.vertices, avg_degree=a.avg_degree, features=a.features,
                             seed=0)
    t0 = time.perf_counter()
    part = load_slice(group, source)
    load_s = time.perf_counter() - t0
    group.barrier()
    rss_before = _rss("VmRSS")
    _reset_peak_rss()
    t, c = time.perf_counter(), time.process_time()
    cfg = PlanConfig(servers=2, gpus_per_server=2, layers=a.layers, model="sage", hidden=a.hidden,
                     budget=parse_size(a.memory_per_gpu), device="cuda", partitioner=a.partitioner, seed=0)
    if a.way == "assembled":  # the code path before halo_counts: every rank holds the whole graph
        graph = assemble(group, part)
        del part
        decision = auto_hops(group, graph, cfg)
    else:
        decision = auto_hops(group, part, cfg)
    rec = {"rank": group.rank, "rss_before": rss_before, "peak_rss": _rss("VmHWM"),
           "cpu_s": time.process_time() - c, "wall_s": time.perf_counter() - t, "load_s": load_s}
    ranks = group.gather_object(rec)
    if group.rank == 0:
        d = decision.to_dict()
        with open(a.out, "w") as f:
            json.dump({"ranks": ranks, "k": d["choice"]["k"], "reason": d["reason"],
                       "peaks": {o["label"]: o["peak_bytes"] for o in [d["choice"]] + d["rejected"]}}, f)
    return 0


def run_one(a, P, way) -> dict:
    out = os.path.join(a.work, f"P{P}-{way}.json")
    if os.path.exists(out):
        os.remove(out)
    cmd = ["mpirun", "-n", str(P), sys.executable, os.path.abspath(__file__), "--worker", "--way", way,
           "--out", out, "--vertices", str(a.vertices), "--avg-degree", str(a.avg_degree), "--features",
           str(a.features), "--layers", str(a.layers), "--hidden", str(a.hidden), "--memory-per-gpu",
           a.memory_per_gpu, "--partitioner", a.partitioner]
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with MemoryGuard(a.min_available_gib) as guard:
        try:
            r = subprocess.run(cmd, cwd=REPO, env=mpi_env(), capture_output=True, text=True, timeout=a.timeout)
        except subprocess.TimeoutExpired:  # a record saying so; the campaign goes on
            r = subprocess.CompletedProcess(cmd, 124, "", f"timed out after {a.timeout:.0f} s")
    rec = {"P": P, "way": way, "job_wall_s": time.perf_counter() - t0, "rc": r.returncode,
           "loadavg_start": load0, "loadavg_end": os.getloadavg()[0],
           "command": f"mpirun -n {P} python bench/bench_hops_auto.py " + " ".join(cmd[5:])}
    if guard.fired is not None:
        rec["error"] = f"stopped by the memory guard: MemAvailable {guard.fired:.2f} GiB < {a.min_available_gib} GiB"
    elif r.returncode != 0 or not os.path.exists(out):
        rec["error"] = (r.stderr or r.stdout)[-1500:]
    else:
        with open(out) as f:
            rec.update(json.load(f))
    return rec


def table(records) -> str:
    gib = 2.0 ** 30
    lines = ["| P | way | peak RSS during the choice, max over ranks (GiB) | RSS before it: the rank's slice + "
             "Python (GiB) | peak minus RSS before, max over ranks (GiB) | peak / P = 1 | CPU s (max rank) | wall s | "
             "k "
             "| load avg (start, end) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    base = {}
    for r in records:
        if "ranks" not in r:
            lines.append(f"| {r['P']} | {r['way']} | failed: {r.get('error', '')[-120:]!r} | | | | | | | |")
            continue
        peak = max(x["peak_rss"] for x in r["ranks"])
        base.setdefault(r["way"], peak if r["P"] == 1 else None)
        ratio = f"{peak / base[r['way']]:.2f}" if base.get(r["way"]) else "-"
        added = max(x["peak_rss"] - x["rss_before"] for x in r["ranks"])
        lines.append(f"| {r['P']} | {r['way']} | {peak / gib:.2f} | "
                     f"{max(x['rss_before'] for x in r['ranks']) / gib:.2f} | "
                     f"{added / gib:.2f} | {ratio} | {max(x['cpu_s'] for x in r['ranks']):.1f} | "
                     f"{max(x['wall_s'] for x in r['ranks']):.1f} | "
                     f"{r['k']} | {r['loadavg_start']:.1f}, {r['loadavg_end']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--way", choices=("sliced", "assembled"), help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--vertices", type=int, default=300000)
    p.add_argument("--avg-degree", type=float, default=22.0)
    p.add_argument("--features", type=int, default=100)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--memory-per-gpu", default="4GiB")
    p.add_argument("--partitioner", default="parmetis")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--ways", nargs="+", default=["sliced", "assembled"], choices=("sliced", "assembled"))
    p.add_argument("--work", default=os.path.join(REPO, "bench-out", "hops-auto"))
    p.add_argument("--timeout", type=float, default=1500)
    p.add_argument("--min-available-gib", type=float, default=3.0)
    p.add_argument("--json")
    p.add_argument("--md")
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    os.makedirs(a.work, exist_ok=True)
    records = []
    for P in a.ranks:
        for way in a.ways:  # interleaved: both ways of one P side by side
            rec = run_one(a, P, way)
            print(json.dumps({k: v for k, v in rec.items() if k != "ranks"}), flush=True)
            records.append(rec)
            if a.json:  # after every job: a campaign cut short keeps what it measured
                with open(a.json, "w") as f:
                    json.dump({"argv": argv if argv is not None else sys.argv[1:], "records": records}, f, indent=1)
    # The partition (ParMETIS) depends on P, so the estimates may too; for one P both ways must agree.
    notes = []
    for P in a.ranks:
        got = {r["way"]: (r["k"], r["reason"]) for r in records if r["P"] == P and "k" in r}
        if len(set(got.values())) == 1:
            k, reason = next(iter(got.values()))
            notes.append(f"P = {P}, {' and '.join(got)}: k = {k} ({reason})")
        else:
            notes.append(f"P = {P}: " + ("no result" if not got else "DIFFER: " + "; ".join(
                f"{w}: k = {k} ({reason})" for w, (k, reason) in got.items())))
    text = table(records) + "\n\nDecisions:\n" + "\n".join(f"- {n}" for n in notes)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

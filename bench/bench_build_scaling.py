"""Strong scaling of one preprocessing build over P ranks (not a test).

For each P (and preload) the driver runs one fresh job
`mpirun -n P granndis preprocess build --source synthetic --generator local --vertices N ...` with
$GRANNDIS_BUILD_PROFILE set, so every rank writes its CPU seconds and peak RSS per phase (the peak is
reset at each phase end: preprocess/build/pipeline.py PhaseLog), and records the wall time of the job, the
manifest's digests, and `preprocess plan`'s estimate of the peak per build rank.  A memory guard stops
a job that drives the machine's MemAvailable under --min-available-gib (other jobs share it).

  python bench/bench_build_scaling.py --vertices 2450000 --ranks 1 2 4 8 --preload full eas \\
      --json bench-out/bench-build-scaling.json --md bench-out/build-scaling.md

`--whole-graph` adds the whole-graph build (every rank loads the whole graph) for comparison.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from bench_scale import MemoryGuard
from harness import REPO, mpi_env

PHASES = ("load", "partition", "halos+write", "commit")


def graph_args(a) -> list:
    return ["--source", "synthetic", "--generator", "local", "--vertices", str(a.vertices), "--features",
            str(a.features), "--avg-degree", str(a.avg_degree), "--seed", "0"]


def layout_args(a, preload) -> list:
    out = ["--servers", "2", "--gpus-per-server", "2", "--layers", str(a.layers), "--preload", preload,
           "--partitioner", a.partitioner]
    return out + (["--hops", str(a.hops)] if preload == "full" else ["--hops", "1", "--eas-fanout", "15"])


def run_one(a, P, preload, whole) -> dict:
    tag = f"P{P}-{preload}" + ("-whole" if whole else "")
    out = os.path.join(a.work, tag)
    prof = os.path.join(a.work, tag + ".profile.json")
    shutil.rmtree(out, ignore_errors=True)
    cmd = ["mpirun", "-n", str(P), sys.executable, "-m", "granndis_hpc.preprocess", "build", *graph_args(a),
           *layout_args(a, preload), "--out", out] + (["--whole-graph"] if whole else [])
    env = mpi_env(GRANNDIS_BUILD_PROFILE=prof)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with MemoryGuard(a.min_available_gib) as guard:
        r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=a.timeout)
    rec = {"P": P, "preload": preload, "whole_graph": whole,
           "command": " ".join(cmd[:1] + cmd[1:3] + ["python"] + cmd[4:]),
           "wall_s": time.perf_counter() - t0, "rc": r.returncode, "loadavg_start": load0,
           "loadavg_end": os.getloadavg()[0], "log": [l for l in r.stdout.splitlines() if l.startswith("[preprocess]")]}
    if guard.fired is not None:
        rec["error"] = f"stopped by the memory guard: MemAvailable {guard.fired:.2f} GiB < {a.min_available_gib} GiB"
    if r.returncode != 0:
        rec.setdefault("error", r.stderr[-2000:])
        return rec
    with open(prof) as f:
        rec["ranks"] = json.load(f)["ranks"]
    with open(os.path.join(out, "manifest.json")) as f:
        m = json.load(f)
    rec.update(content_sha256=m["dataset"]["content_sha256"], partition_digest=m["partition_digest"],
               files={k: v["sha256"] for k, v in m["files"].items()},
               file_bytes={k: v["bytes"] for k, v in m["files"].items()}, num_edges=m["dataset"]["num_edges"],
               rows_per_vertex=m["stats"]["replication_factor"],
               gpu_row_balance_max=m["stats"]["gpu_row_balance_max"],
               gpu_train_balance_max=m["stats"]["gpu_train_balance_max"])
    if a.verify:
        # /usr/bin/time: verify's own peak RSS (docs/performance/build-scaling.md: bounded, one file at a time).
        timed = ["/usr/bin/time", "-f", "maxrss_kib=%M"] if os.path.exists("/usr/bin/time") else []
        v = subprocess.run(timed + [sys.executable, "-m", "granndis_hpc.preprocess", "verify", out], cwd=REPO,
                           capture_output=True, text=True)
        rec["verify"] = v.stdout.strip().splitlines()[-1] if v.stdout.strip() else v.stderr[-300:]
        rss = [l for l in v.stderr.splitlines() if l.startswith("maxrss_kib=")]
        if rss:
            rec["verify_peak_rss"] = int(rss[-1].split("=")[1]) * 1024
    if not a.keep:
        shutil.rmtree(out, ignore_errors=True)
    return rec


def plan_inputs(a) -> dict:
    """`preprocess plan --json`'s build-memory inputs for this graph (one plan run; every preload)."""
    path = a.plan_json or os.path.join(a.work, "plan.json")
    if a.plan_json and os.path.exists(path):  # an earlier run's plan of the same graph
        with open(path) as f:
            return json.load(f)["build_memory"]
    cmd = [sys.executable, "-m", "granndis_hpc.preprocess", "plan", *graph_args(a), "--servers", "2",
           "--gpus-per-server", "2",
           "--layers", str(a.layers), "--partitioner", a.partitioner, "--model", "sage", "--hidden", "64",
           "--cob-batches", "2", "--eas-hops", "1", "--eas-fanout", "15", "--json", path]
    r = subprocess.run(cmd, cwd=REPO, env=mpi_env(), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-800:])
    with open(path) as f:
        return json.load(f)["build_memory"]


def add_estimates(a, records) -> None:
    """The estimated peak per rank (preprocess/plan/build_memory.py) beside every sliced build's measurement."""
    from granndis_hpc.preprocess.plan.build_memory import ServerLoad, estimate_build_memory

    plan = plan_inputs(a)
    for r in records:
        if r["whole_graph"] or "ranks" not in r:
            continue
        inp = dict(plan["eas" if r["preload"] == "eas" else f"flx k={a.hops}"]["inputs"])
        inp["eas"] = r["preload"] == "eas"
        servers = [ServerLoad(**x) for x in inp.pop("servers")]
        if a.scale_plan:  # the plan of a smaller graph of the same generator, scaled to this one
            fv, fe = a.vertices / inp["num_vertices"], r["num_edges"] / inp["num_edges"]
            servers = [ServerLoad(x.server, int(x.rows * fv), int(x.fetched_edges * fe)) for x in servers]
            inp.update(num_vertices=a.vertices, num_edges=r["num_edges"], raw_keys=int(inp["raw_keys"] * fe),
                       num_features=a.features)
        r["estimate"] = estimate_build_memory(servers=servers, ranks=r["P"], **inp).to_dict()


def _split(values, P, servers=2):
    """(max over the writer ranks s % P, max over the other ranks or None)."""
    writers = {s % P for s in range(servers)}
    w = max(v for r, v in enumerate(values) if r in writers)
    o = [v for r, v in enumerate(values) if r not in writers]
    return w, (max(o) if o else None)


def table(records) -> str:
    gib = 2.0 ** 30
    fmt = lambda x: "-" if x is None else f"{x / gib:.2f}"  # noqa: E731
    lines = ["| P | preload | build | wall (s) | CPU s per rank: load / partition / halos+write / commit (max over "
             "ranks) | total CPU s (all ranks) | peak RSS per phase (GiB, max over ranks) | peak RSS (GiB): writer "
             "ranks / others | estimate (GiB): writer / others | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if "ranks" not in r:
            lines.append(f"| {r['P']} | {r['preload']} | {'whole' if r['whole_graph'] else 'sliced'} | "
                         f"{r['wall_s']:.0f} | failed: {r.get('error', '')[:80]} | | | | | |")
            continue
        cpu = [max(x[p]["cpu_s"] for x in r["ranks"]) for p in PHASES]
        rss = [max(x[p]["peak_rss"] for x in r["ranks"]) / gib for p in PHASES]
        total = sum(x[p]["cpu_s"] for x in r["ranks"] for p in PHASES)
        per_rank = [max(x[p]["peak_rss"] for p in PHASES) for x in r["ranks"]]
        w, o = _split(per_rank, r["P"])
        est = r.get("estimate")
        ew, eo = _split(est["per_rank"], r["P"]) if est else (None, None)
        lines.append(f"| {r['P']} | {r['preload']} | {'whole' if r['whole_graph'] else 'sliced'} | {r['wall_s']:.0f} | "
                     + " / ".join(f"{c:.1f}" for c in cpu) + f" | {total:.0f} | "
                     + " / ".join(f"{x:.2f}" for x in rss) + f" | {fmt(w)} / {fmt(o)} | {fmt(ew)} / {fmt(eo)}"
                     + f" | {r['loadavg_start']:.1f} / {r['loadavg_end']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vertices", type=int, default=2_450_000)
    p.add_argument("--features", type=int, default=100)
    p.add_argument("--avg-degree", type=float, default=25.0)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--hops", type=int, default=3, help="full preload hops")
    p.add_argument("--partitioner", default="parmetis")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--preload", nargs="+", default=["full", "eas"])
    p.add_argument("--whole-graph", type=int, nargs="*", default=[],
                   help="also run the pre-issue-17 build (every rank loads the whole graph) at these P")
    p.add_argument("--verify", action="store_true", help="run `preprocess verify` on every set")
    p.add_argument("--keep", action="store_true", help="keep the shard sets (default: removed after each run)")
    p.add_argument("--min-available-gib", type=float, default=3.0)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--work", default=os.path.join(REPO, "bench-out", "build-scaling"))
    p.add_argument("--json", default=None)
    p.add_argument("--estimate", action="store_true",
                   help="add `preprocess plan`'s estimated peak per rank to every record (after the builds)")
    p.add_argument("--plan-json", default=None,
                   help="with --estimate: the plan's JSON (reused when it exists, else written there)")
    p.add_argument("--scale-plan", action="store_true",
                   help="with --estimate --plan-json: the plan is of a smaller graph; scale its rows and edges")
    p.add_argument("--from-json", nargs="+", default=None,
                   help="skip the builds: read the records of earlier runs (e.g. to add --estimate, or to "
                        "join runs of some P each)")
    p.add_argument("--estimate-only", type=int, default=None, metavar="EDGES",
                   help="build nothing: print the estimate (--plan-json --scale-plan) for a graph of --vertices "
                        "vertices and EDGES directed edges at each --ranks and --preload (e.g. the 12M graph)")
    p.add_argument("--md", default=None)
    a = p.parse_args(argv)
    os.makedirs(a.work, exist_ok=True)
    records = []
    if a.estimate_only is not None:
        records = [{"P": P, "preload": pl, "whole_graph": False, "num_edges": a.estimate_only, "ranks": []}
                   for pl in a.preload for P in a.ranks]
        add_estimates(a, records)
        for r in records:
            per = r["estimate"]["per_rank"]
            print(f"{a.vertices} vertices, {a.estimate_only} edges, {r['preload']}, P = {r['P']}: peak per rank "
                  f"{max(per) / 2 ** 30:.2f} GiB (min {min(per) / 2 ** 30:.2f}), "
                  f"all ranks {sum(per) / 2 ** 30:.1f} GiB")
        return 0
    for path in a.from_json or []:
        with open(path) as f:
            records += json.load(f)["records"]
    for preload in ([] if a.from_json else a.preload):
        for P in a.ranks:
            for whole in ([True] if P in a.whole_graph else []) + [False]:
                rec = run_one(a, P, preload, whole)
                records.append(rec)
                print(json.dumps({k: v for k, v in rec.items() if k not in ("ranks", "log", "files")}), flush=True)
                if a.json:
                    with open(a.json, "w") as f:
                        json.dump({"argv": sys.argv[1:], "records": records}, f, indent=1)
    if a.estimate:
        add_estimates(a, records)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"argv": sys.argv[1:], "records": records}, f, indent=1)
    md = table(records)
    print(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

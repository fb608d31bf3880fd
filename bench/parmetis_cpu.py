"""Where the distributed build's partition-phase CPU goes: every ParMETIS call timed per rank (issue 17;
not a test).

For each P the driver runs one `mpirun -n P python bench/parmetis_cpu.py --worker DIR -- <build args>`:
the worker wraps partition.parmetis_part_kway (the servers' call and each server's GPU split) with
getrusage (the process and its main thread, so helper threads would show as the difference; voluntary
and involuntary context switches) and then runs `python -m preprocess build` unchanged.  --barrier
puts a sleeping barrier (Group.idle_barrier) before each call, so a call's CPU is its own and not a
rank's wait for the slowest to arrive.  --perf records each rank with `perf record --call-graph dwarf`
and attributes the samples taken inside the call (SCOTCH_dgraphMapCompute, the build's entry point into PT-Scotch, or its
ParMETIS_V3_PartKway layer) to what PT-Scotch is doing
(CATEGORIES): the shares, times the call's CPU seconds, say which part grows with P.
--cross prints, per P, the fraction of the graph's edges whose two ends lie in different ranks'
vtxdist slices (PT-Scotch's ghost edges), in the generator's ids and in the locality order the build's
ParMETIS calls see (preprocess/locality.py); --cross-only prints just that, building nothing.

  python bench/parmetis_cpu.py --vertices 300000 --features 8 --ranks 1 2 4 8 --barrier [--perf]
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import resource
import shutil
import subprocess
import sys
import time

from harness import REPO, mpi_env  # first: puts the repository on sys.path

# (label, test on the leaf frame f0 and its caller f1) in this order; the first that matches counts.
CATEGORIES = (
    ("ghost edges: dgraphGhst2 and its sort", lambda f0, f1: f0 == "_SCOTCHdgraphGhst2"
     or (f0 == "_SCOTCHintSort2asc1" and f1 == "_SCOTCHdgraphGhst2")),
    ("MPI progress / waiting (Open MPI, sched_yield)", lambda f0, f1: f0.startswith("MPI:")
     or any(k in f0 for k in ("sched", "finish_task_switch", "_raw_spin"))),
    ("band refinement (bdgraphBipartDf/Bd, bgraphBipartFm/Bd)", lambda f0, f1: f0 in (
        "_SCOTCHbdgraphBipartDf", "_SCOTCHbdgraphBipartBd", "_SCOTCHbgraphBipartFm", "_SCOTCHbgraphBipartBd")),
    ("coarsening, matching, halo, band, fold, gather", lambda f0, f1: f0.startswith((
        "_SCOTCHdgraphMatch", "_SCOTCHdgraphHalo", "_SCOTCHdgraphCoarsen", "_SCOTCHdgraphBand",
        "_SCOTCHdgraphFold", "_SCOTCHdgraphGather"))),
    ("Scotch's static (unnamed) functions: its sequential code", lambda f0, f1: f0 == "?:libptscotch"),
    ("other", lambda f0, f1: True),
)


def worker(out: str, argv: list) -> int:
    import preprocess.partition as partition
    from granndis_hpc.cluster import as_group

    orig, calls = partition.parmetis_part_kway, []

    def usage(who):
        r = resource.getrusage(who)
        return r.ru_utime + r.ru_stime, r.ru_nvcsw, r.ru_nivcsw

    def timed(pm, comm, vtxdist, xadj, adjncy, *rest, **kw):
        if os.environ.get("PARMETIS_CPU_BARRIER") == "1":
            as_group(comm).idle_barrier()
        s0, t0, w0 = usage(resource.RUSAGE_SELF), usage(resource.RUSAGE_THREAD), time.perf_counter()
        result = orig(pm, comm, vtxdist, xadj, adjncy, *rest, **kw)
        w1, s1, t1 = time.perf_counter(), usage(resource.RUSAGE_SELF), usage(resource.RUSAGE_THREAD)
        calls.append({"rows": int(xadj.shape[0] - 1), "adjacency": int(adjncy.shape[0]), "wall_s": w1 - w0,
                      "cpu_s": s1[0] - s0[0], "main_thread_cpu_s": t1[0] - t0[0], "voluntary_switches": s1[1] - s0[1],
                      "involuntary_switches": s1[2] - s0[2], "threads": len(os.listdir("/proc/self/task"))})
        return result

    partition.parmetis_part_kway = timed
    from preprocess.__main__ import main

    rc = main(argv)
    r = resource.getrusage(resource.RUSAGE_SELF)
    g = as_group(None)
    with open(os.path.join(out, f"rank{g.rank}.json"), "w") as f:
        json.dump({"rank": g.rank, "size": g.size, "calls": calls, "process_cpu_s": r.ru_utime + r.ru_stime}, f)
    return rc


def _frame(line: str) -> str:
    """A perf-script stack line as a name; unnamed frames by their library, Open MPI's marked MPI:."""
    parts = line.split()
    name, dso = (parts[1].split("+")[0] if len(parts) > 1 else ""), parts[-1]
    if any(k in dso for k in ("mca_", "libopen-pal", "libmpi", "libopen-rte")):
        return "MPI:" + name
    if name == "[unknown]":
        return "?:" + os.path.basename(dso.strip("()")).split("-")[0].split(".")[0]
    return name


def attribute(perf_files: list) -> collections.Counter:
    counts = collections.Counter()
    for path in perf_files:
        text = subprocess.run(["perf", "script", "-i", path], capture_output=True, text=True).stdout
        for sample in text.split("\n\n"):
            frames = [_frame(x) for x in sample.split("\n")[1:] if x.strip()]
            # the call's entry point: PT-Scotch's own API since session 8, its ParMETIS layer before
            if not frames or not any("SCOTCH_dgraphMapCompute" in f or "ParMETIS_V3_PartKway" in f for f in frames):
                continue
            f0, f1 = frames[0], (frames[1] if len(frames) > 1 else "")
            counts["(in the call)"] += 1
            counts[next(label for label, test in CATEGORIES if test(f0, f1))] += 1
    return counts


def cross_fractions(a, ranks) -> dict:
    """{"ids": {P: f}, "locality_order": {P: f}}: the fraction of the graph's edges whose ends lie in
    different ranks' vtxdist slices, in the generator's ids and in preprocess/locality.py's order (the
    ids every ParMETIS call with P >= 2 sees; the order is the same for any P, so one process makes it)."""
    from granndis_hpc.cluster.group import self_group
    from granndis_hpc.graph.csr import owner_of, row_of_edges
    import preprocess.locality as locality
    from preprocess.partition import vtxdist_for
    from preprocess.sliced import load_slice
    from preprocess.sources import sliced_source

    import numpy as np

    part = load_slice(None, sliced_source("synthetic", generator="local", vertices=a.vertices, features=1,
                                          avg_degree=a.avg_degree, seed=0))
    n = part.num_vertices
    rows, cols = row_of_edges(part.indptr), part.indices.astype(np.int64)
    # load_slice symmetrises and drops self loops: the rows are ParMETIS' adjacency as they are
    if a.region_vertices:
        locality.REGION_VERTICES = a.region_vertices
    new_of_old = locality.locality_order(self_group(), np.array([0, n], dtype=np.int64), part.indptr, cols, n)
    out = {"ids": {}, "locality_order": {}}
    for P in ranks:
        d = vtxdist_for(n, P)
        out["ids"][P] = float(np.mean(owner_of(d, rows) != owner_of(d, cols)))
        out["locality_order"][P] = float(np.mean(owner_of(d, new_of_old[rows]) != owner_of(d, new_of_old[cols])))
    return out


def run_one(a, P) -> dict:
    d = os.path.join(a.work, f"P{P}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    build = ["build", "--source", "synthetic", "--generator", "local", "--vertices", str(a.vertices), "--features",
             str(a.features), "--avg-degree", str(a.avg_degree), "--seed", "0", "--servers", "2", "--gpus-per-server",
             "2", "--layers", "3", "--preload", "full", "--hops", "3", "--partitioner", "parmetis",
             "--out", os.path.join(d, "out")]
    me = [sys.executable, os.path.abspath(__file__), "--worker", d, "--"]
    if a.perf:  # one perf file per rank (the shell expands the rank's variable)
        inner = ("exec perf record -q -F 100 --call-graph dwarf,8192 -o " + d + "/perf.$OMPI_COMM_WORLD_RANK.data "
                 '"$@"')
        cmd = ["mpirun", "-n", str(P), "bash", "-c", inner, "x", *me, *build]
    else:
        cmd = ["mpirun", "-n", str(P), *me, *build]
    env = mpi_env(PARMETIS_CPU_BARRIER="1" if a.barrier else "0")
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=a.timeout)
    rec = {"P": P, "wall_s": time.perf_counter() - t0, "rc": r.returncode, "loadavg_start": load0,
           "loadavg_end": os.getloadavg()[0], "perf": a.perf, "barrier": a.barrier}
    if r.returncode != 0:
        rec["error"] = r.stderr[-2000:]
        return rec
    ranks = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(d, "rank*.json")),
                                                key=lambda f: int(os.path.basename(f)[4:-5]))]
    rec["process_cpu_s"] = sum(x["process_cpu_s"] for x in ranks)
    rec["calls"] = [{"rows_per_rank": [x["calls"][i]["rows"] for x in ranks],
                     "cpu_s_per_rank": [x["calls"][i]["cpu_s"] for x in ranks],
                     "main_thread_cpu_s": sum(x["calls"][i]["main_thread_cpu_s"] for x in ranks),
                     "cpu_s": sum(x["calls"][i]["cpu_s"] for x in ranks),
                     "wall_s": max(x["calls"][i]["wall_s"] for x in ranks),
                     "involuntary_switches": sum(x["calls"][i]["involuntary_switches"] for x in ranks),
                     "threads": max(x["calls"][i]["threads"] for x in ranks)} for i in range(len(ranks[0]["calls"]))]
    with open(os.path.join(d, "out", "manifest.json")) as f:
        rec["partition_digest"] = json.load(f)["partition_digest"]
    if a.perf:
        counts = attribute(sorted(glob.glob(os.path.join(d, "perf.*.data"))))
        inside = max(counts.pop("(in the call)", 0), 1)
        total = sum(c["cpu_s"] for c in rec["calls"])
        rec["attribution"] = {label: {"share": counts[label] / inside, "cpu_s": total * counts[label] / inside}
                              for label, _ in CATEGORIES}
    if not a.keep:
        shutil.rmtree(d, ignore_errors=True)
    return rec


def report(records, cross) -> str:
    lines = ["| P | ParMETIS CPU s per call (servers / GPU split 0 / 1), all ranks | sum | wall s per call | "
             "vs P = 1 | build CPU s | edges across slices: ids / locality order | load avg start / end | partition digest |",
             "|---|---|---|---|---|---|---|---|---|"]

    def across(P, order):
        return cross.get(order, {}).get(P, 0.0 if P == 1 else float("nan"))
    base = None
    for r in records:
        if "calls" not in r:
            lines.append(f"| {r['P']} | failed: {r.get('error', '')[-200:]!r} |")
            continue
        s = sum(c["cpu_s"] for c in r["calls"])
        base = base if base is not None else (s if r["P"] == 1 else None)
        lines.append(f"| {r['P']} | {' / '.join('%.2f' % c['cpu_s'] for c in r['calls'])} | {s:.2f} | "
                     f"{' / '.join('%.2f' % c['wall_s'] for c in r['calls'])} | "
                     f"{'-' if base is None else f'{s / base:.2f}x'} | {r['process_cpu_s']:.1f} | "
                     f"{across(r['P'], 'ids'):.3f} / {across(r['P'], 'locality_order'):.3f} | {r['loadavg_start']:.1f} / {r['loadavg_end']:.1f} | "
                     f"{r['partition_digest'][:12]} |")
    if any("attribution" in r for r in records):
        labels = [label for label, _ in CATEGORIES]
        lines += ["", "| P | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
        for r in records:
            if "attribution" in r:
                lines.append(f"| {r['P']} | " + " | ".join(
                    f"{100 * r['attribution'][x]['share']:.0f} % ({r['attribution'][x]['cpu_s']:.2f} s)" for x in labels) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker(argv[1], argv[3:])  # --worker DIR -- build args
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vertices", type=int, default=300_000)
    p.add_argument("--features", type=int, default=8, help="the partition never reads them (spilled)")
    p.add_argument("--avg-degree", type=float, default=25.0)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--barrier", action="store_true", help="a sleeping barrier before each call")
    p.add_argument("--perf", action="store_true", help="attribute each call's samples (perf record, dwarf)")
    p.add_argument("--cross", action="store_true", help="print the fraction of edges across the ranks' slices")
    p.add_argument("--cross-only", action="store_true", help="only the --cross fractions, no build")
    p.add_argument("--region-vertices", type=int, default=None,
                   help="--cross: one BFS seed per this many vertices (default preprocess/locality.REGION_VERTICES)")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--work", default=os.path.join(REPO, "bench-out", "parmetis-cpu"))
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.perf and shutil.which("perf") is None:
        p.error("--perf needs perf (linux-perf) on PATH")
    if a.cross_only:
        print(json.dumps(cross_fractions(a, [P for P in a.ranks if P > 1]), indent=1))
        return 0
    records = []
    for P in a.ranks:
        records.append(run_one(a, P))
        print(json.dumps({k: v for k, v in records[-1].items() if k != "error"}), flush=True)
    cross = cross_fractions(a, [P for P in a.ranks if P > 1]) if a.cross else {}
    print(report(records, cross))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "records": records, "edges_across_slices": cross}, f, indent=1)
    return 0 if all(r["rc"] == 0 for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())

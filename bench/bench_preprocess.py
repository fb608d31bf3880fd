"""Benchmark of `granndis preprocess build`: wall time and peak RSS per rank (not a test).

For each configuration the driver launches `mpirun -n RANKS python bench/bench_preprocess.py --worker ...`
(a fresh job per configuration, so peak RSS is that build's), parses the per-phase lines rank 0 prints,
and appends one JSON record per configuration to --out (JSON lines) and a Markdown table to stdout.

  python bench/bench_preprocess.py --vertices 100000 1000000 --out bench-out/bench-preprocess.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from harness import REPO, mpi_env

PHASE = re.compile(r"\[preprocess\] (\S+)\s+([0-9.]+) s")


def worker(argv) -> int:
    """Run one build in this MPI job; rank 0 prints every rank's peak RSS as one JSON line."""
    from mpi4py import MPI

    from granndis_hpc.preprocess.__main__ import main

    t0 = time.perf_counter()
    rc = main(argv)
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    # Linux reports ru_maxrss in KiB.  CPU seconds (user + system) say what the wall time would be on
    # an idle machine with a core per rank, whatever the load was during the run.
    mine = {"peak_rss_mib": ru.ru_maxrss / 1024.0, "cpu_s": ru.ru_utime + ru.ru_stime}
    every = MPI.COMM_WORLD.gather(mine, root=0)
    if MPI.COMM_WORLD.rank == 0:
        print("BENCH " + json.dumps({"rc": rc, "build_s": wall, "peak_rss_mib": [r["peak_rss_mib"] for r in every],
                                     "cpu_s": [round(r["cpu_s"], 1) for r in every]}), flush=True)
    return rc


def run_config(vertices, preload, partitioner, ranks, workdir, timeout, generator="sbm", keep=False):
    """One build in a fresh `mpirun` job; returns its record.  keep: leave the shard set in workdir
    (bench_scale.py trains on it) instead of deleting it."""
    out = os.path.join(workdir, f"syn{vertices}-{generator}-{preload}-{partitioner}")
    args = ["build", "--source", "synthetic", "--generator", generator, "--vertices", str(vertices), "--seed", "0",
            "--servers", "2", "--gpus-per-server", "2", "--layers", "3", "--preload", preload,
            "--partitioner", partitioner, "--out", out, "--overwrite"]
    args += ["--hops", "3"] if preload == "full" else ["--hops", "1", "--eas-fanout", "15"]
    cmd = ["mpirun", "-n", str(ranks), sys.executable, os.path.abspath(__file__), "--worker", *args]
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=REPO, env=mpi_env(threads=False), capture_output=True, text=True,
                         timeout=timeout)
    wall = time.perf_counter() - t0
    record = {"vertices": vertices, "generator": generator, "preload": preload, "partitioner": partitioner,
              "ranks": ranks, "servers": 2, "gpus_per_server": 2, "wall_s": round(wall, 2),
              "loadavg_start": load_start, "loadavg_end": os.getloadavg()[0], "out": out,
              "command": f"mpirun -n {ranks} granndis preprocess " + " ".join(args),
              "phase_log": [line for line in res.stdout.splitlines() if line.startswith("[preprocess]")]}
    for line in res.stdout.splitlines():
        m = PHASE.search(line)
        if m:
            record[f"{m.group(1)}_s"] = float(m.group(2))
        if line.startswith("BENCH "):
            record.update(json.loads(line[6:]))
    if res.returncode != 0:
        record["error"] = res.stderr[-2000:]
    else:
        with open(os.path.join(out, "manifest.json")) as f:
            man = json.load(f)
        record["edges"] = man["dataset"]["num_edges"]
        record["edge_cut_fraction"] = man["partitioner"]["edge_cut_fraction"]
        record["replication"] = man["stats"]["replication_factor"]
        record["shard_mib"] = round(sum(v["bytes"] for v in man["files"].values()) / 2**20, 1)
    if not keep or res.returncode != 0:
        shutil.rmtree(out, ignore_errors=True)
    return record


def table(records) -> str:
    head = ("| vertices | edges | preload | partitioner | wall (s) | load | partition | halos+write | "
            "peak RSS/rank (MiB) | edge cut | rows/inner | shards (MiB) |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['vertices']} | | {r['preload']} | {r['partitioner']} | failed | | | | | | | |")
            continue
        lines.append(
            f"| {r['vertices']:,} | {r['edges']:,} | {r['preload']} | {r['partitioner']} | {r['wall_s']:.1f} | "
            f"{r.get('load_s', 0):.1f} | {r.get('partition_s', 0):.1f} | {r.get('halos+write_s', 0):.1f} | "
            f"{' / '.join(f'{p:.0f}' for p in r['peak_rss_mib'])} | {100 * r['edge_cut_fraction']:.1f}% | "
            f"{r['replication']:.2f} | {r['shard_mib']:.0f} |")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vertices", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--preload", nargs="+", default=["full", "eas"])
    p.add_argument("--partitioner", nargs="+", default=["parmetis", "metis"])
    p.add_argument("--generator", choices=("sbm", "local"), default="sbm", help="synthetic graph (README)")
    p.add_argument("--keep", action="store_true", help="keep the shard sets in --workdir")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--timeout", type=int, default=3600, help="seconds per configuration")
    p.add_argument("--workdir", default=None,
                   help="where shard sets are written (deleted after each run unless --keep)")
    p.add_argument("--out", default=None, help="append JSON records here")
    args = p.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-preprocess-")
    records = []
    for n in args.vertices:
        for preload in args.preload:
            for part in args.partitioner:
                rec = run_config(n, preload, part, args.ranks, workdir, args.timeout, args.generator, args.keep)
                records.append(rec)
                print(json.dumps(rec), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(rec) + "\n")
    print(table(records))
    return 0 if all("error" not in r for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())

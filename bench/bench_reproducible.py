"""Are builds reproducible?  Repeated builds of Cora with every partitioner path (not a test).

1. Builds: each partitioner and rank count is built --repeats times with the same seed, each build its
   own `mpirun ... granndis preprocess build`; the page counts the distinct partition digests and the
   distinct sets of server-file sha256 (1 = reproducible).
2. Cause: PT-Scotch's ParMETIS_V3_PartKway called with the fix turned off (no one-thread scope, no
   seeding of Scotch's generator), with Scotch's default thread count, 1 thread and 2 threads; each job
   calls it --calls times, --repeats jobs per row; the page counts distinct partitions among the first
   calls of the jobs (across processes) and among all calls (within a process too); and whether the
   seed in options[] changes the single-threaded result.
3. Seeds: the fixed PT-Scotch path with seeds 0..--seeds-1 in one job: how many distinct partitions.

  python bench/bench_reproducible.py --out bench-out/reproducible.md
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import tempfile

from harness import ENV, REPO, run, write_page

CORA = ["--source", "planetoid", "--name", "cora", "--root", os.path.join(REPO, "tests", "data", "planetoid")]


def worker(raw: bool, calls: int, nparts: int, seeds: list) -> None:
    """One MPI job: partition Cora `calls` times per seed; rank 0 prints one JSON line per call."""
    import numpy as np
    from mpi4py import MPI

    from granndis_hpc.preprocess.partition import parmetis
    from granndis_hpc.preprocess.partition.twolevel import partition_servers
    from granndis_hpc.preprocess.sources import load

    if raw:  # the behaviour before the fix: the library as it comes
        parmetis._scotch_reproducible = lambda pm, seed: contextlib.nullcontext()
    graph = load("planetoid", name="cora", root=os.path.join(REPO, "tests", "data", "planetoid"))
    for seed in seeds:
        for call in range(calls):
            parts = partition_servers(MPI.COMM_WORLD, graph, nparts, "parmetis", seed).parts
            if MPI.COMM_WORLD.rank == 0:
                print("BENCH " + json.dumps({"seed": seed, "call": call, "sizes": np.bincount(parts).tolist(),
                                             "sha": hashlib.sha256(parts.tobytes()).hexdigest()[:12]}), flush=True)


def run_worker(ranks, extra_env, args, log, raw=True, seeds=(0,), calls=None):
    cmd = ["mpirun", "-n", str(ranks), sys.executable, os.path.abspath(__file__), "--worker",
           "--calls", str(calls or args.calls), "--seed-list", *map(str, seeds)] + (["--raw"] if raw else [])
    env = dict(ENV, **extra_env)
    log.append(" ".join(f"{k}={v}" for k, v in extra_env.items()) + (" " if extra_env else "") + " ".join(cmd))
    res = run(cmd, None, env=env, capture=True)
    return [json.loads(line[6:]) for line in res.stdout.splitlines() if line.startswith("BENCH ")]


def builds(args, workdir, log):
    rows = ["## 1. Repeated builds (same seed, one mpirun per build)", "",
            "| partitioner | ranks | S x G | builds | distinct partition digests | distinct server-file sets | "
            "GPU inner counts (first build) | digest (first 16) |", "|---|---:|---|---:|---:|---:|---|---|"]
    for partitioner, ranks in (("parmetis", 2), ("parmetis", 4), ("metis", 1), ("metis", 2), ("random", 2)):
        digests, file_sets, inner = [], [], None
        for r in range(args.repeats):
            out = os.path.join(workdir, f"{partitioner}-{ranks}-{r}")
            run(["mpirun", "-n", str(ranks), sys.executable, "-m", "granndis_hpc.preprocess", "build", *CORA,
                 "--servers", "2",
                 "--gpus-per-server", "2", "--layers", "2", "--partitioner", partitioner, "--seed", "0",
                 "--out", out], log)
            with open(os.path.join(out, "manifest.json")) as f:
                m = json.load(f)
            digests.append(m["partition_digest"])
            file_sets.append(tuple(v["sha256"] for _, v in sorted(m["files"].items())))
            inner = inner or [s["inner_per_gpu"] for s in m["stats"]["servers"]]
        rows.append(f"| {partitioner} | {ranks} | 2 x 2 | {args.repeats} | {len(set(digests))} | {len(set(file_sets))} "
                    f"| {inner} | `{digests[0][:16]}` |")
    return rows + [""]


def cause(args, log):
    rows = ["## 2. PT-Scotch as it comes (fix turned off), Cora into 2 parts on 2 ranks", "",
            f"{args.repeats} jobs per row, {args.calls} calls per job, seed 0 in options[].", "",
            "| SCOTCH_PTHREAD_NUMBER | distinct among first calls (across jobs) | distinct among all calls "
            "| part sizes seen |",
            "|---|---:|---:|---|"]
    for threads in (None, "1", "2"):
        env = {} if threads is None else {"SCOTCH_PTHREAD_NUMBER": threads}
        results = [run_worker(2, env, args, log) for _ in range(args.repeats)]
        first = {job[0]["sha"] for job in results}
        every = {rec["sha"] for job in results for rec in job}
        sizes = sorted({tuple(rec["sizes"]) for job in results for rec in job})
        rows.append(f"| {threads or 'unset (Scotch default: all cores)'} | {len(first)} | {len(every)} | "
                    f"{', '.join(map(str, [list(s) for s in sizes[:4]]))}{' ...' if len(sizes) > 4 else ''} |")
    # does PT-Scotch's layer read the seed in options[]?  One thread, one call per job, other seeds
    other = [run_worker(2, {"SCOTCH_PTHREAD_NUMBER": "1"}, args, log, seeds=(seed,), calls=1)[0]
             for seed in (0, 5, 1234)]
    rows.append(f"| 1, options[] seed 0 / 5 / 1234 (one job each, first call) | {len({r['sha'] for r in other})} "
                f"| - | {other[0]['sizes']} |")
    fixed = [run_worker(2, {}, args, log, raw=False) for _ in range(args.repeats)]
    every = {rec["sha"] for job in fixed for rec in job}
    rows.append(f"| fixed path (1 thread for the call, generator seeded and reset) | "
                f"{len({job[0]['sha'] for job in fixed})} | {len(every)} | {fixed[0][0]['sizes']} |")
    return rows + [""]


def seeds(args, log):
    rows = ["## 3. Seeds on the fixed PT-Scotch path (Cora, 1 job per rank count)", "",
            "| ranks | parts | seeds | distinct partitions | seeds grouped by partition |", "|---:|---:|---:|---:|---|"]
    for ranks in (2, 4):
        recs = run_worker(ranks, {}, args, log, raw=False, seeds=range(args.seeds), calls=1)
        groups = {}
        for rec in recs:
            groups.setdefault(rec["sha"], []).append(rec["seed"])
        rows.append(f"| {ranks} | 2 | {args.seeds} | {len(groups)} | {sorted(groups.values())} |")
    return rows + [""]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--calls", type=int, default=2)
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--out", default=os.path.join(REPO, "docs", "bench-reproducible.md"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seed-list", type=int, nargs="*", default=[0], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.raw, args.calls, 2, args.seed_list)
        return 0
    log = []
    with tempfile.TemporaryDirectory(prefix="bench-repro-") as workdir:
        lines = ["# Reproducible builds: repeated builds of Cora", "",
                 "Written by `bench/bench_reproducible.py`; summary in `docs/performance/README.md` "
                 "(\"Reproducible partitions\").", ""]
        lines += builds(args, workdir, log) + cause(args, log) + seeds(args, log)
    write_page(args.out, lines, "bench/bench_reproducible.py", argv, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())

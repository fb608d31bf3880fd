"""Accuracy with half-width halos: --halo-dtype bfloat16 against float32 on the published GCN recipe
(a benchmark, not a test; writes docs/performance/halo-dtype.md).

    python bench/bench_halo_dtype.py --seeds 5 --out bench-out/halo-dtype.md

Kipf & Welling's recipe as bench/bench_accuracy.py runs it (2-layer GCN, hidden 16, row-normalised
features, input dropout, weight decay on the first layer, 200 epochs, best-validation selection), on
Cora and CiteSeer, 2 servers x 2 ranks, in fb (halo every layer) and flx with k = 1 < L = 2 (layer 0 on
the preload, layer 1 with the world exchange): the layers whose halo rows (and gradients) travel at
half width.  Layer 0's halo is the static input, exchanged once at set-up in float32, and evaluation
always exchanges float32, so only training's layer-1 halo is rounded.  The target: every
5-seed mean within 0.5 point of float32's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

from bench_accuracy import COMMON, DATASETS, SETTINGS, build_sets
from harness import REPO, run, write_page

LOOPS = {"fb": dict(mode="fb"), "flx-k1": dict(mode="flx", preloaded_layers=1)}
DTYPES = ("float32", "bfloat16")
TARGET_POINTS = 0.5


def engine_run(shards, loop, seed, halo_dtype, epochs):
    from granndis_hpc.options.train import TrainConfig
    from granndis_hpc.engine.trainer import Trainer

    opts = {**COMMON, **SETTINGS["recipe"]["train"], **LOOPS[loop], "epochs": epochs, "halo_dtype": halo_dtype}
    trainer = Trainer(TrainConfig(shards=shards, seed=seed, ranks_per_server=2, quiet=True, **opts))
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    return {"best_val": summary["best_val"]["test"], "exact": summary["plan"]["exact"]}


def _worker(args):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    base = world.bcast(tempfile.mkdtemp(prefix="granndis-halo-dtype-") if world.rank == 0 else None)
    dirs = build_sets(base, args.datasets)
    # Seeds outermost and one JSON line per run, appended as it finishes: a sweep stopped early still
    # has every (dataset, loop, dtype) cell at the seeds it reached (`--from-results` renders it).
    for seed in range(args.first_seed, args.seeds):
        for name in args.datasets:
            for loop in args.loops:
                for dtype in DTYPES:  # side by side, seed by seed
                    r = engine_run(dirs[(name, "row")], loop, seed, dtype, args.epochs)
                    if world.rank == 0:
                        with open(args.worker, "a") as f:
                            f.write(json.dumps(dict(r, dataset=name, loop=loop, seed=seed, halo_dtype=dtype)) + "\n")
                        print(f"[halo-dtype] {name} {loop} seed {seed} {dtype}: test {r['best_val']:.4f}", flush=True)


def page(results, args):
    lines = ["# Half-width halos (`--halo-dtype bfloat16`): accuracy against float32", "", __doc__.split("\n\n")[2]
             .replace("\n", " "), "",
             f"{len({r['seed'] for r in results})} seeds, {args.epochs} epochs; test accuracy (%) of the "
             "best-validation epoch, mean ± std.", "",
             "| dataset | loop | float32 | bfloat16 | difference (points) | within 0.5 |", "|---|---|---|---|---:|---|"]
    for name in args.datasets:
        for loop in args.loops:
            stats = {}
            for dtype in DTYPES:
                v = [100 * r["best_val"] for r in results if (r["dataset"], r["loop"], r["halo_dtype"]) == (name, loop,
                                                                                                            dtype)]
                stats[dtype] = (statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0)
            diff = stats["bfloat16"][0] - stats["float32"][0]
            lines.append(f"| {name} | {loop} | {stats['float32'][0]:.2f} ± {stats['float32'][1]:.2f} | "
                         f"{stats['bfloat16'][0]:.2f} ± {stats['bfloat16'][1]:.2f} | {diff:+.2f} | "
                         f"{'yes' if abs(diff) <= TARGET_POINTS else 'NO'} |")
    inexact = sorted({r["exact"] for r in results if r["halo_dtype"] != "float32"})
    lines += ["", f"Every bfloat16 run's summary.json says plan.exact = {inexact} (float32 runs: exact).", ""]
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=COMMON["epochs"])
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    p.add_argument("--loops", nargs="+", default=list(LOOPS), choices=list(LOOPS))
    p.add_argument("--out", default=os.path.join(REPO, "docs", "accuracy-halo-dtype.md"))
    p.add_argument("--results", default=os.path.join(REPO, "bench-out", "halo-dtype.jsonl"),
                   help="JSON lines, one per run, appended as runs finish")
    p.add_argument("--from-results", action="store_true", help="no runs: render the page from --results")
    p.add_argument("--first-seed", type=int, default=0, help="continue a stopped sweep: start at this seed and "
                   "append to --results (with --datasets/--loops naming the cells still missing)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    results_file = os.path.abspath(args.results)
    cmd = ["mpirun", "-n", "4", sys.executable, os.path.abspath(__file__), "--worker", results_file, "--seeds",
           str(args.seeds), "--first-seed", str(args.first_seed), "--epochs", str(args.epochs), "--datasets",
           *args.datasets, "--loops", *args.loops]
    if not args.from_results:
        os.makedirs(os.path.dirname(results_file), exist_ok=True)
        if args.first_seed == 0:
            open(results_file, "w").close()
        run(cmd)
    with open(results_file) as f:
        results = [json.loads(line) for line in f if line.strip()]
    complete = {r["seed"] for r in results if all(
        any((q["seed"], q["dataset"], q["loop"], q["halo_dtype"]) == (r["seed"], d, lp, t) for q in results)
        for d in args.datasets for lp in args.loops for t in DTYPES)}
    results = [r for r in results if r["seed"] in complete]  # only seeds every cell reached
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(results, f, indent=1)
    shown = ["mpirun", "-n", "4", "python", "bench/bench_halo_dtype.py", "--worker", "RESULTS.json", *cmd[6:]]
    write_page(args.out, page(results, args), "bench/bench_halo_dtype.py", argv, [" ".join(shown)])
    return 0


if __name__ == "__main__":
    sys.exit(main())

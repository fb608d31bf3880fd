"""bf16 compute (`--precision bf16`) against float32 on the published GCN recipe: accuracy, epoch time
and memory side by side (a benchmark, not a test; writes docs/performance/precision.md).

    python bench/bench_precision.py --seeds 5 --out bench-out/precision.md --results bench-out/precision-runs.json

Kipf & Welling's recipe as bench/bench_accuracy.py runs it (2-layer GCN, hidden 16, row-normalised
features, input dropout 0.5, weight decay on the first layer, 200 epochs, best-validation selection),
on Cora and CiteSeer, 2 servers x 1 rank (the halo crosses servers every epoch; one rank a server
keeps the run within this benchmark's CPU budget), fb, in float32 and in bf16 (the layers under autocast,
float32 master weights, optimizer state and loss; engine/precision.py), seed by seed in one MPI job.
The target: every 5-seed mean within 0.5 point of float32's.  Beside accuracy: the median epoch time
(slowest rank, training only) averaged over the seeds; the bytes autograd saves for the backward (the
activations, exact); and the peak bytes one training epoch allocates above what it starts with (torch's
profiler on the CPU, memory_model/profile.py; the busiest rank), measured once per dataset and precision.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

from bench_accuracy import COMMON, DATASETS, SETTINGS, build_sets as build_planetoid_sets
from harness import REPO, run_workers, write_page

PRECISIONS = ("fp32", "bf16")
SERVERS, RANKS_PER_SERVER = 2, 1
TARGET_POINTS = 0.5


def engine_run(shards, seed, precision, epochs, measure_peak):
    """One training run (collective): best-validation test accuracy, the run's timing and memory."""
    from mpi4py import MPI

    from granndis_hpc.options.train import TrainConfig
    from granndis_hpc.engine.trainer import Trainer
    from granndis_hpc.memory_model.profile import measure_step_peak

    opts = {**COMMON, **SETTINGS["recipe"]["train"], "epochs": epochs}
    trainer = Trainer(TrainConfig(shards=shards, mode="fb", seed=seed, ranks_per_server=RANKS_PER_SERVER, quiet=True,
                                  precision=precision, **opts))
    try:
        summary = trainer.run()
        # One more epoch under the profiler, after the run (its result is not used).
        peak = measure_step_peak(trainer.train_epoch) if measure_peak else 0
        peak = MPI.COMM_WORLD.allreduce(peak, op=MPI.MAX)
    finally:
        trainer.close()
    return {"best_val": summary["best_val"]["test"], "exact": summary["plan"]["exact"],
            "precision_entry": summary["plan"].get("precision"), "epoch_time_s": summary["epoch_time_s"],
            "activation_bytes": summary["activation_memory_bytes"], "step_peak_bytes": peak,
            "halo_bytes": summary["bytes_per_epoch"]["intra_halo"] + summary["bytes_per_epoch"]["inter_halo"]}


def build_sets(base, datasets):
    """One shard set per dataset (row-normalised features) for SERVERS x RANKS_PER_SERVER."""
    built = build_planetoid_sets(base, datasets, ("row",), SERVERS, RANKS_PER_SERVER, "bench_precision")
    return {name: out for (name, _), out in built.items()}


def _worker(args):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    base = world.bcast(tempfile.mkdtemp(prefix="granndis-precision-") if world.rank == 0 else None)
    dirs = build_sets(base, args.datasets)
    results = []
    for seed in range(args.seeds):
        for name in args.datasets:
            for precision in PRECISIONS:  # side by side, seed by seed: the same load on both
                r = engine_run(dirs[name], seed, precision, args.epochs, measure_peak=seed == 0)
                results.append(dict(r, dataset=name, seed=seed, precision=precision))
                if world.rank == 0:  # one line per run as it finishes: a stopped sweep keeps what it ran
                    with open(args.progress, "a") as f:
                        f.write(json.dumps(results[-1]) + "\n")
                    print(f"[precision] {name} seed {seed} {precision}: test {r['best_val']:.4f} "
                          f"epoch {r['epoch_time_s'] * 1e3:.1f} ms", flush=True)
    if world.rank == 0:
        with open(args.worker, "w") as f:
            json.dump(results, f)
        shutil.rmtree(base, ignore_errors=True)  # the shard sets built for this job


def _stats(values):
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def page(results, args, machine):
    seeds = len({r["seed"] for r in results})
    intro = __doc__.split("\n\n")[2].replace("\n", " ")
    lines = ["# bf16 compute (`--precision bf16`) against float32", "", intro, "",
             f"{seeds} seeds, {args.epochs} epochs; test accuracy (%) of the best-validation epoch, mean ± std.", "",
             "| dataset | float32 | bf16 | difference (points) | within 0.5 |", "|---|---|---|---:|---|"]
    cells = {}
    for name in args.datasets:
        for precision in PRECISIONS:
            cells[name, precision] = [r for r in results if (r["dataset"], r["precision"]) == (name, precision)]
        acc = {p: _stats([100 * r["best_val"] for r in cells[name, p]]) for p in PRECISIONS}
        diff = acc["bf16"][0] - acc["fp32"][0]
        lines.append(f"| {name} | {acc['fp32'][0]:.2f} ± {acc['fp32'][1]:.2f} | {acc['bf16'][0]:.2f} ± "
                     f"{acc['bf16'][1]:.2f} | {diff:+.2f} | {'yes' if abs(diff) <= TARGET_POINTS else 'NO'} |")
    lines += ["", "Time and memory per rank, float32 / bf16 (epoch time: mean over the seeds of each run's median "
              "epoch; memory: seed 0):", "",
              "| dataset | epoch time (ms) | bf16 / fp32 | activations saved (KiB) | step peak (KiB) | halo bytes per "
              "epoch |",
              "|---|---|---:|---|---|---|"]
    for name in args.datasets:
        t = {p: statistics.mean(r["epoch_time_s"] for r in cells[name, p]) for p in PRECISIONS}
        first = {p: next(r for r in cells[name, p] if r["seed"] == 0) for p in PRECISIONS}

        def pair(key, scale=1024):
            return " / ".join(f"{first[p][key] / scale:,.0f}" for p in PRECISIONS)
        lines.append(f"| {name} | {t['fp32'] * 1e3:.1f} / {t['bf16'] * 1e3:.1f} | {t['bf16'] / t['fp32']:.2f} | "
                     f"{pair('activation_bytes')} | {pair('step_peak_bytes')} | {pair('halo_bytes', 1)} |")
    inexact = sorted({r["exact"] for r in results if r["precision"] == "bf16"})
    lines += ["", f"Every bf16 run's summary.json says plan.exact = {inexact} (float32 runs: exact).  Every run's "
              f"record: `{os.path.relpath(os.path.abspath(args.results), REPO)}`.", "", f"Machine: {machine}.", ""]
    return lines


def _machine():
    import platform

    load = os.getloadavg()
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch CPU; 2 emulated servers "
            f"x 1 rank on it; load average {load[0]:.1f} at the end (the machine ran other jobs at the same time, "
            f"so the times are indicative only; bytes are exact)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=COMMON["epochs"])
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    p.add_argument("--out", default=os.path.join(REPO, "bench-out", "precision.md"))
    p.add_argument("--results", default=os.path.join(REPO, "bench-out", "precision-runs.json"),
                   help="every run's record (JSON)")
    p.add_argument("--progress", default=os.path.join(REPO, "bench-out", "precision-runs.jsonl"),
                   help="JSON lines, one per run, written as runs finish")
    p.add_argument("--from-progress", action="store_true",
                   help="no runs: write the page from --progress (the seeds every cell reached)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    worker_args = ["--seeds", str(args.seeds), "--epochs", str(args.epochs), "--datasets", *args.datasets,
                   "--progress", os.path.abspath(args.progress)]
    if args.from_progress:
        with open(args.progress) as f:
            results = [json.loads(line) for line in f if line.strip()]
        cells = len(args.datasets) * len(PRECISIONS)
        done = {s for s in {r["seed"] for r in results} if sum(r["seed"] == s for r in results) == cells}
        results = [r for r in results if r["seed"] in done]
    else:
        os.makedirs(os.path.dirname(os.path.abspath(args.progress)), exist_ok=True)
        open(args.progress, "w").close()
        results = run_workers(__file__, worker_args, ranks=SERVERS * RANKS_PER_SERVER)
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    with open(args.results, "w") as f:
        json.dump(results, f, indent=1)
    shown = ["mpirun", "-n", str(SERVERS * RANKS_PER_SERVER), "python", "bench/bench_precision.py", "--worker",
             "RESULTS.json", *worker_args[:-2]]
    write_page(args.out, page(results, args, _machine()), "bench/bench_precision.py", argv, [" ".join(shown)])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One rank's training epoch: granndis (default and --no-overlap) against PyG, a per-layer profile and a
roofline (not a test).

    .venv/bin/python bench/bench_single_rank.py --out bench-out/single-rank/single-rank.md

Builds two 1 x 1 shard sets of the synthetic graph (`preprocess build --source synthetic --vertices N
--layers L --preload full --servers 1 --gpus-per-server 1`): with the build's default locality blocks
(--row-block-rows) and with the rows in the generator's id order (--row-block-rows 0).  Then it trains,
in this one process (the MPI world is this process), the same model (--model sage, gcn or ressage:
ResSAGE+, 28 layers by default, with activation checkpointing; hidden --hidden, dropout --dropout, Adam,
--threads threads):

  default     granndis_hpc's Trainer, --mode flx with its defaults (overlap on)
  no-overlap  the same with --no-overlap
  torch-ops   the default with torch's sparse product and dropout (GRANNDIS_CPU_KERNELS=torch) instead of
              the C kernels of nn/cpu_kernels.c
  id-order    the default on the set in id order (what the row order alone gains)
  pyg-csr     PyG's SAGEConv / GCNConv(normalize=False) stack (bench/single_rank_pyg.py) over a torch.sparse
              CSR adj_t of the id-order set's graph, rows and labels (the dataset's own vertex order, as
              PyG trains on it), from the same initial weights

--epochs rounds, every implementation one epoch per round in a rotated order (a change of the machine's
load hits all of them alike); per-epoch time, median, min-max and the largest deviation from the median
after the second epoch.  Then one default epoch under torch.profiler (self time by op), its per-layer
forward and backward compute (the engine's layer clock), and a roofline (bench/single_rank_roofline.py):
per layer and op the bytes it must move and the flops it must do, bounded by max(bytes / bandwidth,
flops / peak) with the STREAM-like bandwidth and a large GEMM's FLOP/s measured in the same run, next
to the op's measured time alone on the same shapes.

--ranks R > 1 measures one server of R ranks instead: a 1 x R shard set, default against --no-overlap
alternating under `mpirun -n R` (no PyG, profile or roofline).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

import harness  # (a script's own folder is on sys.path)
import single_rank_pyg
import single_rank_roofline as rl

from granndis_hpc.preprocess.partition.row_blocks import DEFAULT_BLOCK_ROWS


def set_path(args, row_block_rows):
    return os.path.join(args.work, f"synthetic-{args.vertices}-L{args.layers}"
                        + (f"-G{args.ranks}" if args.ranks > 1 else "") + f"-rb{row_block_rows}")


def build_set(args, log, row_block_rows):
    out = set_path(args, row_block_rows)
    if not os.path.exists(os.path.join(out, "manifest.json")):
        harness.run([sys.executable, "-m", "granndis_hpc.preprocess", "build", "--source", "synthetic", "--vertices",
                     args.vertices, "--seed", "0", "--servers", "1", "--gpus-per-server", args.ranks, "--layers",
                     args.layers, "--preload", "full", "--row-block-rows", row_block_rows, "--out", out,
                     "--overwrite"], log, env=dict(os.environ))
    return out


MODEL_NAMES = {"sage": "SAGE", "gcn": "GCN", "ressage": "ResSAGE+ (activation checkpointing)"}


def make_trainer(shards, args, no_overlap):
    from granndis_hpc.options.train import TrainConfig
    from granndis_hpc.engine.trainer import Trainer

    return Trainer(TrainConfig(shards=shards, mode="flx", model=args.model, layers=args.layers, hidden=args.hidden,
                               dropout=args.dropout, no_overlap=no_overlap, ranks_per_server=args.ranks,
                               checkpoint_activations=args.model == "ressage", skip_checksums=True))


class Granndis:
    """One implementation: a trainer, and GRANNDIS_CPU_KERNELS while it runs (None: as it is set)."""

    def __init__(self, name, trainer, kernels=None):
        self.name, self.trainer, self.kernels, self.records = name, trainer, kernels, []

    def epoch(self):
        saved = os.environ.get("GRANNDIS_CPU_KERNELS")
        if self.kernels:  # read on every call (nn/cpu_kernels.py): this epoch's products and dropouts
            os.environ["GRANNDIS_CPU_KERNELS"] = self.kernels
        try:
            start = time.perf_counter()
            self.records.append(self.trainer.train_epoch())
            return time.perf_counter() - start
        finally:
            if saved is None:
                os.environ.pop("GRANNDIS_CPU_KERNELS", None)
            else:
                os.environ["GRANNDIS_CPU_KERNELS"] = saved


def alternate(impls, rounds):
    """{name: [epoch seconds]}: every implementation one epoch per round, in a rotated order."""
    times = {i.name: [] for i in impls}
    for r in range(rounds):
        k = r % len(impls)
        for impl in impls[k:] + impls[:k]:
            times[impl.name].append(impl.epoch())
        print(f"round {r}: " + ", ".join(f"{n} {t[-1]:.3f} s" for n, t in times.items()), flush=True)
    return times


def epoch_lines(times, rounds):
    """The epoch-time table and the default / no-overlap ratio."""
    ref = statistics.median(times["pyg-csr"]) if "pyg-csr" in times else None
    lines = ["## Epoch time", "", f"{rounds} rounds, every implementation one epoch per round in a rotated order.", "",
             "| implementation | median (s) | min-max (s) | largest deviation after epoch 2 | median / PyG |",
             "|---|---:|---:|---:|---:|"]
    for name, ts in times.items():
        med, lo, hi, dev = spread(ts)
        lines.append(f"| {name} | {med:.3f} | {lo:.3f}-{hi:.3f} | {100 * dev:.0f} % | "
                     + (f"{med / ref:.2f}x |" if ref else "|"))
    lines.append("")
    for other in ("no-overlap", "torch-ops", "id-order"):
        if other in times:
            d, n = statistics.median(times["default"]), statistics.median(times[other])
            lines.append(f"Default / {other}: {d / n:.3f}x by median; per round median "
                         f"{statistics.median(a / b for a, b in zip(times['default'], times[other])):.3f}x.")
    return lines + [""]


def server_worker(args):
    """The mpirun part of --ranks R > 1: default and --no-overlap alternating on the 1 x R set; rank 0
    writes the times to args.worker."""
    shards = set_path(args, args.row_block_rows)
    impls = [Granndis("default", make_trainer(shards, args, False)),
             Granndis("no-overlap", make_trainer(shards, args, True))]
    times = alternate(impls, args.epochs)
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        with open(args.worker, "w") as f:
            json.dump({"times": times}, f)
    for impl in impls:
        impl.trainer.close()
    return 0


def server_page(args, argv, log):
    """--ranks R > 1: one server of R ranks (mpirun -n R), default against --no-overlap only."""
    build_set(args, log, args.row_block_rows)
    load_before = os.getloadavg()
    worker_args = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("vertices", "model", "layers", "hidden",
                                                                           "dropout", "epochs",
                                                           "threads", "work", "ranks", "row_block_rows")]
    times = harness.run_workers(__file__, worker_args, ranks=args.ranks)["times"]
    log.append(f"mpirun -n {args.ranks} python bench/bench_single_rank.py --worker RESULTS.json "
               f"{' '.join(worker_args)}")
    lines = ["# One server's epoch: default against --no-overlap", "",
             f"1 x {args.ranks} shard set of the synthetic graph ({args.vertices:,} vertices, `--preload full`), "
             f"{args.ranks} ranks on one server (mpirun -n {args.ranks}), {args.layers}-layer "
             f"{MODEL_NAMES[args.model]}, "
             f"hidden {args.hidden}, dropout {args.dropout}, Adam; {args.threads} thread(s) a rank, {os.cpu_count()} "
             "cores. "
             f"Load average (1 min) {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after.", ""]
    harness.write_page(args.out, lines + epoch_lines(times, args.epochs), "bench/bench_single_rank.py", argv, log,
                       data={"times": times})
    return 0


def spread(ts, skip=2):
    """(median, min, max, largest |t - median| / median over epochs after the first `skip`)."""
    med = statistics.median(ts)
    late = ts[skip:] or ts
    return med, min(ts), max(ts), max(abs(t - med) for t in late) / med


def profile_epoch(impl, rows=14):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        impl.epoch()
    events = sorted(prof.key_averages(), key=lambda ev: -ev.self_cpu_time_total)[:rows]
    total = sum(ev.self_cpu_time_total for ev in prof.key_averages())
    return [(ev.key, ev.count, ev.self_cpu_time_total / 1e6, ev.self_cpu_time_total / max(total, 1))
            for ev in events], total / 1e6


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vertices", type=int, default=100_000)
    p.add_argument("--model", choices=("sage", "gcn", "ressage"), default="sage",
                   help="sage, gcn or ressage (ResSAGE+, with activation checkpointing on both sides)")
    p.add_argument("--layers", type=int, default=None, help="layers (default: 3; ressage 28)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--epochs", type=int, default=30, help="timed rounds (every implementation one epoch each)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (OMP_NUM_THREADS for the engine)")
    p.add_argument("--work", default="bench-out/single-rank", help="where the shard sets are built (reused)")
    p.add_argument("--row-block-rows", type=int, default=DEFAULT_BLOCK_ROWS,
                   help="the build's locality blocks for the default's set (preprocess build --row-block-rows)")
    p.add_argument("--out", default="bench-out/single-rank/single-rank.md", help="the results page")
    p.add_argument("--ranks", type=int, default=1,
                   help="ranks on the one server: more than 1 times only default against --no-overlap, alternating, "
                        "on a 1 x RANKS shard set under mpirun -n RANKS")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: the mpirun part of --ranks, results to this file
    args = p.parse_args(argv)
    if args.layers is None:
        args.layers = 28 if args.model == "ressage" else 3
    if args.epochs < 3 or args.threads < 1 or args.layers < 2 or args.ranks < 1:
        p.error("--epochs must be at least 3, --threads at least 1, --layers at least 2, --ranks at least 1")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the engine keeps the thread count it finds set
    torch.set_num_threads(args.threads)
    if args.worker:
        return server_worker(args)
    log, load_before = [], os.getloadavg()
    if args.ranks > 1:
        return server_page(args, argv, log)
    shards, id_order = build_set(args, log, args.row_block_rows), build_set(args, log, 0)
    impls = [Granndis("default", make_trainer(shards, args, False)),
             Granndis("no-overlap", make_trainer(shards, args, True)),
             Granndis("torch-ops", make_trainer(shards, args, False), kernels="torch"),
             Granndis("id-order", make_trainer(id_order, args, False))]
    try:
        impls.append(single_rank_pyg.PygEpoch(impls[3].trainer, args))
    except ImportError:
        print("torch_geometric is not installed (`.venv/bin/pip install torch_geometric`): PyG not measured")
    times = alternate(impls, args.epochs)
    load_after = os.getloadavg()
    prof, prof_total = profile_epoch(impls[0])
    default = impls[0].records[1:]  # the layer clock of every default epoch after the first
    fwd = np.median([r["layer_compute_s"]["forward"][0] for r in default], axis=0)
    bwd = np.median([r["layer_compute_s"]["backward"][0] for r in default], axis=0)
    stream, gflops = rl.stream_gbs(), rl.peak_gflops()
    roof = rl.roofline(impls[0].trainer)
    n_edges = int(impls[0].trainer.world_view.graphs[0].indices.shape[0])
    for impl in impls[:4]:
        impl.trainer.close()

    lines = ["# One rank's epoch: granndis against PyG, profile and roofline", "",
             f"1 x 1 shard set of the synthetic graph ({args.vertices:,} vertices, {n_edges:,} edges, "
             f"`--preload full`, rows in locality blocks of {args.row_block_rows}; id-order and PyG: the generator's "
             f"vertex order), {args.layers}-layer {MODEL_NAMES[args.model]}, hidden {args.hidden}, "
             f"dropout {args.dropout}, Adam; "
             f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} cores. Load average (1 min) "
             f"{load_before[0]:.1f} before, {load_after[0]:.1f} after the timed rounds.", ""]
    lines += epoch_lines(times, args.epochs)
    d = statistics.median(times["default"])
    lines += ["## Per layer (default, the engine's layer clock, median over epochs)", "",
              "| layer | forward (s) | backward (s) |", "|---:|---:|---:|"]
    lines += [f"| {l} | {f:.4f} | {b:.4f} |" for l, (f, b) in enumerate(zip(fwd, bwd))]
    lines += [f"| all | {fwd.sum():.4f} | {bwd.sum():.4f} |", "",
              f"The rest of the epoch (loss, optimizer, bookkeeping): {d - fwd.sum() - bwd.sum():.4f} s of the "
              f"median {d:.4f} s.", "", f"## Profile of one default epoch (torch.profiler, self time, "
              f"{prof_total:.3f} s profiled)", "", "| op | calls | self (s) | share |", "|---|---:|---:|---:|"]
    lines += [f"| `{k}` | {c} | {s:.4f} | {100 * f:.1f} % |" for k, c, s, f in prof]
    lines += rl.page_lines(roof, stream, gflops, d)
    harness.write_page(args.out, lines, "bench/bench_single_rank.py", argv, log,
                       data={"times": times, "roofline": roof, "stream_gbs": stream, "peak_gflops": gflops})
    return 0


if __name__ == "__main__":
    sys.exit(main())

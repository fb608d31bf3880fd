"""Overlap against --no-overlap inside one job, epoch by epoch (a diagnostic, not a test).

    bench/cluster/emu-cluster session --servers 2 --rate unshaped -- bench/cluster/emu-mpirun -n 4 \
        .venv/bin/python bench/overlap_ab.py --shards SHARDS --mode eas --pairs 6 --out ab.jsonl

Separate runs of a mode and its --no-overlap twin (bench_cluster, overlap_pairs) differ by more than
the overlap: which ranks share a core, the load of the minutes between them.  Here one trainer switches
between the two orders between epochs -- the gradient buckets' hooks on or off (GradientSync against
the blocking Communicator.allreduce_) and the overlapped halo groups on or off, which is all
`--no-overlap` changes (engine/trainer.py) -- in the order A B B A A B ..., so each pair of epochs
shares the minute it ran in.  Per epoch and rank it records the wall epoch, the forward / backward
compute (layer_compute_s), the gradient sync's seconds, the process's CPU seconds (a rank busy-waiting
in MPI spends CPU; one waiting descheduled does not), and, for the overlapped epochs, what the gradient
path did during the backward: hooks fired, bucket polls (PendingReduce.poll) and MPI_Testall calls
(MPIProgress.test), and the threads alive at each hook (/proc/self/task: MPI's and torch's included).
One JSON line per epoch on rank 0 (--out), and a summary printed at the end.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time

import harness  # first: the repository on sys.path


class Counters:
    """Wraps the gradient path's calls to count them (per epoch)."""

    def __init__(self):
        from granndis_hpc.cluster import allreduce, gradsync, pending

        self.reset()
        counters = self

        def counted(cls, name, key, extra=None):
            inner = getattr(cls, name)

            def wrapper(self, *a, **k):
                counters.n[key] += 1
                if extra is not None:
                    extra()
                return inner(self, *a, **k)
            setattr(cls, name, wrapper)

        def sample_threads():
            counters.threads_py.append(threading.active_count())
            counters.threads_os.append(len(os.listdir("/proc/self/task")))

        counted(gradsync.GradientSync, "_on_final", "hooks", sample_threads)
        counted(allreduce.PendingReduce, "poll", "polls")
        counted(pending.MPIProgress, "test", "testall")
        counted(gradsync.GradientSync, "_post", "buckets_posted")

    def reset(self):
        self.n = {"hooks": 0, "polls": 0, "testall": 0, "buckets_posted": 0}
        self.threads_py, self.threads_os = [], []

    def snapshot(self):
        return dict(self.n, threads_py_max=max(self.threads_py, default=0),
                    threads_os_max=max(self.threads_os, default=0))


def set_overlap(trainer, sync, halos, on: bool) -> None:
    """Switch the trainer between its overlapped order and --no-overlap's (both things the flag changes)."""
    if on:
        if not sync._handles:
            sync._handles = [p.register_post_accumulate_grad_hook(sync._on_final) for _, p in sync._named]
        trainer.gradsync, trainer._overlap_halo = sync, halos
    else:
        sync.close()  # hooks off: the backward posts nothing
        trainer.gradsync, trainer._overlap_halo = None, frozenset()


def arms(pairs: int):
    """A B B A A B ...: each arm first in half of the pairs."""
    out = []
    for i in range(pairs):
        out += [True, False] if i % 2 == 0 else [False, True]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=os.path.relpath(__file__, harness.REPO), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", required=True)
    p.add_argument("--mode", default="eas")
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--out", required=True, help="JSON lines, one per epoch (rank 0)")
    p.add_argument("--label", default="")
    args = p.parse_args(argv)

    from granndis_hpc.engine.trainer import TrainConfig, Trainer

    counters = Counters()
    trainer = Trainer(TrainConfig(shards=args.shards, mode=args.mode, epochs=1, quiet=True, skip_checksums=True))
    comm, rank = trainer.comm, trainer.topo.rank
    sync, halos = trainer.gradsync, trainer._overlap_halo
    if sync is None:
        raise SystemExit("overlap_ab: the trainer has no GradientSync (run without --no-overlap)")
    order = [True, False] + arms(args.pairs)  # two warm-up epochs (the first learns the bucket order)
    lines = []
    try:
        for i, on in enumerate(order):
            set_overlap(trainer, sync, halos, on)
            counters.reset()
            comm.topo.world.Barrier()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            rec = trainer.train_epoch()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            mine = dict(counters.snapshot(), cpu_s=cpu, wall_s=wall, grad_sync_s=rec["grad_sync_s"])
            everyone = comm.topo.world.gather(mine, root=0)
            if rank == 0:
                lc = rec["layer_compute_s"]
                line = {"label": args.label, "mode": args.mode, "epoch": i, "warmup": i < 2,
                        "overlap": on, "time_s": rec["time_s"], "loadavg_1min": os.getloadavg()[0],
                        "forward_s": [sum(x) for x in lc["forward"]], "backward_s": [sum(x) for x in lc["backward"]],
                        "ranks": everyone}
                lines.append(line)
                with open(args.out, "a") as f:
                    f.write(json.dumps(line) + "\n")
                print(f"[ab] {args.mode} epoch {i} {'ovl  ' if on else 'noovl'} {rec['time_s']:.3f} s  "
                      f"cpu {' '.join('%.2f' % r['cpu_s'] for r in everyone)}  "
                      f"bw {' '.join(f'{x:.2f}' for x in line['backward_s'])}  "
                      f"hooks/polls/testall {everyone[0]['hooks']}/{everyone[0]['polls']}/{everyone[0]['testall']}  "
                      f"threads {everyone[0]['threads_os_max']}", flush=True)
    finally:
        set_overlap(trainer, sync, halos, True)
        trainer.close()
    if rank == 0:
        summarize(lines)
    return 0


def summarize(lines) -> None:
    timed = [ln for ln in lines if not ln["warmup"]]
    ratios = []
    for a, b in zip(timed[0::2], timed[1::2]):
        ovl, no = (a, b) if a["overlap"] else (b, a)
        ratios.append(ovl["time_s"] / no["time_s"])

    def mean_of(key, on, f=sum):
        return statistics.mean(f(ln[key]) / len(ln[key]) for ln in timed if ln["overlap"] == on)

    def cpu(on):
        return statistics.mean(sum(r["cpu_s"] for r in ln["ranks"]) / len(ln["ranks"]) for ln in timed
                               if ln["overlap"] == on)
    def grad(on):
        return statistics.mean(sum(r["grad_sync_s"] for r in ln["ranks"]) / len(ln["ranks"]) for ln in timed
                               if ln["overlap"] == on)
    print(f"[ab] pairs {len(ratios)}: ratios {' '.join(f'{r:.3f}' for r in ratios)}; geometric mean "
          f"{math.exp(statistics.mean(math.log(r) for r in ratios)):.3f}")
    for on in (True, False):
        print(f"[ab] {'overlap   ' if on else 'no-overlap'}: epoch {statistics.mean(ln['time_s'] for ln in timed if ln['overlap'] == on):.3f} s, "
              f"per-rank mean forward {mean_of('forward_s', on):.3f} backward {mean_of('backward_s', on):.3f} "
              f"cpu {cpu(on):.3f} s, gradient sync {grad(on):.3f} s")


if __name__ == "__main__":
    sys.exit(main())

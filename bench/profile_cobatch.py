"""cProfile of one rank's main thread over a batched run's epochs, in CPU seconds (not a test).

    mpirun -n 4 python bench/profile_cobatch.py --shards DIR --mode cob --batches-per-epoch 1 --fanout 25 \
        --epochs 2 [--rank 0] [--top 25]

Set-up is not profiled.  --loader: profile the loader thread's co-batch builds instead (every build after
set-up's first co-batch, in that thread's CPU seconds).  The clock is the main thread's CPU time (`cProfile.Profile(time.thread_time)`):
on a shared or oversubscribed host a wall-clock profile measures the queue for a core.  The loader
thread is not in the profile; its work is in the epoch records' per-phase host seconds, printed after it
(and each epoch's wait for its co-batch: the host work left on the critical path).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

from granndis_hpc.engine.trainer import TrainConfig, Trainer


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", required=True)
    p.add_argument("--mode", default="cob")
    p.add_argument("--batches-per-epoch", type=int, default=1)
    p.add_argument("--fanout", type=int, default=25)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--ranks-per-server", type=int, default=2)
    p.add_argument("--rank", type=int, default=0, help="the rank whose main thread is profiled")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--sort", default="cumulative", help="pstats order: cumulative or tottime")
    p.add_argument("--loader", action="store_true",
                   help="profile the loader thread's co-batch builds (BatchedSteps._build) instead of the main thread")
    args = p.parse_args(argv)
    trainer = Trainer(TrainConfig(shards=args.shards, mode=args.mode, model="sage", layers=args.layers,
                                  hidden=args.hidden, epochs=args.epochs, eval_every=0, quiet=True,
                                  ranks_per_server=args.ranks_per_server, batches_per_epoch=args.batches_per_epoch,
                                  fanout=args.fanout))
    prof = cProfile.Profile(time.thread_time) if trainer.topo.rank == args.rank else None
    main_prof = prof if not args.loader else None
    if prof is not None and args.loader:
        # Every build after set-up's (the first co-batch, built before this wrapper) runs in the loader
        # thread: profile each inside that thread (one builds at a time: one worker).
        batches = trainer.mode.batches
        build = batches._build

        def profiled(*a, **k):
            prof.enable()
            try:
                return build(*a, **k)
            finally:
                prof.disable()
        batches._build = profiled
    records = []
    try:
        for _ in range(args.epochs):
            if main_prof:
                main_prof.enable()
            records.append(trainer.train_epoch())
            if main_prof:
                main_prof.disable()
    finally:
        trainer.close()
    if prof is None:
        return
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats(args.sort).print_stats(args.top)
    print(out.getvalue())
    for r in records:
        print(f"epoch {r['epoch']}: {r['time_s']:.2f} s, waited for the co-batch {r['sampling_s']:.2f} s, "
              f"compute {r['compute_s']:.2f} s, host s per co-batch {r.get('cobatch_host_s')}")


if __name__ == "__main__":
    main()

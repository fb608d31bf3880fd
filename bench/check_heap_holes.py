"""The C heap's holes a CPU training step leaves, against the memory model's step (memory_model/host.py's
allocator term; not a test).  One process per measurement, no cluster:

    python bench/check_heap_holes.py --graph mag --vertices 10000 30000 --models rgcn rgat
    python bench/check_heap_holes.py --graph sbm --vertices 20000 60000 --models sage gcn
    python bench/check_heap_holes.py --graph sbm --vertices 2500 5000 --models gat

(GAT on small graphs: a step above 1 GiB measures too few holes, as the heap gives its free top beyond
1 GiB back to the system.)  Runs vary; docs/memory-model.md has the ranges of repeated runs.

For each graph size it builds a one-rank shard set (the typed synthetic graph with ogbn-mag's statistics,
or the DC-SBM synthetic graph; full preload of L hops), then, in a fresh process per model (so no other
run's freed memory is in its heap), trains fb three epochs and reads glibc's mallinfo2: the heap's free
bytes after them (the engine keeps freed memory and serves every block from the heap: engine/hostmem.py);
a fourth epoch measures the peak torch allocates in a step (its profiler).  The holes are the free bytes
beyond that peak, set beside the estimate's step (activations + halo buffers + step transient) and the
fraction the estimate counts (the model's ModelEstimate.heap_holes).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from harness import run

LAYERS, HIDDEN = 3, 64


def build(path: str, graph: str, vertices: int) -> None:
    """The one-rank shard set of the graph (in a process of its own: the parent keeps no MPI)."""
    from mpi4py import MPI

    from granndis_hpc.preprocess.build.pipeline import build_shards
    from granndis_hpc.preprocess.sources import load

    g = (load("synthetic", generator="mag", vertices=vertices, seed=0) if graph == "mag"
         else load("synthetic", vertices=vertices, seed=0))
    build_shards(g, path, servers=1, gpus_per_server=1, layers=LAYERS, hops=LAYERS, partitioner="metis",
                 comm=MPI.COMM_SELF)


def measure(path: str, model: str) -> dict:
    """One model's heap after three fb epochs and the step peak of a fourth, beside its estimate."""
    from granndis_hpc import memory_model as mm
    from granndis_hpc.engine.trainer import Trainer
    from granndis_hpc.memory_model.profile import measure_step_peak
    from granndis_hpc.options.train import TrainConfig
    from granndis_hpc.preprocess.partition.parmetis import libc_malloc_info

    libc = libc_malloc_info()
    if libc is None:
        sys.exit("check_heap_holes: needs glibc's mallinfo2 (Linux, glibc >= 2.33)")
    t = Trainer(TrainConfig(shards=path, mode="fb", model=model, layers=LAYERS, hidden=HIDDEN, eval_every=0,
                            ranks_per_server=1, quiet=True))
    try:
        for _ in range(3):
            t.train_epoch()
        free = int(libc.mallinfo2().fordblks)
        peak = measure_step_peak(t.train_epoch)
    finally:
        t.close()
    ds = t.manifest["dataset"]
    rows = mm.shard_rows(mm.read_shard_set(path)[1], LAYERS, 0, int(ds["num_features"]), int(ds["num_classes"]))
    spec = mm.model_for(t.manifest, model, HIDDEN, LAYERS, resident=True)
    b = mm.estimate(rows[0], spec, device="cpu")["breakdown"]
    step = b["activations"] + b["halo_buffers"] + b["step_transient"]
    return {"model": model, "free": free, "peak": peak, "step": step, "holes": free - peak,
            "counted": spec.estimator.heap_holes}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graph", choices=("mag", "sbm"), default="mag")
    p.add_argument("--vertices", type=int, nargs="+", default=[10000, 30000])
    p.add_argument("--models", nargs="+", default=["rgcn", "rgat"])
    p.add_argument("--work", help="folder for the shard sets (default: a new temporary one)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per build or measurement")
    p.add_argument("--build", nargs=3, metavar=("PATH", "GRAPH", "VERTICES"), help=argparse.SUPPRESS)
    p.add_argument("--measure", nargs=2, metavar=("PATH", "MODEL"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.build:
        return build(args.build[0], args.build[1], int(args.build[2]))
    if args.measure:
        print("HOLES " + json.dumps(measure(*args.measure)), flush=True)
        return None
    work = args.work or tempfile.mkdtemp(prefix="granndis-holes-")
    lines = ["| graph | vertices | model | step estimate (MB) | step peak (MB) | heap free (MB) | "
             "holes / step estimate | counted |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for n in args.vertices:
        path = os.path.join(work, f"{args.graph}-{n}")
        if not os.path.exists(os.path.join(path, "manifest.json")):
            run([sys.executable, __file__, "--build", path, args.graph, n], timeout=args.timeout)
        for model in args.models:
            out = run([sys.executable, __file__, "--measure", path, model], timeout=args.timeout, capture=True)
            r = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("HOLES "))[6:])
            lines.append(f"| {args.graph} | {n:,} | {model} | {r['step'] / 1e6:,.0f} | {r['peak'] / 1e6:,.0f} | "
                         f"{r['free'] / 1e6:,.0f} | {r['holes'] / r['step']:.2f} | {r['counted']:.2f} |")
            print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

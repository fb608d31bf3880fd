"""What the MPI progress thread's polling costs the compute it runs beside (issue 19).

    mpirun -n 4 python bench/poll_cost.py [--seconds 1.5] [--reps 3]

Ranks pair up (0-1, 2-3, ...).  Each pass, every rank posts an Irecv from its partner and the matching
Isend of a 2.3 MB block (one layer-pass's halo on the 200 k local graph) *after* its compute, so the
requests stay open for the whole compute and the thread polls throughout (the worst case: a transfer
as long as the compute).  The compute is one layer's work on 50,000 rows x 64: CSR spmm, two Linear,
ReLU and the counter-based dropout mask, repeated a fixed number of times (about --seconds).  Variants, alternated every rep:
none (no thread: cluster/pending.MPIProgress(progress=False)), fixed intervals and back-off
(PROGRESS_POLL_S, PROGRESS_BACKOFF, PROGRESS_POLL_MAX_S).  Prints, per variant, the median over reps of
the slowest rank's compute wall seconds and the mean of the ranks' CPU seconds (all threads), and the
polls per second.  Run it under the exclusive bench lock (it is a timing).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch
from mpi4py import MPI

from granndis_hpc.cluster import pending
from granndis_hpc.nn.dropout import keep_mask

VARIANTS = {  # name -> (progress thread, first interval, back-off factor, longest interval)
    "none": (False, 0.001, 1.0, 0.001),
    "fixed-1ms": (True, 0.001, 1.0, 0.001),
    "fixed-0.2ms": (True, 0.0002, 1.0, 0.0002),
    "fixed-5ms": (True, 0.005, 1.0, 0.005),
    "backoff-1-16ms": (True, 0.001, 2.0, 0.016),
    "backoff-1-4ms": (True, 0.001, 2.0, 0.004),
}


def layer_work(n=50000, d=64, deg=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = torch.arange(n).repeat_interleave(deg)
    cols = (rows + torch.randint(-500, 500, (n * deg,), generator=g)).clamp(0, n - 1)
    a = torch.sparse_coo_tensor(torch.stack([rows, cols]), torch.full((n * deg,), 1.0 / deg), (n, n))
    a = a.coalesce().to_sparse_csr()
    h = torch.randn(n, d, generator=g)
    lin1, lin2 = torch.nn.Linear(d, d), torch.nn.Linear(d, d)
    ids = torch.arange(n)

    def step():
        with torch.no_grad():
            z = torch.relu(lin1(h) + a @ lin2(h))
            return z * keep_mask(1, 2, 3, ids, d, 0.5)
    return step


def one_pass(comm, step, steps, variant, nbytes):
    progress, first, backoff, longest = VARIANTS[variant]
    pending.PROGRESS_POLL_S, pending.PROGRESS_BACKOFF, pending.PROGRESS_POLL_MAX_S = first, backoff, longest
    partner = comm.rank ^ 1
    recv, send = np.empty(nbytes, np.uint8), np.ones(nbytes, np.uint8)
    comm.Barrier()
    req = [comm.Irecv(recv, source=partner, tag=7)]
    waiter = pending.MPIProgress(req, progress)
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    sreq = comm.Isend(send, dest=partner, tag=7)
    polls = waiter.polls
    waiter.wait()
    sreq.Wait()
    return wall, cpu, polls / wall


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--bytes", type=int, default=2_287_616)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    if comm.size % 2:
        print("poll_cost: needs an even number of ranks", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    step = layer_work()
    step()
    t0 = time.perf_counter()
    for _ in range(3):
        step()
    # The same number of steps on every rank and in every pass (about --seconds of compute).
    steps = comm.allreduce(max(1, int(args.seconds / ((time.perf_counter() - t0) / 3))), op=MPI.MIN)
    variants = [v for v in args.variants.split(",") if v]
    out = {v: [] for v in variants}
    for rep in range(args.reps):
        for v in (variants if rep % 2 == 0 else variants[::-1]):
            wall, cpu, polls = one_pass(comm, step, steps, v, args.bytes)
            out[v].append(comm.gather((wall, cpu, polls), root=0))
    if comm.rank == 0:
        res = {}
        for v in variants:
            res[v] = {"wall_s": statistics.median(max(r[0] for r in rep) for rep in out[v]),
                      "cpu_s": statistics.median(statistics.mean(r[1] for r in rep) for rep in out[v]),
                      "polls_per_s": statistics.median(statistics.mean(r[2] for r in rep) for rep in out[v])}
        print(json.dumps({"ranks": comm.size, "steps": steps, "loadavg": list(__import__("os").getloadavg()), "variants": res}, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""MPI ping-pong bandwidth inside a server and between servers (the emulated cluster's self-check).

Run under emu-mpirun with S x R ranks (R consecutive ranks per server).  Rank 0 prints one line
`PINGPONG {json}`: the host of every rank, intra-server bandwidth (rank 0 <-> rank 1) and inter-server
bandwidth (rank 0 <-> the first rank of every other server), in bytes/s one way:
2 x bytes x round trips / elapsed, after one warm-up round trip; the best of --trials trials, because on a
shared machine CPU starvation only ever slows a trial down (measured: 0.23x the link rate at load 21 on
2 cores, 0.85x a minute later), while the link's limit is what the check is about.
"""
import argparse
import json
import time

import numpy as np
from mpi4py import MPI


def pingpong(comm, peer, buf, reps):
    """Seconds for `reps` round trips between rank 0 and `peer` (measured on rank 0; others return 0)."""
    rank = comm.Get_rank()
    comm.Barrier()
    if rank not in (0, peer):
        comm.Barrier()
        return 0.0
    other = peer if rank == 0 else 0
    start = None
    for i in range(reps + 1):
        if i == 1:
            start = time.perf_counter()  # the first round trip opens the TCP connection: not timed
        if rank == 0:
            comm.Send(buf, other)
            comm.Recv(buf, other)
        else:
            comm.Recv(buf, other)
            comm.Send(buf, other)
    elapsed = time.perf_counter() - start
    comm.Barrier()
    return elapsed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bytes", type=int, default=4 << 20)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--ranks-per-server", type=int, required=True)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    size, rps = comm.Get_size(), args.ranks_per_server
    if size % rps:
        raise SystemExit(f"pingpong: {size} ranks are not a multiple of --ranks-per-server {rps}")
    hosts = comm.allgather(MPI.Get_processor_name())
    buf = np.zeros(args.bytes, dtype=np.uint8)
    intra = None
    if rps > 1:
        dt = min(pingpong(comm, 1, buf, args.reps) for _ in range(args.trials))
        intra = 2 * args.bytes * args.reps / dt if comm.Get_rank() == 0 else None
    inter = {}
    for s in range(1, size // rps):
        dt = min(pingpong(comm, s * rps, buf, args.reps) for _ in range(args.trials))
        if comm.Get_rank() == 0:
            inter[str(s)] = 2 * args.bytes * args.reps / dt
    if comm.Get_rank() == 0:
        print("PINGPONG " + json.dumps({"hosts": hosts, "intra_Bps": intra, "inter_Bps": inter,
                                        "bytes": args.bytes, "reps": args.reps, "trials": args.trials}), flush=True)


if __name__ == "__main__":
    main()

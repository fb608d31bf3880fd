"""The two link classes a job runs on, measured at start-up: between servers and inside one.

GraNNDis' preloading (flx, eas) trades inter-server bytes for more rows computed, which pays where the
link between servers is much slower than the links inside one (the paper's 10 GbE testbed: 28x) and not
where it is about as fast (one machine, or emulated servers sharing loopback).  A short MPI ping-pong
tells which regime the job is in, so the run can say so before its first epoch (granndis_hpc/link_classes.py
words the verdict).

Inter-server: the leaders of servers 0 and 1 (world ranks rank_table[0, 0] and rank_table[1, 0]);
intra-server: local ranks 0 and 1 of server 0.  Bandwidth one way = 2 x bytes x round trips / seconds,
after one untimed round trip (it opens connections), the best of the trials: on a shared machine CPU
starvation only ever slows a trial down, while the link's limit is what is measured.  The sizes bound
the check: 2 x 2 trials x 2 round trips of 512 KiB are 4 MiB per link class, 0.35 s at 100 Mbit/s.
"""
from __future__ import annotations

import time
from typing import Optional

import numpy as np

MESSAGE_BYTES = 512 << 10
ROUND_TRIPS = 2
TRIALS = 2
def _pingpong(comm, me: int, peer: int, buf: np.ndarray) -> float:
    """Seconds for ROUND_TRIPS round trips between ranks `me`'s pair on `comm`; 0 on ranks outside it."""
    rank = comm.Get_rank()
    if rank not in (me, peer):
        return 0.0
    other = peer if rank == me else me
    start = 0.0
    for i in range(ROUND_TRIPS + 1):
        if i == 1:
            start = time.perf_counter()
        if rank == me:
            comm.Send(buf, other)
            comm.Recv(buf, other)
        else:
            comm.Recv(buf, other)
            comm.Send(buf, other)
    return time.perf_counter() - start


def _bandwidth(world, pair, buf) -> Optional[float]:
    """Best one-way bandwidth between the world ranks `pair` (None when there is no such pair); collective."""
    if pair is None:
        return None
    best = None
    for _ in range(TRIALS):
        world.Barrier()
        seconds = _pingpong(world, pair[0], pair[1], buf)
        if world.Get_rank() == pair[0]:
            best = seconds if best is None else min(best, seconds)
    measured = world.bcast(best, root=pair[0])
    return 2 * buf.nbytes * ROUND_TRIPS / max(measured, 1e-9)


def measure_links(topo) -> dict:
    """{inter_Bps, intra_Bps, message_bytes}: the job's link classes, None where the job has no such link
    (one server; one rank per server).  Collective over the world: every rank calls it and gets the result."""
    table = topo.rank_table
    inter = (int(table[0, 0]), int(table[1, 0])) if topo.servers > 1 else None
    intra = (int(table[0, 0]), int(table[0, 1])) if topo.ranks_per_server > 1 else None
    buf = np.zeros(MESSAGE_BYTES, dtype=np.uint8)
    return {"inter_Bps": _bandwidth(topo.world, inter, buf), "intra_Bps": _bandwidth(topo.world, intra, buf),
            "message_bytes": MESSAGE_BYTES}

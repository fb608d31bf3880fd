"""What an exchange round costs on the run's own communication path, measured at start-up.

The cost model (memory_model/epoch_time.py) charges every exchange round -- a layer's halo exchange,
forward and backward -- a fixed time beyond its bytes, and every optimizer step a gradient all-reduce
round.  A round is what the training step pays: the Communicator's world exchange (Isend/Irecv between
servers, the server's part beside it; overlapped, posted with a progress thread and completed after
compute, unless --no-overlap), the server group's exchange (blocking unless --overlap-halos all; its price
is also that of the per-server route's relay of a world round's rows, a blocking server exchange) and the
hierarchical all-reduce (reduce in the server, leaders' all-reduce, broadcast): overlapped as
cluster/gradsync.py runs it (a bucket posted with `reduce_flat_start`, moved on by the polls of the
backward's gradient hooks, completed after the backward), or blocking (`allreduce_`) under --no-overlap.
On a machine whose cores the ranks share, such a round costs what the operating system's scheduler makes
it cost: it completes only once every rank has run after every rank has posted, and a rank that waits
(MPI_Waitall spins unless Open MPI was told to yield) competes for the cores with those still computing.
The check runs the engine's own calls, not MPI's collectives, so that what the run's path adds (its
progress threads, the all-reduce's three stages) is in the price, with a round's smallest payload: one
row of ROW_FLOATS float32 to every peer (the bytes are priced apart).

`measure_exchange_rounds` times rounds of the three, interleaved (they see the same load), each entered
from a burst of compute (a millisecond of matrix products, as a layer computes between two exchanges);
an overlapped round is its posting plus its wait, with a second burst between them (the compute the
exchange hides), as the ledger counts the exchange's time; an overlapped all-reduce's burst is cut by a
poll after each of its products, as the backward's hooks poll the posted buckets between layers, and the
polls count in the round (the gradient's bytes are priced apart, with the backward they hide behind:
memory_model/epoch_time.py).  It runs up to `repeats` of them, and stops after MIN_ROUNDS once BUDGET_S
has passed on any rank: the all-reduce round carries that flag (a sum every rank reads alike), so every
rank stops after the same round without a message of its own (on 2 cores shared by 4 ranks and other
jobs, load 17-27, rounds of 30-200 ms: 3-4 rounds, 1-5 s).  The slowest rank's mean is kept: a round
waits for the last rank.  Its bytes go to a scratch ledger, so the run's ledger starts empty.  Collective
over the world: every rank calls it with the same arguments; it raises nothing that one rank alone could
raise (every input is checked before the first message).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from .ledger import Ledger

ROUNDS = 20  # rounds timed per group, at most
MIN_ROUNDS = 3  # at least, whatever the time
BUDGET_S = 0.5  # after MIN_ROUNDS, no round starts once this has passed on some rank
ROW_FLOATS = 16  # one row of 64 bytes to every peer: a round, not a transfer

_BURST = np.random.default_rng(0).standard_normal((192, 192))


def burst(between=None) -> float:
    """A millisecond of compute (four 192 x 192 products), as a layer computes between two exchanges;
    `between` (a pending exchange's poll) runs after each product: returns the seconds it took."""
    spent = 0.0
    for _ in range(4):
        _BURST @ _BURST
        if between is not None:
            t0 = time.perf_counter()
            between()
            spent += time.perf_counter() - t0
    return spent


def _exchange_round(start, exchange, size: int, device, overlapped: bool):
    """One round of a group: every peer (this rank included) gets one row; returns its seconds."""
    counts = [1] * size
    send = torch.zeros((size, ROW_FLOATS), dtype=torch.float32, device=device)

    def blocking() -> float:
        t0 = time.perf_counter()
        exchange(send, counts, counts)
        return time.perf_counter() - t0

    def posted() -> float:
        t0 = time.perf_counter()
        pending = start(send, counts, counts)
        posting = time.perf_counter() - t0
        burst()  # the compute the exchange overlaps (not counted: the model prices it as compute)
        t1 = time.perf_counter()
        pending.wait()
        return posting + time.perf_counter() - t1
    return posted if overlapped else blocking


def _allreduce_round(comm, flat: torch.Tensor, overlapped: bool):
    """One gradient all-reduce round of `flat` (summed in place): (its seconds, the sum)."""
    if not overlapped:
        t0 = time.perf_counter()
        comm.allreduce_([flat], phase="gradient")
        return time.perf_counter() - t0, flat
    t0 = time.perf_counter()
    pending = comm.reduce_flat_start(flat, "gradient")  # posted by the bucket's last gradient hook
    posting = time.perf_counter() - t0
    polls = burst(pending.poll)  # the backward's earlier layers, each hook polling the posted bucket
    t1 = time.perf_counter()
    out = pending.wait()  # GradientSync.finish()
    return posting + polls + time.perf_counter() - t1, out


def measure_exchange_rounds(comm, world_overlapped: bool = True, server_overlapped: bool = False,
                            repeats: int = ROUNDS, gradient_overlapped: bool = True) -> dict:
    """{world_round_s, server_round_s, allreduce_s, repeats, seconds, world_path, server_path,
    gradient_path}: the mean seconds of a round of the world exchange, of the server exchange (0 with one
    rank per server) and of the gradient all-reduce on `comm` (a Communicator), on the paths the run takes
    (`*_overlapped`: posted and completed after compute, else blocking; the run's --no-overlap turns all
    three to blocking), the slowest rank's; `repeats`: the rounds timed (MIN_ROUNDS to `repeats`, the same
    on every rank).  Collective over the world."""
    repeats = int(repeats)
    if repeats < MIN_ROUNDS:
        raise ValueError(f"repeats must be at least {MIN_ROUNDS}, got {repeats}")
    topo = comm.topo
    ledger, comm.ledger = comm.ledger, Ledger()  # the check's bytes are not the run's
    try:
        world = _exchange_round(comm.world_exchange_start, comm.world_exchange, topo.world_size, topo.device,
                                world_overlapped)
        server = _exchange_round(comm.intra_exchange_start, comm.intra_exchange, topo.ranks_per_server,
                                 topo.device, server_overlapped)
        flat = torch.zeros(ROW_FLOATS, dtype=torch.float32, device=topo.device)

        def allreduce(stop: bool):
            flat.zero_()
            flat[0] = float(stop)
            seconds, total = _allreduce_round(comm, flat, gradient_overlapped)
            return seconds, float(total[0]) > 0  # stop: some rank's budget has passed
        groups = [world] + ([server] if topo.ranks_per_server > 1 else [])
        for fn in groups:  # untimed: opens the connections
            fn()
        allreduce(False)
        topo.world.Barrier()
        totals, done, start = np.zeros(3), 0, time.perf_counter()
        while done < repeats:
            for i, fn in enumerate(groups):
                burst()
                totals[i] += fn()
            burst()
            seconds, stop = allreduce(done + 1 >= MIN_ROUNDS and time.perf_counter() - start > BUDGET_S)
            totals[2] += seconds
            done += 1
            if stop:
                break
        mine = [*(totals / done), time.perf_counter() - start]
    finally:
        comm.ledger = ledger
    slowest = np.max(np.asarray(topo.world.allgather(mine), dtype=np.float64), axis=0)
    return {"world_round_s": float(slowest[0]), "server_round_s": float(slowest[1]),
            "allreduce_s": float(slowest[2]), "repeats": done, "seconds": float(slowest[3]),
            "world_path": "overlapped" if world_overlapped else "blocking",
            "server_path": "overlapped" if server_overlapped else "blocking",
            "gradient_path": "overlapped" if gradient_overlapped else "blocking"}

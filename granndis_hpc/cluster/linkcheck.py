"""The two link classes a job runs on, measured at start-up: between servers and inside one.

GraNNDis' preloading (flx, eas) trades inter-server bytes for more rows computed, which pays where the
link between servers is much slower than the links inside one (the paper's 10 GbE testbed: 28x) and not
where it is about as fast (one machine, or emulated servers sharing loopback).  A short MPI ping-pong
tells which regime the job is in, so the run can say so before its first epoch (granndis_hpc/link_classes.py
words the verdict).

Inter-server: the leaders of servers 0 and 1 (world ranks rank_table[0, 0] and rank_table[1, 0]);
intra-server: local ranks 0 and 1 of server 0.  Bandwidth one way = 2 x bytes x round trips / seconds,
after one untimed round trip (it opens connections).  The inter-server pair is also timed sending both
ways at once (each leader sends ROUND_TRIPS messages to the other while receiving as many, after a small
untimed exchange that starts them together; each message in the pieces the engine sends between servers,
cluster/layout.py): the rate each direction gets = bytes x round trips / seconds.  A training step's halo
exchanges and gradient all-reduce move data both ways at once, and a
link is not always full-duplex: where the two directions share one budget the rate both ways is about
half the one-way rate, on a full-duplex link it equals the one-way rate; the cost model prices the
simultaneous bytes with it (memory_model/epoch_time.py).  Only --mode auto's time rule measures it.

On a shared machine CPU starvation only ever slows a trial down, while the link's limit is what is
measured, so the check keeps the best trial, and it runs trials until it has MIN_TRIALS and then
while BUDGET_S lasts (at most MAX_TRIALS): on a
fast link that is a dozen trials, on a slow one (2 MiB a trial: 1.7 s at 10 Mbit/s) the minimum.  The
ranks outside the measured pair wait without spinning (a non-blocking barrier polled with a sleep),
leaving the cores to the pair where ranks outnumber them: with the others spinning in a barrier and
two trials, a 4-rank run on two cores measured the unshaped emulated link at 13 MB/s where the
self-check's ping-pong of two ranks measured 104 MB/s.  The result states the trials' count, best
and median.

What an exchange round costs beyond its bytes is measured on the engine's own exchange path by
cluster/roundcheck.py; `link_check_text` states both.
"""
from __future__ import annotations

import time
from typing import List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from .layout import MESSAGE_PIECE_BYTES, message_pieces

MESSAGE_BYTES = 512 << 10
ROUND_TRIPS = 2
MIN_TRIALS = 2
MAX_TRIALS = 12
BUDGET_S = 1.0  # per link class, once MIN_TRIALS are done
_FLAG_TAG = 7321
_EXCHANGE_TAG = 7322


def _wait_idle(comm) -> None:
    """A barrier that sleeps between polls: the ranks not measuring leave the cores to those that are."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.0005)


def _pingpong(comm, me: int, peer: int, buf: np.ndarray, round_trips: int = ROUND_TRIPS) -> float:
    """Seconds for `round_trips` round trips between ranks `me` and `peer` (called by both)."""
    other = peer if comm.Get_rank() == me else me
    start = time.perf_counter()
    for _ in range(round_trips):
        if comm.Get_rank() == me:
            comm.Send(buf, other)
            comm.Recv(buf, other)
        else:
            comm.Recv(buf, other)
            comm.Send(buf, other)
    return time.perf_counter() - start


def _exchange(comm, me: int, peer: int, buf: np.ndarray, rounds: int = ROUND_TRIPS,
              piece_bytes: int = MESSAGE_PIECE_BYTES) -> float:
    """Seconds for `rounds` messages sent each way at once between ranks `me` and `peer` (called by both),
    each in pieces of at most `piece_bytes` as the engine sends its blocks between servers (one larger
    message each way runs the two directions one after the other: cluster/layout.py)."""
    other = peer if comm.Get_rank() == me else me
    received = np.empty_like(buf)
    pieces = message_pieces(buf.nbytes, 1, piece_bytes)
    start = time.perf_counter()
    for _ in range(rounds):
        requests = [comm.Irecv(received[a:b], source=other, tag=_EXCHANGE_TAG) for a, b in pieces]
        requests += [comm.Isend(buf[a:b], dest=other, tag=_EXCHANGE_TAG) for a, b in pieces]
        MPI.Request.Waitall(requests)
    return time.perf_counter() - start


def _trials(world, pair, buf, both_ways: bool = False, piece_bytes: int = MESSAGE_PIECE_BYTES) -> List[float]:
    """The pair's trial seconds (on pair[0]; empty elsewhere): after an untimed round trip (both_ways: a
    small untimed exchange, which starts the two together), trials of ping-pongs (both_ways: exchanges)
    until MIN_TRIALS are done and then while BUDGET_S lasts, at most MAX_TRIALS; pair[0] decides and
    tells pair[1] after each."""
    rank = world.Get_rank()
    if rank not in pair:
        return []
    if both_ways:
        _exchange(world, pair[0], pair[1], buf[:64], 1)
    else:
        _pingpong(world, pair[0], pair[1], buf, 1)  # untimed: opens the connection
    out: List[float] = []
    start = time.perf_counter()
    more = True
    while more:
        out.append(_exchange(world, pair[0], pair[1], buf, piece_bytes=piece_bytes) if both_ways
                   else _pingpong(world, pair[0], pair[1], buf))
        if rank == pair[0]:
            more = len(out) < MIN_TRIALS or (len(out) < MAX_TRIALS and time.perf_counter() - start < BUDGET_S)
            world.send(more, dest=pair[1], tag=_FLAG_TAG)
        else:
            more = world.recv(source=pair[0], tag=_FLAG_TAG)
    return out if rank == pair[0] else []


def _bandwidth(world, pair, buf, both_ways: bool = False,
               piece_bytes: int = MESSAGE_PIECE_BYTES) -> Tuple[Optional[float], dict]:
    """(best one-way bandwidth between the world ranks `pair`, {trials, best_Bps, median_Bps}); (None, {})
    where there is no such pair.  both_ways: the bandwidth each direction gets while both send.
    Collective."""
    if pair is None:
        return None, {}
    trials = _trials(world, pair, buf, both_ways, piece_bytes)
    _wait_idle(world)
    if world.Get_rank() == pair[0]:
        moved = buf.nbytes * ROUND_TRIPS * (1 if both_ways else 2)  # per direction; a ping-pong's both legs
        rates = moved / np.maximum(np.asarray(trials), 1e-9)
        stats = {"trials": len(trials), "best_Bps": float(rates.max()), "median_Bps": float(np.median(rates))}
    else:
        stats = None
    stats = world.bcast(stats, root=pair[0])
    return stats["best_Bps"], stats


def measure_links(topo, both_ways: bool = False, piece_bytes: int = MESSAGE_PIECE_BYTES) -> dict:
    """{inter_Bps, inter_both_Bps, intra_Bps, message_bytes, inter, inter_both, intra (each {trials,
    best_Bps, median_Bps}), seconds}: the job's link classes, None where the job has no such link (one
    server; one rank per server); inter_both_Bps: the inter-server rate each way while both leaders
    send, measured with `both_ways` (what --mode auto prices with; None and {} without), in messages of at
    most `piece_bytes` as the run sends (the Communicator's `piece_bytes`).  Collective over
    the world: every rank calls it and gets the result."""
    start = time.perf_counter()
    table = topo.rank_table
    inter = (int(table[0, 0]), int(table[1, 0])) if topo.servers > 1 else None
    intra = (int(table[0, 0]), int(table[0, 1])) if topo.ranks_per_server > 1 else None
    buf = np.zeros(MESSAGE_BYTES, dtype=np.uint8)
    inter_Bps, inter_stats = _bandwidth(topo.world, inter, buf)
    both_Bps, both_stats = _bandwidth(topo.world, inter if both_ways else None, buf, both_ways=True,
                                      piece_bytes=piece_bytes)
    intra_Bps, intra_stats = _bandwidth(topo.world, intra, buf)
    seconds = max(topo.world.allgather(time.perf_counter() - start))
    return {"inter_Bps": inter_Bps, "inter_both_Bps": both_Bps, "intra_Bps": intra_Bps,
            "message_bytes": MESSAGE_BYTES, "inter": inter_stats, "inter_both": both_stats, "intra": intra_stats,
            "seconds": float(seconds)}


def both_ways_rate(links: dict) -> Optional[float]:
    """The inter-server rate each way with both directions busy, as the cost model prices it: the
    measured one, at most the one-way rate (a link carries no more one way when the other way is busy
    too: a higher reading is the trials' noise); None where it was not measured."""
    both, one = links.get("inter_both_Bps"), links.get("inter_Bps")
    return None if both is None or one is None else float(min(both, one))


def link_check_text(links: dict, rounds: Optional[dict] = None) -> str:
    """What the check measured, for a decision's reason: each link's best and median and its trials,
    and the rounds' seconds."""
    def one(name, key):
        stats = links.get(name) or {}
        if links.get(key) is None:
            return f"no {name}-server link"
        if not stats:
            return f"{name}-server {links[key] / 1e6:.3g} MB/s"
        return (f"{name}-server {stats['best_Bps'] / 1e6:.3g} MB/s (best of {stats['trials']} ping-pongs of "
                f"{ROUND_TRIPS} x {links.get('message_bytes', MESSAGE_BYTES) >> 10} KiB round trips; median "
                f"{stats['median_Bps'] / 1e6:.3g})")
    text = f"link check: {one('inter', 'inter_Bps')}"
    both = links.get("inter_both") or {}
    if both:
        text += (f", both ways at once {both['best_Bps'] / 1e6:.3g} MB/s each (best of {both['trials']} exchanges "
                 f"of {ROUND_TRIPS} x {links.get('message_bytes', MESSAGE_BYTES) >> 10} KiB each way; median "
                 f"{both['median_Bps'] / 1e6:.3g})")
    text += f", {one('intra', 'intra_Bps')}"
    if links.get("seconds") is not None:
        text += f", {links['seconds']:.2g} s"
    if rounds:
        # (a record without paths was timed with small MPI all-to-alls, before the run's own exchanges were)
        how = (f"of the run's own exchanges after compute, world {rounds['world_path']}, server "
               f"{rounds['server_path']}" if "world_path" in rounds else "small exchanges after compute")
        if "gradient_path" in rounds:
            how += f", gradient {rounds['gradient_path']}"
        text += (f"; a round (mean of {rounds['repeats']} {how}, the slowest rank's): world "
                 f"{rounds['world_round_s'] * 1e3:.3g} ms, server {rounds['server_round_s'] * 1e3:.3g} ms, "
                 f"gradient all-reduce {rounds['allreduce_s'] * 1e3:.3g} ms")
    return text

"""Throughput of the cluster primitives for each intra-server transport (not a test).

    mpirun -n 4 .venv/bin/python bench/bench_comm.py --ranks-per-server 2 \
        --out bench-out/comm.json --md bench-out/comm.md

For each transport (gloo, mpi) and message size: intra_exchange (every rank sends one block of the
given size to each server peer), world_exchange (one block to every other rank) and allreduce_ of a
flat float32 buffer of the given size.  Time per call = the slowest rank's wall time (each repetition
starts after a barrier), median over repetitions.  Bytes per call come from the ledger (summed over
ranks), so "job GB/s" = bytes all ranks sent / time.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time

import numpy as np
import torch
from mpi4py import MPI

from granndis_hpc.cluster import Communicator, Ledger, init_topology, main_guard

WIDTH = 256  # float32 columns per row: 1 KiB rows, like a hidden layer of 256 features


def _time_calls(topo, fn, reps: int) -> float:
    fn()  # warm-up (connections, buffers)
    times = []
    for _ in range(reps):
        topo.world.Barrier()
        start = time.perf_counter()
        fn()
        times.append(topo.world.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return float(np.median(times))


def bench_transport(transport: str, ranks_per_server: int, sizes_kib, reps: int) -> list[dict]:
    topo = init_topology(ranks_per_server=ranks_per_server, device="cpu", intra_transport=transport)
    ledger = Ledger()
    comm = Communicator(topo, ledger)
    g, p = topo.ranks_per_server, topo.world_size
    rows_of = {kib: max(1, kib * 1024 // (WIDTH * 4)) for kib in sizes_kib}
    results = []
    for kib in sizes_kib:
        rows = rows_of[kib]
        intra_counts = np.full(g, rows)
        intra_counts[topo.local_rank] = 0
        intra_send = torch.randn(int(intra_counts.sum()), WIDTH)
        world_counts = np.full(p, rows)
        world_counts[topo.rank] = 0
        world_send = torch.randn(int(world_counts.sum()), WIDTH)
        grads = torch.randn(kib * 1024 // 4)
        ops = {
            "intra_exchange": lambda: comm.intra_exchange(intra_send, intra_counts, intra_counts),
            "world_exchange": lambda: comm.world_exchange(world_send, world_counts, world_counts),
            "allreduce_": lambda: comm.allreduce_([grads], bucket_bytes=grads.numel() * 4),
        }
        for name, fn in ops.items():
            ledger.reset()
            seconds = _time_calls(topo, fn, reps)
            job_bytes = sum(sum(v.values()) for v in ledger.reduce(topo.world)["bytes"].values()) // (reps + 1)
            results.append({"transport": transport, "op": name, "message_kib": kib, "seconds": seconds,
                            "job_bytes": int(job_bytes), "job_gbps": job_bytes / seconds / 1e9})
    comm.close()
    topo.close()
    return results


def markdown(results: list[dict], meta: dict) -> str:
    lines = [
        "# Communication benchmark (cluster layer)",
        "",
        f"Command: `{meta['command']}`  ",
        f"Date: {meta['date']}; {meta['ranks']} ranks as {meta['servers']} emulated servers x "
        f"{meta['ranks_per_server']}, CPU tensors, {meta['reps']} repetitions (median of the slowest rank).  ",
        f"Machine: {meta['machine']}, torch {meta['torch']}, {meta['mpi']}.",
        "",
        "**Indicative only**: this machine has 2 cores shared with other jobs, and 4 ranks oversubscribe",
        "them, so absolute numbers are low and noisy; the ratio between transports is what we use.",
        "Message size = one block per peer (exchanges) or the whole buffer (all-reduce).",
        "Job GB/s = payload bytes all ranks sent (ledger convention) / time per call.",
        "",
        "| op | message | gloo ms | mpi ms | gloo job GB/s | mpi job GB/s | mpi speed-up |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    by_key = {(r["op"], r["message_kib"], r["transport"]): r for r in results}
    for op in ("intra_exchange", "world_exchange", "allreduce_"):
        for kib in meta["sizes_kib"]:
            gl, mp = by_key.get((op, kib, "gloo")), by_key.get((op, kib, "mpi"))
            if gl is None or mp is None:
                continue
            lines.append(f"| {op} | {kib} KiB | {gl['seconds'] * 1e3:.2f} | {mp['seconds'] * 1e3:.2f} | "
                         f"{gl['job_gbps']:.3f} | {mp['job_gbps']:.3f} | {gl['seconds'] / mp['seconds']:.1f}x |")
    lines += ["", meta.get("conclusion", ""), ""]
    return "\n".join(lines)


def conclusion(results: list[dict]) -> str:
    """Pick the CPU default by total time over the measured set: an epoch's communication time is
    dominated by its large messages, so a transport that wins small messages by a millisecond but
    loses large ones by tens of milliseconds is the wrong default."""
    total = {t: sum(r["seconds"] for r in results if r["transport"] == t) for t in ("gloo", "mpi")}
    pairs = [(r, q) for r in results for q in results if r["transport"] == "mpi" and q["transport"] == "gloo"
             and (q["op"], q["message_kib"]) == (r["op"], r["message_kib"])]
    wins = [f"{r['op']} {r['message_kib']} KiB" for r, q in pairs if r["seconds"] < q["seconds"]]
    best = min(total, key=total.get)
    return (f"MPI was faster in {len(wins)} of {len(pairs)} measurements ({', '.join(wins) or 'none'}); "
            f"summed over all of them gloo took {total['gloo'] * 1e3:.0f} ms and MPI {total['mpi'] * 1e3:.0f} ms. "
            f"By total time the CPU default intra-server transport "
            f"(granndis_hpc.cluster.topology.CPU_DEFAULT_INTRA_TRANSPORT) should be **{best}**.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks-per-server", type=int, default=2)
    parser.add_argument("--sizes-kib", type=int, nargs="+", default=[4, 256, 4096])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--transports", nargs="+", default=["gloo", "mpi"], choices=["gloo", "mpi"])
    parser.add_argument("--out", default="bench-out/comm.json", help="JSON results")
    parser.add_argument("--md", default="bench-out/performance/comm.md", help="markdown table")
    parser.add_argument("--render", action="store_true",
                        help="only re-render --md from an existing --out JSON (no measurement)")
    args = parser.parse_args()
    if args.render:
        with open(args.out) as f:
            saved = json.load(f)
        saved["meta"]["conclusion"] = conclusion(saved["results"])
        with open(args.md, "w") as f:
            f.write(markdown(saved["results"], saved["meta"]))
        return 0
    torch.set_num_threads(1)
    results = []
    for transport in args.transports:
        results += bench_transport(transport, args.ranks_per_server, args.sizes_kib, args.reps)
    if MPI.COMM_WORLD.Get_rank() == 0:
        size = MPI.COMM_WORLD.Get_size()
        meta = {
            "command": f"mpirun -n {size} python " + " ".join(sys.argv),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "ranks": size, "ranks_per_server": args.ranks_per_server,
            "servers": size // args.ranks_per_server, "reps": args.reps, "sizes_kib": args.sizes_kib,
            "machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores visible",
            # Open MPI's version string ends with a NUL byte: the page would read as binary.
            "torch": torch.__version__, "mpi": MPI.Get_library_version().replace("\0", "").splitlines()[0].strip(),
        }
        meta["conclusion"] = conclusion(results)
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
        with open(args.md, "w") as f:
            f.write(markdown(results, meta))
        print(markdown(results, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main_guard(main))

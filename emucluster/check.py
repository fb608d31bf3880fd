"""The self-check's verdict on an MPI ping-pong measurement of the emulated cluster, and its printout
(standard library only)."""
from __future__ import annotations

from .config import format_rate


def check_measurement(m, servers, ranks_per_server, bps, high=1.15, low=0.5, capacity_Bps=None,
                      with_fatal=False):
    """Problems (list of str) with a ping-pong measurement; empty when shaping holds.

    with_fatal: return (problems, fatal) where fatal says a problem is structural (not load)."""
    problems, fatal = [], False
    hosts = m["hosts"]
    if len(set(hosts)) != servers:
        problems.append(f"Open MPI sees {len(set(hosts))} host(s) ({sorted(set(hosts))}), expected {servers}: "
                        f"the UTS namespaces are not in effect")
        fatal = True
    for s in range(servers):
        mine = set(hosts[s * ranks_per_server:(s + 1) * ranks_per_server])
        if len(mine) != 1:
            problems.append(f"server {s}'s ranks are on several hosts {sorted(mine)}")
            fatal = True
    if bps is not None:
        want = bps / 8
        floor = want if capacity_Bps is None else min(want, capacity_Bps)
        for peer, bw in m["inter_Bps"].items():
            ratio = bw / want
            if ratio > high:
                problems.append(f"inter-server bandwidth to server {peer}: {bw / 1e6:.2f} MB/s = {ratio:.2f}x "
                                f"the configured {format_rate(bps)} ({want / 1e6:.2f} MB/s); allowed at most "
                                f"{high:g}x: the link is not shaped as configured")
                fatal = True
            elif bw < low * floor:
                what = "the configured rate" if floor == want else "this machine's unshaped capacity"
                problems.append(f"inter-server bandwidth to server {peer}: {bw / 1e6:.2f} MB/s = {ratio:.2f}x "
                                f"the configured {format_rate(bps)} ({want / 1e6:.2f} MB/s), under {low:g}x "
                                f"{what} ({floor / 1e6:.2f} MB/s): the link is not shaped as configured "
                                f"(or the machine is too busy to drive it; try again when it is idle)")
        inter_best = max(m["inter_Bps"].values()) if m["inter_Bps"] else 0.0
        if m.get("intra_Bps") is not None and m["intra_Bps"] < 1.5 * inter_best:
            problems.append(f"intra-server bandwidth {m['intra_Bps'] / 1e6:.1f} MB/s is not above the shaped "
                            f"inter-server link ({inter_best / 1e6:.1f} MB/s): ranks inside a server are not "
                            f"using shared memory")
            fatal = True
    return (problems, fatal) if with_fatal else problems


def format_selfcheck(m):
    rate = format_rate(m.get("rate_bps"))
    lines = [f"hosts by rank: {' '.join(m['hosts'])}",
             f"intra-server (rank 0 <-> 1, shared memory): {m['intra_Bps'] / 1e6:9.1f} MB/s"
             if m.get("intra_Bps") is not None else "intra-server: (one rank per server, not measured)"]
    for peer, bw in m["inter_Bps"].items():
        ratio = "" if m.get("rate_bps") is None else f" = {bw / (m['rate_bps'] / 8):.2f}x the {rate} limit"
        lines.append(f"inter-server (server 0 <-> {peer}):            {bw / 1e6:9.2f} MB/s{ratio}")
    lines.append(f"message size {m['bytes']:,} B, {m['reps']} round trips each, best of {m.get('trials', 1)} trials"
                 f" (job {m.get('attempts', 1)})")
    return "\n".join(lines)

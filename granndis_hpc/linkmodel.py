"""The cost model's overlapped limit of an epoch on a measured link (standard library only).

`granndis report` shows it beside each run's measured epoch; bench/cluster/costmodel.py fits the same
model over a link-rate sweep.  With the halo in flight while a layer aggregates the rows it holds, and
gradient buckets reduced during the backward (granndis-train's default), a layer-pass costs
max(its compute, its wire time), not their sum:

    T_overlap = sum over the 2L layer-passes of max(c, w_l) + W_grad

c = C / 2L: the run's compute spread evenly over the forward and backward passes of the L layers (the
record has no per-layer times); w_l = W_halo / 2(L-1) on the layers that exchange (every layer but the
first: layer 0's halo is the static input, exchanged at set-up) and 0 on the first; W_grad = the
gradient bytes' wire time, left additive (the leaders' stage overlaps only the rest of the backward).
It is a *limit*: the compute that needs the halo (the halo edges' products) cannot overlap it, so a
measured epoch is at or above it.  Wire times: the busiest server's inter-server bytes over the link's
sustained payload rate, the busiest rank's intra-server bytes over the shared-memory rate.

The link a run ran on is described by an optional file of its run directory, ``link.json`` (LINK_FILE),
written by whoever measured the link (bench/bench_cluster.py does, from its MPI ping-pong self-check):

    {"label": "100mbit",      # a name for the link setting; runs with the same label form one point
     "rate_bps": 100000000,   # the configured rate in bit/s, or null for an unshaped link
     "bw_Bps": 11500000.0,    # measured inter-server payload bandwidth, bytes/s
     "intra_Bps": 2.1e9}      # measured intra-server (shared-memory) bandwidth, bytes/s (null: not measured,
                              # one rank per server; then runs with intra-server bytes have no limit)
"""
from __future__ import annotations

import math
import os

LINK_FILE = "link.json"
# TCP payload per byte on the wire with a 1500-byte MTU: 1448 (timestamps) of 1514 (+ Ethernet header).
TCP_PAYLOAD_SHARE = 1448 / 1514


def positive(bw, what):
    if bw is None or bw <= 0:
        raise ValueError(f"{what} bandwidth must be positive, got {bw!r}")
    return bw


def link_bandwidth(link):
    """Sustained inter-server payload bytes/s of a link: the ping-pong's, capped at what the shaped rate
    can carry.  The cap matters at slow rates: between round trips tbf's bucket refills, so every
    ping-pong message gets a 64 KiB burst free (25 Mbit/s measured 1.01x nominal), a long exchange not."""
    bw = positive(link["bw_Bps"], "inter-server")
    return bw if link.get("rate_bps") is None else min(bw, link["rate_bps"] / 8 * TCP_PAYLOAD_SHARE)


def busiest_bytes(record):
    """(the busiest server's inter-server bytes, the busiest rank's intra-server bytes) of one epoch
    record (metrics.jsonl); None for either where the record predates those counts."""
    per_server, max_rank = record.get("inter_bytes_per_server"), record.get("max_rank_bytes")
    return (None if per_server is None else int(max(per_server)),
            None if max_rank is None else int(max_rank["intra_halo"] + max_rank["intra_grad"]))


def wire_s(run, bw_inter, bw_intra):
    """Seconds on the links: the busiest server's inter bytes and the busiest rank's intra bytes."""
    if run.get("inter_bytes_max_server") is None or run.get("intra_bytes_max_rank") is None:
        raise ValueError(f"run {run.get('run_dir', '?')} has no per-server / per-rank bytes in its records; "
                         f"rerun it with this version of granndis_hpc (the epoch record's inter_bytes_per_server "
                         f"and max_rank_bytes)")
    return (run["inter_bytes_max_server"] / positive(bw_inter, "inter-server")
            + _intra_s(run["intra_bytes_max_rank"], bw_intra))


def _intra_s(nbytes, bw_intra):
    """Seconds of intra-server bytes; none and no link needed where there are none (1 rank per server)."""
    return 0.0 if not nbytes else nbytes / positive(bw_intra, "intra-server")


def overlap_limit(run, compute_s, bandwidths, servers):
    """T_overlap of the module docstring: sum over layer-passes of max(compute, halo wire) + gradient wire.

    run: {"layers", "bytes": {"inter_grad", "intra_grad", ...}, "inter_bytes_max_server",
    "intra_bytes_max_rank"}; bandwidths: (inter, intra) bytes/s."""
    bw_inter, bw_intra = positive(bandwidths[0], "inter-server"), bandwidths[1]
    layers = int(run.get("layers") or 0)
    if layers < 1:
        raise ValueError(f"run {run.get('run_dir', '?')}: the overlap model needs the run's layer count")
    b = run["bytes"]
    # Gradient bytes are the same on every leader (the ring), so the busiest server's halo share is its
    # inter bytes less one leader's gradient bytes; the busiest rank's intra bytes likewise less the
    # gradient's (an upper bound on its halo bytes: the leader's broadcast is the largest intra grad).
    grad_inter = b["inter_grad"] / servers
    grad_wire = grad_inter / bw_inter + _intra_s(b["intra_grad"] / servers, bw_intra)
    halo_wire = (max(run["inter_bytes_max_server"] - grad_inter, 0) / bw_inter
                 + _intra_s(run["intra_bytes_max_rank"], bw_intra))
    passes, exchanging = 2 * layers, 2 * (layers - 1)
    c = compute_s / passes
    if exchanging == 0:
        return compute_s + halo_wire + grad_wire
    w = halo_wire / exchanging
    return exchanging * max(c, w) + (passes - exchanging) * c + grad_wire


def check_link(link, where, error=ValueError):
    """The link.json object, checked (a clear `error` naming `where` otherwise)."""
    def number(key, optional=False):
        v = link.get(key)
        if v is None and optional:
            return
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise error(f"{where}: {key!r} must be a positive number{' or null' if optional else ''}, found {v!r}")
    if not isinstance(link.get("label"), str) or not link["label"]:
        raise error(f"{where}: 'label' must be a non-empty string, found {link.get('label')!r}")
    number("rate_bps", optional=True)
    number("bw_Bps")
    number("intra_Bps", optional=True)
    return link


def run_limit(summary, record, link, run_dir=""):
    """The overlapped limit (seconds) of a run's epoch on `link`, from its summary.json (layers, servers,
    bytes per epoch, the compute and sampling seconds of its median epoch) and the epoch record whose
    busiest-server / busiest-rank bytes it uses.  The compute is the run's own measured compute: the
    limit says how far the run is from hiding all of its wire time behind it."""
    inter_max, intra_max = busiest_bytes(record)
    if inter_max is None or intra_max is None:
        raise ValueError(f"run {run_dir}: its metrics.jsonl has no per-server / per-rank byte counts "
                         f"(a run of an older version)")
    run = {"run_dir": run_dir, "layers": summary["layers"], "bytes": summary["bytes_per_epoch"],
           "inter_bytes_max_server": inter_max, "intra_bytes_max_rank": intra_max}
    seconds = summary["seconds_per_epoch"]
    compute = seconds["compute"] + seconds.get("sampling", 0.0)
    return overlap_limit(run, compute, (link_bandwidth(link), link["intra_Bps"]), summary["servers"])


def link_path(run_dir):
    return os.path.join(os.fspath(run_dir), LINK_FILE)

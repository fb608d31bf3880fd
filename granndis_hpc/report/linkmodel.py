"""The cost model's overlapped limit of an epoch on a measured link (standard library only).

`granndis report` shows it beside each run's measured epoch; emucluster/costmodel.py computes it
for a sweep with the same function (`overlap_limit`).  It models what the
run actually overlaps (summary.json's plan: overlap on/off, `overlap_halos`) and what cannot overlap:

    T = C + sum over the exchanges e of w_e - hidden_e + W_grad,   hidden_e = min(w_e, window_e)

- C: the run's own compute (+ sampling) seconds.  It is spread over the L layers in proportion to the
  rows each computes (the record's rows_computed, summed over ranks: the row-wise work -- projections,
  bias, activation, dropout -- dominates a layer here), half in the forward and half in the backward:
  c_l per layer and direction.
- The exchanges: every layer but the first exchanges its halo once forward and once backward (layer 0 of
  sage/gcn reads the static input halo, exchanged at set-up; ResSAGE's layer 0 exchanges too).  w_e: the
  layer's share of the epoch's halo wire time, split over the exchanges in proportion to their halo rows
  (the record's halo_rows): world-view layers carry the busiest server's inter-server halo bytes over the
  link's payload rate, every exchanging layer the busiest rank's intra-server bytes over shared memory.
- window_e: the compute that runs while exchange e (layer l) travels, by the engine's order
  (docs/performance/overlap.md): zero where e does not overlap (`--no-overlap`; a server-view layer under the default
  `--overlap-halos world`), else
      c_{l-1} (1 - s_l)  +  c_l (1 - h_l) f_l
  * s_l = send rows / rows layer l - 1 computes (the record's send_rows): boundary-first, layer l - 1
    computes the rows exchange e sends first and posts them; that part (c_{l-1} s_l) cannot overlap e;
  * h_l = halo edges / edges of layer l (halo_edges, edges): the halo columns' product (and the halo
    rows' projection) waits for e, so that share of c_l cannot overlap it;
  * f_l = s_{l+1} where layer l is itself split for an overlapped exchange l + 1 (only its send rows'
    own part runs before it needs e), else 1.
  The backward mirrors the forward (halo gradients posted after the halo part's backward, the own branch
  and the rest rows run while they travel), so it gets the same window.  The windows are disjoint pieces
  of C, so no second of compute hides two exchanges.
- W_grad: the gradient bytes' wire time.  Without overlap it is additive.  With overlap the gradient
  travels in buckets cut between layers (cluster/gradsync.py; summary.json's plan.gradient_buckets_bytes,
  in posting order), and each bucket is posted as soon as its layers' backward is done, so only the
  last bucket has no backward left to hide behind.  The limit (a lower bound) charges W_grad x last
  bucket / all buckets.  Runs that recorded no buckets had one, so W_grad is fully additive for
  them.  The model has no per-message term: each bucket's latency of a few messages is not modelled.
Without overlap T = C + W: the additive model.  It is a *limit* (a lower bound on the epoch): it assumes
the link's full rate while a window lasts.

**Every rank's compute.**  A bulk-synchronous exchange waits for the slowest rank of its
group at every layer, not for one rank's total: on 4 ranks sharing 2 cores the same layer took 0.2-0.86 s
on different ranks, so C taken from one rank (the record's compute_s: the rank with the longest epoch)
is a compute the run cannot achieve.  Where the epoch record has `layer_compute_s` (every rank's compute
per layer and direction, engine/layerclock.py, and its total), the model runs the same order on every
rank's timeline (`timeline`): a compute piece advances each rank by its share of that rank's c_l; an
overlapped exchange's wait ends when every peer of its group (world: all ranks; server: the rank's
server) has posted and its wire time has passed; a blocking one waits for the group's last rank, then
its wire time; each rank's rest (loss, optimizer) runs between forward and backward, and the gradient
all-reduce waits for every rank.  T is the slowest rank's end, + W_grad.  On one rank (or equal ranks)
it is the formula above: each wait's delay is max(0, w_e - window_e) and no window holds another wait,
so the delays add.  Without the per-rank record the one-rank form is used (C spread by rows).

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


# What the epoch record counts per layer for the model (engine/steps.LAYER_COUNT_KEYS, summed over ranks).
COUNT_KEYS = ("rows_computed", "rows_held", "send_rows", "halo_rows", "edges", "halo_edges")
# The exchange groups a run overlapped when its record predates `overlap_halos` (before the option every
# halo overlapped), by the overlap flag.
ALL_GROUPS = ("server", "world")


def layer_counts(record):
    """Per layer {group, rows_computed, rows_held, send_rows, halo_rows, edges, halo_edges} of an epoch
    record's rows_per_layer, summed over ranks (the group: rank 0's, the same on every rank); None where
    the record predates those counts."""
    per_rank = record.get("rows_per_layer")
    if not per_rank or any(key not in per_rank[0] for key in COUNT_KEYS + ("group",)):
        return None
    layers = len(per_rank[0]["rows_computed"])
    return [dict({key: sum(int(r[key][l]) for r in per_rank) for key in COUNT_KEYS}, group=per_rank[0]["group"][l])
            for l in range(layers)]


def overlapped_groups(overlap, overlap_halos):
    """The exchange groups a run overlapped: none without overlap; `overlap_halos` (summary.json's plan
    or config.OVERLAP_HALOS) with it, every group where the run predates the option."""
    if not overlap:
        return frozenset()
    return frozenset(ALL_GROUPS if overlap_halos is None else overlap_halos)


def overlap_limit(run, compute_s, bandwidths, servers, groups=None, per_rank=None):
    """T of the module docstring: the run's compute, plus each exchange's wire time less what its window
    of compute hides, plus the gradient's wire time.

    run: {"layers", "bytes": {"inter_grad", "intra_grad", ...}, "inter_bytes_max_server",
    "intra_bytes_max_rank", "layer_counts" (layer_counts()), "overlap", "overlap_halos", "model"};
    bandwidths: (inter, intra) bytes/s; groups: the exchange groups that overlap (default: the run's own,
    overlapped_groups); with none the result is the additive C + W (with per_rank: the slowest ranks'
    path plus W).  per_rank: an epoch record's `layer_compute_s` (every rank's compute per layer and
    direction, engine/layerclock.py); with it compute_s is not used and the compute is that of the
    per-rank timeline (module docstring), else compute_s spread over the layers by rows on one rank."""
    bw_inter, bw_intra = positive(bandwidths[0], "inter-server"), bandwidths[1]
    layers = int(run.get("layers") or 0)
    if layers < 1:
        raise ValueError(f"run {run.get('run_dir', '?')}: the overlap model needs the run's layer count")
    if groups is None:
        groups = overlapped_groups(run.get("overlap", True), run.get("overlap_halos"))
    b = run["bytes"]
    # Gradient bytes are the same on every leader (the ring), so the busiest server's halo share is its
    # inter bytes less one leader's gradient bytes; the busiest rank's intra bytes likewise less the
    # gradient's (an upper bound on its halo bytes: the leader's broadcast is the largest intra grad).
    grad_inter = b["inter_grad"] / servers
    grad_wire = grad_inter / bw_inter + _intra_s(b["intra_grad"] / servers, bw_intra)
    buckets = run.get("gradient_buckets_bytes")
    if run.get("overlap", True) and buckets and sum(buckets):  # only the last bucket cannot hide
        grad_wire *= buckets[-1] / sum(buckets)
    inter_wire = max(run["inter_bytes_max_server"] - grad_inter, 0) / bw_inter
    intra_wire = _intra_s(run["intra_bytes_max_rank"], bw_intra)
    counts = run.get("layer_counts")
    if per_rank is None and not groups:
        return compute_s + inter_wire + intra_wire + grad_wire
    if counts is None or len(counts) != layers:
        raise ValueError(f"run {run.get('run_dir', '?')}: the overlap model needs the per-layer row and edge "
                         f"counts of its epoch records (rows_per_layer's send_rows, halo_rows, edges, halo_edges); "
                         f"rerun it with this version of granndis_hpc")
    # sage/gcn (PlainGNN): layer 0's halo is static and a layer below an overlapped exchange computes
    # its send rows first; ResSAGE exchanges at layer 0 too and computes every row before posting.
    plain = run.get("model") != "ressage"
    first = 1 if plain else 0
    exchanging = range(first, layers)
    world_halo = sum(counts[l]["halo_rows"] for l in exchanging if counts[l]["group"] == "world")
    all_halo = sum(counts[l]["halo_rows"] for l in exchanging)
    if inter_wire and not world_halo:
        raise ValueError(f"run {run.get('run_dir', '?')}: inter-server halo bytes but no world-view layer")

    def share(part, whole):
        return part / whole if whole else 0.0

    # each exchanging layer's share of the epoch's halo wire, half of it forward and half backward
    wire = {l: ((share(counts[l]["halo_rows"], world_halo) * inter_wire if counts[l]["group"] == "world" else 0.0)
                + share(counts[l]["halo_rows"], all_halo) * intra_wire) / 2 for l in exchanging}
    order = forward_order(counts, plain, groups)
    if per_rank is None:  # one rank: compute_s spread over the layers by rows, half per direction
        rows = sum(c["rows_computed"] for c in counts) or 1
        c = [[compute_s * x["rows_computed"] / rows / 2 for x in counts]]
        fwd, bwd, rest, server = c, c, [0.0], [0]
    else:
        fwd, bwd, server = per_rank["forward"], per_rank["backward"], per_rank["server"]
        if any(len(x) != layers for x in fwd + bwd) or not len(fwd) == len(bwd) == len(server):
            raise ValueError(f"run {run.get('run_dir', '?')}: its layer_compute_s does not have {layers} layers "
                             f"per rank")
        rest = [max(total - sum(f) - sum(g), 0.0) for total, f, g in zip(per_rank["compute"], fwd, bwd)]
    return timeline(order, wire, fwd, bwd, rest, server, [c["group"] for c in counts]) + grad_wire


def forward_order(counts, plain=True, groups=()):
    """The forward's events in the engine's order (docs/performance/overlap.md), per layer l:
    ("compute", l, share of c_l), ("post", l), ("wait", l) for an overlapped exchange, ("block", l) for
    one that blocks.  Boundary-first (plain models, exchange l + 1 overlapped): layer l computes the
    share s = send rows / rows of l + 1's send rows first, posts, then the rest; an overlapped exchange
    l waits after the own-edge part (1 - h_l, h_l = halo edges / edges) of what comes before the post.
    ResSAGE posts layer l's exchange after the whole of layer l - 1.  The backward runs it in reverse,
    every post a wait and every wait a post."""
    layers, first = len(counts), 1 if plain else 0

    def share(part, whole):
        return part / whole if whole else 0.0

    def overlaps(l):
        return first <= l < layers and counts[l]["group"] in groups

    out = []
    for l in range(layers):
        x = counts[l]
        if first <= l and not overlaps(l):
            out.append(("block", l))
        if overlaps(l) and not plain:
            out.append(("post", l))
        s = share(counts[l + 1]["send_rows"], x["rows_computed"]) if plain and overlaps(l + 1) else None
        before = 1.0 if s is None else s  # what layer l computes before posting l + 1 (all: no post)
        if overlaps(l):
            h = share(x["halo_edges"], x["edges"])
            out += [("compute", l, before * (1 - h)), ("wait", l), ("compute", l, before * h)]
        else:
            out.append(("compute", l, before))
        if s is not None:
            out += [("post", l + 1), ("compute", l, 1 - s)]
    return out


def timeline(order, wire, fwd, bwd, rest, server, group_of):
    """The epoch on R ranks' timelines: the forward (order), each rank's rest (loss, optimizer), the
    backward (order reversed), then the gradient's all-reduce waits for every rank.  A compute piece
    advances each rank by its share of that rank's c_l; an overlapped exchange's wait ends when every
    peer of its group (world: all ranks; server: the rank's server) has posted and its wire time
    `wire[l]` has passed; a blocking one waits for the group's last rank and then its wire time.
    fwd / bwd: [R][L] seconds; rest: [R]; server: [R] server of each rank.  Returns the slowest rank's
    end.  On one rank it is C + sum of max(0, wire - window) per exchange and direction."""
    t = [0.0] * len(server)

    def members(l, r):
        return range(len(t)) if group_of[l] == "world" else [q for q in range(len(t)) if server[q] == server[r]]

    def run(events, c, kind_map):
        posted = {}
        for ev in events:
            kind = kind_map.get(ev[0], ev[0])
            if kind == "compute":
                for r in range(len(t)):
                    t[r] += ev[2] * c[r][ev[1]]
            elif kind == "post":
                posted[ev[1]] = list(t)
            elif kind == "wait":
                at = posted.pop(ev[1])
                t[:] = [max(t[r], max(at[q] for q in members(ev[1], r)) + wire[ev[1]]) for r in range(len(t))]
            else:  # block
                t[:] = [max(t[q] for q in members(ev[1], r)) + wire[ev[1]] for r in range(len(t))]

    run(order, fwd, {})
    for r in range(len(t)):
        t[r] += rest[r]
    run(order[::-1], bwd, {"post": "wait", "wait": "post"})
    return max(t)


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
    """The limit (seconds) of a run's epoch on `link`, from its summary.json (layers, servers, model, plan:
    overlap and overlap_halos, bytes per epoch, the compute and sampling seconds of its median epoch) and
    the epoch record whose busiest-server / busiest-rank bytes and per-layer counts it uses.  The compute
    is the run's own measured compute: the limit says how far the run is from hiding what its order
    allows it to hide."""
    inter_max, intra_max = busiest_bytes(record)
    if inter_max is None or intra_max is None:
        raise ValueError(f"run {run_dir}: its metrics.jsonl has no per-server / per-rank byte counts "
                         f"(a run of an older version)")
    plan = summary.get("plan", {})
    run = {"run_dir": run_dir, "layers": summary["layers"], "bytes": summary["bytes_per_epoch"],
           "inter_bytes_max_server": inter_max, "intra_bytes_max_rank": intra_max, "model": summary.get("model"),
           "layer_counts": layer_counts(record), "overlap": plan.get("overlap", True),
           "overlap_halos": plan.get("overlap_halos"), "gradient_buckets_bytes": plan.get("gradient_buckets_bytes")}
    seconds = summary["seconds_per_epoch"]
    compute = seconds["compute"] + seconds.get("sampling", 0.0)
    return overlap_limit(run, compute, (link_bandwidth(link), link["intra_Bps"]), summary["servers"],
                         per_rank=record.get("layer_compute_s"))


def link_path(run_dir):
    return os.path.join(os.fspath(run_dir), LINK_FILE)

"""The cost model's overlapped limit of an epoch on a measured link (standard library only).

`granndis report` shows it beside each run's measured epoch; bench/cluster/costmodel.py and
bench/overlap_pairs.py compute it for a sweep with the same function (`overlap_limit`).  It models what the
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
  (docs/overlap.md): zero where e does not overlap (`--no-overlap`; a server-view layer under the default
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
- W_grad: the gradient bytes' wire time, additive (one bucket on these models, final only at the end of
  the backward).
Without overlap T = C + W: the additive model.  It is a *limit* (a lower bound on the epoch): it assumes
the link's full rate while a window lasts and no waiting for slower ranks.

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


def overlap_limit(run, compute_s, bandwidths, servers, groups=None):
    """T of the module docstring: the run's compute, plus each exchange's wire time less what its window
    of compute hides, plus the gradient's wire time.

    run: {"layers", "bytes": {"inter_grad", "intra_grad", ...}, "inter_bytes_max_server",
    "intra_bytes_max_rank", "layer_counts" (layer_counts()), "overlap", "overlap_halos", "model"};
    bandwidths: (inter, intra) bytes/s; groups: the exchange groups that overlap (default: the run's own,
    overlapped_groups); with none the result is the additive C + W."""
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
    inter_wire = max(run["inter_bytes_max_server"] - grad_inter, 0) / bw_inter
    intra_wire = _intra_s(run["intra_bytes_max_rank"], bw_intra)
    counts = run.get("layer_counts")
    if not groups:
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
    rows = sum(c["rows_computed"] for c in counts) or 1
    c = [compute_s * x["rows_computed"] / rows / 2 for x in counts]  # per layer and direction
    world_halo = sum(counts[l]["halo_rows"] for l in exchanging if counts[l]["group"] == "world")
    all_halo = sum(counts[l]["halo_rows"] for l in exchanging)
    if inter_wire and not world_halo:
        raise ValueError(f"run {run.get('run_dir', '?')}: inter-server halo bytes but no world-view layer")

    def share(part, whole):
        return part / whole if whole else 0.0

    def overlaps(l):
        return first <= l < layers and counts[l]["group"] in groups

    exposed = 0.0
    for l in exchanging:
        x = counts[l]
        # the layer's share of the epoch's halo wire, half of it forward and half backward
        wire = ((share(x["halo_rows"], world_halo) * inter_wire if x["group"] == "world" else 0.0)
                + share(x["halo_rows"], all_halo) * intra_wire) / 2
        window = 0.0
        if overlaps(l):
            # boundary-first: layer l - 1 computes and posts the send rows, then the rest while they travel
            below = c[l - 1] * (1 - share(x["send_rows"], counts[l - 1]["rows_computed"])) if plain else 0.0
            split = share(counts[l + 1]["send_rows"], x["rows_computed"]) if plain and overlaps(l + 1) else 1.0
            window = below + c[l] * (1 - share(x["halo_edges"], x["edges"])) * split
        exposed += 2 * max(wire - window, 0.0)  # forward and backward
    return compute_s + exposed + grad_wire


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
           "overlap_halos": plan.get("overlap_halos")}
    seconds = summary["seconds_per_epoch"]
    compute = seconds["compute"] + seconds.get("sampling", 0.0)
    return overlap_limit(run, compute, (link_bandwidth(link), link["intra_Bps"]), summary["servers"])


def link_path(run_dir):
    return os.path.join(os.fspath(run_dir), LINK_FILE)

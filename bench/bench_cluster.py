"""fb, flx, eas and cob side by side on an emulated 2-server cluster, at several link rates (not a test).

    make bench-cluster        # = python bench/bench_cluster.py (root; ~20 min on a busy 2-core machine)

Builds the shard sets once (synthetic DC-SBM graph, 2 servers x 2 GPUs, METIS), sets up the emulated
cluster (emucluster/: a network + UTS namespace per server, one veth, tc tbf on both egresses), then
runs one round per rate: re-shapes the link, measures it (MPI ping-pong self-check; the run stops if
shaping does not hold) and trains every mode back to back under emu-mpirun (4 ranks, 2 per server,
servers found by Open MPI from the hostnames).  The rounds alternate between the fast and the slow end of
the rates and end with the unshaped round again (`round_order`): the machine is shared, and its load
drifts during a sweep; the cost model (emucluster/costmodel.py) fits each round's load from the
round's modes.  Writes bench-out/cluster/sweep.json and the markdown page (tables, cost model, the exact
commands), and into every run directory (bench-out/cluster/runs/RATE/MODE; the repeated unshaped round's
under repeat/) a link.json, the link it ran on (granndis_hpc/report/linkmodel.py), so that
`granndis report --sweep bench-out/cluster/runs` draws speedup against link rate from the runs themselves.

Epoch time = median over the epochs after the first; evaluation runs on the last epoch only (not timed
in an epoch) and gives the test accuracy.  The cluster is torn down on exit, failure or SIGTERM.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import time

from harness import ENV, REPO

from granndis_hpc.report.linkmodel import LINK_FILE  # noqa: E402

from emucluster import cluster as emucluster, costmodel  # noqa: E402

# Shard sets: name -> preprocess arguments (beyond the graph and cluster shape).  Add a row per set.
SHARD_SETS = {
    "full": ["--preload", "full"],
    "eas": ["--preload", "eas", "--hops", "1", "--eas-fanout", "15"],
    # Flexible Preloading with k < L: k-hop preloads of a 3-layer model (flx then runs k layers on the
    # preload and the rest with the world exchange).
    "full-k1": ["--preload", "full", "--hops", "1"],
    "full-k2": ["--preload", "full", "--hops", "2"],
}
# Modes of the sweep: name -> (shard set, granndis-train arguments, in the default list?).
# fb is the baseline every speedup is measured against.  flx k=1..L-1: --modes fb,flx,flx-k1,flx-k2.
MODES = {
    "fb": ("full", ["--mode", "fb"], True),
    "flx": ("full", ["--mode", "flx"], True),
    "eas": ("eas", ["--mode", "eas"], True),
    "cob": ("full", ["--mode", "cob", "--batches-per-epoch", "2", "--fanout", "10"], True),
    "flx-k1": ("full-k1", ["--mode", "flx"], False),
    "flx-k2": ("full-k2", ["--mode", "flx"], False),
    # Overlap of communication with computation (docs/performance/overlap.md): the modes above run
    # with it (the default); these rows are today's order (--no-overlap) and half-width halos.
    "fb-noovl": ("full", ["--mode", "fb", "--no-overlap"], False),
    # fb's halo on the direct route (every reading rank gets its own copy across servers; the default
    # per-server route sends a row once per server: docs/performance/halo-route.md).
    "fb-direct": ("full", ["--mode", "fb", "--halo-route", "direct"], False),
    "fb-bf16": ("full", ["--mode", "fb", "--halo-dtype", "bfloat16"], False),
    "flx-noovl": ("full", ["--mode", "flx", "--no-overlap"], False),
    "flx-k1-noovl": ("full-k1", ["--mode", "flx", "--no-overlap"], False),
    "flx-k1-bf16": ("full-k1", ["--mode", "flx", "--halo-dtype", "bfloat16"], False),
    "eas-noovl": ("eas", ["--mode", "eas", "--no-overlap"], False),
}
DEFAULT_RATES = "unshaped,1gbit,250mbit,100mbit,50mbit,25mbit"


def parse_modes(text):
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown mode(s) {', '.join(unknown)}; known: {', '.join(MODES)} "
                         f"(add a row to MODES in bench/bench_cluster.py)")
    if "fb" not in modes:
        raise ValueError("--modes must include fb: every speedup is measured against it")
    if len(set(modes)) != len(modes):
        raise ValueError(f"--modes lists a mode twice: {text}")
    return ["fb"] + [m for m in modes if m != "fb"]


def parse_rates(text):
    """[(label, bits/s or None)], fastest first: unshaped, the first round (the load reference, and
    what the previous model takes every mode's local seconds from), then the rates high to low."""
    out = []
    for label in (t.strip() for t in text.split(",") if t.strip()):
        bps = emucluster.parse_rate(label)
        out.append((emucluster.format_rate(bps), bps))
    if not any(b is None for _, b in out):
        raise ValueError("--rates must include 'unshaped': it is the sweep's first and last round (the cost "
                         "model's load reference and drift check) and the machine's link capacity")
    if len({b for _, b in out}) != len(out):
        raise ValueError(f"--rates lists a rate twice: {text}")
    return sorted(out, key=lambda lb: (0, 0) if lb[1] is None else (1, -lb[1]))


def round_order(rates, repeat=True):
    """[(label, bits/s, is_repeat)]: the rates (fastest first) taken alternately from the fast and the slow
    end, then the unshaped one again.  The machine is shared and its load drifts over a sweep; swept
    fast to slow, the drift would look like an effect of the rate.  The repeat measures the drift."""
    order, lo, hi = [], 0, len(rates) - 1
    while lo <= hi:
        order.append(rates[lo])
        if hi != lo:
            order.append(rates[hi])
        lo, hi = lo + 1, hi - 1
    out = [(label, bps, False) for label, bps in order]
    if repeat:
        out += [(f"{label}-repeat", bps, True) for label, bps in rates if bps is None]
    return out


def all_rounds(sweep):
    return sweep["rates"] + sweep.get("repeat", [])


def steps_per_epoch(run_dir):
    """Steps per epoch of a run (its config.json): batches per epoch in a batched mode, else 1."""
    from granndis_hpc.engine.modes import MODES as TRAIN_MODES, BatchedMode

    with open(os.path.join(run_dir, "config.json")) as f:
        cfg = json.load(f)
    return int(cfg["batches_per_epoch"]) if issubclass(TRAIN_MODES[cfg["mode"]], BatchedMode) else 1


def run_config(run_dir):
    """What the cost model needs of a run's config.json and summary.json: layers, model, whether it
    overlapped and which exchange groups (summary.json's plan.overlap_halos; None before the option,
    when every halo overlapped), and its gradient buckets' bytes (plan.gradient_buckets_bytes; None for
    runs that recorded no buckets: one bucket)."""
    with open(os.path.join(run_dir, "config.json")) as f:
        cfg = json.load(f)
    plan = {}
    if os.path.exists(os.path.join(run_dir, "summary.json")):
        with open(os.path.join(run_dir, "summary.json")) as f:
            plan = json.load(f).get("plan", {})
    return {"layers": int(cfg["layers"]), "model": cfg.get("model"),
            "overlap": not cfg.get("no_overlap", True) if "overlap" not in cfg else bool(cfg["overlap"]),
            "overlap_halos": plan.get("overlap_halos"), "halo_dtype": cfg.get("halo_dtype", "float32"),
            "gradient_buckets_bytes": plan.get("gradient_buckets_bytes")}


def run(cmd, log, timeout, capture=False):
    print("+", " ".join(cmd), flush=True)
    log.append(" ".join(cmd))
    # `timeout` bounds the command; emucluster.run_bounded passes a SIGTERM of the sweep on to it.
    p = emucluster.run_bounded(["timeout", "--kill-after=15", str(int(timeout)), *cmd], env=ENV, capture=capture,
                               cwd=REPO)
    if p.returncode != 0:
        tail = ((p.stdout or "") + (p.stderr or ""))[-3000:] if capture else ""
        raise RuntimeError(f"command failed ({p.returncode}): {' '.join(cmd)}\n{tail}")
    return p


def read_records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def load_line(sweep):
    """What the machine's load was (other jobs share its cores): say it beside the numbers."""
    start, end = sweep.get("loadavg_start"), sweep.get("loadavg_end")
    if not start or not end:
        return "The machine's load average was not recorded."
    fmt = lambda la: " / ".join(f"{x:.1f}" for x in la)  # noqa: E731
    return (f"Load average (1 / 5 / 15 min) before the sweep: {fmt(start)}; after: {fmt(end)}; 2 cores "
            f"(4 ranks of this sweep and other jobs).")


def fmt_rate_col(rate):
    if rate["rate_bps"] is None:
        return f"{rate['label']} ({rate['bw_Bps'] * 8 / 1e6:,.0f} Mbit/s measured)"
    return rate["label"]


def _model_table(rates, modes, predicted, error, tag="", why=""):
    """Measured vs predicted epoch time per rate and mode, and the largest error (the last line)."""
    lines = ["| link rate | " + " | ".join(f"{m} meas / pred (err)" for m in modes) + " |",
             "|---|" + "---:|" * len(modes)]
    off = []
    for r in rates:
        cells = []
        for m in modes:
            x = r["runs"][m]
            cells.append(f"{x['epoch_s']:.3f} / {x[predicted]:.3f} ({x[error] * 100:+.0f} %)")
            if abs(x[error]) > 0.25:
                off.append(f"{m} at {r['label']}")
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    worst = max(abs(x[error]) for r in rates for x in r["runs"].values())
    lines += ["", f"Largest error{tag}: {worst * 100:.0f} %. "
              + (f"Off by more than 25 %: {', '.join(off)}{why}." if off else "Every prediction is within 25 %.")]
    return lines


def render(sweep, argv):
    """The markdown page of a sweep."""
    g, rates, modes = sweep["graph"], sweep["rates"], sweep["modes"]
    rounds = all_rounds(sweep)  # the rates fastest first, then the repeated unshaped round
    L = [f"# Speedup on an emulated 2-server cluster ({sweep['date']})", "",
         f"Synthetic graph (`--generator {g.get('generator', 'sbm')}`), {g['vertices']:,} vertices, "
         f"{g['layers']}-layer SAGE, hidden {g['hidden']}, "
         f"{g['epochs']} epochs per run (median epoch time over epochs 1..{g['epochs'] - 1}; test accuracy "
         f"after epoch {g['epochs'] - 1}). 2 servers x {g.get('ranks_per_server', 2)} rank(s); each server is a "
         "network + UTS namespace, the "
         f"servers are joined by one veth shaped with `tc tbf` on both egresses, ranks inside a server use "
         f"shared memory (see `docs/emulated-cluster.md`). One 2-core machine shared with other jobs: times are "
         f"indicative, bytes are exact ledger counts (summed over ranks, per epoch).", "",
         f"Run as rounds, one rate per round with every mode back to back, in the order "
         f"{', '.join(sweep.get('round_order', [r['label'] for r in rates]))} (fast and slow rates alternate, so "
         f"a drift of the machine's load is not read as an effect of the rate). "
         + load_line(sweep), ""]
    L += ["## Link check (MPI ping-pong, emucluster/pingpong.py)", "",
          "| link rate | inter-server MB/s | x nominal | intra-server MB/s |", "|---|---:|---:|---:|"]
    for r in rounds:
        pp = r["pingpong"]
        nominal = "" if r["rate_bps"] is None else f"{r['bw_Bps'] / (r['rate_bps'] / 8):.2f}"
        intra = pp.get("intra_Bps")
        L.append(f"| {r['label']} | {r['bw_Bps'] / 1e6:,.2f} | {nominal} | "
                 f"{'' if intra is None else f'{intra / 1e6:,.0f}'} |")
    L += ["", "## Epoch time and speedup over fb", "",
          "| link rate | " + " | ".join(f"{m} (s)" for m in modes) + " | " +
          " | ".join(f"{m} speedup" for m in modes if m != "fb") + " | fb inter share |",
          "|---|" + "---:|" * (2 * len(modes) - 1 + 1)]
    for r in rounds:
        sp = costmodel.speedups(r)
        L.append(f"| {fmt_rate_col(r)} | " + " | ".join(f"{r['runs'][m]['epoch_s']:.3f}" for m in modes) + " | "
                 + " | ".join(f"**{sp[m]:.2f}x**" for m in modes if m != "fb") +
                 f" | {costmodel.inter_share(r['runs']['fb']) * 100:.0f} % |")
    L += ["", "## Breakdown per epoch (s), bytes per link class, accuracy", "",
          "| link rate | mode | epoch | compute | sampling | intra comm | inter comm | grad sync | intra halo (B) | "
          "inter halo (B) | intra grad (B) | inter grad (B) | test acc |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rounds:
        for m in modes:
            x, b = r["runs"][m], r["runs"][m]["bytes"]
            acc = "" if x["test_acc"] is None else f"{x['test_acc']:.3f}"
            L.append(f"| {r['label']} | {m} | {x['epoch_s']:.3f} | {x['compute']:.3f} | {x['sampling']:.3f} | "
                     f"{x['intra_comm']:.3f} | {x['inter_comm']:.3f} | {x['grad_sync']:.3f} | {b['intra_halo']:,} | "
                     f"{b['inter_halo']:,} | {b['intra_grad']:,} | {b['inter_grad']:,} | {acc} |")
    L += ["", "## Cost model: predicted vs measured epoch time", "",
          "T = rows x k(mode) x f(round) + B_intra / bw_intra + B_inter / bw_inter: rows = rows computed per epoch "
          "(all ranks, layers and steps; exact), k = the mode's cost per row (fitted on its runs at the *other* "
          "rates), f = the round's load factor (fitted on the *other* modes of the round), B_inter = the busiest "
          "server's inter-server bytes, B_intra = the busiest rank's intra-server bytes (exact, from the ledger), "
          "bw = the round's ping-pong bandwidths (table above; inter capped at the rate's TCP payload). Every run "
          "is predicted from the others only (leave-one-out). `emucluster/costmodel.py` has the reasoning.", ""]
    L += _model_table(rounds, modes, "predicted_s", "model_error",
                      why=" (see docs/emulated-cluster.md, 'When the model is off')")
    fit = sweep.get("model_fit")
    if fit:
        by_round = {r.get("round", i): (r, f) for i, (r, f) in enumerate(zip(rounds, fit["load_factor"]))}
        L += ["", "Fitted on all runs: the load factor of every round, in the order the rounds ran (1 = the "
              "first round), beside the machine's 1-minute load average when the round started; and each mode's "
              "cost per row at the first round's load.", "",
              "| round | link rate | load average | load factor f |", "|---:|---|---:|---:|"]
        for i in sorted(by_round):
            r, f = by_round[i]
            load = r.get("loadavg_1min")
            L.append(f"| {i} | {r['label']} | {'' if load is None else f'{load:.1f}'} | {f:.2f} |")
        L += ["", "| mode | rows per epoch | k (us per row) |", "|---|---:|---:|"]
        L += [f"| {m} | {rounds[0]['runs'][m]['rows']:,} | {fit['cost_per_row_s'][m] * 1e6:.2f} |" for m in modes]
    if all("overlap_limit_s" in x for r in rounds for x in r["runs"].values()):
        L += ["", "Overlap limit (compute + the halo wire each exchange's window of compute cannot hide + gradient "
              "wire, for the exchanges the run overlapped; granndis_hpc/report/linkmodel.py): measured epoch / limit "
              "per "
              "run, marked * where the run overlapped. "
              "A run that overlaps is at or above its limit; one that does not is near the additive model.", "",
              "| link rate | " + " | ".join(f"{m} meas / limit" for m in modes) + " |", "|---|" + "---:|" * len(modes)]
        for r in rounds:
            L.append(f"| {r['label']} | " + " | ".join(
                f"{r['runs'][m]['epoch_s']:.3f} / {r['runs'][m]['overlap_limit_s']:.3f} = "
                f"{r['runs'][m]['measured_over_limit']:.2f}{'*' if r['runs'][m].get('overlap') else ''}"
                for m in modes) + " |")
    L += ["", "For comparison, the previous model (C + T_intra of the mode's unshaped run, which counts waits "
          "for the link twice, + total inter bytes / 2 / bw):", ""]
    L += _model_table(rounds, modes, "predicted_unshaped_s", "model_error_unshaped", " (previous model)")
    paper = costmodel.paper_like_rates(rates)
    L += ["", "## At the paper's communication share", "",
          f"The paper measured FB spending {costmodel.PAPER_SHARE[0] * 100:.0f}-{costmodel.PAPER_SHARE[1] * 100:.0f} % "
          f"of its epoch on inter-server communication on its 10 GbE GPU cluster. Here fb does so at: "
          f"{', '.join(paper) if paper else 'none of the measured rates'}.", "",
          "| link rate | fb inter share | " + " | ".join(f"{m} speedup" for m in modes if m != "fb") + " |",
          "|---|---:|" + "---:|" * (len(modes) - 1)]
    for r in rates:
        if r["label"] in paper:
            sp = costmodel.speedups(r)
            L.append(f"| {r['label']} | {costmodel.inter_share(r['runs']['fb']) * 100:.0f} % | "
                     + " | ".join(f"{sp[m]:.2f}x" for m in modes if m != "fb") + " |")
    L += ["", "Paper (AE cluster, 10 GbE, FLX over FB): "
          + ", ".join(f"{k} {v:.2f}x" for k, v in costmodel.PAPER_FLX_SPEEDUP.items()) + ".", ""]
    if sweep.get("skipped"):
        L += ["## Rates left out", "", "The self-check could not verify these links (after 3 ping-pong jobs), so "
              "no training numbers were taken there:", ""]
        L += [f"- {s['label']}: {'; '.join(s['problems'])}" for s in sweep["skipped"]] + [""]
    L += ["## Commands", "", "```", f"python bench/bench_cluster.py {' '.join(argv)}".rstrip(), *sweep["log"], "```",
          ""]
    return "\n".join(L)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vertices", type=int, default=20000)
    p.add_argument("--generator", choices=("sbm", "local"), default="sbm",
                   help="synthetic generator (local: the locality of real graphs, docs/performance/locality.md)")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--epochs", type=int, default=8, help="per run; the first is left out of the median")
    p.add_argument("--rates", default=DEFAULT_RATES, help="comma-separated; must include unshaped")
    p.add_argument("--modes", default=",".join(m for m, (_, _, on) in MODES.items() if on),
                   help=f"comma-separated, from: {', '.join(MODES)}")
    p.add_argument("--no-repeat", action="store_true",
                   help="leave out the second unshaped round at the end (it measures the load drift of the sweep)")
    p.add_argument("--run-timeout", type=int, default=300, help="seconds per training run")
    p.add_argument("--ranks-per-server", type=int, choices=(1, 2), default=2,
                   help="ranks on each of the 2 emulated servers (1: a core per rank on this 2-core machine; "
                        "its shard sets are built apart, suffix -1rps)")
    p.add_argument("--reverse-modes", action="store_true",
                   help="start the first round with the modes in reverse order (alternating passes: each mode "
                        "runs first in a round as often as last)")
    p.add_argument("--reuse-shards", action="store_true",
                   help="keep shard sets already built in --work (same options: the caller's responsibility)")
    p.add_argument("--work", default=os.path.join(REPO, "bench-out", "cluster"))
    p.add_argument("--out", default=os.path.join(REPO, "docs", "bench-cluster.md"))
    p.add_argument("--from-json", default=None, metavar="SWEEP_JSON",
                   help="no runs: recompute the cost model and rewrite the page from a saved sweep.json")
    args = p.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            sweep = json.load(f)
        for rnd in all_rounds(sweep):  # what the cost model needs of each run, read from the run itself
            for run_ in rnd["runs"].values():
                if os.path.exists(os.path.join(run_.get("run_dir", ""), "config.json")):
                    run_.update(run_config(run_["run_dir"]))
        sweep["model_fit"] = costmodel.model_sweep(all_rounds(sweep), servers=sweep["graph"]["servers"])
        with open(args.from_json, "w") as f:
            json.dump(sweep, f, indent=1)
        page = render(sweep, sweep.get("argv", [])) + f"\nWhole sweep: {sweep['wall_s'] / 60:.1f} min wall.\n"
        with open(args.out, "w") as f:
            f.write(page)
        print(page)
        return 0
    try:
        modes, rates = parse_modes(args.modes), parse_rates(args.rates)
        if args.epochs < 2:
            raise ValueError("--epochs must be at least 2 (the first epoch is left out)")
        emucluster.preflight()
    except ValueError as exc:
        p.error(str(exc))
    except emucluster.EmuError as exc:
        print(f"bench_cluster: cannot run here: {exc}", file=sys.stderr)
        return exc.code
    os.environ.update(ENV)  # the self-check's mpirun reads os.environ (root needs OMPI_ALLOW_RUN_AS_ROOT)
    py, log, started = sys.executable, [], time.monotonic()
    shards = {}
    for m in modes:
        name = MODES[m][0]
        if name not in shards:
            suffix = "" if args.ranks_per_server == 2 else f"-{args.ranks_per_server}rps"
            shards[name] = os.path.join(args.work, f"shards-{name}{suffix}")
            if args.reuse_shards and os.path.exists(os.path.join(shards[name], "manifest.json")):
                log.append(f"(reused {shards[name]})")
                continue
            run(["mpirun", "-n", "2", py, "-m", "granndis_hpc.preprocess", "build", "--source", "synthetic",
                 "--vertices",
                 str(args.vertices), "--seed", "0", "--servers", "2", "--gpus-per-server", str(args.ranks_per_server),
                 "--layers", str(args.layers), "--partitioner", "metis", "--out", shards[name], "--overwrite",
                 "--generator", args.generator, *SHARD_SETS[name]], log, timeout=600)
    common = ["--model", "sage", "--layers", str(args.layers), "--hidden", str(args.hidden), "--epochs",
              str(args.epochs), "--eval-every", str(args.epochs), "--lr", "0.01", "--dropout", "0.5", "--quiet"]
    emucluster.install_signal_teardown()
    sweep = {"date": str(datetime.date.today()), "modes": modes, "rates": [], "repeat": [], "log": log, "argv": argv,
             "skipped": [], "loadavg_start": list(os.getloadavg()),
             # the progress thread's polling (cluster/pending.py), where a benchmark sets it
             "progress_poll": os.environ.get("GRANNDIS_PROGRESS_POLL", ""),
             "graph": {"vertices": args.vertices, "generator": args.generator, "layers": args.layers,
                       "hidden": args.hidden,
                       "epochs": args.epochs, "servers": 2, "ranks_per_server": args.ranks_per_server}}
    capacity = None  # unshaped inter-server bandwidth: the most this machine can drive
    plan = round_order(rates, repeat=not args.no_repeat)
    sweep["round_order"] = [label for label, _, _ in plan]
    for old in ("runs", "repeat"):  # runs of an earlier sweep would join this one's report
        shutil.rmtree(os.path.join(args.work, old), ignore_errors=True)
    try:
        emucluster.setup(2, None)
        log.append("emucluster/emu-cluster setup --servers 2 --rate unshaped")
        for i, (label, bps, repeat) in enumerate(plan):
            emucluster.shape(bps)
            log.append(f"emucluster/emu-cluster shape --rate {emucluster.format_rate(bps)} && "
                       f"emucluster/emu-cluster selfcheck")
            load = os.getloadavg()[0]
            pp = emucluster.selfcheck(args.ranks_per_server, python=py, capacity_Bps=capacity)
            print(emucluster.format_selfcheck(pp), flush=True)
            if pp["problems"] and (pp["fatal"] or bps is None):
                raise RuntimeError("the emulated cluster is not what it should be:\n  " + "\n  ".join(pp["problems"]))
            if pp["problems"]:  # too slow after retries: a busy machine; no numbers from an unverified link
                sweep["skipped"].append({"label": label, "problems": pp["problems"]})
                print(f"   {label}: skipped, the link could not be verified", flush=True)
                continue
            if capacity is None and bps is None:
                capacity = pp["inter_Bps"]["1"]
            entry = {"label": label, "rate_bps": bps, "bw_Bps": pp["inter_Bps"]["1"], "pingpong": pp, "runs": {},
                     "round": i, "loadavg_1min": load}
            # Every mode back to back at this rate; alternate rounds reverse the order, so no mode is
            # always the first (or the last) of a round.
            for m in (modes if (i + args.reverse_modes) % 2 == 0 else modes[::-1]):
                shard_set, extra, _ = MODES[m]
                run_dir = os.path.join(args.work, "repeat" if repeat else "runs", label, m)
                run([os.path.join(REPO, "emucluster", "emu-mpirun"), "-n", str(2 * args.ranks_per_server),
                     "--emu-timeout",
                     str(args.run_timeout), py, "-m", "granndis_hpc.cli", "train", "--shards", shards[shard_set],
                     *extra, *common, "--out", run_dir], log, timeout=args.run_timeout + 60)
                with open(os.path.join(run_dir, LINK_FILE), "w") as f:  # the run's own record of its link
                    json.dump({"label": label, "rate_bps": bps, "bw_Bps": entry["bw_Bps"],
                               "intra_Bps": pp["intra_Bps"]}, f)
                entry["runs"][m] = dict(costmodel.summarize_run(read_records(run_dir), steps_per_epoch(run_dir)),
                                        run_dir=run_dir, **run_config(run_dir))
                print(f"   {label} {m}: epoch {entry['runs'][m]['epoch_s']:.3f} s", flush=True)
            entry["runs"] = {m: entry["runs"][m] for m in modes}  # table order
            (sweep["repeat"] if repeat else sweep["rates"]).append(entry)
            with open(os.path.join(args.work, "sweep.partial.json"), "w") as f:  # survives a stopped sweep
                json.dump(sweep, f, indent=1)
    finally:
        emucluster.teardown()
    sweep["rates"].sort(key=lambda r: (0, 0) if r["rate_bps"] is None else (1, -r["rate_bps"]))
    sweep["loadavg_end"] = list(os.getloadavg())
    sweep["model_fit"] = costmodel.model_sweep(all_rounds(sweep), servers=2)
    sweep["wall_s"] = time.monotonic() - started
    os.makedirs(args.work, exist_ok=True)
    with open(os.path.join(args.work, "sweep.json"), "w") as f:
        json.dump(sweep, f, indent=1)
    page = render(sweep, argv) + f"\nWhole sweep: {sweep['wall_s'] / 60:.1f} min wall.\n"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(page)
    print(page)
    print(f"sweep: {os.path.join(args.work, 'sweep.json')}\npage: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

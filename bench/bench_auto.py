"""--mode auto's choice against every option it chooses among, on an emulated 2-server cluster (not a test).

    python bench/bench_auto.py     # root; ~15 min on a busy 2-core machine with the defaults

For each graph (Cora from tests/data; the demo's synthetic graph at --vertices) it builds two shard sets
(full 3-hop preload, and EAS h=1 f=15; 2 servers x 2 GPUs, METIS), sets up the emulated cluster
(emucluster/, its own instance: docs/emulated-cluster.md), and at every link rate of --rates runs, under
emu-mpirun (4 ranks, 2 per server), each option auto's table lists (fb; flx k=1..L on the full set; eas;
cob with the fewest co-batches) and before them `--mode auto --shards FULL,EAS` (the time rule, the default).
Recorded per run: the measured epoch time (median of the epochs after the first); from auto's run:
its choice, its predicted epoch per option, the rates it measured, and its own measured epoch.  The
verdict per (graph, rate): auto's choice is "within 10 %" when the measured epoch of the option it
chose is at most 1.1x the fastest measured option, and "not slower than fb" when it is at most fb's.

The products-size graph (`--graphs products`: bench_products.py's graph, built with its preset, trained as
configs/products.toml) runs auto once per rate and each option auto lists once over every rate, the link
re-shaped between them (bench/auto_reshaped.py), plus runs for their exact ledger bytes alone (fb on the
direct route, fb's partial payloads); e.g., root, beside rounds of the other graphs already in --json:

    python bench/bench_auto.py --graphs products --merge --reuse-shards --over-estimate --min-available-gib 2.5 \
        --timeout 3600 --run-timeout 900

Writes --json (bench/results/auto.json) after every run, and the page --out (docs/performance/auto.md);
--from-json rewrites the page from a saved one; --merge puts a sweep's rounds into --json by (graph, rate)
beside the other graphs' rounds.  The cluster is torn down on exit, failure or SIGTERM.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

# Its own emulated cluster, so that a benchmark on the default instance can run beside it (set before
# bench_products is imported, which names its own).
os.environ.setdefault("GRANNDIS_EMU_INSTANCE", "auto")
os.environ.setdefault("GRANNDIS_EMU_SUBNET", "10.219.0")

from bench_scale import MemoryGuard, add_run_arguments, save_records  # noqa: E402
from harness import ENV, REPO, read_run, write_page  # noqa: E402
from products_ref import PRODUCTS, graph_args  # noqa: E402
import auto_reshaped  # noqa: E402

from emucluster import cluster as emucluster, costmodel  # noqa: E402
from granndis_hpc.cluster.linkcheck import link_check_text  # noqa: E402

GRAPHS = {
    "cora": ["--source", "planetoid", "--name", "cora", "--root", os.path.join(REPO, "tests", "data", "planetoid")],
    "synthetic": ["--source", "synthetic", "--seed", "0", "--feature-noise", "5"],  # the demo's; + --vertices
    # bench_products.py's graph and build preset (+ products_ref.graph_args(--products-vertices)); its
    # options' epochs come from one run each over every rate (auto_reshaped.py)
    "products": ["--config", "configs/products.build.toml"],
}
# products trains bench_products.py's setting: inductive, 3 SAGE + 1 Linear, LayerNorm, hidden 64
PRODUCTS_TRAIN = ["--config", "configs/products.toml"]
SETS = {"full": ["--preload", "full"], "eas": ["--preload", "eas", "--hops", "1", "--eas-fanout", "15"]}
LAYERS = 3


def options(layers):
    """(name = auto's option label, shard set, train arguments): what auto's table lists, one each."""
    out = [("fb", "full", ["--mode", "fb"])]
    # fb with partial aggregates (--halo-payload): auto offers them for the weighted-sum models
    out += [(f"fb payload={p}", "full", ["--mode", "fb", "--halo-payload", p]) for p in ("partial", "smaller")]
    out += [(f"flx k={k}", "full", ["--mode", "flx", "--preloaded-layers", str(k)]) for k in range(1, layers + 1)]
    out += [("eas", "eas", ["--mode", "eas"]), ("cob batches=2", "full", ["--mode", "cob", "--batches-per-epoch", "2"])]
    return out


def verdict(measured, choice):
    """(fastest option, auto's choice's epoch / fastest's, within 10 %, not slower than fb) from the
    options' measured epochs; None where auto's choice was not among the options run."""
    if choice not in measured:
        return None
    fastest = min(measured, key=measured.get)
    ratio = measured[choice] / measured[fastest]
    return {"fastest": fastest, "ratio": ratio, "within_10pct": ratio <= 1.10,
            "not_slower_than_fb": measured[choice] <= measured.get("fb", float("inf"))}


def build_args(graph, args):
    """The build's graph and layer arguments of `graph`."""
    if graph == "products":
        return GRAPHS[graph] + graph_args(args.products_vertices)
    return GRAPHS[graph] + (["--vertices", str(args.vertices)] if graph == "synthetic" else []) + [
        "--layers", str(LAYERS), "--partitioner", "metis"]


def train_command(args, graph, shards, extra, run_dir, epochs):
    common = PRODUCTS_TRAIN if graph == "products" else [
        "--model", "sage", "--layers", str(LAYERS), "--hidden", str(args.hidden), "--lr", "0.01", "--dropout", "0.5"]
    return [os.path.join(REPO, "emucluster", "emu-mpirun"), "-n", "4", "--emu-timeout", str(args.run_timeout),
            sys.executable, "-m", "granndis_hpc.cli", "train", "--shards", shards, *extra, *common, "--epochs",
            str(epochs), "--eval-every", "0", "--quiet", "--out", run_dir, "--overwrite-run"]


def run(cmd, log, timeout):
    cmd = [str(c) for c in cmd]
    print("+", " ".join(cmd), flush=True)
    log.append(" ".join(cmd).replace(REPO + os.sep, ""))  # the page and the JSON are read on other machines
    p = emucluster.run_bounded(["timeout", "--kill-after=15", str(int(timeout)), *cmd], env=dict(os.environ), cwd=REPO)
    if p.returncode != 0:
        raise RuntimeError(f"exit status {p.returncode}: {' '.join(cmd)}")


def find_decision(obj):
    """summary.json's auto decision (the mode's description holds it under "auto")."""
    if isinstance(obj, dict):
        if isinstance(obj.get("auto"), dict) and "options" in obj["auto"]:
            return obj["auto"]
        for v in obj.values():
            found = find_decision(v)
            if found is not None:
                return found
    return None


def train(args, graph, shards, extra, run_dir, log):
    with MemoryGuard(args.min_available_gib) as guard:
        try:
            run(train_command(args, graph, shards, extra, run_dir, args.epochs), log, args.run_timeout + 60)
        finally:
            if guard.fired is not None:
                raise RuntimeError(f"stopped by the memory guard: MemAvailable {guard.fired:.2f} GiB < "
                                   f"{args.min_available_gib} GiB")
    summary, records = read_run(run_dir)
    return summary, costmodel.summarize_run(records)["epoch_s"], [float(r["time_s"]) for r in records]


def sweep(args, data, path):
    log = data["log"]
    shards = {}
    for graph in args.graphs:
        for kind, extra in SETS.items():
            out = os.path.join(args.work, f"shards-{graph}-{kind}")
            shards[graph, kind] = out
            cmd = ["mpirun", "-n", "2", sys.executable, "-m", "granndis_hpc.preprocess", "build",
                   *build_args(graph, args), "--servers", "2", "--gpus-per-server", "2", *extra, "--out", out,
                   "--overwrite"]
            if args.reuse_shards and os.path.exists(os.path.join(out, "manifest.json")):  # the caller's word
                log.append(f"{' '.join(cmd)}   # reused: already built".replace(REPO + os.sep, ""))
                continue
            run(cmd, log, args.timeout)
    emucluster.install_signal_teardown()
    try:
        emucluster.setup(2, None)
        log.append("emucluster/emu-cluster setup --servers 2 --rate unshaped")
        instance = os.environ["GRANNDIS_EMU_INSTANCE"]
        for label in args.rates:
            bps = emucluster.parse_rate(label)
            emucluster.shape(bps)
            pp = emucluster.selfcheck(2, python=sys.executable)
            log.append(f"emucluster/emu-cluster shape --rate {label} && emucluster/emu-cluster selfcheck")
            print(emucluster.format_selfcheck(pp), flush=True)
            link = {"inter_Bps": pp["inter_Bps"]["1"], "intra_Bps": pp["intra_Bps"], "problems": pp["problems"]}
            entry = next((r for r in data["rates"] if r["rate"] == label), None) if args.merge else None
            if entry is None:
                entry = dict({"rate": label, "rate_bps": bps, "graphs": {}}, **link)
                data["rates"].append(entry)
            for graph in args.graphs:
                g = entry["graphs"][graph] = {"loadavg_start": os.getloadavg()[0], "measured": {}, "epochs": {},
                                              "link": link, "instance": instance}
                # auto first: a sweep stopped part-way has its choice beside the options measured so far
                run_dir = os.path.join(args.work, "runs", label, graph, "auto")
                try:
                    summary, g["auto_epoch_s"], g["epochs"]["auto"] = train(
                        args, graph, f"{shards[graph, 'full']},{shards[graph, 'eas']}",
                        ["--mode", "auto", "--memory-per-gpu", args.memory_per_gpu], run_dir, log)
                    d = find_decision(summary)
                    kinds = {v: k for (gr, k), v in shards.items() if gr == graph}
                    name = lambda o: o["label"] + ("" if kinds.get(o["source"]) != "eas" or o["mode"] == "eas"  # noqa
                                                   else " (eas set)")
                    g["choice"] = name(d["choice"])
                    g["predicted"] = {name(o): o["predicted_s"] for o in d["options"]}
                    g["peak_bytes"] = {name(o): o["peak_bytes"] for o in d["options"]}
                    g["inter_server_bytes"] = {name(o): o.get("inter_server_bytes") for o in d["options"]}
                    g["rates"], g["compute_rate"], g["reason"] = d["rates"], d.get("compute_rate"), d["reason"]
                    g["link_check"] = d.get("link_check")
                except (RuntimeError, OSError, ValueError, KeyError, TypeError) as exc:
                    g.setdefault("errors", {})["auto"] = f"{type(exc).__name__}: {exc}"
                for name, kind, extra in options(LAYERS) if graph != "products" else ():  # products: below
                    run_dir = os.path.join(args.work, "runs", label, graph, name.replace(" ", "").replace("=", ""))
                    try:
                        _, g["measured"][name], g["epochs"][name] = train(args, graph, shards[graph, kind], extra,
                                                                          run_dir, log)
                    except (RuntimeError, OSError, ValueError) as exc:  # recorded; the sweep goes on
                        g.setdefault("errors", {})[name] = str(exc)
                    save_records(path, data)
                if "choice" in g:
                    g["verdict"] = verdict(g["measured"], g["choice"])
                g["loadavg_end"] = os.getloadavg()[0]
                save_records(path, data)
        if "products" in args.graphs:
            log.append(f"(each products run below re-shapes the link to the next of {', '.join(args.rates)} after "
                       f"every {args.epochs} epochs)")
            auto_reshaped.sweep(data, "products", options(LAYERS), shards,
                                lambda s, e, d, n: train_command(args, "products", s, e, d, n), run, args, log,
                                lambda: save_records(path, data))
            for r in data["rates"]:
                g = r["graphs"].get("products")
                if g is not None and r["rate"] in args.rates and "choice" in g:
                    g["verdict"] = verdict(g["measured"], g["choice"])
            save_records(path, data)
    finally:
        emucluster.teardown()


MODEL = (
    "auto prices each option's epoch (memory_model/epoch_time.py, docs/concepts.md) as the sum of: compute (per "
    "rank and layer, the rows' projections and the edges' aggregation at rates timed at start-up, times the "
    "calibration of the model's real training step; between two world exchanges the slowest rank's), "
    "inter-server seconds (the busiest server's halo and gradient bytes over the measured link; what crosses "
    "both ways at once, as the halo exchanges and the gradient all-reduce do, at the rate the start-up check "
    "measured with both leaders sending; the gradient's seconds, where the run overlaps the gradient with "
    "the backward, charged only beyond the backward's share of the compute, except the last bucket's, the first "
    "layer's, charged whole), intra-server seconds, and fixed "
    "seconds (every exchange round, forward and backward, at the cost the start-up check measured on the "
    "run's own exchange paths, and every optimizer step: the calibration's fixed part and a gradient "
    "all-reduce round, overlapped as the run makes it; per co-batch for cob, and each co-batch's "
    "set-up, fixed and per row, timed at start-up on the job's graph). fb is kept unless another option is "
    "predicted more than 10 % faster. Runs of an earlier version have no calibration and no fixed term: "
    "their page shows `-` there.")


RESHAPED = ("the link re-shaped to the next rate after every few epochs, bench_products.Reshaper; the first epoch at "
            "each rate is left out of its median")
PRODUCTS_NOTE = (
    "products: bench_products.py's graph (`--generator local`, ogbn-products' statistics) built with "
    "configs/products.build.toml (inductive, 3 hops) and trained as configs/products.toml (inductive, 3 SAGE "
    "+ 1 Linear, LayerNorm, hidden 64, dropout and input dropout 0.3); auto runs once per rate (its link check "
    f"runs at start-up), each option once over every rate ({RESHAPED}), under the memory guard. Its final "
    "evaluation is not in the epoch time.")


def bytes_section(data):
    """Per graph with recorded ledger bytes: each run's inter- and intra-server bytes of one epoch."""
    out = []
    for graph in data["config"]["graphs"]:
        g = next((r["graphs"][graph] for r in data["rates"] if r["graphs"].get(graph, {}).get("bytes")), None)
        if g is None:
            continue
        out += [f"## {graph}: bytes of one training epoch (ledger, summed over ranks)", "",
                "Exact, the same at every rate. fb's default route sends a remote row once per server (to one of "
                "its ranks, which shares it inside the server); `route=direct` once per reading rank; the "
                "payloads send partial aggregates where they are fewer bytes (`smaller`) or always (`partial`).",
                "", "| run | inter-server halo B | inter-server gradient B | intra-server halo B | "
                "intra-server gradient B | inter-server halo / fb's | auto's count of the inter-server halo B |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        fb = g["bytes"].get("fb", {}).get("inter_halo")
        for n, b in g["bytes"].items():
            ratio = f"{b['inter_halo'] / fb:.3f}" if fb else "-"
            model = (g.get("inter_server_bytes", {}).get(n) or {}).get("halo")
            out.append(f"| {n} | {b['inter_halo']:,} | {b['inter_grad']:,} | {b['intra_halo']:,} | "
                       f"{b['intra_grad']:,} | {ratio} | {'-' if model is None else f'{model:,}'} |")
        out.append("")
    return out


def fmt(x, digits=3):
    return "-" if x is None else f"{x:.{digits}g}"


def render(data):
    names = [n for n, _, _ in options(LAYERS)]
    cfg = data["config"]
    L = ["# Does --mode auto pick the fastest option? (emulated 2 x 2 cluster)", "",
         f"Written by `bench/bench_auto.py` ({data['date']}); raw results: `bench/results/auto.json`.", "",
         f"Machine: {cfg['cores']} cores, {cfg['mem_gib']:.0f} GiB, no GPU, Python {cfg['python']}, shared with other "
         f"jobs: load average {data['loadavg_start'][0]:.1f} at the start, "
         f"{(data.get('loadavg_end') or [0])[0]:.1f} at the end "
         f"(per run below). 3-layer SAGE, hidden {cfg['hidden']}, {cfg['epochs']} epochs per run (the epoch time is "
         f"the median of the epochs after the first), 2 emulated servers x 2 ranks (docs/emulated-cluster.md); "
         f"auto with `--memory-per-gpu {cfg['memory_per_gpu']}` (every option fits). Graphs: "
         + ", ".join(f"{g}" + (f" ({cfg['vertices']:,} vertices)" if g == "synthetic" else "")
                     + (f" ({cfg.get('products_vertices', 0):,} vertices)" if g == "products" else "")
                     for g in cfg["graphs"])
         + ". Rounds run (rate: graphs): "
         + "; ".join(r["rate"] + ": " + ", ".join(r["graphs"]) for r in data["rates"])
         + f". Whole sweep {data.get('wall_s', 0) / 60:.1f} min.",
         ""]
    if "products" in cfg["graphs"]:
        L[-1:] = [PRODUCTS_NOTE, ""]
    L += ["## The model", "", MODEL, ""]
    if data.get("findings"):  # the reading of these numbers, kept with them in the JSON (--from-json)
        L += ["## What it found", "", *[f"- {f}" for f in data["findings"]], ""]
    L += ["## Summary", "", "| graph | rate | auto chose | fastest measured | chosen / fastest | within 10 % | "
          "not slower than fb | auto's own run / fastest |", "|---|---|---|---|---:|---|---|---:|"]
    for r in data["rates"]:
        for graph, g in r["graphs"].items():
            v, best = g.get("verdict"), min(g["measured"].values()) if g["measured"] else None
            if v is None and "choice" in g:  # a sweep stopped part-way: among the options measured so far
                v = verdict(g["measured"], g["choice"])
            own = g.get("auto_epoch_s") / best if best and g.get("auto_epoch_s") else None
            planned = len(g.get("options") or options(LAYERS))
            part = "" if len(g["measured"]) == planned else f" (stopped: {len(g['measured'])} of {planned} options run)"
            L.append(f"| {graph} | {r['rate']}{part} | {g.get('choice', 'failed')} | "
                     + (f"{v['fastest']} | {v['ratio']:.2f} | {'yes' if v['within_10pct'] else 'no'} | "
                        f"{'yes' if v['not_slower_than_fb'] else 'no'} |" if v else "- | - | - | - |")
                     + f" {fmt(own)} |")
    L.append("")
    L += bytes_section(data)
    for r in data["rates"]:
        for graph, g in r["graphs"].items():
            link = g.get("link") or r  # the graph's own link check (rounds merged from another sweep)
            L += [f"## {graph}, {r['rate']} (ping-pong {link['inter_Bps'] / 1e6:.3g} MB/s between servers; "
                  f"load {g['loadavg_start']:.1f} -> {g.get('loadavg_end', 0):.1f})", ""]
            if "options" in g:
                L += [f"Each option's epochs: its one run over every rate ({RESHAPED}); auto's: its own run at "
                      "this rate.", ""]
            L += [
                  "| option | measured epoch (s) | auto's prediction (s) | predicted / measured | "
                  "predicted compute / inter / intra / fixed (s) |", "|---|---:|---:|---:|---|"]
            pred = g.get("predicted", {})
            other = g.get("other", {})  # runs for their bytes, not among auto's options
            unrun = []
            for n in names + sorted(set(pred) - set(names), key=lambda n: pred[n].get("total_s", 0)) + list(other):
                p = pred.get(n) or {}
                if n not in g["measured"] and n not in other and n != g.get("choice"):
                    if p:  # predicted, not run: listed below the table
                        unrun.append(f"{n} {fmt(p.get('total_s'))}")
                    continue
                mark = " **(auto)**" if n == g.get("choice") else (" (not an option of auto)" if n in other else "")
                meas = g["measured"].get(n, other.get(n))
                ratio = p["total_s"] / meas if meas and p.get("total_s") else None
                L.append(f"| {n}{mark} | {fmt(meas)} | {fmt(p.get('total_s'))} | {fmt(ratio, 2)} | "
                         f"{fmt(p.get('compute_s'))} / {fmt(p.get('inter_s'))} / {fmt(p.get('intra_s'))} / "
                         f"{fmt(p.get('fixed_s'))} |")
            v = g.get("verdict") or (verdict(g["measured"], g["choice"]) if "choice" in g else None)
            L.append("")
            if unrun:
                L += [f"Predicted, not run (s): {', '.join(unrun)}.", ""]
            if "choice" in g:
                L.append(f"auto chose **{g['choice']}**; its own run's epoch: {fmt(g.get('auto_epoch_s'))} s. " + (
                    f"Fastest measured: {v['fastest']}; auto's choice / fastest = {v['ratio']:.2f} "
                    f"({'within' if v['within_10pct'] else 'NOT within'} 10 %), "
                    f"{'not slower' if v['not_slower_than_fb'] else 'SLOWER'} than fb." if v else
                    "Its choice is not among the options run, so no verdict."))
                cr = g.get("compute_rate") or {}
                rt = g["rates"]
                fixed = (f", compute x{fmt(rt['compute_scale'])}, step {fmt(rt.get('step_s'))} s, round world "
                         f"{fmt(rt.get('world_round_s'))} s / server {fmt(rt.get('server_round_s'))} s"
                         if "compute_scale" in rt else "")
                if "cobatch_row_s" in rt:
                    fixed += (f", co-batch set-up {fmt(rt['cobatch_s'])} s + {fmt(rt['cobatch_row_s'])} s "
                              f"per row")
                if rt.get("targets_round_s"):
                    fixed += f", target-count all-reduce {fmt(rt['targets_round_s'])} s per co-batch"
                both = (f" ({fmt(rt['inter_both_Bps'] / 1e6)} MB/s each way both ways at once)"
                        if rt.get("inter_both_Bps") else "")
                L.append(f"Rates auto priced with: inter {fmt((rt.get('inter_Bps') or 0) / 1e6)} MB/s{both}, "
                         f"intra {fmt((rt.get('intra_Bps') or 0) / 1e6)} MB/s, row_s {fmt(rt.get('row_s'))}, "
                         f"edge_s {fmt(rt.get('edge_s'))}{fixed}" + (f" ({cr['method']})" if cr else "") + ".")
                if g.get("link_check"):
                    L.append(f"Its {link_check_text(g['link_check'], g['link_check'].get('rounds'))}.")
            for n, e in g.get("errors", {}).items():
                L.append(f"{n}: failed ({e}).")
            peaks = {n: max(x["peak_rss"]) for n, x in g.get("runs", {}).items() if x.get("peak_rss")}
            if peaks:
                L.append("Largest rank's peak RSS per run (GiB): " + ", ".join(
                    f"{n} {v / 2**30:.2f}" for n, v in peaks.items()) + ".")
            L.append("")
    return L


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graphs", default="cora,synthetic", help=f"comma-separated, from: {', '.join(GRAPHS)}")
    p.add_argument("--vertices", type=int, default=5000, help="the synthetic graph's vertices")
    p.add_argument("--products-vertices", type=int, default=PRODUCTS["vertices"],
                   help="the products-size graph's vertices (bench_products.py's graph; its statistics scale)")
    p.add_argument("--rates", default="unshaped,1gbit,100mbit,10mbit", help="comma-separated, tc's units")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--epochs", type=int, default=4, help="per run; the first is left out of the median")
    p.add_argument("--memory-per-gpu", default="16GiB")
    p.add_argument("--work", default=os.path.join(REPO, "bench-out", "auto"))
    p.add_argument("--json", default=os.path.join(REPO, "bench", "results", "auto.json"))
    p.add_argument("--out", default=os.path.join(REPO, "docs", "performance", "auto.md"))
    p.add_argument("--from-json", action="store_true", help="no runs: rewrite the page from --json")
    p.add_argument("--append", action="store_true", help="add this sweep's rounds to those already in --json")
    p.add_argument("--merge", action="store_true",
                   help="put this sweep's rounds into --json by (graph, rate), keeping every other graph's rounds "
                        "(a graph's round at a rate is replaced)")
    p.add_argument("--memory-budget", type=float, default=15.0,
                   help="products: GiB the 4 ranks of one run may use by auto's estimate; an option above it "
                        "is not run")
    p.add_argument("--over-estimate", action="store_true",
                   help="products: run an option over --memory-budget anyway, stopped by the memory guard if "
                        "the machine runs short")
    add_run_arguments(p, timeout=600, run_timeout=300, timeout_help="seconds per shard-set build")
    args = p.parse_args(argv)
    if args.from_json:
        with open(args.json) as f:
            data = json.load(f)
        write_page(args.out, render(data), "bench/bench_auto.py", command_args(data), data["log"])
        return 0
    args.graphs = [g.strip() for g in args.graphs.split(",") if g.strip()]
    args.rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    if any(g not in GRAPHS for g in args.graphs):
        p.error(f"--graphs: any of {', '.join(GRAPHS)}")
    if args.epochs < 2:
        p.error("--epochs must be at least 2 (the first is left out)")
    try:
        for r in args.rates:
            emucluster.parse_rate(r)
        emucluster.preflight()
    except ValueError as exc:
        p.error(str(exc))
    except emucluster.EmuError as exc:
        print(f"bench_auto: cannot run here: {exc}", file=sys.stderr)
        return exc.code
    os.environ.update(ENV)  # the self-check's mpirun reads os.environ (root needs OMPI_ALLOW_RUN_AS_ROOT)
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    data = {"date": str(datetime.date.today()), "argv": argv, "log": [], "rates": [],
            "loadavg_start": list(os.getloadavg()),
            "config": {"graphs": args.graphs, "vertices": args.vertices, "hidden": args.hidden, "epochs": args.epochs,
                       "memory_per_gpu": args.memory_per_gpu, "cores": os.cpu_count(),
                       "products_vertices": args.products_vertices,
                       "python": platform.python_version(),
                       "mem_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30}}
    if args.append and args.merge:
        p.error("--append or --merge, not both")
    if (args.append or args.merge) and os.path.exists(args.json):  # a later sweep's rounds beside an earlier one's
        with open(args.json) as f:
            old = json.load(f)
        old["config"]["graphs"] = list(dict.fromkeys(old["config"]["graphs"] + args.graphs))
        if "synthetic" in args.graphs:
            old["config"]["vertices"] = args.vertices
        if "products" in args.graphs:
            old["config"]["products_vertices"] = args.products_vertices
        old["argv"] = [old["argv"], argv] if old["argv"] and isinstance(old["argv"][0], str) else old["argv"] + [argv]
        data = dict(old, loadavg_end=None, wall_s=old.get("wall_s", 0))
    started = time.monotonic() - data.get("wall_s", 0)
    try:
        sweep(args, data, args.json)
    finally:
        data["loadavg_end"], data["wall_s"] = list(os.getloadavg()), time.monotonic() - started
        save_records(args.json, data)
    write_page(args.out, render(data), "bench/bench_auto.py", command_args(data), data["log"])
    return 0


def command_args(data):
    """The page's command line: the sweep's arguments (several sweeps of one --json: joined by `&&`)."""
    runs = data["argv"] if data["argv"] and not isinstance(data["argv"][0], str) else [data["argv"]]
    return [" && python bench/bench_auto.py ".join(" ".join(a) for a in runs)]


if __name__ == "__main__":
    sys.exit(main())

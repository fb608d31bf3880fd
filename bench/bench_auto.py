"""--mode auto's choice against every option it chooses among, on an emulated 2-server cluster (not a test).

    python bench/bench_auto.py     # root; ~15 min on a busy 2-core machine with the defaults

For each graph (Cora from tests/data; the demo's synthetic graph at --vertices) it builds two shard sets
(full 3-hop preload, and EAS h=1 f=15; 2 servers x 2 GPUs, METIS), sets up the emulated cluster
(emucluster/, its own instance: docs/emulated-cluster.md), and at every link rate of --rates runs, under
emu-mpirun (4 ranks, 2 per server), each option auto's table lists (fb; flx k=1..L on the full set; eas;
cob with the fewest co-batches) and before them `--mode auto --shards FULL,EAS` (the time rule, the default).
Recorded per run: the measured epoch time (median of the epochs after the first); from auto's run:
its choice, its predicted epoch per option, the rates it measured, and its own measured epoch.  With
--repeats N each (graph, rate) runs auto and the options N times in turn (auto, every option, auto, ...,
so that a change of this shared machine's load reaches all alike); an option's measured epoch is the
median of its runs' (every run's kept beside it), auto's choice the one most of its runs made.  The
verdict per (graph, rate): auto's choice is "within 10 %" when the measured epoch of the option it
chose is at most 1.1x the fastest measured option, and "not slower than fb" when it is at most fb's;
the page says besides whether the two options' runs, min to max, overlap (auto_page.py renders it).

The products-size graph (`--graphs products`: bench_products.py's graph, built with its preset, trained as
configs/products.toml) runs auto --repeats times per rate and each option auto lists --repeats times over
every rate (in turn), the link re-shaped between them (bench/auto_reshaped.py), plus runs for their exact
ledger bytes alone (fb on the direct route, fb's partial payloads; once); e.g., root, beside rounds of the
other graphs already in --json:

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

from bench_scale import MemoryGuard, add_run_arguments, save_records  # noqa: E402
from harness import ENV, REPO, own_instance, read_run, write_page  # noqa: E402
from products_ref import PRODUCTS, graph_args  # noqa: E402
import auto_reshaped  # noqa: E402
from auto_page import LAYERS, auto_decision, command_args, options, page_log, record_run, render, verdict  # noqa: E402

from emucluster import cluster as emucluster, costmodel  # noqa: E402

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


def rep_suffix(k, repeats):
    """The run directory's suffix of run k (0-based) of an option: none where it runs once."""
    return "" if repeats == 1 else f"-run{k + 1}"


def rep_prefix(k, repeats):
    return "" if repeats == 1 else f"run {k + 1} of {repeats}: "


def train_auto(args, g, graph, shards, run_dir, log):
    """One run of --mode auto in round `g`: its choice, epoch and decision join g["auto_runs"]; the round's
    choice, auto epoch and decision (predictions, rates) are those auto_page.auto_decision picks."""
    summary, epoch_s, epochs = train(args, graph, f"{shards[graph, 'full']},{shards[graph, 'eas']}",
                                     ["--mode", "auto", "--memory-per-gpu", args.memory_per_gpu], run_dir, log)
    d = find_decision(summary)
    kinds = {v: k for (gr, k), v in shards.items() if gr == graph}
    name = lambda o: o["label"] + ("" if kinds.get(o["source"]) != "eas" or o["mode"] == "eas"  # noqa
                                   else " (eas set)")
    g.setdefault("auto_runs", []).append({
        "choice": name(d["choice"]), "epoch_s": epoch_s, "epochs": epochs,
        "predicted": {name(o): o["predicted_s"] for o in d["options"]},
        "peak_bytes": {name(o): o["peak_bytes"] for o in d["options"]},
        "inter_server_bytes": {name(o): o.get("inter_server_bytes") for o in d["options"]},
        "rates": d["rates"], "compute_rate": d.get("compute_rate"), "reason": d["reason"],
        "link_check": d.get("link_check")})
    g["choice"], first, g["auto_epoch_s"] = auto_decision(g["auto_runs"])
    g.update({k: first[k] for k in ("predicted", "peak_bytes", "inter_server_bytes", "rates", "compute_rate",
                                    "reason", "link_check")})


def measure_round(args, g, graph, shards, where, log, save):
    """Round `g` (a graph at a rate): --repeats times auto and then every option (products: auto alone; its
    options run over every rate in auto_reshaped.py), each run into `where`, saved (`save()`) after each."""
    n = args.repeats
    for k in range(n):  # round-robin: a change of the machine's load reaches every option alike
        # auto first: a sweep stopped part-way has its choice beside the options measured so far
        try:
            train_auto(args, g, graph, shards, os.path.join(where, "auto" + rep_suffix(k, n)), log)
        except (RuntimeError, OSError, ValueError, KeyError, TypeError) as exc:
            g.setdefault("errors", {})["auto"] = rep_prefix(k, n) + f"{type(exc).__name__}: {exc}"
        save()
        for name, kind, extra in options(LAYERS) if graph != "products" else ():
            run_dir = os.path.join(where, name.replace(" ", "").replace("=", "") + rep_suffix(k, n))
            try:
                _, epoch_s, epochs = train(args, graph, shards[graph, kind], extra, run_dir, log)
                record_run(g, name, epoch_s, epochs)
            except (RuntimeError, OSError, ValueError) as exc:  # recorded; the sweep goes on
                g.setdefault("errors", {})[name] = rep_prefix(k, n) + str(exc)
            save()


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
                g = entry["graphs"][graph] = {"loadavg_start": os.getloadavg()[0], "measured": {}, "link": link,
                                              "instance": instance, "repeats": args.repeats}
                measure_round(args, g, graph, shards, os.path.join(args.work, "runs", label, graph), log,
                              lambda: save_records(path, data))
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


def main(argv=None):
    own_instance("auto", "10.219.0")  # a benchmark on another instance can run beside it
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graphs", default="cora,synthetic", help=f"comma-separated, from: {', '.join(GRAPHS)}")
    p.add_argument("--vertices", type=int, default=5000, help="the synthetic graph's vertices")
    p.add_argument("--products-vertices", type=int, default=PRODUCTS["vertices"],
                   help="the products-size graph's vertices (bench_products.py's graph; its statistics scale)")
    p.add_argument("--rates", default="unshaped,1gbit,100mbit,10mbit", help="comma-separated, tc's units")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--epochs", type=int, default=4, help="per run; the first is left out of the median")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each option (auto included) per graph and rate, the options in turn and then "
                        "again; an option's epoch is the median of its runs'")
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
        write_page(args.out, render(data), "bench/bench_auto.py", command_args(data), page_log(data["log"]))
        return 0
    args.graphs = [g.strip() for g in args.graphs.split(",") if g.strip()]
    args.rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    if any(g not in GRAPHS for g in args.graphs):
        p.error(f"--graphs: any of {', '.join(GRAPHS)}")
    if args.epochs < 2:
        p.error("--epochs must be at least 2 (the first is left out)")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
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
                       "repeats": args.repeats,
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
    write_page(args.out, render(data), "bench/bench_auto.py", command_args(data), page_log(data["log"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""fb's inter-server halo bytes on the direct and the per-server route (--halo-route), from the ledger
(a benchmark, not a test; writes docs/performance/halo-route.md).

    python bench/bench_halo_route.py          # a few minutes on a busy 2-core machine

Three graphs on 2 servers x 2 ranks (METIS): the demo's (synthetic DC-SBM, 20,000 vertices), a
products-like one (bench/products_ref.py's statistics, `--generator local`, 100,000 vertices) and Cora
(tests/data).  Each trains fb (3-layer SAGE, hidden 64) for a few epochs on each route under one
mpirun with 2 ranks per server (servers emulated by rank numbers, no link shaping); the page reports
the ledger's inter- and intra-server halo bytes of one epoch summed over ranks, the memory model's
inter-server halo bytes (memory_model.inter_server_bytes, which `--mode auto --auto-rule time` and
`preprocess plan` price), and the median epoch time on this machine (no slow link: the route's extra
intra-server hop shows, its saving does not; the last section is the emulated cluster at a shaped rate,
from bench/bench_cluster.py's `fb` and `fb-direct` modes).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from harness import REPO, measure_on_built_sets, run, write_page
from products_ref import graph_args

ROUTES = ("direct", "per-server")
LAYERS, HIDDEN = 3, 64
GRAPHS = {
    "demo (synthetic SBM, 20k)": ["--source", "synthetic", "--vertices", "20000", "--seed", "0",
                                  "--feature-noise", "5"],
    "products-like (local, 100k)": ["--source", "synthetic", *graph_args(100_000)],
    "Cora": ["--source", "planetoid", "--name", "cora", "--root", os.path.join(REPO, "tests", "data", "planetoid")],
}


def build_sets(base, log):
    dirs = {}
    for i, (name, source) in enumerate(GRAPHS.items()):
        dirs[name] = os.path.join(base, f"set{i}")
        run(["mpirun", "-n", "2", sys.executable, "-m", "granndis_hpc.preprocess", "build", *source, "--servers", "2",
             "--gpus-per-server", "2", "--layers", str(LAYERS), "--preload", "full", "--hops", "1",
             "--partitioner", "metis", "--out", dirs[name], "--overwrite"], log)
    return dirs


def _worker(args):
    from mpi4py import MPI

    from granndis_hpc import memory_model as mm
    from granndis_hpc.engine.trainer import TrainConfig, Trainer

    world, out = MPI.COMM_WORLD, {}
    for name, shards in zip(GRAPHS, args.sets):
        for route in ROUTES:
            trainer = Trainer(TrainConfig(shards=shards, mode="fb", model="sage", layers=LAYERS, hidden=HIDDEN,
                                          epochs=args.epochs, eval_every=0, ranks_per_server=2, quiet=True,
                                          halo_route=route, no_link_check=True))
            try:
                records = [trainer.train_epoch() for _ in range(args.epochs)]
                own = [trainer.ledger.bytes(link, "halo") for link in ("inter", "intra")]
                inter, intra = (int(x) for x in world.allreduce(own_array(own), op=MPI.SUM))
            finally:
                trainer.close()
            if world.rank == 0:
                manifest, servers = mm.read_shard_set(shards)
                ds = manifest["dataset"]
                rows = mm.shard_rows(servers, LAYERS, 0, int(ds["num_features"]), int(ds["num_classes"]))
                m = mm.model_for(manifest, "sage", HIDDEN, LAYERS, halo_route=route)
                out.setdefault(name, {"vertices": int(ds["num_vertices"]), "edges": int(ds["num_edges"])})[route] = {
                    "inter_halo": inter, "intra_halo": intra,
                    "model_inter_halo": mm.inter_server_bytes(rows, m, 2)["halo"],
                    "epoch_s": statistics.median(r["time_s"] for r in records[1:])}
                print(f"[halo-route] {name} {route}: inter {inter:,} B, intra {intra:,} B", flush=True)
    if world.rank == 0:
        with open(args.worker, "w") as f:
            json.dump(out, f)


def own_array(values):
    import numpy as np
    return np.asarray(values, dtype=np.int64)


def page(results, epochs, cluster=None):
    lines = ["# The per-server halo route: fb's inter-server halo bytes", "",
             __doc__.split("\n\n")[2].replace("\n", " "), "",
             f"Bytes of one training epoch (the ledger's halo phase: forward rows and backward gradients of layers 1 "
             f"and 2; layer 0's input features cross once at set-up), summed over the 4 ranks; epoch time: median "
             f"of epochs 2..{epochs}, no shaping, on the shared 2-core machine (docs/performance/README.md) under "
             f"a load average of 10-20 from other jobs: the times are indicative, the bytes exact. Raw results: "
             f"bench/results/halo-route.json.", "",
             "| graph | vertices | edges | inter-server B, direct | inter-server B, per-server | saved | "
             "intra-server B, "
             "direct | intra-server B, per-server | model = ledger | epoch s direct | epoch s per-server |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for name, r in results.items():
        d, s = r["direct"], r["per-server"]
        same = all(x["model_inter_halo"] == x["inter_halo"] for x in (d, s))
        lines.append(f"| {name} | {r['vertices']:,} | {r['edges']:,} | {d['inter_halo']:,} | {s['inter_halo']:,} | "
                     f"{1 - s['inter_halo'] / d['inter_halo']:.1%} | {d['intra_halo']:,} | {s['intra_halo']:,} | "
                     f"{'yes' if same else 'NO'} | {d['epoch_s']:.3f} | {s['epoch_s']:.3f} |")
    lines += ["", "Every row a server reads from another crosses once per server instead of once per reading rank: "
              "the saving is the share of remote rows that more than one rank of a server reads (high on the "
              "SBM graph, whose communities are spread over both ranks of a server; low on the `local` "
              "generator's graph, whose METIS parts share few remote neighbours). The rows that no longer cross "
              "are forwarded inside the server instead: the intra-server column grows by exactly as much.", ""]
    if cluster:
        lines += ["## On the emulated cluster", "",
                  f"`bench/bench_cluster.py --modes fb,fb-direct` on the demo's graph ({cluster['vertices']:,} "
                  f"vertices, 3-layer SAGE, hidden 64, 2 x 2, docs/emulated-cluster.md): median epoch time "
                  f"(epochs 2..{cluster['epochs']}) and the ledger's inter-server halo bytes of the run.", "",
                  "| link | fb per-server: epoch s | fb direct: epoch s | direct / per-server | inter-server halo B "
                  "per-server | direct |", "|---|---:|---:|---:|---:|---:|"]
        for row in cluster["rows"]:
            lines.append(f"| {row['label']} | {row['fb']:.3f} | {row['fb-direct']:.3f} | "
                         f"{row['fb-direct'] / row['fb']:.2f}x | {row['inter_fb']:,} | {row['inter_fb-direct']:,} |")
        lines += ["", "The route trades inter-server bytes for an intra-server hop: a relay forwards only after its "
                  "own rows have arrived, and the forwarding is an exchange among the server's ranks, so each "
                  "layer waits for the slowest rank of the server (in the backward too). On this oversubscribed "
                  "machine that wait is inflated by the other jobs' load (single epochs vary 2-3x); where the "
                  "inter-server link is the bottleneck the bytes saved are time saved.", ""]
    return lines


def cluster_rows(path):
    """The fb and fb-direct runs of a bench_cluster.py sweep.json: per rate, epoch seconds and bytes."""
    import json
    with open(path) as f:
        sweep = json.load(f)
    rows = []
    for rnd in sweep["rates"]:
        runs = rnd["runs"]
        if not all(m in runs for m in ("fb", "fb-direct")):
            continue
        row = {"label": rnd["label"]}
        for m in ("fb", "fb-direct"):
            row[m] = runs[m]["epoch_s"]
            row["inter_" + m] = runs[m]["bytes"]["inter_halo"]
            row["comm_" + m] = (runs[m]["inter_comm"], runs[m]["intra_comm"])
        rows.append(row)
    argv, shown = list(sweep.get("argv") or []), []
    while argv:  # the sweep's options without where it wrote (a local path)
        a = argv.pop(0)
        if a in ("--work", "--out"):
            argv.pop(0)
        elif a != "--reuse-shards":
            shown.append(a)
    return {"vertices": sweep["graph"]["vertices"], "epochs": sweep["graph"]["epochs"], "rows": rows,
            "command": " ".join(["python", "bench/bench_cluster.py", *shown, "--work", "BENCH_CLUSTER_WORK"])}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--out", default=os.path.join(REPO, "docs", "performance", "halo-route.md"))
    p.add_argument("--results", default=os.path.join(REPO, "bench", "results", "halo-route.json"),
                   help="where the measured numbers are written (and read with --from-results)")
    p.add_argument("--from-results", action="store_true", help="no runs: render the page from --results")
    p.add_argument("--cluster-sweep", metavar="SWEEP_JSON",
                   help="a bench_cluster.py sweep.json with the modes fb and fb-direct: adds its epoch times")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--sets", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    if args.from_results:
        with open(args.results) as f:
            data = json.load(f)
    else:
        graphs, commands = measure_on_built_sets(
            os.path.abspath(__file__), build_sets,
            lambda dirs: ["--epochs", str(args.epochs), "--sets", *[dirs[n] for n in GRAPHS]])
        data = {"epochs": args.epochs, "graphs": graphs, "commands": commands}
    if args.cluster_sweep:
        data["cluster"] = cluster_rows(args.cluster_sweep)
    with open(args.results, "w") as f:
        json.dump(data, f, indent=1)
    commands = data.get("commands", [])
    if data.get("cluster"):  # the sweep, then this page rendered with it
        commands += [data["cluster"]["command"],
                     "python bench/bench_halo_route.py --from-results --cluster-sweep BENCH_CLUSTER_WORK/sweep.json"]
    shown = ["--epochs", str(data["epochs"])] if data["epochs"] != 4 else []  # the measuring run's options
    write_page(args.out, page(data["graphs"], data["epochs"], data.get("cluster")), "bench/bench_halo_route.py",
               shown or [""], commands)
    return 0


if __name__ == "__main__":
    sys.exit(main())

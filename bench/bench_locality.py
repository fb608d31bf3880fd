"""Locality of the synthetic generators: edge cut and k-hop preload size per generator (not a test).

For each generator (``--generator sbm`` and ``local``) on the same size, this builds the canonical graph
with `granndis_hpc.preprocess.sources.load`, partitions it over the servers with the build's own server partitioner
(`granndis_hpc.preprocess.partition.twolevel.partition_servers`: METIS, or ParMETIS on this one rank), and for
k = 1..L takes
each server's full k-hop preload with `granndis_hpc.preprocess.build.halo.full_khop` (exactly what `granndis preprocess
build --preload full --hops k` stores per server).  It reports

* the edge cut (directed edges between servers / all edges),
* rows per vertex: preloaded rows summed over servers / vertices (1.00 = no replication, S = all),
* degree statistics, edge homophily (neighbours with the same label),
* accuracy proxies for "a GNN beats an MLP": nearest class mean (fitted on train, test accuracy) on a
  vertex's own features, and on the mean over self + 1-hop, self + 2-hop neighbourhoods.

  python bench/bench_locality.py --vertices 200000 --out bench-out/bench-locality.json

Each generator is measured in a fresh process: PT-Scotch's ParMETIS keeps random state between calls in
one process, so a second partitioning there is not the one a build (a fresh job) would get.

``--check-build`` also runs one `mpirun -n BUILD_RANKS granndis preprocess build ... --preload full
--hops 2` for the local generator and reports the rows its manifest records next to the ones computed
here (equal for METIS; ParMETIS on several ranks partitions differently from one rank).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import scipy.sparse as sp

from harness import REPO, mpi_env

from granndis_hpc.cluster.group import self_group
from granndis_hpc.preprocess.build.halo import full_khop
from granndis_hpc.preprocess.partition.twolevel import partition_servers
from granndis_hpc.preprocess.sources import load


def nearest_class_mean_accuracy(g, x) -> float:
    """Fit class means on the train split; test accuracy of the nearest mean (an MLP-like probe)."""
    mu = np.stack([x[g.train_mask & (g.labels == c)].mean(0) for c in range(g.num_classes)])
    xt = x[g.test_mask]
    d = (xt ** 2).sum(1)[:, None] - 2 * xt @ mu.T + (mu ** 2).sum(1)[None]
    return float(np.mean(d.argmin(1) == g.labels[g.test_mask]))


def accuracy_proxies(g) -> dict:
    a = sp.csr_matrix((np.ones(g.num_edges, np.float32), g.indices, g.indptr), shape=(g.num_vertices,) * 2)
    inv = (1.0 / (g.in_degree() + 1)).astype(np.float32)[:, None]
    h1 = (a @ g.features + g.features) * inv
    h2 = (a @ h1 + h1) * inv
    return {"own": nearest_class_mean_accuracy(g, g.features), "hop1": nearest_class_mean_accuracy(g, h1),
            "hop2": nearest_class_mean_accuracy(g, h2)}


def rows_per_vertex(g, parts: np.ndarray, servers: int, max_hops: int) -> dict:
    """{k: preloaded rows summed over servers / vertices} for k = 1..max_hops (hop 0 = inner rows)."""
    rows = np.zeros(max_hops + 1, dtype=np.int64)
    for s in range(servers):
        _, hop = full_khop(g.indptr, g.indices, np.flatnonzero(parts == s), max_hops)
        rows += np.cumsum(np.bincount(hop, minlength=max_hops + 1))
    return {k: float(rows[k] / g.num_vertices) for k in range(1, max_hops + 1)}


def measure(generator: str, args) -> dict:
    t0 = time.perf_counter()
    g = load("synthetic", generator=generator, vertices=args.vertices, avg_degree=args.avg_degree,
             seed=args.seed)
    gen_s = time.perf_counter() - t0
    comm = self_group()
    t0 = time.perf_counter()
    part = partition_servers(comm, g, args.servers, args.partitioner, args.seed)
    part_s = time.perf_counter() - t0
    deg = g.in_degree()
    rows = np.repeat(np.arange(g.num_vertices), np.diff(g.indptr))
    rec = {"generator": generator, "vertices": g.num_vertices, "edges": int(g.num_edges),
           "avg_degree": float(deg.mean()), "median_degree": float(np.median(deg)), "max_degree": int(deg.max()),
           "frac_deg_gt_5x_mean": float(np.mean(deg > 5 * deg.mean())),
           "edge_homophily": float(np.mean(g.labels[rows] == g.labels[g.indices])),
           "servers": args.servers, "partitioner": part.library, "edge_cut_fraction": part.edge_cut_fraction,
           "vertex_balance": part.vertex_balance,
           "rows_per_vertex": rows_per_vertex(g, part.parts, args.servers, args.layers),
           "generate_s": round(gen_s, 1), "partition_s": round(part_s, 1)}
    if not args.no_accuracy:
        rec["nearest_class_mean"] = accuracy_proxies(g)
    return rec


def check_build(args, rec) -> dict:
    """One real build (local generator, --hops 2): its manifest's replication factor (rows summed over
    servers / inner vertices) must equal rows_per_vertex[2] computed here."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "shards")
        cmd = ["mpirun", "-n", str(args.build_ranks), sys.executable, "-m", "granndis_hpc.preprocess", "build",
               "--source", "synthetic", "--generator", "local",
               "--vertices", str(args.vertices), "--avg-degree", str(args.avg_degree), "--seed", str(args.seed),
               "--servers", str(args.servers), "--gpus-per-server", "1", "--layers", str(args.layers),
               "--preload", "full", "--hops", "2", "--partitioner", args.partitioner, "--out", out]
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True, env=mpi_env(threads=False))
        wall = time.perf_counter() - t0
        with open(os.path.join(out, "manifest.json")) as f:
            manifest = json.load(f)
    stats = manifest["stats"]
    built = float(stats["replication_factor"])
    return {"command": f"mpirun -n {args.build_ranks} granndis preprocess " + " ".join(cmd[6:-1]) + " DIR",
            "build_s": round(wall, 1), "edge_cut_fraction": manifest["partitioner"]["edge_cut_fraction"],
            "manifest_rows_per_server": [s["rows"] for s in stats["servers"]],
            "manifest_replication_factor": built, "computed_rows_per_vertex_k2": rec["rows_per_vertex"][2],
            "equal": abs(built - rec["rows_per_vertex"][2]) < 1e-9}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vertices", type=int, default=200_000)
    p.add_argument("--avg-degree", type=float, default=25.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--layers", type=int, default=3, help="report k = 1..LAYERS (default 3)")
    p.add_argument("--partitioner", choices=("metis", "parmetis"), default="metis")
    p.add_argument("--generators", nargs="+", default=["sbm", "local"])
    p.add_argument("--no-accuracy", action="store_true", help="skip the nearest-class-mean probes")
    p.add_argument("--check-build", action="store_true")
    p.add_argument("--build-ranks", type=int, default=2, help="MPI ranks of the --check-build build (default 2)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # worker: measure one generator, print JSON
    p.add_argument("--out", default=None, help="write the records as JSON here")
    args = p.parse_args(argv)
    if args.one:
        rec = measure(args.one, args)
        rec["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        print("RECORD " + json.dumps(rec), flush=True)
        return 0
    records = []
    for gen in args.generators:
        argv_one = [a for a in (argv if argv is not None else sys.argv[1:])]
        res = subprocess.run([sys.executable, os.path.abspath(__file__), *argv_one, "--one", gen], cwd=REPO,
                             check=True, capture_output=True, text=True)
        rec = json.loads(next(line[7:] for line in res.stdout.splitlines() if line.startswith("RECORD ")))
        rec["rows_per_vertex"] = {int(k): v for k, v in rec["rows_per_vertex"].items()}  # JSON keys are str
        records.append(rec)
        print(json.dumps(rec), flush=True)
    check = None
    if args.check_build and "local" in args.generators:
        check = check_build(args, next(r for r in records if r["generator"] == "local"))
        print(json.dumps(check), flush=True)
    ks = range(1, args.layers + 1)
    print(f"\n| generator | edges (mean degree) | cut ({args.servers}-way) | "
          + " | ".join(f"rows/vertex k={k}" for k in ks)
          + " | NCM own / 1-hop / 2-hop | homophily | max deg |")
    print("|---" * (6 + args.layers) + "|")
    for r in records:
        acc = r.get("nearest_class_mean")
        acc_s = f"{acc['own']:.2f} / {acc['hop1']:.2f} / {acc['hop2']:.2f}" if acc else "-"
        print(f"| {r['generator']} | {r['edges']:,} ({r['avg_degree']:.1f}) | {100 * r['edge_cut_fraction']:.2f} % | "
              + " | ".join(f"{r['rows_per_vertex'][k]:.3f}" for k in ks)
              + f" | {acc_s} | {r['edge_homophily']:.2f} | {r['max_degree']} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"records": records, "argv": sys.argv[1:], "build_check": check}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

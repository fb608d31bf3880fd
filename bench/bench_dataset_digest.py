"""Cost of the dataset content digest every build records (preprocess/build/pipeline.py dataset_digest, the
identity that lets a checkpoint continue on another shard set of the same data).

    .venv/bin/python bench/bench_dataset_digest.py                 # Cora, and a synthetic 2M x 100 graph

Prints the median of --reps timings per graph: one sha256 pass over the CSR, features, labels and masks.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from harness import REPO

from granndis_hpc.graph.csr import Graph
from granndis_hpc.preprocess.build.pipeline import dataset_digest


def synthetic(n: int, features: int, degree: int, seed: int = 0) -> Graph:
    """Arrays of a graph of n vertices (degree in-edges each, random sources): only their sizes matter."""
    rng = np.random.default_rng(seed)
    indptr = np.arange(0, n * degree + 1, degree, dtype=np.int64)
    split = rng.random(n)
    return Graph("synthetic", indptr, rng.integers(0, n, n * degree), rng.random((n, features), dtype=np.float32),
                 rng.integers(0, 10, n), split < 0.6, (split >= 0.6) & (split < 0.8), split >= 0.8, 10)


def timed(graph: Graph, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        dataset_digest(graph)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--vertices", type=int, default=2_000_000)
    p.add_argument("--features", type=int, default=100)
    p.add_argument("--degree", type=int, default=25)
    p.add_argument("--cora-root", default=os.path.join(REPO, "tests", "data", "planetoid"))
    args = p.parse_args()
    from granndis_hpc.preprocess.sources import load

    graphs = [load("planetoid", name="cora", root=args.cora_root),
              synthetic(args.vertices, args.features, args.degree)]
    for g in graphs:
        mb = sum(a.nbytes for a in (g.indptr, g.indices, g.features, g.labels, g.train_mask, g.val_mask,
                                    g.test_mask)) / 2**20
        s = timed(g, args.reps)
        print(f"{g.name}: {g.num_vertices} vertices, {g.num_edges} edges, {g.num_features} features, "
              f"{mb:.0f} MiB hashed: {s * 1e3:.1f} ms ({mb / s:.0f} MiB/s)")


if __name__ == "__main__":
    main()

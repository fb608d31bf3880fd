"""The sparse product under row orders (not a test): how much a locality order of the rows would save.

    .venv/bin/python bench/bench_row_order.py --out bench-out/row-order.md

The synthetic graph's layer-0 mean adjacency (`granndis_hpc.preprocess.sources.synthetic_chunks.load_synthetic`, the
generator the shard sets of docs/performance/single-rank.md are built from, in its own vertex order),
symmetrically permuted (rows and columns, the operand's rows alike) by each order, multiplied with a
random operand of --widths columns on one thread by the CPU path's product (nn/cpu_kernels.py: the C
kernel; with --product torch, torch's CSR product).  Every order is timed once per round, the orders in
a rotated order, --rounds rounds; the table gives the median and its ratio to the generator's order.

Orders: the generator's; a random permutation; degree, descending; reverse Cuthill-McKee (scipy); METIS
blocks (pymetis, --blocks of them) with degree order inside a block; the build's (preprocess/partition/row_blocks.py
on the one GPU of a 1 x 1 set: METIS blocks of --row-block-rows rows, id order inside a block).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import scipy.sparse
import scipy.sparse.csgraph
import torch

import harness  # (a script's own folder is on sys.path)

from granndis_hpc.engine.hostmem import keep_freed_host_memory
from granndis_hpc.nn.cpu_kernels import csr_matmul
from granndis_hpc.nn.sparse import _csr
from granndis_hpc.preprocess.partition.row_blocks import DEFAULT_BLOCK_ROWS


def load_graph(vertices: int, seed: int):
    from granndis_hpc.preprocess.sources.synthetic_chunks import load_synthetic

    return load_synthetic(vertices=vertices, seed=seed)


def mean_adjacency(g) -> scipy.sparse.csr_matrix:
    indptr, indices = np.asarray(g.indptr, np.int64), np.asarray(g.indices, np.int64)
    degree = np.diff(indptr)
    values = np.repeat(1.0 / np.maximum(degree, 1), degree).astype(np.float32)
    return scipy.sparse.csr_matrix((values, indices, indptr), shape=(g.num_vertices, g.num_vertices))


def build_blocks(g, block_rows: int) -> np.ndarray:
    """The block of every vertex of a 1 x 1 set (preprocess/partition/row_blocks.py, one part)."""
    from mpi4py import MPI

    from granndis_hpc.cluster import as_group
    from granndis_hpc.preprocess.partition.twolevel import WholeGraphAccess
    from granndis_hpc.preprocess.partition.row_blocks import row_blocks

    group = as_group(MPI.COMM_SELF)
    return row_blocks(group, WholeGraphAccess(group, g), np.zeros(g.num_vertices, dtype=np.int32), 1, block_rows)


def inside_share(g, key: np.ndarray) -> float:
    """The share of the graph's entries whose source and destination have the same key."""
    dst = np.repeat(np.arange(g.num_vertices), np.diff(g.indptr))
    return float(np.mean(key[np.asarray(g.indices)] == key[dst]))


def orders(a: scipy.sparse.csr_matrix, blocks, seed: int):
    """{name: permutation}: new row i is old row perm[i]."""
    import pymetis

    n = a.shape[0]
    sym = a.maximum(a.T).tocsr()
    degree = np.diff(a.indptr)
    out = {"the generator's": np.arange(n), "random": np.random.default_rng(seed).permutation(n),
           "degree, descending": np.argsort(-degree, kind="stable"),
           "reverse Cuthill-McKee": scipy.sparse.csgraph.reverse_cuthill_mckee(sym, symmetric_mode=True)}
    for k in blocks:
        _, parts = pymetis.part_graph(k, adjacency=pymetis.CSRAdjacency(sym.indptr, sym.indices))
        out[f"METIS {k} blocks, degree order inside"] = np.lexsort((-degree, np.asarray(parts)))
    return out


def permuted(a: scipy.sparse.csr_matrix, perm: np.ndarray) -> torch.Tensor:
    p = a[perm][:, perm].tocsr()
    p.sort_indices()
    return _csr(torch.from_numpy(p.indptr.astype(np.int64)), torch.from_numpy(p.indices.astype(np.int64)),
                torch.from_numpy(p.data), p.shape)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vertices", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--widths", type=int, nargs="+", default=[64, 16])
    ap.add_argument("--blocks", type=int, nargs="*", default=[64, 256], help="METIS block counts")
    ap.add_argument("--row-block-rows", type=int, default=DEFAULT_BLOCK_ROWS,
                    help="the build's locality blocks (preprocess build --row-block-rows)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--product", choices=("native", "torch"), default="native",
                    help="the C kernel (GRANNDIS_CPU_KERNELS=native) or torch's CSR product")
    ap.add_argument("--out", default="bench-out/row-order.md")
    args = ap.parse_args(argv)
    os.environ["GRANNDIS_CPU_KERNELS"] = args.product
    torch.set_num_threads(1)
    keep_freed_host_memory()  # as the trainer does: no page faults on every product's output
    g = load_graph(args.vertices, args.seed)
    a = mean_adjacency(g)
    perms = orders(a, args.blocks, args.seed)
    block = build_blocks(g, args.row_block_rows)
    perms[f"the build's: METIS blocks of {args.row_block_rows} rows, id order inside"] = np.lexsort(
        (np.arange(g.num_vertices), block))
    ids = np.arange(g.num_vertices) // args.row_block_rows
    shares = {"own block": inside_share(g, block), "id window": inside_share(g, ids)}
    mats = {name: permuted(a, perm) for name, perm in perms.items()}
    load_before = os.getloadavg()[0]
    times = {w: {name: [] for name in mats} for w in args.widths}
    names = list(mats)
    for w in args.widths:
        h = torch.randn(a.shape[0], w)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                start = time.perf_counter()
                csr_matmul(mats[name], h)
                times[w][name].append(time.perf_counter() - start)
    lines = ["# The sparse product under row orders", "",
             f"{a.shape[0]:,} x {a.shape[0]:,} mean adjacency, {a.nnz:,} entries (int32 CSR), one thread, "
             f"{'the C kernel' if args.product == 'native' else 'torch' + chr(39) + 's CSR product'}; median of "
             f"{args.rounds} rounds (load average (1 min) {load_before:.1f} before, {os.getloadavg()[0]:.1f} after).",
             "", "| rows and columns | " + " | ".join(f"A@H, {w} columns (ms)" for w in args.widths) + " |",
             "|---|" + "---:|" * len(args.widths)]
    base = {w: statistics.median(times[w][names[0]]) for w in args.widths}
    for name in names:
        cells = []
        for w in args.widths:
            med = statistics.median(times[w][name])
            cells.append(f"{1e3 * med:.1f}" + ("" if name == names[0] else f" ({base[w] / med:.2f}x)"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"In the build's order {100 * shares['own block']:.0f} % of the entries read a row of their own "
                  f"block; in the generator's, {100 * shares['id window']:.0f} % read a row within the same window of "
                  f"{args.row_block_rows} ids."]
    harness.write_page(args.out, lines, "bench/bench_row_order.py", argv, [],
                       data={"times_s": {str(w): t for w, t in times.items()}, "inside_share": shares})
    return 0


if __name__ == "__main__":
    sys.exit(main())

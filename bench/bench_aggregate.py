"""Benchmark the aggregation backends of granndis_hpc.nn: forward+backward time and peak memory.

    .venv/bin/python bench/bench_aggregate.py                       # CPU, writes docs/performance/aggregate.md
    python bench/bench_aggregate.py --device cuda --out bench-out/aggregate-cuda.md

A random graph (default 200k vertices, average in-degree 25, i.e. 5M edges) and a width-64 feature
matrix; for every method, out = A_hat @ h then out.backward(g), timed over --reps repetitions after one
warm-up (the warm-up builds the cached matrices; its time is reported separately as "build").
Each method runs in its own subprocess, so that its peak memory is its own:
  CPU: peak resident set (VmHWM, reset through /proc/self/clear_refs) minus the resident set after the
       graph and h exist; CUDA: torch.cuda.max_memory_allocated minus the allocation before the method.
Methods:
  spmm          granndis_hpc.nn default: cached CSR A and A^T, custom autograd (A @ h, A^T @ grad); on
                the CPU the products are nn/cpu_kernels.py's C kernel
  spmm_torch    the same with torch's CSR product (GRANNDIS_CPU_KERNELS=torch)
  index_add     gather h[src] * w into an [nnz, d] message tensor, index_add into the rows
  csr_autograd  cached CSR A, torch's own autograd through A @ h
  coo_autograd  cached coalesced COO A, torch.sparse.mm with torch's own autograd
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

from granndis_hpc.graph.csr import csr_from_edges
from granndis_hpc.nn import LayerGraph, aggregate

METHODS = ("spmm", "spmm_torch", "index_add", "csr_autograd", "coo_autograd")
NOTES_MARKER = "<!-- notes: kept when the table above is regenerated -->"


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _rss_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    with open("/proc/self/clear_refs", "w") as f:  # "5" resets VmHWM to the current RSS (Linux >= 4.0)
        f.write("5")
    return _rss_bytes("VmRSS")


def _peak(device):
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else _rss_bytes("VmHWM")


def _method_fn(method, graph, kind):
    if method in ("spmm", "spmm_torch", "index_add"):  # (spmm_torch: the spmm backend, product chosen by env)
        backend = "spmm" if method == "spmm_torch" else method
        return lambda h: aggregate(graph, h, kind, backend=backend)
    if method == "csr_autograd":
        return lambda h: graph.adjacency(kind, h.dtype) @ h
    if method == "coo_autograd":
        cache = {}

        def coo_mm(h):
            if "a" not in cache:
                rows, cols, vals = graph.coo(kind, h.dtype)
                a = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (graph.n_dst, graph.n_src))
                cache["a"] = a.coalesce()
            return torch.sparse.mm(cache["a"], h)
        return coo_mm
    raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")


def build_graph(vertices, degree, seed, device):
    """Random in-edge CSR with Poisson-ish in-degrees of mean `degree` (duplicates and self loops kept:
    they cost the same as other edges and the benchmark measures throughput, not a model)."""
    rng = np.random.default_rng(seed)
    edges = vertices * degree
    indptr, indices = csr_from_edges(rng.integers(0, vertices, edges), rng.integers(0, vertices, edges), vertices)
    return LayerGraph.from_csr(indptr, indices, vertices).to(device)


def run_worker(args):
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    graph = build_graph(args.vertices, args.degree, args.seed, device)
    h = torch.randn(args.vertices, args.width, device=device, requires_grad=True)
    grad_out = torch.randn(args.vertices, args.width, device=device)
    fn = _method_fn(args.worker, graph, args.kind)
    _sync(device)
    base = _reset_peak(device)

    t0 = time.perf_counter()
    fn(h).backward(grad_out)  # warm-up: builds the cached matrices
    _sync(device)
    build_s = time.perf_counter() - t0
    fwd, bwd = [], []
    for _ in range(args.reps):
        h.grad = None
        t0 = time.perf_counter()
        out = fn(h)
        _sync(device)
        t1 = time.perf_counter()
        out.backward(grad_out)
        _sync(device)
        fwd.append(t1 - t0)
        bwd.append(time.perf_counter() - t1)
        del out
    result = dict(method=args.worker, build_s=build_s, forward_s=statistics.median(fwd),
                  backward_s=statistics.median(bwd), total_s=statistics.median(f + b for f, b in zip(fwd, bwd)),
                  peak_extra_mib=(_peak(device) - base) / 2**20, nnz=graph.nnz)
    print(json.dumps(result))


def run_all(args):
    results = []
    for method in args.methods:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", method, "--device", args.device,
               "--vertices", str(args.vertices), "--degree", str(args.degree), "--width", str(args.width),
               "--reps", str(args.reps), "--kind", args.kind, "--seed", str(args.seed)]
        env = dict(os.environ, GRANNDIS_CPU_KERNELS="torch") if method == "spmm_torch" else None
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            sys.exit(f"bench_aggregate: method {method} failed (exit {proc.returncode})")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        r = results[-1]
        print(f"{method:13s} fwd {r['forward_s']:.3f}s  bwd {r['backward_s']:.3f}s  total {r['total_s']:.3f}s  "
              f"build {r['build_s']:.3f}s  peak +{r['peak_extra_mib']:.0f} MiB", flush=True)
    if args.out:
        write_markdown(args, results)
        print(f"wrote {args.out}")


def write_markdown(args, results):
    fastest = min(results, key=lambda r: r["total_s"])
    if args.device == "cuda":
        where = torch.cuda.get_device_name(0)
    else:
        where = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads"
    lines = [
        "# Aggregation backends: forward + backward",
        "",
        "Generated by `bench/bench_aggregate.py` (see its docstring for the method); re-run it to refresh.",
        "",
        f"- graph: {args.vertices:,} vertices, {results[0]['nnz']:,} edges (average in-degree {args.degree}), "
        f"width {args.width}, kind `{args.kind}`, float32",
        f"- device: {args.device} ({where}); torch {torch.__version__}; median of {args.reps} repetitions",
        "- peak: extra memory over the graph and h while building the caches and running the repetitions "
        "(CPU: resident set high-water mark; CUDA: max allocated)",
        "",
        "| method | forward (s) | backward (s) | fwd+bwd (s) | build, first call (s) | peak extra (MiB) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(f"| `{r['method']}` | {r['forward_s']:.3f} | {r['backward_s']:.3f} | {r['total_s']:.3f} | "
                     f"{r['build_s']:.3f} | {r['peak_extra_mib']:.0f} |")
    lines += ["", f"Fastest forward+backward here: `{fastest['method']}`.", ""]
    # Hand-written interpretation below NOTES_MARKER survives a re-run.
    notes = ""
    if os.path.exists(args.out):
        with open(args.out) as f:
            old = f.read()
        if NOTES_MARKER in old:
            notes = old[old.index(NOTES_MARKER):]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + ("\n" + notes if notes else ""))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vertices", type=int, default=200_000)
    p.add_argument("--degree", type=int, default=25, help="average in-degree")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--kind", choices=("mean", "gcn"), default="mean")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--out", default=None, help="write a markdown table here (e.g. docs/performance/aggregate.md)")
    p.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda requested but torch.cuda.is_available() is False")
    if args.worker:
        run_worker(args)
    else:
        run_all(args)


if __name__ == "__main__":
    main()

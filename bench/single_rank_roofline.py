"""The roofline of one rank's epoch (bench/bench_single_rank.py): per layer and op the bytes it must move
and the floating-point operations it must do, bounded by the machine's two roofs measured in the same run.

An op's bound is max(bytes / bandwidth, flops / peak): the memory roof is the better bandwidth of
STREAM-like copy and add kernels (bytes read + written), the compute roof the FLOP/s of a large float32
GEMM, both on the benchmark's thread count.  Bytes are what the op must move at least (CSR arrays read
once, dense operands read and results written once; a row gathered twice counts once); flops are the
multiply-adds of the products (2 per multiply-add) and one per element of an elementwise op (the keyed
dropout's integer hash is not counted: its bound is its bytes).  Each op is also timed alone on the
same shapes, so "measured / bound" says how far each op is from its roof.
"""
from __future__ import annotations

import statistics
import time

import torch

F32 = 4


def stream_gbs(mib=256, reps=7):
    """Bandwidth of STREAM's copy (c = a) and add (c = a + b) kernels as torch runs them on the current
    thread count: bytes read + written per second, for each (best of `reps`)."""
    a, b = torch.ones(mib * 2 ** 18), torch.ones(mib * 2 ** 18)
    c = torch.zeros_like(a)  # touched: no page faults inside the timing
    best = {"copy": float("inf"), "add": float("inf")}
    for _ in range(reps):
        for name, fn in (("copy", lambda: c.copy_(a)), ("add", lambda: torch.add(a, b, out=c))):
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    nbytes = a.numel() * 4
    return {"copy": 2 * nbytes / best["copy"] / 1e9, "add": 3 * nbytes / best["add"] / 1e9}


GEMM_N = 1024  # the compute roof's GEMM: n x n x n


def peak_gflops(n=GEMM_N, reps=5):
    """FLOP/s (in G) of a float32 n x n x n GEMM on the current thread count, best of `reps`: the
    compute roof (a GEMM this size runs at the BLAS kernel's peak; the skinny products of a layer can
    only be slower)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    c = torch.empty(n, n)
    torch.mm(a, b, out=c)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b, out=c)
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best / 1e9


def timed(fn, reps=5):
    """Median time of fn() over `reps` calls after one warm-up call."""
    fn()
    ts = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - start)
    return statistics.median(ts)


def bound_s(row, gbs, gflops):
    """(seconds, roof) of one op row: the larger of its memory and compute times."""
    mem, comp = row["bytes"] / (gbs * 1e9), row["flops"] / (gflops * 1e9)
    return (mem, "memory") if mem >= comp else (comp, "compute")


def dropout_fwd_bwd(layer, n, width, p=0.5):
    """One keyed dropout of [n, width] rows, forward and backward through autograd (as in training)."""
    from granndis_hpc.nn.dropout import apply_mask, keep_mask

    x, g, ids = torch.randn(n, width, requires_grad=True), torch.randn(n, width), torch.arange(n)
    return lambda: torch.autograd.grad(apply_mask(x, keep_mask(0, 0, layer, ids, width, p), p), x, g)


def sage_ops(l, g, conv, x, last):
    """The ops of SAGE layer l in the order granndis computes them: [(name, bytes, flops, fn)]."""
    n, n_src, e = int(g.n_dst), int(g.n_src), int(g.indices.shape[0])
    din, dout = conv.lin_self.in_features, conv.lin_self.out_features
    w = dout if dout < din else din  # the aggregated width (nn/layers.project_first on one rank)
    a, at = g._matrix("mean", torch.float32, transposed=False), g._matrix("mean", torch.float32, transposed=True)
    csr = (n + 1) * a.crow_indices().element_size() + e * (a.col_indices().element_size() + F32)
    agg_in = torch.randn(n_src, w)
    gy, gz = torch.randn(n, dout), torch.randn(n, dout)
    lin = torch.nn.Linear(din, dout)
    mm = 2 * n * din * dout  # one projection's multiply-adds, x2
    ops = [("spmm fwd A@H", csr + (n_src + n) * w * F32, 2 * e * w, lambda: a @ agg_in),
           ("spmm bwd A^T@G", csr + (n_src + n) * w * F32, 2 * e * w, lambda: at @ agg_in[:n]),
           ("2 linear fwd X@W", 2 * (n * din + n * dout) * F32, 2 * mm, lambda: (lin(x), lin(x))),
           ("2 linear bwd dX", 2 * (n * dout + n * din) * F32, 2 * mm, lambda: (gy @ lin.weight, gy @ lin.weight)),
           ("2 linear bwd dW", 2 * (n * dout + n * din) * F32, 2 * mm, lambda: (gy.T @ x, gy.T @ x)),
           ("add self + neigh", 3 * n * dout * F32, n * dout, lambda: gy + gz)]
    if not last:
        # relu: read h, write out; backward read grad and out, write.  Dropout as the engine runs it
        # (nn/dropout.py): the keyed mask written (1 byte an element) and read, h read and the result
        # written; backward the gradient read and written (times the saved mask).
        ops += [("relu fwd + bwd", 5 * n * dout * F32, 2 * n * dout, lambda: (torch.relu(gy), gy * (gz > 0))),
                ("dropout fwd + bwd", (4 * F32 + 2) * n * dout, 2 * n * dout, dropout_fwd_bwd(l, n, dout))]
    return ops


def roofline(trainer):
    """Per layer, the ops of the trainer's SAGE model, each timed alone: [{layer, op, bytes, flops, s}]."""
    graphs, model = trainer.train_view.graphs, trainer.model
    rows = []
    for l, (g, conv) in enumerate(zip(graphs, model.convs)):
        din = conv.lin_self.in_features
        x = torch.randn(int(g.n_src), din) if l else trainer.train_view.input_features
        for name, nbytes, flops, fn in sage_ops(l, g, conv, x, l == len(graphs) - 1):
            rows.append({"layer": l, "op": name, "bytes": nbytes, "flops": flops, "s": timed(fn)})
    return rows


def page_lines(rows, stream, gflops, epoch_s):
    """The roofline section of the results page: the roofs, the per-op table and the epoch's ratio."""
    gbs = max(stream.values())
    lines = [f"## Roofline (memory {gbs:.1f} GB/s: STREAM-like copy {stream['copy']:.1f}, add {stream['add']:.1f} "
             f"GB/s, bytes read + written; compute {gflops:.1f} GFLOP/s: a {GEMM_N}^3 float32 GEMM)", "",
             "Per op the bytes it must move at least and the flops it must do; its bound is the larger of "
             "bytes / bandwidth and flops / peak (the roof that binds), next to the op's measured time alone "
             "on the same shapes (median of 5).", "",
             "| layer | op | MB | MFLOP | roof | bound (ms) | measured (ms) | measured / bound |",
             "|---:|---|---:|---:|---|---:|---:|---:|"]
    total = {"memory": 0.0, "compute": 0.0}
    for r in rows:
        b, roof = bound_s(r, gbs, gflops)
        total[roof] += b
        lines.append(f"| {r['layer']} | {r['op']} | {r['bytes'] / 1e6:.1f} | {r['flops'] / 1e6:.0f} | {roof} | "
                     f"{1e3 * b:.2f} | {1e3 * r['s']:.2f} | {r['s'] / b:.1f}x |")
    bound = sum(total.values())
    measured = sum(r["s"] for r in rows)
    lines += ["", f"Sum of the bounds {1e3 * bound:.1f} ms ({1e3 * total['memory']:.1f} ms memory-bound ops, "
              f"{1e3 * total['compute']:.1f} ms compute-bound ops); of the ops measured alone {1e3 * measured:.1f} ms; "
              f"the default epoch's median {1e3 * epoch_s:.1f} ms = {epoch_s / bound:.1f}x the bound.", ""]
    return lines

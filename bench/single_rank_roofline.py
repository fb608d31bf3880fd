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

from granndis_hpc.nn.cpu_kernels import csr_matmul

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


def _backward(f, x, params=()):
    """Time-able backward alone of y = f(x): the graph is built once and kept (retain_graph)."""
    x = x.detach().requires_grad_()
    y = f(x)
    g = torch.randn_like(y)
    return lambda: torch.autograd.grad(y, [x, *params], g, retain_graph=True)


def spmm_ops(g, kind, w):
    """A layer's sparse product at width w, forward and backward (the cached transposed matrix), by the
    product the aggregations use (nn/cpu_kernels.py)."""
    n, n_src = int(g.n_dst), int(g.n_src)
    a, at = g._matrix(kind, torch.float32, transposed=False), g._matrix(kind, torch.float32, transposed=True)
    nnz = int(a.col_indices().shape[0])
    csr = (n + 1) * a.crow_indices().element_size() + nnz * (a.col_indices().element_size() + F32)
    h, gy = torch.randn(n_src, w), torch.randn(n, w)
    nbytes, flops = csr + (n_src + n) * w * F32, 2 * nnz * w
    return [("spmm fwd A@H", nbytes, flops, lambda: csr_matmul(a, h), True),
            ("spmm bwd A^T@G", nbytes, flops, lambda: csr_matmul(at, gy), False)]


def linear_ops(k, n, din, dout, x=None, dx=True):
    """k projections [n, din] -> [n, dout] (their weights' bytes are negligible): forward, the input's
    gradient (dx: unless x is the input features) and the weight's gradient."""
    x = torch.randn(n, din) if x is None else x
    lin, gy = torch.nn.Linear(din, dout), torch.randn(n, dout)
    nbytes, flops, tag = k * (n * din + n * dout) * F32, k * 2 * n * din * dout, f"{k} linear" if k > 1 else "linear"
    ops = [(f"{tag} fwd X@W", nbytes, flops, lambda: [lin(x) for _ in range(k)], True)]
    if dx:
        ops.append((f"{tag} bwd dX", nbytes, flops, lambda: [gy @ lin.weight for _ in range(k)], False))
    ops.append((f"{tag} bwd dW", nbytes, flops, lambda: [gy.T @ x for _ in range(k)], False))
    return ops


def between_ops(layer, n, d, norm=False, p=0.5):
    """[LayerNorm] -> ReLU -> keyed dropout of [n, d] rows, each forward and backward (autograd's).
    Bytes: LayerNorm reads h and writes its result, its backward reads the gradient and h and writes;
    relu the same; dropout writes (forward) and reads (backward) a one-byte mask besides."""
    from granndis_hpc.nn.dropout import drop_rows

    nd, ops, ids = n * d, [], torch.arange(n)
    h = torch.randn(n, d)
    if norm:
        ln = torch.nn.LayerNorm(d)
        with torch.no_grad():
            ops.append(("layernorm fwd", 2 * nd * F32, 8 * nd, lambda: ln(h), True))
        ops.append(("layernorm bwd", 3 * nd * F32, 10 * nd, _backward(ln, h, list(ln.parameters())), False))
    ops += [("relu fwd", 2 * nd * F32, nd, lambda: torch.relu(h), True),
            ("relu bwd", 3 * nd * F32, nd, _backward(torch.relu, h), False),
            ("dropout fwd", 2 * nd * F32 + nd, nd, lambda: drop_rows(0, 0, layer, ids, h, p), True),
            ("dropout bwd", 2 * nd * F32 + nd, nd, _backward(lambda t: drop_rows(0, 0, layer, ids, t, p), h), False)]
    return ops


def add_ops(name, n, d):
    """A sum of two [n, d] operands forward; backward hands the gradient to both (no copy)."""
    a, b = torch.randn(n, d), torch.randn(n, d)
    return [(name, 3 * n * d * F32, n * d, lambda: a + b, True)]


def conv_ops(g, conv, x=None):
    """The ops of one conv (nn/layers.py SAGEConv or GCNConv) on one rank, in the order granndis runs them."""
    n, din, dout = int(g.n_dst), conv.in_features, conv.out_features
    w = dout if dout < din else din  # the aggregated width (nn/layers.project_first on one rank)
    # On the input features (x given: no gradient) aggregated before projecting, no backward product.
    spmm = spmm_ops(g, "mean" if hasattr(conv, "lin_self") else "gcn", w)[:1 if x is not None and w == din else 2]
    if hasattr(conv, "lin_self"):  # SAGE: the vertex's and the neighbours' projections, summed
        return spmm + linear_ops(2, n, din, dout, x, dx=x is None) + add_ops("add self + neigh", n, dout)
    bias = torch.randn(dout)
    y = torch.randn(n, dout)
    return spmm + linear_ops(1, n, din, dout, x, dx=x is None) + [
        ("bias fwd", 2 * n * dout * F32, n * dout, lambda: y + bias, True),
        ("bias bwd", n * dout * F32, n * dout, lambda: y.sum(0), False)]


def model_ops(trainer):
    """Yields (layer label, recomputed, ops) of the trainer's model (sage, gcn or ressage) on one rank:
    the layers in order, ResSAGE+'s encoder and head as their own entries; `recomputed`: the layer's
    forward runs twice (a checkpointed residual block).  One layer at a time: its operands are
    allocated when it is reached and freed after."""
    model, graphs = trainer.model, trainer.train_view.graphs
    x = trainer.train_view.input_features
    if not model.residual:
        for l, (g, conv) in enumerate(zip(graphs, model.convs)):
            ops = conv_ops(g, conv, x if l == 0 else None)
            if l < len(graphs) - 1:
                ops += between_ops(l + 1, int(g.n_dst), conv.out_features, norm=model.norms is not None,
                                   p=model.dropout)
            yield str(l), False, ops
        return
    hidden, n0 = model.encoder.out_features, int(graphs[0].n_src)
    yield "encoder", False, linear_ops(1, n0, model.encoder.in_features, hidden, x, dx=False)
    yield "0", False, conv_ops(graphs[0], model.convs[0])
    for l in range(1, model.num_layers):
        n = int(graphs[l].n_dst)
        ops = (between_ops(l, int(graphs[l].n_src), hidden, norm=True, p=model.dropout)
               + conv_ops(graphs[l], model.convs[l]) + add_ops("residual add", n, hidden))
        yield str(l), bool(trainer.pass_settings.checkpoint_activations), ops
    n = int(graphs[-1].n_dst)
    yield "head", False, (between_ops(model.total_layers, n, hidden, norm=True, p=model.dropout)
                          + linear_ops(1, n, hidden, model.head.out_features))


def roofline(trainer):
    """Per layer and op of the trainer's model, each timed alone (ops of the same shape once):
    [{layer, op, bytes, flops, s, times}], `times` the op's runs per epoch (2: a recomputed forward).
    Consecutive layers with the same ops (ResSAGE+'s blocks) are one row group, layer "a-b", their
    times summed."""
    measured, groups = {}, []
    for label, recomputed, ops in model_ops(trainer):
        rows = []
        for name, nbytes, flops, fn, forward in ops:
            key = (name, nbytes, flops)
            if key not in measured:
                measured[key] = timed(fn)
            times = 2 if recomputed and forward else 1
            rows.append({"op": name + (" (x2: recomputed)" if times == 2 else ""), "bytes": nbytes, "flops": flops,
                         "s": measured[key], "times": times})
        shape = [(r["op"], r["bytes"], r["flops"]) for r in rows]
        if groups and groups[-1][2] == shape and label.isdigit() and groups[-1][0][-1].isdigit():
            groups[-1][0][1] = label
            groups[-1][3] += 1
        else:
            groups.append([[label, label], rows, shape, 1])
    out = []
    for (first, last), rows, _, count in groups:
        for r in rows:
            out.append(dict(r, layer=first if first == last else f"{first}-{last}", times=r["times"] * count))
    return out


def page_lines(rows, stream, gflops, epoch_s):
    """The roofline section of the results page: the roofs, the per-op table and the epoch's ratio."""
    gbs = max(stream.values())
    lines = [f"## Roofline (memory {gbs:.1f} GB/s: STREAM-like copy {stream['copy']:.1f}, add {stream['add']:.1f} "
             f"GB/s, bytes read + written; compute {gflops:.1f} GFLOP/s: a {GEMM_N}^3 float32 GEMM)", "",
             "Per op the bytes it must move at least and the flops it must do; its bound is the larger of "
             "bytes / bandwidth and flops / peak (the roof that binds), next to the op's measured time alone "
             "on the same shapes (median of 5); runs: the op's runs per epoch (a group of identical layers, "
             "a recomputed forward), which MB, MFLOP, bound and measured count.", "",
             "| layer | op | runs | MB | MFLOP | roof | bound (ms) | measured (ms) | measured / bound |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|"]
    total = {"memory": 0.0, "compute": 0.0}
    for r in rows:
        b, roof = bound_s(r, gbs, gflops)
        k = r["times"]
        total[roof] += k * b
        lines.append(f"| {r['layer']} | {r['op']} | {k} | {k * r['bytes'] / 1e6:.1f} | {k * r['flops'] / 1e6:.0f} | "
                     f"{roof} | {1e3 * k * b:.2f} | {1e3 * k * r['s']:.2f} | {r['s'] / b:.1f}x |")
    bound = sum(total.values())
    measured = sum(r["times"] * r["s"] for r in rows)
    lines += ["", f"Sum of the bounds {1e3 * bound:.1f} ms ({1e3 * total['memory']:.1f} ms memory-bound ops, "
              f"{1e3 * total['compute']:.1f} ms compute-bound ops); of the ops measured alone {1e3 * measured:.1f} ms; "
              f"the default epoch's median {1e3 * epoch_s:.1f} ms = {epoch_s / bound:.1f}x the bound.", ""]
    return lines

"""Single-rank GraphSAGE training: this project's model against PyTorch Geometric's SAGEConv (not a test).

    .venv/bin/pip install torch_geometric        # or: pip install -e '.[bench]'
    .venv/bin/python bench/bench_single.py --out bench-out/single.md

The same 3-layer SAGE (mean aggregation, ReLU between layers, no dropout, hidden 64) on the same
synthetic graph (preprocess's DC-SBM, default 100,000 vertices, average degree 25, 100 features), trained
full-batch on one process: forward over the whole graph, cross-entropy on the train rows, backward,
Adam step.  Implementations, each with its own copy of the same initial weights:

  granndis   granndis_hpc.nn (build_model("sage")): cached CSR adjacency, sparse matmul both ways
  pyg-csr    torch_geometric.nn.SAGEConv over a torch.sparse CSR adj_t (PyG's sparse path, spmm mean)
  pyg-edges  torch_geometric.nn.SAGEConv over edge_index (PyG's default gather/scatter message passing)

Before timing, a check that all of them compute the same loss and the same gradients given the same
weights (float32; the script exits 1 if not).  Then --reps rounds; in each round every implementation
trains one epoch, in a rotated order, so a change of the machine's load hits all of them alike; the
per-epoch time is the median over the rounds, and the ratio PyG / granndis is printed per round too.
torch runs --threads threads (default 1, as one rank of the MPI jobs here).
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
import warnings

import numpy as np
import torch

from granndis_hpc.nn import LayerGraph  # noqa: E402
from granndis_hpc.nn.models import build_model  # noqa: E402

TOLERANCE = 1e-4  # relative, float32: the implementations sum the same terms in different orders


class GranndisSage:
    """This project's model over one whole-graph LayerGraph, reused by every layer."""

    name = "granndis"

    def __init__(self, graph, features, classes, args):
        self.model = build_model("sage", features.shape[1], args.hidden, classes, args.layers, dropout=0.0)
        deg = np.diff(graph.indptr).astype(np.float32)  # global in-degree: the mean's denominator
        self.graph = LayerGraph.from_csr(graph.indptr, graph.indices, graph.num_vertices, dst_degree=deg,
                                         src_degree=deg)

    def logits(self, x):
        return self.model(x, [self.graph] * len(self.model.convs))


class PygSage(torch.nn.Module):
    """The same layers built from torch_geometric.nn.SAGEConv; `adj` is edge_index or a sparse adj_t."""

    def __init__(self, name, adj, features, classes, args):
        from torch_geometric.nn import SAGEConv

        super().__init__()
        self.name, self.adj = name, adj
        widths = [features] + [args.hidden] * (args.layers - 1) + [classes]
        self.convs = torch.nn.ModuleList(SAGEConv(a, b, aggr="mean") for a, b in zip(widths[:-1], widths[1:]))
        self.model = self

    def copy_from(self, ours):
        """PyG: lin_l(mean of neighbours) + lin_r(x), bias in lin_l; ours: lin_self (with bias) +
        lin_neigh (without).  The sum is the same function, so the weights map one to one."""
        with torch.no_grad():
            for pyg, conv in zip(self.convs, ours.convs):
                pyg.lin_l.weight.copy_(conv.lin_neigh.weight)
                pyg.lin_r.weight.copy_(conv.lin_self.weight)
                pyg.lin_l.bias.copy_(conv.lin_self.bias)
        return self

    def logits(self, x):
        h = x
        for i, conv in enumerate(self.convs):
            if i > 0:
                h = torch.relu(h)
            h = conv(h, self.adj)
        return h


def build_graph(args):
    from granndis_hpc.preprocess.sources import load

    return load("synthetic", vertices=args.vertices, avg_degree=args.degree, features=args.features, seed=0)


def make_implementations(graph, args):
    """[granndis, pyg-csr, pyg-edges] with the same initial weights (the PyG ones only when installed)."""
    torch.manual_seed(0)
    ours = GranndisSage(graph, graph.features, graph.num_classes, args)
    impls = [ours]
    try:
        import torch_geometric  # noqa: F401
    except ImportError:
        return impls, "torch_geometric is not installed (`.venv/bin/pip install torch_geometric`)"
    n = graph.num_vertices
    indptr, indices = torch.from_numpy(graph.indptr), torch.from_numpy(graph.indices)
    # In-edge CSR: row v lists the sources of v's in-edges, which is PyG's adj_t (target rows) as it is.
    with warnings.catch_warnings():  # torch's "beta" / "invariant checks" notes, once per tensor
        warnings.simplefilter("ignore", UserWarning)
        adj_t = torch.sparse_csr_tensor(indptr, indices, torch.ones(indices.shape[0]), size=(n, n))
    edge_index = torch.stack([indices, torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])])
    for name, adj in (("pyg-csr", adj_t), ("pyg-edges", edge_index)):
        impls.append(PygSage(name, adj, graph.num_features, graph.num_classes, args).copy_from(ours.model))
    return impls, None


def loss_and_grads(impl, x, labels, train):
    impl.model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(impl.logits(x)[train], labels[train])
    loss.backward()
    return loss.item(), [p.grad.detach().clone() for p in impl.model.parameters()]


def grad_norms_by_layer(impl, grads):
    """Per-layer gradient norms in one layout for both models: [self, neighbour, bias] per layer."""
    named = dict(zip((n for n, _ in impl.model.named_parameters()), grads))
    out = []
    for i in range(len(impl.model.convs)):
        if impl.name == "granndis":
            keys = (f"convs.{i}.lin_self.weight", f"convs.{i}.lin_neigh.weight", f"convs.{i}.lin_self.bias")
        else:
            keys = (f"convs.{i}.lin_r.weight", f"convs.{i}.lin_l.weight", f"convs.{i}.lin_l.bias")
        out.append([named[k] for k in keys])
    return out


def check_same_function(impls, x, labels, train):
    """Same weights -> same loss and gradients; returns the lines for the page, raises if they differ."""
    ref_loss, ref_grads = loss_and_grads(impls[0], x, labels, train)
    ref = grad_norms_by_layer(impls[0], ref_grads)
    lines = [f"- {impls[0].name}: loss {ref_loss:.6f}"]
    for impl in impls[1:]:
        loss, grads = loss_and_grads(impl, x, labels, train)
        worst = 0.0
        for a_layer, b_layer in zip(ref, grad_norms_by_layer(impl, grads)):
            for a, b in zip(a_layer, b_layer):
                worst = max(worst, float((a - b).abs().max()) / max(float(a.abs().max()), 1e-12))
        rel = abs(loss - ref_loss) / abs(ref_loss)
        lines.append(f"- {impl.name}: loss {loss:.6f} (relative difference {rel:.1e}), largest relative "
                     f"gradient difference {worst:.1e}")
        if rel > TOLERANCE or worst > TOLERANCE:
            raise SystemExit(f"bench_single: {impl.name} does not compute what granndis computes with the same "
                             f"weights (loss {loss} vs {ref_loss}, gradient difference {worst:.1e} > {TOLERANCE})")
    return lines


def time_epoch(impl, opt, x, labels, train):
    start = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(impl.logits(x)[train], labels[train]).backward()
    opt.step()
    return time.perf_counter() - start


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vertices", type=int, default=100_000)
    p.add_argument("--degree", type=float, default=25.0, help="average in-degree of the synthetic graph")
    p.add_argument("--features", type=int, default=100)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--reps", type=int, default=11, help="timed rounds (every implementation once per round)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--out", default=None, help="write the results page here (markdown)")
    args = p.parse_args(argv)
    if args.reps < 1 or args.threads < 1 or args.layers < 1:
        p.error("--reps, --threads and --layers must be at least 1")
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    graph = build_graph(args)
    x, labels = torch.from_numpy(graph.features), torch.from_numpy(graph.labels)
    train = torch.from_numpy(np.flatnonzero(graph.train_mask))
    impls, missing = make_implementations(graph, args)
    lines = [f"# Single-rank GraphSAGE: granndis_hpc.nn vs PyTorch Geometric ({datetime.date.today()})", "",
             f"Synthetic DC-SBM graph, {graph.num_vertices:,} vertices, {graph.num_edges:,} edges, "
             f"{graph.num_features} features, {graph.num_classes} classes; {args.layers}-layer SAGE, hidden "
             f"{args.hidden}, mean aggregation, no dropout; full-batch epoch = forward, cross-entropy on the "
             f"{train.numel():,} train rows, backward, Adam step. torch {torch.__version__}, {args.threads} "
             f"thread(s), {platform.machine()}, {os.cpu_count()} cores shared with other jobs.", ""]
    if missing:
        lines += [f"PyG not measured: {missing}.", ""]
    else:
        import torch_geometric
        from torch_geometric import typing as pyg_typing

        lines[2] = lines[2].replace(f"torch {torch.__version__}",
                                    f"torch {torch.__version__}, torch_geometric {torch_geometric.__version__}")
        # PyG's compiled extensions change its speed; say which it had (PyPI has wheels of none of them).
        ext = {name: getattr(pyg_typing, flag, False) for name, flag in
               (("pyg-lib", "WITH_PYG_LIB"), ("torch-scatter", "WITH_TORCH_SCATTER"), ("torch-sparse",
                                                                                       "WITH_TORCH_SPARSE"))}
        lines += ["PyG's optional compiled extensions: " + ", ".join(f"{n} {'yes' if on else 'no'}" for n,
                                                                     on in ext.items())
                  + " (without them PyG aggregates with torch's own scatter / sparse kernels). granndis "
                  "aggregates after the linear map in a layer whose output is narrower than its input (here "
                  f"the first, {graph.num_features} -> {args.hidden}, and the last, {args.hidden} -> "
                  f"{graph.num_classes}); PyG's SAGEConv always aggregates first.", ""]
    lines += ["## Same weights, same function", ""] + check_same_function(impls, x, labels, train) + [""]
    opts = [torch.optim.Adam(i.model.parameters(), lr=0.01) for i in impls]
    for impl, opt in zip(impls, opts):  # warm-up: caches (CSR matrices, PyG's checks), allocator
        time_epoch(impl, opt, x, labels, train)
    times = {i.name: [] for i in impls}
    for r in range(args.reps):
        k = r % len(impls)
        for impl, opt in list(zip(impls, opts))[k:] + list(zip(impls, opts))[:k]:  # rotated order per round
            times[impl.name].append(time_epoch(impl, opt, x, labels, train))
        print(f"round {r}: " + ", ".join(f"{n} {t[-1]:.3f} s" for n, t in times.items()), flush=True)
    ours = statistics.median(times["granndis"])
    lines += ["## Epoch time (median over the rounds)", "",
              "| implementation | epoch (s) | min-max (s) | time / granndis | ratio per round (median, min-max) |",
              "|---|---:|---:|---:|---:|"]
    for name, ts in times.items():
        per_round = [t / o for t, o in zip(ts, times["granndis"])]
        lines.append(f"| {name} | {statistics.median(ts):.3f} | {min(ts):.3f}-{max(ts):.3f} | "
                     f"{statistics.median(ts) / ours:.2f}x | {statistics.median(per_round):.2f}x "
                     f"({min(per_round):.2f}-{max(per_round):.2f}) |")
    load_after = os.getloadavg()
    lines += ["", f"{args.reps} rounds, each implementation once per round in a rotated order, after one warm-up "
              f"epoch each. Load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after.", "",
              "## Command", "", "```", f"python bench/bench_single.py {' '.join(argv or sys.argv[1:])}".rstrip(),
              "```", ""]
    page = "\n".join(lines)
    print(page)
    if args.out:
        with open(args.out, "w") as f:
            f.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The one-process reference epoch of bench/bench_hetero.py: the same models from PyTorch Geometric's
convolutions, trained on the same graph in one process (not a test).

    python bench/hetero_pyg.py --vertices 100000 --models rgcn,rgat --epochs 3 --json OUT.json

  rgcn  torch_geometric.nn.RGCNConv(aggr="mean") per layer over the graph's edge list and each edge's
        relation, ReLU between the layers (as PyG's R-GCN example)
  rgat  HeteroConv({relation: GATConv(add_self_loops=False)}, aggr="sum") per layer over the types' rows
        and each relation's edges (as MLPerf's R-GAT reference), LeakyReLU 0.01 between the layers; the
        hidden layers 4 heads of --hidden concatenated, the last one head into the classes

3 layers, --hidden, no dropout, Adam; an epoch is the forward over every vertex, the cross entropy over
the target type's training vertices, the backward and the optimiser's step.  The graph is loaded whole
in this process (`--source synthetic --generator mag`), as a PyG user holds it; the median epoch over all
but the first and the process's peak RSS are written as JSON.  One torch thread by default, as each rank
of the emulated cluster has on a 2-core machine (torch's threads spin on a loaded machine: 2 threads
were 10x slower than 1 there).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from granndis_hpc.preprocess.sources import load


SIZES = ("vertices", "seed", "layers", "hidden", "epochs")  # what a record was measured at


def typed_inputs(g):
    """x_dict and edge_index_dict as a PyG user holds them (ids local to each type)."""
    types = g.types
    offsets = np.asarray(types.offsets)
    dst = np.repeat(np.arange(types.num_vertices), np.diff(g.indptr))
    src_t = np.searchsorted(offsets, g.indices, side="right") - 1
    dst_t = np.searchsorted(offsets, dst, side="right") - 1
    x = torch.from_numpy(np.asarray(g.features, dtype=np.float32))
    x_dict = {name: x[offsets[t]: offsets[t + 1]] for t, name in enumerate(types.names)}
    edges, relation = {}, np.full(len(g.indices), -1, dtype=np.int64)
    for r, rel in enumerate(types.relations):
        s, d = types.names.index(rel.src), types.names.index(rel.dst)
        e = (src_t == s) & (dst_t == d)
        relation[e] = r
        edges[rel.key] = torch.from_numpy(np.stack([g.indices[e] - offsets[s], dst[e] - offsets[d]]))
    edge_index = torch.from_numpy(np.stack([np.asarray(g.indices, dtype=np.int64), dst]))
    return x, x_dict, edges, edge_index, torch.from_numpy(relation)


class RGCN(torch.nn.Module):
    def __init__(self, widths, relations):
        from torch_geometric.nn import RGCNConv
        super().__init__()
        self.convs = torch.nn.ModuleList(RGCNConv(widths[l], widths[l + 1], relations, aggr="mean")
                                         for l in range(len(widths) - 1))

    def forward(self, inputs):
        h, _, _, edge_index, relation = inputs
        for l, conv in enumerate(self.convs):
            h = conv(torch.relu(h) if l else h, edge_index, relation)
        return h


class RGAT(torch.nn.Module):
    def __init__(self, in_features, hidden, classes, layers, types, heads=4):
        from torch_geometric.nn import GATConv, HeteroConv
        super().__init__()
        self.types = types

        def conv(i, o, h, concat):
            return HeteroConv({rel.key: GATConv((i, i), o, heads=h, concat=concat, add_self_loops=False)
                               for rel in types.relations}, aggr="sum")
        self.convs = torch.nn.ModuleList([conv(in_features if l == 0 else heads * hidden, hidden, heads, True)
                                          for l in range(layers - 1)]
                                         + [conv(heads * hidden, classes, 1, False)])

    def forward(self, inputs):
        _, h, edges, _, _ = inputs
        for l, conv in enumerate(self.convs):
            if l:
                h = {k: F.leaky_relu(v, 0.01) for k, v in h.items()}
            out = conv(h, edges)
            h = {k: out.get(k, v.new_zeros(v.shape[0], next(iter(out.values())).shape[1])) for k, v in h.items()}
        return h[self.types.target]


def epochs(model, inputs, labels, train, n_epochs):
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    times = []
    for _ in range(n_epochs):
        t = time.perf_counter()
        opt.zero_grad()
        logits = model(inputs)
        F.cross_entropy(logits[train], labels[train]).backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return times


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vertices", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", required=True, choices=("rgcn", "rgat"))
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3, help="the first is left out of the median")
    p.add_argument("--threads", type=int, default=1,
                   help="torch's threads (1: as each of the 4 emulated ranks on this 2-core machine has)")
    p.add_argument("--json", required=True, help="where the record is written")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    g = load("synthetic", generator="mag", vertices=args.vertices, seed=args.seed)
    inputs = typed_inputs(g)
    t = g.types.index(g.types.target)
    rows = slice(g.types.offsets[t], g.types.offsets[t + 1])  # the target type's rows of the whole graph
    labels = torch.from_numpy(np.asarray(g.labels[rows], dtype=np.int64))
    train = torch.from_numpy(np.nonzero(np.asarray(g.train_mask[rows]))[0])
    torch.manual_seed(args.seed)
    if args.model == "rgcn":
        widths = [g.num_features] + [args.hidden] * (args.layers - 1) + [g.num_classes]
        model = RGCN(widths, g.types.num_relations)
    else:
        model = RGAT(g.num_features, args.hidden, g.num_classes, args.layers, g.types)
    times = epochs(model, inputs, labels, train, args.epochs)
    import torch_geometric
    record = dict(model=args.model, **{k: getattr(args, k) for k in SIZES}, epoch_s=statistics.median(times[1:]),
                  epoch_times=times, peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  threads=torch.get_num_threads(), torch=torch.__version__,
                  torch_geometric=torch_geometric.__version__)
    with open(args.json, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

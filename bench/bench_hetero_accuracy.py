"""R-GCN on real DBLP (HAN/GTN's heterogeneous DBLP: authors, papers, conferences, four relations; labels
on authors): granndis-hpc's accuracy beside PyG's own training of the same model (not a test).

    python bench/bench_hetero_accuracy.py                       # 5 seeds, one process each side
    GRANNDIS_RANKS_PER_SERVER=2 mpirun -n 4 python bench/bench_hetero_accuracy.py \\
        --out bench/results/hetero_accuracy.json

Both sides train the same model on the same graph, read by the same loader (tests/data/dblp-hetero/dblp.npz,
the bundle source: every relation with its reverse, duplicates dropped): 2-layer R-GCN (mean per relation,
a root weight; PyG's RGCNConv), hidden 64, dropout 0.5 between the layers, Adam lr 0.01 with weight
decay 5e-4, full-graph, 100 epochs, evaluated every epoch; the test accuracy is the one at the best
validation epoch.  PyG's side is a plain loop over torch_geometric.nn.RGCNConv on the graph's edge list
with each edge's relation; granndis-hpc's is `granndis_hpc.train` (fb, exact) on the same graph, built for
the job's shape.  Prints and writes the mean and standard deviation over the seeds of each side.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

import granndis_hpc as gd
from granndis_hpc.preprocess.sources import load

HERE = os.path.dirname(os.path.abspath(__file__))
DBLP = os.path.join(HERE, "..", "tests", "data", "dblp-hetero", "dblp.npz")
HP = dict(layers=2, hidden=64, dropout=0.5, lr=0.01, weight_decay=5e-4, epochs=100)


def pyg_accuracy(graph, seed: int) -> float:
    """Test accuracy at the best validation epoch of PyG's RGCNConv trained on `graph` (one process)."""
    from torch_geometric.nn import RGCNConv

    torch.manual_seed(seed)
    dst = np.repeat(np.arange(graph.num_vertices), np.diff(graph.indptr))
    edge_index = torch.from_numpy(np.stack([graph.indices, dst]))
    edge_type = torch.from_numpy(graph.types.edge_type(graph.indices, dst))
    R, widths = graph.types.num_relations, [graph.num_features, HP["hidden"], graph.num_classes]
    convs = torch.nn.ModuleList(RGCNConv(widths[i], widths[i + 1], R, aggr="mean") for i in range(HP["layers"]))
    opt = torch.optim.Adam(convs.parameters(), lr=HP["lr"], weight_decay=HP["weight_decay"])
    x, y = torch.from_numpy(graph.features), torch.from_numpy(graph.labels)
    masks = {k: torch.from_numpy(getattr(graph, f"{k}_mask")) for k in ("train", "val", "test")}

    def forward():
        h = x
        for i, conv in enumerate(convs):
            if i:
                h = F.dropout(F.relu(h), HP["dropout"], convs.training)
            h = conv(h, edge_index, edge_type)
        return h

    best = (-1.0, 0.0)
    for _ in range(HP["epochs"]):
        convs.train()
        opt.zero_grad()
        out = forward()
        F.cross_entropy(out[masks["train"]], y[masks["train"]]).backward()
        opt.step()
        convs.eval()
        with torch.no_grad():
            pred = forward().argmax(1)
        val, test = (float((pred[m] == y[m]).float().mean()) for m in (masks["val"], masks["test"]))
        if val > best[0]:
            best = (val, test)
    return best[1]


def granndis_accuracy(graph, seed: int, work: str) -> tuple:
    """(test accuracy at the best validation epoch, this process's rank) of `granndis_hpc.train`."""
    result = gd.train(graph, out=os.path.join(work, f"run-{seed}"), overwrite_run=True, build={"name": "dblp"},
                      cache_dir=os.path.join(work, "shard-cache"), mode="fb", model="rgcn", seed=seed,
                      eval_every=1, quiet=True, **HP)
    return float(result.best["test"]), result.rank


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--path", default=DBLP, help="the heterogeneous bundle (default: the DBLP of tests/data)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--work", default=None, help="run directories (default: a temporary directory)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    graph = load("bundle", path=args.path)
    work = args.work or tempfile.mkdtemp(prefix="hetero-accuracy-")
    ours = [granndis_accuracy(graph, s, work) for s in range(args.seeds)]
    if ours[0][1] != 0:  # every rank trained; one compares
        return
    ours = [accuracy for accuracy, _ in ours]
    theirs = [pyg_accuracy(graph, s) for s in range(args.seeds)]
    row = {side: {"mean": statistics.mean(v), "std": statistics.pstdev(v), "runs": v}
           for side, v in (("granndis", ours), ("pyg", theirs))}
    record = {"dataset": os.path.basename(args.path), "model": "rgcn", **HP, "seeds": args.seeds, **row,
              "difference_points": 100 * (row["granndis"]["mean"] - row["pyg"]["mean"])}
    print(f"R-GCN on {record['dataset']}, {args.seeds} seeds: granndis-hpc {100 * row['granndis']['mean']:.2f} "
          f"+- {100 * row['granndis']['std']:.2f} %, PyG {100 * row['pyg']['mean']:.2f} +- "
          f"{100 * row['pyg']['std']:.2f} % (difference {record['difference_points']:+.2f} points)")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()

"""The pieces of bench/bench_products.py that run outside its driver: the graph's statistics, the
one-machine reference epoch, and the timed full-graph evaluation pass.

    python bench/products_ref.py reference --vertices N --epochs E --out RESULT.json   # one process
    emucluster/emu-mpirun -n 4 python bench/products_ref.py evaluate --shards SET --model RUN --out RESULT.json

* PRODUCTS: ogbn-products' published statistics; graph_args() the synthetic source's options that give
  a graph with them at any size (the split fractions and the average degree stay those of products).
* reference: the training graph of an inductive run (the subgraph induced by the training vertices,
  with the self loops the products build preset adds) trained in one process with a CSR GraphSAGE in
  plain torch (PyG's SAGEConv where torch_geometric is installed), the products preset's model: 3 SAGE
  layers + 1 Linear, hidden 64, LayerNorm, dropout 0.3 (inputs too), Adam lr 0.003.
* evaluate: one exact forward over the full graph's world view (what the test accuracy of an inductive
  run is measured on), timed between barriers, with the model a training run saved.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np

# ogbn-products (OGB's dataset page; the split is the official sales-rank split).
PRODUCTS = {"vertices": 2_449_029, "edges": 61_859_140, "features": 100, "classes": 47,
            "train": 196_615, "val": 39_323}
# The local generator's average degree before symmetrisation and duplicate removal that gives products'
# 25.3 directed edges per vertex (measured: 2,449,029 vertices -> 61,337,420 edges without self loops).
AVG_DEGREE = 28.4


def graph_params(vertices: int) -> dict:
    """Options of the synthetic source (`--generator local`: power-law degrees with locality) for a graph
    with products' features, classes, average degree and split fractions at `vertices` vertices."""
    n = PRODUCTS["vertices"]
    return {"generator": "local", "vertices": int(vertices), "avg_degree": AVG_DEGREE,
            "features": PRODUCTS["features"], "classes": PRODUCTS["classes"], "seed": 0,
            "train_frac": round(PRODUCTS["train"] / n, 6), "val_frac": round(PRODUCTS["val"] / n, 6)}


def graph_args(vertices: int) -> list:
    """The same as `preprocess build`/`plan` options."""
    return [a for k, v in graph_params(vertices).items() for a in (f"--{k.replace('_', '-')}", str(v))]


def induced_csr(indptr: np.ndarray, indices: np.ndarray, keep: np.ndarray):
    """In-edge CSR of the subgraph induced by the vertices where `keep` is true, renumbered in id order:
    (indptr, indices) with only the edges whose both ends are kept (vectorised)."""
    new_id = np.full(keep.shape[0], -1, dtype=np.int64)
    new_id[keep] = np.arange(int(keep.sum()))
    dst = np.repeat(np.arange(keep.shape[0]), np.diff(indptr))
    ok = keep[dst] & keep[indices]
    sub_dst, sub_src = new_id[dst[ok]], new_id[indices[ok]]
    counts = np.bincount(sub_dst, minlength=int(keep.sum()))
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), sub_src


def _sage_layers(torch, hidden_in, hidden, classes, convs):
    """(convolutions, norms, head): PyG's SAGEConv (mean) where installed, else the same layer in torch."""
    nn = torch.nn
    try:
        from torch_geometric.nn import SAGEConv  # noqa: F401
        make = lambda i, o: SAGEConv(i, o, aggr="mean")  # noqa: E731
        kind = "torch_geometric.nn.SAGEConv"
    except ImportError:
        class PlainSAGE(nn.Module):  # out = W_self h_v + W_neigh mean_{u in N(v)} h_u + b, as PyG's
            def __init__(self, i, o):
                super().__init__()
                self.lin_r, self.lin_l = nn.Linear(i, o), nn.Linear(i, o, bias=False)

            def forward(self, h, adj_mean):
                return self.lin_r(h) + self.lin_l(adj_mean @ h)
        make, kind = PlainSAGE, "plain torch (sparse CSR mean)"
    widths = [hidden_in] + [hidden] * convs
    conv = nn.ModuleList(make(widths[i], widths[i + 1]) for i in range(convs))
    norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(convs))
    return conv, norms, nn.Linear(hidden, classes), kind


def reference(vertices: int, epochs: int, hidden: int = 64, dropout: float = 0.3, lr: float = 0.003) -> dict:
    """Train the inductive training graph in one process: per-epoch times of `epochs` epochs after one
    warm-up, and the graph's sizes (checked against the shard set's manifest by the driver)."""
    import torch
    import torch.nn.functional as F
    from granndis_hpc.preprocess.sources.synthetic_chunks import load_synthetic

    t0 = time.perf_counter()
    params = graph_params(vertices)
    g = load_synthetic(symmetrize=True, self_loops="add", **params)  # the products build preset's graph
    indptr, indices = induced_csr(g.indptr, g.indices, g.train_mask)
    x = torch.from_numpy(np.ascontiguousarray(g.features[g.train_mask]))
    y = torch.from_numpy(g.labels[g.train_mask])
    full = {"vertices": g.num_vertices, "edges": g.num_edges}
    del g
    deg = np.diff(indptr)
    n = deg.shape[0]
    values = torch.from_numpy((1.0 / np.repeat(np.maximum(deg, 1), deg)).astype(np.float32))
    adj = torch.sparse_csr_tensor(torch.from_numpy(indptr), torch.from_numpy(indices), values, (n, n))
    load_s = time.perf_counter() - t0
    torch.manual_seed(0)
    conv, norms, head, kind = _sage_layers(torch, x.shape[1], hidden, PRODUCTS["classes"], 3)
    if kind.startswith("torch_geometric"):
        # PyG takes the graph as a transposed sparse adjacency (a row per destination) of ones and
        # reduces it by its aggregation (mean): a torch.sparse CSR tensor needs no torch_sparse.
        graph = torch.sparse_csr_tensor(torch.from_numpy(indptr), torch.from_numpy(indices),
                                        torch.ones(indices.shape[0]), (n, n))
    else:
        graph = adj
    params_ = [*conv.parameters(), *norms.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params_, lr=lr)

    def epoch():
        opt.zero_grad()
        h = F.dropout(x, dropout, training=True)
        for c, nrm in zip(conv, norms):
            h = F.dropout(F.relu(nrm(c(h, graph))), dropout, training=True)
        loss = F.cross_entropy(head(h), y)
        loss.backward()
        opt.step()
        return loss.item()

    times, losses = [], []
    for _ in range(epochs + 1):  # the first is the warm-up (allocator, first sparse products)
        t = time.perf_counter()
        losses.append(epoch())
        times.append(time.perf_counter() - t)
    return {"kind": kind, "threads": torch.get_num_threads(), "train_vertices": int(n),
            "train_edges": int(indices.shape[0]), "full_graph": full, "load_s": load_s,
            "warmup_s": times[0], "epoch_s": times[1:], "loss": losses,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def evaluate(shards_dir: str, model: str, passes: int) -> dict:
    """Collective (mpirun): time `passes` exact forwards over the full graph's world view, between
    barriers (the slowest rank's time), with the evaluation halo bytes of the last pass."""
    import torch
    from granndis_hpc.engine.predict import WorldForward

    t0 = time.perf_counter()
    fw = WorldForward(shards_dir, model, None, "cpu", "auto")
    try:
        set_up_s, times = time.perf_counter() - t0, []
        for _ in range(passes):
            fw.topo.world.barrier()
            t = time.perf_counter()
            logits, _ = fw.forward()
            fw.topo.world.barrier()
            times.append(time.perf_counter() - t)
        labels = torch.as_tensor(fw.slice.labels[: fw.n_inner])
        test = torch.as_tensor(np.asarray(fw.slice.test_mask[: fw.n_inner], dtype=bool))
        correct = int((logits.argmax(1)[test] == labels[test]).sum())
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        gathered = fw.topo.allgather_object({"correct": correct, "test": int(test.sum()), "rss": rss,
                                             "set_up_s": set_up_s, "inner": fw.n_inner})
        return {"pass_s": times, "set_up_s": max(g["set_up_s"] for g in gathered),
                "test_acc": sum(g["correct"] for g in gathered) / max(sum(g["test"] for g in gathered), 1),
                "peak_rss_bytes": [g["rss"] for g in gathered], "inner": [g["inner"] for g in gathered],
                "rank": fw.topo.rank}
    finally:
        fw.close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("reference", help="the one-machine reference epoch (one process)")
    r.add_argument("--vertices", type=int, default=PRODUCTS["vertices"])
    r.add_argument("--epochs", type=int, default=3, help="timed epochs after one warm-up")
    r.add_argument("--out", required=True)
    e = sub.add_parser("evaluate", help="timed full-graph evaluation passes (under mpirun)")
    e.add_argument("--shards", required=True)
    e.add_argument("--model", required=True, help="a training run's directory (its best-model.pt)")
    e.add_argument("--passes", type=int, default=2, help="the first builds the cached adjacencies")
    e.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.what == "reference":
        result = reference(args.vertices, args.epochs)
    else:
        result = evaluate(args.shards, args.model, args.passes)
        if result.pop("rank") != 0:
            return 0
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

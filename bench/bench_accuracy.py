"""GCN accuracy on Cora and CiteSeer, 5 seeds: fb and flx with and without Kipf & Welling's recipe, and
PyTorch Geometric's own training loop beside them (a benchmark, not a test; writes docs/performance/accuracy.md).

    python bench/bench_accuracy.py --seeds 5 --out bench-out/accuracy.md      # needs `pip install '.[bench]'`

The recipe (Kipf & Welling 2017, as PyG's examples/gcn.py runs it): row-normalised features, dropout
0.5 on the input features and between the layers, weight decay 5e-4 on the first layer only, 2 layers,
hidden 16, Adam lr 0.01, 200 epochs, and the test accuracy of the epoch with the best validation
accuracy (evaluated every epoch, ties keep the earlier).  Without it ("plain"): raw features, dropout
0.5 between the layers only, weight decay 5e-4 on every parameter, the last epoch's test accuracy.

The engine runs under `mpirun -n 4` on 2 emulated servers x 2 ranks (the script starts it: one
process group runs every configuration one after another, see `_worker`); PyG's loop runs in this
process on PyG's own Planetoid loader and GCNConv over the same raw files (tests/data/planetoid).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

from harness import REPO, run_workers, write_page

PLANETOID = os.path.join(REPO, "tests", "data", "planetoid")
DATASETS = ("cora", "citeseer")
MODES = ("fb", "flx")
PUBLISHED = {"cora": 81.5, "citeseer": 70.3}  # Kipf & Welling 2017, Table 2 (GCN)
# The GCN both loops train: what the settings share, then what the recipe changes.
COMMON = dict(model="gcn", layers=2, hidden=16, epochs=200, lr=0.01, dropout=0.5, weight_decay=5e-4, eval_every=1)
SETTINGS = {
    "plain": dict(normalize="none", train=dict(input_dropout=0.0, weight_decay_on="all"), select="last"),
    "recipe": dict(normalize="row", train=dict(input_dropout=0.5, weight_decay_on="first"), select="best_val"),
}


# ---- the engine (under mpirun -n 4) ----------------------------------------------------------
def build_sets(base: str, datasets, normalisations=("none", "row"), servers: int = 2, ranks_per_server: int = 2,
               command: str = "bench_accuracy") -> dict:
    """Rank 0 builds one servers x ranks_per_server shard set per (dataset, feature normalisation), as
    `preprocess build` would: {(dataset, normalisation): directory}."""
    from mpi4py import MPI

    from granndis_hpc.preprocess.build.pipeline import BuildConfig, run_build
    from granndis_hpc.preprocess.sources import features_record, load

    world = MPI.COMM_WORLD
    dirs = {(d, n): os.path.join(base, f"{d}-{n}") for d in datasets for n in normalisations}
    error = None
    if world.rank == 0:
        try:
            for (name, how), out in dirs.items():
                graph = load("planetoid", name=name, root=PLANETOID, normalize_features=how)
                cfg = BuildConfig(out=out, servers=servers, gpus_per_server=ranks_per_server, layers=COMMON["layers"],
                                  partitioner="metis", command=f"{command} {name} --normalize-features {how}",
                                  extra=features_record(how))
                run_build(MPI.COMM_SELF, graph, cfg)
        except Exception as exc:  # noqa: BLE001 - reported on every rank instead of hanging them
            error = repr(exc)
    error = world.bcast(error)
    if error:
        raise RuntimeError(error)
    return dirs


def engine_run(shards: str, mode: str, seed: int, setting: str, epochs: int) -> dict:
    """One training run (collective); returns the last epoch's and the best-validation epoch's accuracy."""
    from granndis_hpc.options.train import TrainConfig
    from granndis_hpc.engine.trainer import Trainer

    opts = {**COMMON, **SETTINGS[setting]["train"], "epochs": epochs}
    trainer = Trainer(TrainConfig(shards=shards, mode=mode, seed=seed, ranks_per_server=2, quiet=True, **opts))
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    return {"last": summary["accuracy"]["test"], "best_val": summary["best_val"]["test"],
            "best_epoch": summary["best_val"]["epoch"], "features": summary["features"]["normalization"]}


def _worker(args) -> None:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    base = world.bcast(tempfile.mkdtemp(prefix="granndis-accuracy-") if world.rank == 0 else None)
    dirs = build_sets(base, args.datasets)
    results = []
    for name in args.datasets:
        for setting, spec in SETTINGS.items():
            for mode in args.modes:
                for seed in range(args.seeds):
                    r = engine_run(dirs[(name, spec["normalize"])], mode, seed, setting, args.epochs)
                    results.append(dict(r, dataset=name, setting=setting, loop=mode, seed=seed))
                    if world.rank == 0:
                        print(f"[accuracy] {name} {setting} {mode} seed {seed}: test {r['best_val']:.4f} at best "
                              f"val (epoch {r['best_epoch']}), last {r['last']:.4f}", flush=True)
    if world.rank == 0:
        with open(args.worker, "w") as f:
            json.dump(results, f)


# ---- PyG's loop (examples/gcn.py) --------------------------------------------------------------
def pyg_data(name: str, normalize: bool):
    """PyG's Planetoid loader over the same raw files (linked into the layout it expects)."""
    import torch_geometric.transforms as T
    from torch_geometric.datasets import Planetoid

    root = tempfile.mkdtemp(prefix="pyg-planetoid-")
    raw = os.path.join(root, name, "raw")
    os.makedirs(raw)
    for f in os.listdir(PLANETOID):
        if f.startswith(f"ind.{name}."):
            os.symlink(os.path.join(PLANETOID, f), os.path.join(raw, f))
    return Planetoid(root, name, transform=T.NormalizeFeatures() if normalize else None)[0]


def pyg_run(data, seed: int, setting: str, epochs: int) -> dict:
    """PyG's examples/gcn.py loop (GCNConv, cached normalisation), with or without the recipe."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GCNConv

    recipe = setting == "recipe"
    torch.manual_seed(seed)

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = GCNConv(data.num_features, COMMON["hidden"], cached=True)
            self.conv2 = GCNConv(COMMON["hidden"], int(data.y.max()) + 1, cached=True)

        def forward(self, x, edge_index):
            if recipe:
                x = F.dropout(x, p=0.5, training=self.training)
            x = F.dropout(self.conv1(x, edge_index).relu(), p=0.5, training=self.training)
            return self.conv2(x, edge_index)

    model = GCN()
    wd = COMMON["weight_decay"]
    opt = torch.optim.Adam([dict(params=model.conv1.parameters(), weight_decay=wd),
                            dict(params=model.conv2.parameters(), weight_decay=0.0 if recipe else wd)],
                           lr=COMMON["lr"])
    best_val, best_test, best_epoch, test = -1.0, 0.0, -1, 0.0
    for epoch in range(epochs):
        model.train()
        opt.zero_grad()
        out = model(data.x, data.edge_index)
        F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            pred = model(data.x, data.edge_index).argmax(dim=1)
        val, test = [float((pred[m] == data.y[m]).float().mean()) for m in (data.val_mask, data.test_mask)]
        if val > best_val:
            best_val, best_test, best_epoch = val, test, epoch
    return {"last": test, "best_val": best_test, "best_epoch": best_epoch}


# ---- the page -----------------------------------------------------------------------------------
def _stats(values):
    pct = [100 * v for v in values]
    return statistics.mean(pct), (statistics.stdev(pct) if len(pct) > 1 else 0.0)


def table(results, datasets, loops) -> list:
    lines = ["| dataset | setting | loop | test acc, selected (mean ± std) | last epoch | best-val epoch "
             "(mean) | published |", "|---|---|---|---|---|---|---|"]
    for name in datasets:
        for setting, spec in SETTINGS.items():
            for loop in loops:
                rs = [r for r in results if (r["dataset"], r["setting"], r["loop"]) == (name, setting, loop)]
                if not rs:
                    continue
                sel, sel_sd = _stats([r[spec["select"]] for r in rs])
                last, last_sd = _stats([r["last"] for r in rs])
                epoch = statistics.mean(r["best_epoch"] for r in rs)
                lines.append(f"| {name} | {setting} ({spec['select'].replace('_', '-')}) | {loop} | "
                             f"**{sel:.2f}** ± {sel_sd:.2f} | {last:.2f} ± {last_sd:.2f} | {epoch:.0f} | "
                             f"{PUBLISHED[name]} |")
    return lines


INTRO = [
    "Kipf & Welling (ICLR 2017) report GCN test accuracy 81.5 % on Cora and 70.3 % on CiteSeer (public "
    "Planetoid split).  Their recipe differs from plain training in three ways, each an option here:",
    "",
    "- `granndis preprocess build ... --normalize-features row`: every feature row divided by its sum "
    "(recorded in the manifest; `info` and the run's summary.json say which features were used);",
    "- `--input-dropout 0.5`: dropout on the input features too, keyed by vertex id like `--dropout` "
    "(nn/dropout.py), so the cached layer-0 halo needs no exchange and fb/flx stay exact;",
    "- best-validation selection: with `--eval-every 1` the summary's `best_val` gives the epoch with the "
    "best validation accuracy and its test accuracy (ties keep the earlier epoch), beside the last "
    "epoch's; its parameters are in RUN_DIR/best-model.pt;",
    "",
    "and it decays only the first layer (`--weight-decay 5e-4 --weight-decay-on first`).  PyG's "
    "examples/gcn.py runs the same recipe; its loop is measured beside ours on PyG's own loader and "
    "GCNConv.  The README's \"Reproducing the published GCN accuracy\" section has the two commands.",
]


NOTES = [
    "- fb and flx give the same numbers seed by seed: both are exact (the single-process trajectory, "
    "dropout masks included), so the cluster's shape and the mode do not change the accuracy.",
    "- Without the recipe both loops stay below the paper (the last epoch's test accuracy, raw features); "
    "the recipe is what closes the gap, in PyG's loop as in ours.  The two loops differ in their random "
    "streams (initialisation, dropout masks), so their per-seed numbers differ; the 5-seed means agree "
    "within their standard deviations.",
    "- tests/mpi/test_published_accuracy.py runs the two commands below on Cora (seeds 0-4 in flx, their mode) "
    "and checks the mean within one point of the paper; CiteSeer's check is this page's (its 5 runs of 200 "
    "epochs would lengthen the distributed test lane, which sets `make test`'s time).",
]


def verdict(results, datasets, loops) -> list:
    """One line per dataset and loop: the recipe's mean against the published figure."""
    out = []
    for name in datasets:
        for loop in loops:
            rs = [r["best_val"] for r in results if (r["dataset"], r["setting"], r["loop"]) == (name, "recipe", loop)]
            if not rs:
                continue
            mean = _stats(rs)[0]
            gap = mean - PUBLISHED[name]
            out.append(f"- {name}, {loop}: recipe {mean:.2f} % vs published {PUBLISHED[name]} % "
                       f"({gap:+.2f} points: {'within' if abs(gap) <= 1.0 else 'NOT within'} one point)")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=COMMON["epochs"])
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--no-pyg", action="store_true", help="skip PyG's loop (torch_geometric not installed)")
    p.add_argument("--out", default=os.path.join(REPO, "bench-out", "accuracy.md"))
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: the mpirun part, results to this file
    args = p.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    worker_args = ["--seeds", str(args.seeds), "--epochs", str(args.epochs), "--datasets", *args.datasets,
                   "--modes", *args.modes]
    results = run_workers(__file__, worker_args)
    loops = list(args.modes)
    if not args.no_pyg:
        for name in args.datasets:
            for setting, spec in SETTINGS.items():
                data = pyg_data(name, spec["normalize"] == "row")
                for seed in range(args.seeds):
                    results.append(dict(pyg_run(data, seed, setting, args.epochs), dataset=name, setting=setting,
                                        loop="PyG", seed=seed))
        loops.append("PyG")
    lines = ["# GCN accuracy: the published figures, reproduced", "", *INTRO, "",
             f"{args.seeds} seeds (0..{args.seeds - 1}), {args.epochs} epochs, fb and flx on 2 servers x 2 ranks "
             "(Cora/CiteSeer shards built with METIS); test accuracy in %, \"selected\" = the setting's own "
             "rule (plain: last epoch, recipe: best-validation epoch).", "", *table(results, args.datasets, loops),
             "", "## What the numbers say", "", *verdict(results, args.datasets, loops), *NOTES, ""]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(results, f, indent=1)
    shown = ["mpirun", "-n", "4", "python", "bench/bench_accuracy.py", "--worker", "RESULTS.json", *worker_args]
    write_page(args.out, lines, "bench/bench_accuracy.py", argv, [" ".join(shown)])
    return 0


if __name__ == "__main__":
    sys.exit(main())

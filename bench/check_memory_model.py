"""The memory model's estimate against measurement on the real engine (not a test; the assertions are
in tests/mpi/test_memory_model_mpi.py).  Run under mpirun with 2 ranks per server:

    GRANNDIS_RANKS_PER_SERVER=2 mpirun -n 4 python bench/check_memory_model.py --ks 0 3

For each graph (real Cora, a synthetic DC-SBM graph with features narrower than the hidden width),
model and k, it builds the shard set (full preload of k hops; k = 0 trains fb on the L-hop set), trains
three epochs and measures, in the third: every rank's saved-activation bytes (SavedBytes) and the peak a
training step allocates on CPU above its starting level (profiler allocation events), and the
ledger's inter-server bytes; then prints them beside granndis_hpc.memory_model's estimate as a
markdown table (worst rank's relative error per row).
"""
from __future__ import annotations

import argparse
import os
import tempfile

from mpi4py import MPI

from harness import RANKS_PER_SERVER, REPO

from granndis_hpc import memory_model as mm  # noqa: E402
from granndis_hpc.memory_model.profile import measure_step_peak  # noqa: E402
from granndis_hpc.options.train import TrainConfig  # noqa: E402
from granndis_hpc.engine.trainer import Trainer  # noqa: E402

W = MPI.COMM_WORLD


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ks", type=int, nargs="+", default=[0, 3])
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--models", nargs="+", default=["sage", "gcn", "ressage"])
    p.add_argument("--no-overlap", action="store_true", help="train and estimate the --no-overlap order "
                   "(default: the overlapped order of --overlap-halos world)")
    p.add_argument("--cora-root", default=os.environ.get("GRANNDIS_DATASETS", os.path.join(REPO, "tests",
                                                                                           "data")) + "/planetoid")
    args = p.parse_args(argv)
    from granndis_hpc.preprocess.build.pipeline import build_shards
    from granndis_hpc.preprocess.sources import load

    rps = int(os.environ.get("GRANNDIS_RANKS_PER_SERVER", RANKS_PER_SERVER))
    graphs = {"cora": lambda: load("planetoid", name="cora", root=args.cora_root),
              "synthetic": lambda: load("synthetic", vertices=3000, avg_degree=10.0, features=8, classes=5, seed=2)}
    base = W.bcast(tempfile.mkdtemp(prefix="granndis-mmcheck-") if W.rank == 0 else None)
    lines = ["| graph | model | k | activation est / measured (B) | err | step peak est / measured (B) | err | "
             "inter-server halo est / ledger (B) | total estimate / GPU |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for gname, make in graphs.items():
        graph = make() if W.rank == 0 else None
        for k in args.ks:
            hops = args.layers if k == 0 else k
            out = os.path.join(base, f"{gname}-h{hops}")
            if W.rank == 0 and not os.path.exists(os.path.join(out, "manifest.json")):
                build_shards(graph, out, servers=W.size // rps, gpus_per_server=rps, layers=args.layers, hops=hops,
                             partitioner="metis", comm=MPI.COMM_SELF)
            W.Barrier()
            for model in args.models:
                t = Trainer(TrainConfig(shards=out, mode="fb" if k == 0 else "flx", model=model, layers=args.layers,
                                        hidden=args.hidden, dropout=0.5, eval_every=0, ranks_per_server=rps,
                                        quiet=True, no_overlap=args.no_overlap))
                try:
                    t.train_epoch()
                    t.train_epoch()
                    rec = {}
                    peak = measure_step_peak(lambda: rec.update(t.train_epoch()))
                    mine = (t.topo.rank, int(t.activation_bytes), peak)
                finally:
                    t.close()
                got = W.gather(mine, root=0)
                if W.rank == 0:
                    rows = mm.shard_rows(mm.read_shard_set(out)[1], args.layers, k,
                                         int(t.manifest["dataset"]["num_features"]),
                                         int(t.manifest["dataset"]["num_classes"]))
                    spec = mm.model_for(t.manifest, model, args.hidden, args.layers, dropout=0.5,
                                        overlap=() if args.no_overlap else ("world",))
                    est = {r.rank: mm.estimate(r, spec, device="cpu") for r in rows}
                    inter = mm.inter_server_bytes(rows, spec, W.size // rps)
                    a_err = max(abs(est[r]["activation_saved"] - s) / s for r, s, _ in got)
                    p_err = max(abs(est[r]["step_peak"] - pk) / pk for r, _, pk in got)
                    worst = max(got, key=lambda g: g[2])
                    lines.append(
                        f"| {gname} | {model} | {k} | {est[worst[0]]['activation_saved']:,} / {worst[1]:,} | "
                        f"{100 * a_err:.1f} % | {est[worst[0]]['step_peak']:,} / {worst[2]:,} | {100 * p_err:.1f} % | "
                        f"{inter['halo']:,} / {rec['bytes']['inter_halo']:,} | "
                        f"{max(e['total'] for e in est.values()):,} |")
                    print(lines[-1], flush=True)
    if W.rank == 0:
        print("\n".join(lines))


if __name__ == "__main__":
    main()

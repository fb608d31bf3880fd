"""The device check's epoch stages: one rank's full-graph SAGE epoch on the device, and (--pyg) PyTorch
Geometric's SAGEConv stack (bench/single_rank_pyg.py) over the same rows, labels, training split and
initial weights on the same device, timed alike.  Prints one JSON object; exit 0 when both trained to a
finite loss.

    mpirun -n 1 python bench/gpu_check_epoch.py --shards SET --device cuda --pyg
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from granndis_hpc.mpistart import init_mpi

_early = argparse.ArgumentParser(add_help=False)
_early.add_argument("--device", default="cuda")
init_mpi(_early.parse_known_args()[0].device)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pyg_epochs(trainer, args, device):
    """PyG's SAGE epochs (Adam, the trainer's dropout) on the device: (per-epoch seconds, last loss)."""
    import single_rank_pyg as pyg  # beside this script, whose folder Python puts first on sys.path

    view, ds = trainer.world_view, trainer.manifest["dataset"]
    net = pyg.PygNet("sage", int(ds["num_features"]), args.hidden, int(ds["num_classes"]), args.layers,
                     args.dropout).copy_from(trainer.model).to(device).train()
    adj = pyg.adjacency(view.graphs[0], "mean").to(device)
    x, labels = view.input_features.to(device), trainer.labels.to(device)
    train = torch.as_tensor(trainer.split_rows["train"]).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    times, loss = [], float("nan")
    for _ in range(args.epochs):
        _sync(device)
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = F.cross_entropy(net(x, adj)[train], labels[train])
        out.backward()
        opt.step()
        loss = float(out.detach())
        times.append(time.perf_counter() - start)
    return times, loss


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shards", required=True)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--epochs", type=int, default=4, help="timed epochs (the first is reported apart: warm-up)")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--pyg", action="store_true", help="also PyG's SAGEConv stack on the same device")
    args = p.parse_args(argv)

    from granndis_hpc.options.train import TrainConfig
    from granndis_hpc.engine.trainer import Trainer

    trainer = Trainer(TrainConfig(shards=args.shards, mode="flx", model="sage", layers=args.layers,
                                  hidden=args.hidden, dropout=args.dropout, device=args.device, eval_every=0,
                                  quiet=True, skip_checksums=True))
    device = trainer.device
    result = {"device": str(device), "vertices": int(trainer.manifest["dataset"]["num_vertices"]),
              "edges": int(trainer.manifest["dataset"].get("num_edges", 0))}
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        records = [trainer.train_epoch() for _ in range(args.epochs)]
        ours = [r["time_s"] for r in records]
        result.update(granndis_epoch_s=ours, granndis_median_s=statistics.median(ours[1:] or ours),
                      granndis_loss=records[-1]["loss"])
        if device.type == "cuda":
            result["peak_reserved_mib"] = torch.cuda.max_memory_reserved(device) >> 20
        ok = math.isfinite(records[-1]["loss"])
        if args.pyg:
            try:
                times, loss = _pyg_epochs(trainer, args, device)
            except ImportError as exc:
                result.update(pyg="missing", note=f"not reached: torch_geometric missing ({exc})")
                ok = False
            else:
                result.update(pyg_epoch_s=times, pyg_median_s=statistics.median(times[1:] or times), pyg_loss=loss,
                              granndis_over_pyg=result["granndis_median_s"] / statistics.median(times[1:] or times))
                ok = ok and math.isfinite(loss)
    finally:
        trainer.close()
    result["ok"] = bool(ok)
    print(json.dumps(result), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

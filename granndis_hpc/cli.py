"""Command-line entry points: `granndis-train` (under mpirun/srun) and `granndis {train,report}`."""
from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from granndis_hpc.config import HelpFormatter, parse_args_with_config


def train_parser() -> argparse.ArgumentParser:
    from granndis_hpc.engine.trainer import MODES
    from granndis_hpc.nn.models import MODELS

    p = argparse.ArgumentParser(
        prog="granndis-train", formatter_class=HelpFormatter,
        description="Train a GNN on a shard directory with one MPI rank per GPU "
                    "(mpirun -n S*G granndis-train --shards DIR --ranks-per-server G ...).")
    p.add_argument("--shards", required=True, help="shard directory written by `python -m preprocess build`")
    p.add_argument("--mode", default="flx", choices=MODES,
                   help="fb: full-batch baseline (1-hop halo every layer, world-wide); flx: flexible "
                        "preloading (full k-hop preload, only gradients cross servers); eas: "
                        "expansion-aware sampled preload")
    p.add_argument("--model", default="sage", choices=MODELS, help="GNN architecture")
    p.add_argument("--layers", type=int, default=3, help="message-passing layers")
    p.add_argument("--hidden", type=int, default=64, help="hidden width")
    p.add_argument("--epochs", type=int, default=200, help="training epochs")
    p.add_argument("--lr", type=float, default=0.01, help="Adam learning rate")
    p.add_argument("--weight-decay", type=float, default=0.0, help="Adam weight decay")
    p.add_argument("--dropout", type=float, default=0.5, help="dropout probability")
    p.add_argument("--norm", action="store_true", help="LayerNorm between sage/gcn layers")
    p.add_argument("--seed", type=int, default=0, help="seed for parameters and dropout")
    p.add_argument("--eval-every", type=int, default=10,
                   help="exact full-graph evaluation every N epochs (and always at the end); 0 = only at the end")
    p.add_argument("--out", default=None, help="run directory (config.json, metrics.jsonl, summary.json)")
    p.add_argument("--ranks-per-server", type=int, default=None,
                   help="emulate servers of N ranks (default: env GRANNDIS_RANKS_PER_SERVER, else one server "
                        "per shared-memory node)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto = cuda:local_rank when CUDA is available")
    p.add_argument("--intra-transport", default="auto", choices=("auto", "gloo", "nccl", "mpi"),
                   help="intra-server transport (auto: NCCL on GPU, measured default on CPU)")
    p.add_argument("--skip-checksums", action="store_true", help="do not verify shard sha256 at start-up")
    p.add_argument("--quiet", action="store_true", help="no per-epoch lines on stdout")
    return p


def _config_from_args(ns):
    from granndis_hpc.engine.trainer import TrainConfig

    names = {f.name for f in fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in vars(ns).items() if k in names})


def run_training(argv=None) -> dict:
    """Parse, train, write outputs; returns the summary (rank 0) — used by tests and the CLI."""
    from granndis_hpc.engine.trainer import Trainer

    ns = parse_args_with_config(train_parser(), argv)
    trainer = Trainer(_config_from_args(ns))
    try:
        summary = trainer.run()  # writes the resolved config (every option) to RUN_DIR/config.json
    finally:
        trainer.close()
    if trainer.topo.rank == 0 and not ns.quiet:
        acc = summary["accuracy"]
        print(f"[{summary['mode']}] done: {summary['epochs']} epochs, median epoch {summary['epoch_time_s']:.4f} s, "
              f"test acc {acc.get('test', float('nan')):.4f}", flush=True)
    return summary


def train_main(argv=None) -> int:
    from granndis_hpc.cluster.errors import main_guard

    main_guard(run_training, argv)
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: granndis {train,report} ...\n  train   same as granndis-train\n"
              "  report  plots and a table for run directories")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "train":
        return train_main(rest)
    if cmd == "report":
        from granndis_hpc.report import main as report_main
        return report_main(rest)
    print(f"granndis: unknown command {cmd!r}; choose train or report", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

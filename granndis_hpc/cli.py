"""Command-line entry points: `granndis-train` (under mpirun/srun) and `granndis {train,report}`."""
from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, fields

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
                        "expansion-aware sampled preload; cob: cooperative batching (a server's GPUs share "
                        "one co-batch); mb: per-GPU mini-batches (the baseline cob is measured against)")
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
    p.add_argument("--batches-per-epoch", type=int, default=1,
                   help="cob/mb: co-batches per epoch (each server's training vertices in shuffled chunks)")
    p.add_argument("--sampler", default="sage", choices=("sage", "saint"),
                   help="cob/mb: sage = per-hop fanout sampling of the dependency graph; saint = the "
                        "subgraph induced on the batch")
    p.add_argument("--fanout", type=int, default=-1, help="cob/mb: in-neighbours kept per vertex and hop (-1 = all)")
    p.add_argument("--checkpoint-activations", action="store_true",
                   help="ressage: recompute each residual block (its exchange included) in the backward "
                        "pass instead of keeping its activations (deep models, less memory)")
    p.add_argument("--skip-checksums", action="store_true", help="do not verify shard sha256 at start-up")
    p.add_argument("--quiet", action="store_true", help="no per-epoch lines on stdout and no progress bar")
    p.add_argument("--progress", action="store_true",
                   help="draw rank 0's progress bar (epochs, loss, ETA) even when stderr is not a terminal, "
                        "as under mpirun/srun, which pipe the ranks' output")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="write a checkpoint into RUN_DIR/checkpoints/ every N epochs (the newest 2 complete ones "
                        "are kept); 0 = only when SIGUSR1 or SIGTERM asks the run to stop, which it does after "
                        "the current epoch, with a checkpoint, exiting 0")
    p.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue RUN_DIR from its newest complete checkpoint with the options in RUN_DIR/config.json "
                        "(nothing else is needed); options given again may differ only for --epochs, --eval-every, "
                        "--checkpoint-every, --quiet, --skip-checksums, --intra-transport, and --shards / "
                        "--ranks-per-server when they name the same shard set and layout")
    return p


def _parse_train_args(argv):
    """Options of a run.  With --resume RUN_DIR they come from RUN_DIR/config.json, and options given
    again (command line or --config) may change only what checkpoint.resume_config allows; a refusal is
    raised on every rank."""
    import argparse as _argparse

    from mpi4py import MPI

    from granndis_hpc.cluster.errors import agree
    from granndis_hpc.config import ConfigError, load_resolved_config
    from granndis_hpc.engine.checkpoint import CheckpointError, resume_config
    from granndis_hpc.engine.trainer import TrainConfig

    argv = list(sys.argv[1:] if argv is None else argv)
    pre = _argparse.ArgumentParser(add_help=False)
    pre.add_argument("--resume", default=None)
    if pre.parse_known_args(argv)[0].resume is None:
        ns = parse_args_with_config(train_parser(), argv)
        error = "" if ns.resume is None else "resume cannot be set in a --config file; give --resume RUN_DIR"
        agree(MPI.COMM_WORLD, not error, f"ConfigError: {error}")
        return ns
    given_only = train_parser()  # no defaults: what is left in the namespace was given
    for action in given_only._actions:
        if action.dest != "help":
            action.default, action.required = _argparse.SUPPRESS, False
    given = vars(parse_args_with_config(given_only, argv))
    defaults = {f.name: (None if f.default is MISSING else f.default) for f in fields(TrainConfig)}
    merged, error = None, ""
    try:
        merged = resume_config(load_resolved_config(given["resume"]), given, given["resume"], defaults)
    except (ConfigError, CheckpointError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    agree(MPI.COMM_WORLD, not error, error)
    return _argparse.Namespace(**merged)


def _config_from_args(ns):
    from granndis_hpc.engine.trainer import TrainConfig

    names = {f.name for f in fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in vars(ns).items() if k in names})


def run_training(argv=None) -> dict:
    """Parse, train, write outputs; returns the summary (rank 0) — used by tests and the CLI."""
    from granndis_hpc.engine.trainer import Trainer

    ns = _parse_train_args(argv)
    trainer = Trainer(_config_from_args(ns))
    try:
        summary = trainer.run()  # writes the resolved config (every option) to RUN_DIR/config.json
    finally:
        trainer.close()
    if summary is None:  # stopped by SIGUSR1/SIGTERM with a checkpoint written: exit 0 so the job requeues
        return None
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

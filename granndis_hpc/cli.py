"""Command-line entry points: `granndis {preprocess,train,predict,report}` and `granndis-train` (under
mpirun/srun, the same as `granndis train`)."""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict

from granndis_hpc.options.train import TrainConfig
from granndis_hpc.options import ConfigError, read_options
from granndis_hpc.metric_names import summary_key
from granndis_hpc.options.resume import train_config

TRAIN_PROG = "granndis-train"
TRAIN_DESCRIPTION = ("Train a GNN on a shard directory with one MPI rank per GPU "
                     "(mpirun -n S*G granndis-train --shards DIR --ranks-per-server G ...).")


def _parse_train_args(argv):
    """Options of a run, validated (TrainConfig.__post_init__).  With --resume RUN_DIR they come from
    RUN_DIR/config.json, and options given again (command line or --config) may change only what
    resume_config allows.  A bad flag is argparse's usage error (status 2) on every rank; any other
    refusal is raised on every rank together (collective_errors)."""
    # The one direct MPI use left here: options are parsed before the Topology exists (it is built
    # from them), so the collective refusal runs on COMM_WORLD.
    from mpi4py import MPI

    from granndis_hpc.cluster.errors import ClusterError, collective_errors
    from granndis_hpc.rundir.checkpoint_files import CheckpointError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        ns = _agreed_train_args(argv, MPI, collective_errors, CheckpointError)
    except ClusterError as exc:
        exc.exit_code = 2  # an option error: exit status 2 on every rank, as argparse's usage errors
        raise
    return ns


def _agreed_train_args(argv, MPI, collective_errors, CheckpointError):
    cfg = None
    with collective_errors(MPI.COMM_WORLD, "", catch=(ConfigError, CheckpointError)):
        command_line, file_values, _ = read_options(TrainConfig, argv, TRAIN_PROG, TRAIN_DESCRIPTION)
        if "resume" in file_values:
            raise ConfigError("resume cannot be set in a --config file; give --resume RUN_DIR")
        cfg = train_config({**file_values, **command_line})
    return argparse.Namespace(**asdict(cfg))


def checked_before_start(ns):
    """The refusals the run's set-up would give after seconds of start-up on every rank (the model's code,
    the shard set's shape and layers: engine/preflight.check_before_start), given before the world starts,
    with the exit status of those refusals (1).  ConfigError, ShardError, MemoryModelError and nn/pyg.py's
    ModelCodeError are ValueErrors."""
    from mpi4py import MPI

    from granndis_hpc.cluster.errors import collective_errors
    from granndis_hpc.engine.preflight import check_before_start
    from granndis_hpc.engine.steps import TrainingError

    with collective_errors(MPI.COMM_WORLD, "", catch=(ValueError, TrainingError)):
        check_before_start(_config_from_args(ns), MPI.COMM_WORLD.Get_size())
    return ns


def _config_from_args(ns) -> TrainConfig:
    return TrainConfig(**vars(ns))


def run_training(argv=None, ignore_late_warnings: bool = False) -> dict:
    """Parse, train, write outputs; returns the summary (rank 0) — used by tests and the CLI.

    ignore_late_warnings (the CLI's process only): leave SIGUSR1 ignored after the run, for the rank's
    way out.  Not for in-process callers: children they start later would inherit SIG_IGN, and a shell
    cannot trap a signal ignored at its entry (the stand-in srun tests failed after such a caller)."""
    from granndis_hpc.api.training import run_trainer

    ns = checked_before_start(_parse_train_args(argv))
    _log_as_this_rank(ns)
    summary, _, rank = run_trainer(_config_from_args(ns), ignore_late_warnings)  # the Python API's train() too
    if summary is None:  # stopped by SIGUSR1/SIGTERM with a checkpoint written: exit 0 so the job requeues
        return None
    if rank == 0:  # the result line, --quiet included
        metric = summary.get("metric", "accuracy")
        acc, best = summary[summary_key(metric)], summary.get("best_val")
        at_best = "" if best is None else (f" (best val {best['val']:.4f} at epoch {best['epoch']}: test "
                                           f"{best['test']:.4f})")
        print(f"[{summary['mode']}] done: {summary['epochs']} epochs, median epoch {summary['epoch_time_s']:.4f} s, "
              f"test {'acc' if metric == 'accuracy' else metric} {acc.get('test', float('nan')):.4f}{at_best}",
              flush=True)
    return summary


def _log_as_this_rank(opts) -> None:
    """Log lines of this rank at --log-level (rank 0, or every rank with --log-all-ranks): progress.py."""
    from mpi4py import MPI

    from granndis_hpc.progress import setup_logging

    setup_logging(MPI.COMM_WORLD.Get_rank(), all_ranks=opts.log_all_ranks, level=opts.log_level)


def train_main(argv=None) -> int:
    # First, before the imports and the set-up that take seconds: a stop signal (Slurm's time-limit
    # warning, preemption) arriving meanwhile must be recorded, not kill the rank (engine/signals.py).
    from granndis_hpc.engine.signals import install_early
    install_early()
    argv = sys.argv[1:] if argv is None else argv
    if _asks_for_help(argv):  # the help needs neither MPI nor torch: printed (by the launch's rank 0), exit 0
        read_options(TrainConfig, argv, TRAIN_PROG, TRAIN_DESCRIPTION)
    # Then this rank's GPU, and MPI after it (nothing before this line imports mpi4py.MPI).
    from granndis_hpc.mpistart import requested_device, init_mpi
    init_mpi(requested_device(argv))
    from granndis_hpc.cluster.errors import main_guard

    main_guard(run_training, argv, ignore_late_warnings=True)
    return 0


def _asks_for_help(argv) -> bool:
    """-h/--help before any "--" (argparse prints the help wherever it stands)."""
    head = argv[:argv.index("--")] if "--" in argv else argv
    return any(a in ("-h", "--help") for a in head)


def predict_main(argv=None) -> int:
    """`granndis predict` (under mpirun/srun like training): engine/predict.py."""
    from granndis_hpc.mpistart import requested_device, init_mpi
    from granndis_hpc.options.predict import PREDICT_DESCRIPTION, PREDICT_EPILOG, PREDICT_PROG, PredictOptions

    argv = sys.argv[1:] if argv is None else argv
    if _asks_for_help(argv):  # as train's: no MPI, no torch
        from granndis_hpc.options import parse_options
        parse_options(PredictOptions, argv, PREDICT_PROG, PREDICT_DESCRIPTION, PREDICT_EPILOG)
    init_mpi(requested_device(argv, PredictOptions))  # the GPU before MPI
    from granndis_hpc.cluster.errors import main_guard

    main_guard(run_predict, argv)
    return 0


def run_predict(argv=None) -> dict:
    """Parse (a usage error exits 2 on every rank alike: every rank parses the same argv), predict."""
    from granndis_hpc.options import parse_options
    from granndis_hpc.options.predict import PREDICT_DESCRIPTION, PREDICT_EPILOG, PREDICT_PROG, PredictOptions

    opts = parse_options(PredictOptions, argv, PREDICT_PROG, PREDICT_DESCRIPTION, PREDICT_EPILOG)
    from granndis_hpc.engine.predict import run_predict as predict  # torch: after the options are read

    _check_predict_before_start(opts)
    _log_as_this_rank(opts)
    return predict(opts)


def _check_predict_before_start(opts) -> None:
    """Before the world starts (seconds on every rank): the shard set's manifest, and on rank 0 the output's
    place (its directory created when missing, as train's --out is); one refusal on every rank together."""
    from mpi4py import MPI

    from granndis_hpc.cluster.errors import collective_errors
    from granndis_hpc.engine.predict import reads
    from granndis_hpc.engine.predict_io import OutputError, check_output
    from granndis_hpc.shards import ShardError, read_manifest

    with collective_errors(MPI.COMM_WORLD, "", catch=(OutputError, ShardError)):
        read_manifest(opts.shards)
        if MPI.COMM_WORLD.Get_rank() == 0:
            check_output(opts.out, opts.overwrite, reads(opts))


USAGE = """usage: granndis {preprocess,train,predict,report} ...
  preprocess  build, plan, verify, inspect or chunk a shard set (granndis preprocess -h)
  train       train on a shard set under mpirun/srun (also installed as granndis-train)
  predict     write a trained model's predictions and embeddings (under mpirun, like train)
  report      plots and a table for run directories"""


def main(argv=None) -> int:
    try:
        return _dispatch(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        # The reader went away (`granndis preprocess info SET | head`): stop quietly, as other Unix tools do,
        # with stdout pointed at /dev/null so that the interpreter's final flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by the closed pipe


def _dispatch(argv) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "preprocess":
        from granndis_hpc.preprocess.__main__ import main as preprocess_main
        return preprocess_main(rest)
    if cmd == "train":
        return train_main(rest)
    if cmd == "predict":
        return predict_main(rest)
    if cmd == "report":
        from granndis_hpc.report.command import main as report_main
        return report_main(rest)
    print(f"granndis: unknown command {cmd!r}; choose preprocess, train, predict or report", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

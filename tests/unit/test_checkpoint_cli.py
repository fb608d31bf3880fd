"""`granndis-train --resume RUN_DIR` option handling (granndis_hpc.cli), in one process.

The options come from RUN_DIR/config.json, written the way Trainer.run() writes it; options given again
may change only what options.resume.RESUME_OVERRIDABLE allows.  Refusals go through `collective_errors`, so under
mpirun every rank raises the same collective error (here the world is this one process)."""
import json
import os
from dataclasses import asdict

import pytest

from granndis_hpc import cli
from granndis_hpc.cluster.errors import ClusterError

pytest.importorskip("mpi4py")


@pytest.fixture
def run_dir(tmp_path):
    """A run directory as `granndis-train --shards S --out RUN --hidden 16 --lr 0.02 ...` leaves it."""
    run = tmp_path / "run"
    ns = cli._parse_train_args(["--shards", str(tmp_path / "shards"), "--out", str(run), "--hidden", "16",
                                "--lr", "0.02", "--epochs", "30", "--checkpoint-every", "5", "--quiet"])
    os.makedirs(run)
    with open(run / "config.json", "w") as f:
        json.dump(asdict(cli._config_from_args(ns)), f)
    return run


def test_resume_alone_restores_every_option(run_dir, tmp_path):
    ns = cli._parse_train_args(["--resume", str(run_dir)])
    cfg = cli._config_from_args(ns)
    assert (cfg.hidden, cfg.lr, cfg.epochs, cfg.checkpoint_every, cfg.quiet) == (16, 0.02, 30, 5, True)
    assert cfg.shards == str(tmp_path / "shards") and cfg.out == cfg.resume == str(run_dir)


def test_resume_with_safe_and_repeated_options(run_dir, tmp_path):
    # What slurm/train.sbatch passes after a requeue: the same flags again, plus --resume.
    ns = cli._parse_train_args(["--shards", str(tmp_path / "shards"), "--mode", "flx", "--model", "sage",
                                "--hidden", "16", "--epochs", "60", "--out", str(run_dir), "--resume", str(run_dir),
                                "--eval-every", "0"])
    cfg = cli._config_from_args(ns)
    assert (cfg.epochs, cfg.eval_every, cfg.lr, cfg.hidden) == (60, 0, 0.02, 16)


def test_resume_refuses_other_settings(run_dir, tmp_path):
    with pytest.raises(ClusterError) as err:
        cli._parse_train_args(["--resume", str(run_dir), "--lr", "0.5", "--dropout", "0.1"])
    text = str(err.value)
    assert err.value.collective and "CheckpointError" in text
    assert "lr=0.5 (the run has 0.02)" in text and "dropout=0.1 (the run has 0.5)" in text
    config = tmp_path / "more.toml"
    config.write_text("weight_decay = 0.001\n")
    with pytest.raises(ClusterError, match=r"weight_decay=0.001 \(the run has 0.0\)"):
        cli._parse_train_args(["--resume", str(run_dir), "--config", str(config)])
    with pytest.raises(ClusterError, match="a resumed run writes into the run directory"):
        cli._parse_train_args(["--resume", str(run_dir), "--out", str(tmp_path / "elsewhere")])


def test_resume_of_something_that_is_not_a_run(tmp_path):
    with pytest.raises(ClusterError, match=r"ConfigError: .*config.json not found: .* is not a run directory"):
        cli._parse_train_args(["--resume", str(tmp_path / "nothing")])


def test_resume_in_a_config_file_is_refused(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'resume = "{tmp_path}"\n')
    with pytest.raises(ClusterError, match="give --resume RUN_DIR"):
        cli._parse_train_args(["--shards", str(tmp_path), "--config", str(config)])

"""Resuming a run whose files were damaged: the history (metrics.jsonl) must match the checkpoint, and
damaged run files are named for what they are (one process on a 1x1 shard set, as test_run_files)."""
import shutil

import pytest

from granndis_hpc import cli, metrics
from granndis_hpc.cluster.errors import ClusterError
from tests.unit.test_run_files import train
from tests.unit.test_shards import build, make_graph

pytest.importorskip("mpi4py")


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A finished 3-epoch run on a 1x1 set, checkpointed every epoch; tests resume copies of it."""
    shards = tmp_path_factory.mktemp("set") / "set"
    build(make_graph(n=200, m=800), shards, servers=1, gpus_per_server=1)
    run = tmp_path_factory.mktemp("trained") / "run"
    train(shards, run)
    return run


def _copy(run, tmp_path):
    return shutil.copytree(run, tmp_path / "run")


def test_an_empty_history_is_refused_and_a_deleted_one_is_said(trained_run, tmp_path, capsys):
    """An empty metrics.jsonl was accepted by --resume: the file then held epochs 3.. only."""
    run = _copy(trained_run, tmp_path)
    (run / "metrics.jsonl").write_bytes(b"")
    with pytest.raises(ClusterError, match=r"metrics\.jsonl: the records of epoch\(s\) 0, 1, 2 \(before the "
                                           r"checkpoint, after 3 epochs\) are missing: resuming would lose records"):
        cli.run_training(["--resume", str(run), "--quiet", "--epochs", "4"])
    assert (run / "metrics.jsonl").read_bytes() == b""  # untouched
    # Deleting the file is the way to continue without the old records; the resume says so, once.
    (run / "metrics.jsonl").unlink()
    capsys.readouterr()
    cli.run_training(["--resume", str(run), "--quiet", "--epochs", "4"])
    err = capsys.readouterr().err
    assert err.count("metrics.jsonl is missing: the records of the 3 epoch(s) before the checkpoint are not "
                     "kept") == 1, err
    assert [r["epoch"] for r in metrics.read_metrics(run)] == [3]


def test_a_directory_in_place_of_a_run_file_is_refused_before_training(trained_run, tmp_path):
    """best-model.pt being a directory let the resume train 4 epochs, then blamed free space."""
    run = _copy(trained_run, tmp_path)
    (run / "best-model.pt").unlink()
    (run / "best-model.pt").mkdir()
    before = (run / "metrics.jsonl").read_bytes()
    with pytest.raises(ClusterError, match=r"best-model\.pt is a directory, not the run's best-model\.pt: .*move "
                                           r"the directory away and resume again"):
        cli.run_training(["--resume", str(run), "--quiet", "--epochs", "7"])
    assert (run / "metrics.jsonl").read_bytes() == before  # no epoch trained


def test_the_resume_says_in_one_line_whether_the_content_was_checked(trained_run, tmp_path, capsys):
    """A set whose files were edited with re-hashed checksums resumed silently: the message says the
    content was not checked unless --verify-content was given."""
    run = _copy(trained_run, tmp_path)
    capsys.readouterr()
    cli.run_training(["--resume", str(run), "--quiet", "--epochs", "4"])
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "content was not checked" in line] == [
        f"[rank 0] continuing {run}/checkpoints/epoch-000003 after 3 epochs; the shard set's content was not "
        "checked (its files' checksums were): add --verify-content to check it against the build's digest"], err
    cli.run_training(["--resume", str(run), "--quiet", "--epochs", "5", "--verify-content"])
    assert "content was not checked" not in capsys.readouterr().err

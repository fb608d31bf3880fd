"""Run-directory files under ordinary faults, in one process on a 1x1
shard set (the world is this one process; every refusal is the collective one mpirun's ranks share)."""
import errno
import json
import os
import stat

import pytest

from granndis_hpc import cli, metrics
from granndis_hpc.cluster.errors import ClusterError
from granndis_hpc.engine.steps import TrainingError
from tests.unit.test_shards import build, make_graph

pytest.importorskip("mpi4py")


@pytest.fixture(scope="module")
def one_rank_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("set11") / "set"
    build(make_graph(n=200, m=800), out, servers=1, gpus_per_server=1)
    return out


def train(shards, run, *extra):
    return cli.run_training(["--shards", str(shards), "--ranks-per-server", "1", "--layers", "2", "--hidden", "8",
                             "--epochs", "3", "--checkpoint-every", "1", "--eval-every", "1", "--out", str(run),
                             "--quiet", *map(str, extra)])


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_every_run_file_honours_the_umask(one_rank_set, tmp_path, umask):
    """Before: config.json, summary.json, best-model.pt and checkpoints were 0600 (mkstemp's mode)."""
    old = os.umask(umask)
    try:
        train(one_rank_set, tmp_path / "run")
    finally:
        os.umask(old)
    modes = {os.path.relpath(os.path.join(d, n), tmp_path): stat.S_IMODE(os.stat(os.path.join(d, n)).st_mode)
             for d, _, names in os.walk(tmp_path / "run") for n in names}
    assert {"run/config.json", "run/summary.json", "run/best-model.pt", "run/metrics.jsonl"} <= set(modes)
    assert modes == {name: 0o666 & ~umask for name in modes}, {k: oct(v) for k, v in modes.items()}


def _full_disk_after(calls):
    real = metrics.MetricsWriter.write
    count = {"n": 0}

    def write(self, rec):
        count["n"] += 1
        if count["n"] > calls:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
        return real(self, rec)
    return write


def test_a_full_disk_during_the_run_stops_every_rank_with_one_message(one_rank_set, tmp_path, monkeypatch):
    """Before: an OSError traceback on rank 0 and MPI_ABORT; now the one-line error, and the newest
    checkpoint continues the run."""
    run = tmp_path / "run"
    monkeypatch.setattr(metrics.MetricsWriter, "write", _full_disk_after(2))
    with pytest.raises(TrainingError) as info:
        train(one_rank_set, run)
    text = str(info.value)
    assert info.value.collective and "metrics.jsonl" in text and "No space left on device" in text
    assert f"--resume {run}" in text and "checkpoint" in text and "stopped after 3 epochs" in text
    assert [r["epoch"] for r in metrics.read_metrics(run)] == [0, 1]
    monkeypatch.undo()
    summary = cli.run_training(["--resume", str(run), "--quiet"])
    assert summary["epochs"] == 3 and [r["epoch"] for r in metrics.read_metrics(run)] == [0, 1, 2]


def test_a_full_disk_at_the_summary_is_the_collective_error(one_rank_set, tmp_path, monkeypatch):
    import granndis_hpc.rundir.directory as rundir  # the run directory writes summary.json

    def no_space(run_dir, summary):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(run_dir, "summary.json"))
    monkeypatch.setattr(rundir, "write_summary", no_space)
    with pytest.raises(ClusterError, match=r"summary.json \(free space, then continue with --resume .*No space left"):
        train(one_rank_set, tmp_path / "run")


def test_a_failed_append_leaves_whole_lines(tmp_path, monkeypatch):
    """ENOSPC in the middle of a line (a partial write) is cut back: metrics.jsonl never ends half a record."""
    writer = metrics.MetricsWriter(str(tmp_path))
    writer.write({"epoch": 0})
    real = os.write

    def half(fd, data):
        real(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "write", half)
    with pytest.raises(OSError):
        writer.write({"epoch": 1, "loss": 0.5})
    monkeypatch.undo()
    writer.close()
    assert (tmp_path / "metrics.jsonl").read_text() == json.dumps({"epoch": 0}) + "\n"


def test_plan_json_to_a_missing_directory_is_refused_before_the_work(tmp_path, capsys):
    """`preprocess plan ... --json /nonexistent/x.json` is refused before the plan is printed, not with a traceback."""
    from granndis_hpc.preprocess.__main__ import main

    rc = main(["plan", "--source", "synthetic", "--vertices", "300", "--avg-degree", "4", "--features", "4",
               "--classes", "3", "--servers", "1", "--gpus-per-server", "2", "--layers", "2",
               "--json", str(tmp_path / "nonexistent" / "x.json")])
    out, err = capsys.readouterr()
    assert rc == 1 and "[plan]" not in out
    assert "nonexistent does not exist; create it or choose another path" in err and "Traceback" not in err


def test_a_live_run_directory_is_locked(one_rank_set, tmp_path, monkeypatch):
    """--overwrite-run (or --resume, or a new run) while another job trains in the directory would mix
    the two runs' files.  Each is refused naming the holder, and nothing is written."""
    import socket

    from granndis_hpc.rundir.lock import RunLock

    run = tmp_path / "run"
    train(one_rank_set, run)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    held = RunLock(str(run))  # the "other job" (another open file description: flock conflicts)
    held.announce()
    monkeypatch.delenv("SLURM_JOB_ID")
    before = {n: os.path.getmtime(run / n) for n in os.listdir(run)}
    try:
        holder = f"host {socket.gethostname()}, pid {os.getpid()}, job id 4242"
        for extra, action in ((["--overwrite-run"], "replace its run"), ([], "start a run in it")):
            with pytest.raises(ClusterError, match=rf"in use by a running job \({holder}\).*cannot {action}"):
                train(one_rank_set, run, *extra)
        with pytest.raises(ClusterError, match=rf"in use by a running job \({holder}\).*cannot resume it"):
            cli.run_training(["--resume", str(run), "--quiet", "--epochs", "5"])
        assert {n: os.path.getmtime(run / n) for n in os.listdir(run)} == before
    finally:
        held.release()
    train(one_rank_set, run, "--overwrite-run", "--seed", "1")  # free again


def test_a_killed_holder_leaves_no_stale_lock(one_rank_set, tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO

    run = tmp_path / "run"
    code = ("import os, signal; from granndis_hpc.rundir.lock import RunLock; "
            f"lock = RunLock({str(run)!r}); lock.announce(); os.kill(os.getpid(), signal.SIGKILL)")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=60)
    assert res.returncode == -9 and (run / ".lock").exists()
    assert train(one_rank_set, run)["epochs"] == 3


def _metrics(tmp_path, lines):
    (tmp_path / "metrics.jsonl").write_bytes(b"".join(lines))


def test_damaged_metrics_lines_are_refused_or_repaired_with_a_message(tmp_path):
    """A damaged line in the middle is never dropped silently on --resume (epochs 0, 1, 3, 4...)."""
    rec = [json.dumps({"epoch": e}).encode() + b"\n" for e in range(5)]
    _metrics(tmp_path, rec[:2] + [b'{"epoch": 2, "lo\n'] + rec[3:])
    with pytest.raises(metrics.MetricsError, match=r"line\(s\) 3 are not epoch records.*epoch\(s\) 2 .*missing"):
        metrics.truncate_metrics(str(tmp_path), 4)
    assert (tmp_path / "metrics.jsonl").read_bytes().count(b"\n") == 5  # untouched
    _metrics(tmp_path, rec[:2] + rec[3:])  # a record gone
    with pytest.raises(metrics.MetricsError, match=r"epoch\(s\) 2 \(before the checkpoint"):
        metrics.truncate_metrics(str(tmp_path), 3)
    _metrics(tmp_path, [b"\xff\xfe junk \x00\n"] + rec)  # random bytes: a refusal, not a traceback
    with pytest.raises(metrics.MetricsError, match=r"line\(s\) 1 are not epoch records"):
        metrics.truncate_metrics(str(tmp_path), 2)
    notes = []
    _metrics(tmp_path, rec[:3] + [b'{"epoch": 3, "lo'])  # the last line cut by a kill: repaired, said
    assert [r["epoch"] for r in metrics.truncate_metrics(str(tmp_path), 3, note=notes.append)] == [0, 1, 2]
    assert len(notes) == 1 and "line 4, the last, was cut short" in notes[0]
    os.remove(tmp_path / "metrics.jsonl")
    os.mkdir(tmp_path / "metrics.jsonl")
    with pytest.raises(metrics.MetricsError, match="is a directory"):
        metrics.truncate_metrics(str(tmp_path), 2)


def test_resume_refuses_a_damaged_metrics_file_on_every_rank(one_rank_set, tmp_path):
    run = tmp_path / "run"
    train(one_rank_set, run)
    lines = (run / "metrics.jsonl").read_bytes().splitlines(True)
    (run / "metrics.jsonl").write_bytes(lines[0] + b"garbage\n" + lines[2])
    with pytest.raises(ClusterError, match=r"metrics.jsonl: line\(s\) 2 are not epoch records"):
        cli.run_training(["--resume", str(run), "--quiet", "--epochs", "4"])


def test_a_killed_writers_temporaries_are_removed_by_the_next_run(one_rank_set, tmp_path, capsys):
    """A SIGKILL while best-model.pt is written leaves .best-model.pt.*.tmp; the next run removes it."""
    run = tmp_path / "run"
    train(one_rank_set, run)
    (run / ".best-model.pt.abc123.tmp").write_bytes(b"half")
    (run / ".summary.json.x.tmp").write_bytes(b"{")
    (run / ".keep-me.tmp").write_bytes(b"not ours")
    cli.run_training(["--resume", str(run), "--quiet", "--epochs", "4"])
    assert sorted(n for n in os.listdir(run) if n.endswith(".tmp")) == [".keep-me.tmp"]
    assert "removed 2 temporary file(s) of a job killed while writing" in capsys.readouterr().err

"""SIGTERM and SIGINT (Ctrl-C) sent to Open MPI's `mpirun` itself, under `mpirun -n 2` (2 servers x 1
rank), real Cora: what a user sees, as docs/checkpoints.md states it.

Open MPI 4.1's mpirun answers either signal by aborting the job: it sends the ranks SIGCONT, waits
odls_base_sigkill_timeout seconds (default 1), sends SIGTERM, waits as long again, then SIGKILL, and
exits 1 whatever the ranks did (its own abort status; the ranks cannot change it).  The ranks take
SIGTERM as a stop request: they finish the epoch, write a complete checkpoint and exit, if that fits in
the wait.  The test gives the wait as the docs advise (OMPI_MCA_odls_base_sigkill_timeout), then checks
exit status 1, a complete checkpoint that `--resume` continues, and nothing half-written."""
import json
import os
import shutil
import signal
import time

import pytest

from granndis_hpc.rundir import checkpoint as ck
from granndis_hpc.rundir import checkpoint_files as cf
from tests.conftest import start_mpi
from tests.launch.test_resume import cora_shards

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")
TRAIN = ["--ranks-per-server", "1", "--layers", "2", "--hidden", "16", "--epochs", "1000", "--eval-every", "0"]
# Seconds between mpirun's SIGCONT, SIGTERM and SIGKILL: room for an epoch and a checkpoint on a busy machine.
KILL_WAIT = {"OMPI_MCA_odls_base_sigkill_timeout": "2"}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return cora_shards(tmp_path_factory.mktemp("signals") / "cora-2x1", 2, 1)


def _epochs(run_dir):
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _signal_mpirun(args, run_dir, log_path, signum, after):
    """Launch, wait until metrics.jsonl holds more than `after` epochs (an epoch line appeared), send
    `signum` to mpirun; (exit status, output, seconds from the signal to mpirun's exit)."""
    with open(log_path, "w+") as log:
        proc = start_mpi(["-m", "granndis_hpc.cli", "train", *args], log, n=2, env=KILL_WAIT)
        try:
            deadline = time.monotonic() + 240
            while len(_epochs(run_dir)) <= after:
                assert proc.poll() is None and time.monotonic() < deadline, "no epoch before the signal"
                time.sleep(0.02)
            proc.send_signal(signum)
            sent = time.monotonic()
            rc = proc.wait(timeout=60)
            waited = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
        log.seek(0)
        return rc, log.read(), waited


def _check_clean(run_dir, log, after):
    """The newest checkpoint complete with both ranks' files, loadable, at the epoch metrics.jsonl ends
    at; no incomplete checkpoint directory, no temporary file, no summary (the run is not finished)."""
    stopped = cf.latest_complete(str(run_dir))
    assert stopped is not None and stopped.epoch > after, log
    assert sorted(stopped.manifest["files"]) == ["rank-0000.pt", "rank-0001.pt", "state.pt"]
    state = ck.read_payload(stopped.path, stopped.manifest["files"][cf.SHARED_FILE])
    assert set(state["model"]) and all(t.isfinite().all() for t in state["model"].values())
    assert all(complete for _, _, complete in cf.list_checkpoints(str(run_dir))), cf.list_checkpoints(str(run_dir))
    assert [r["epoch"] for r in _epochs(run_dir)] == list(range(stopped.epoch))  # every line whole
    leftovers = [os.path.join(root, n) for root, _, names in os.walk(run_dir) for n in names if n.endswith(".tmp")]
    assert not leftovers, leftovers
    assert not (run_dir / "summary.json").exists()
    assert f"stopped after {stopped.epoch} epochs" in log, log
    return stopped.epoch


def test_sigterm_then_sigint_to_mpirun_exit_1_with_a_complete_resumable_checkpoint(shards, tmp_path):
    run_dir = tmp_path / "run"
    rc, log, waited = _signal_mpirun(["--shards", shards, "--out", run_dir, *TRAIN], run_dir, tmp_path / "term.log",
                                     signal.SIGTERM, after=0)
    assert rc == 1, log  # mpirun's own abort status, not the ranks'
    first = _check_clean(run_dir, log, after=0)
    # SIGCONT, the whole wait, SIGTERM; the wait before SIGKILL ends early once every rank has exited.
    assert waited >= float(KILL_WAIT["OMPI_MCA_odls_base_sigkill_timeout"]) - 0.5, waited
    # Ctrl-C on the continued run: the same abort, and the run continues from where the first stop left it.
    rc, log, _ = _signal_mpirun(["--resume", run_dir], run_dir, tmp_path / "int.log", signal.SIGINT, after=first)
    assert rc == 1, log
    assert f"after {first} epochs" in log, log  # continued from the first stop's checkpoint
    second = _check_clean(run_dir, log, after=first)
    assert second > first

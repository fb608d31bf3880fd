"""A stop signal (Slurm's time-limit warning, preemption) that reaches the ranks while they are still
setting up -- importing torch, MPI_Init, reading shards: seconds -- must be honoured, not kill them
(handlers installed only after set-up would let SIGUSR1 kill the ranks, and the Slurm script would
requeue the job forever).  Under `mpirun -n 2` (2 servers x 1 rank), real Cora."""
import os
import shutil
import signal
import time

import pytest

from granndis_hpc.rundir import checkpoint_files as cf
from tests.conftest import start_mpi
from tests.slurm_real import catches_usr1
from tests.launch.test_resume import _rank_pids, cora_shards

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")
TRAIN = ["--ranks-per-server", "1", "--layers", "2", "--hidden", "16", "--epochs", "4", "--eval-every", "0",
         "--quiet"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return cora_shards(tmp_path_factory.mktemp("stop") / "cora-2x1", 2, 1)


def test_stop_signal_during_set_up_stops_cleanly_before_training(shards, tmp_path):
    run_dir = tmp_path / "run"
    with open(tmp_path / "log", "w+") as log:
        proc = start_mpi(["-m", "granndis_hpc.cli", "train", "--shards", shards, "--out", run_dir, *TRAIN], log, n=2)
        try:
            # As soon as every rank catches SIGUSR1 (the handlers are installed before the imports),
            # signal them all: they are then still importing torch and mpi4py.
            deadline = time.monotonic() + 60
            while len(pids := _rank_pids(proc.pid)) < 2 or not all(map(catches_usr1, pids.values())):
                assert proc.poll() is None and time.monotonic() < deadline, "the ranks did not start"
                time.sleep(0.005)
            for pid in pids.values():
                os.kill(pid, signal.SIGUSR1)
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        log.seek(0)
        out = log.read()
    assert not (run_dir / "metrics.jsonl").exists() or (run_dir / "metrics.jsonl").read_text() == "", out
    assert rc == 0, out
    assert "stop requested (SIGUSR1/SIGTERM) during set-up: stopped before training, at epoch 0" in out, out
    assert cf.latest_complete(str(run_dir)) is None and not (run_dir / "summary.json").exists()
    assert (run_dir / "config.json").exists()  # the run exists: --resume continues it from epoch 0

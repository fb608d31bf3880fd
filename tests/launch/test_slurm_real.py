"""The real slurm/*.sbatch under a real Slurm (Debian's slurm-wlm 22.05, slurm/testing/slurmcluster.py):
two emulated servers as two nodes of 4 CPUs, no GPUs.  preprocess.sbatch with its own resource defaults,
then train.sbatch in the documented CPU form on 2 nodes x 2 tasks: the job must find its 2 servers by
itself (hosts slurm-s0, slurm-s1, not "emulated"), finish, and train exactly what a plain `mpirun -n 4`
of the same options trains.  The longer scenarios (time limits, requeues, signals) are `make test-slurm`
(tests/slurm/).  Skipped with the reason where the cluster cannot exist (not root, no namespaces, Slurm
not installed: `make setup` installs it where root)."""
import json
import re

import pytest

from tests import slurm_real as sr
from tests.conftest import REPO
from tests.unit.test_slurm_real import CPU_FORM  # noqa: F401


@pytest.mark.timeout(400)
def test_preprocess_then_train_on_two_nodes_equals_plain_mpirun(tmp_path):
    with sr.slurm_cluster():
        # Submitted from outside the checkout, by path, without GRANNDIS_HOME; the script's own
        # resource defaults fit a 4-CPU node
        shards = sr.preprocess(tmp_path, cwd=tmp_path)
        run_dir, log = tmp_path / "run", tmp_path / "train.out"
        # No GRANNDIS_LAYERS: the depth comes from the shards
        job = sr.submit(REPO / "slurm" / "train.sbatch", CPU_FORM,
                        ["--epochs", "3", "--hidden", "16", "--eval-every", "0"],
                        env=sr.job_env(GRANNDIS_SHARDS=shards, GRANNDIS_RUN_DIR=run_dir), log=log, cwd=tmp_path)
        info = sr.wait(job, 240)
    text = log.read_text(errors="replace")
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, text[-4000:])
    summary = json.loads((run_dir / "summary.json").read_text())
    # The job found its servers itself: one per node, named
    assert (summary["servers"], summary["ranks_per_server"]) == (2, 2)
    assert summary["hosts"] == ["slurm-s0", "slurm-s1"] and summary["emulated_servers"] is False
    assert re.search(r"server +0 +host slurm-s0 +ranks 0,1", text) and re.search(r"server +1 +host slurm-s1 +ranks 2,3",
                                                                                 text)
    assert "(emulated)" not in text
    train = sr.logged_train_args(text)
    # The depth from the shards.
    assert train.count("--epochs") == 1 and train[train.index("--layers") + 1] == "2", train
    # The same options under a plain mpirun on one machine: the same losses, bit for bit
    ref = tmp_path / "ref"
    sr.plain_mpirun(train, ref)
    assert len(sr.losses(run_dir)) == 3
    assert sr.losses(run_dir) == sr.losses(ref)

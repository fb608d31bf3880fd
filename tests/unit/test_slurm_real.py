"""The real-Slurm test cluster's pieces that need no Slurm: the documented CPU form of train.sbatch and
the slurm.conf it writes (the job itself runs in tests/launch/test_slurm_real.py)."""
from tests import slurm_real as sr
from tests.conftest import REPO

# The CPU form slurm/README.md documents (with the script's GPU defaults,
# `sbatch -N 2 --ntasks-per-node=2 slurm/train.sbatch` would fail on a cluster without GPUs).
CPU_FORM = ["--nodes=2", "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1"]


def test_cpu_form_is_the_documented_one():
    assert f"sbatch {' '.join(CPU_FORM)} slurm/train.sbatch" in (REPO / "slurm" / "README.md").read_text()


def test_slurm_conf_of_the_test_cluster(tmp_path, monkeypatch):
    """What the measured set-up needs (slurm/testing/slurmcluster.py): per-node paths with %n (TmpFS
    too: the pmix plugin's spmix_appdir_* collide without it), the controller on server 0 by address,
    the lowered cred_expire, more CPUs than the machine's cores."""
    monkeypatch.delenv(sr.sc.emu.ENV_STATE_DIR, raising=False)
    monkeypatch.delenv(sr.sc.emu.ENV_SUBNET, raising=False)
    monkeypatch.setenv(sr.sc.emu.ENV_INSTANCE, sr.sc.INSTANCE)
    state = sr.sc.emu.layout(2, str(tmp_path))
    conf = dict(line.split("=", 1) for line in sr.sc.slurm_conf(state, "/s", 4, 10, 15, "/m/sock").splitlines()
                if "=" in line and not line.startswith(("#", "NodeName", "PartitionName")))
    assert conf["SlurmctldHost"] == "slurm-s0(10.214.0.1)"
    assert conf["AuthInfo"] == "socket=/m/sock,cred_expire=10"
    for key in ("SlurmdSpoolDir", "SlurmdPidFile", "SlurmdLogFile", "TmpFS"):
        assert "%n" in conf[key], key
    assert conf["SlurmdParameters"] == "config_overrides" and conf["MpiDefault"] == "none"
    assert conf["ProctrackType"] == "proctrack/linuxproc" and conf["TaskPlugin"] == "task/none"
    nodes = [line for line in sr.sc.slurm_conf(state, "/s", 4, 10, 15, "/m/sock").splitlines()
             if line.startswith("NodeName")]
    assert nodes == ["NodeName=slurm-s0 NodeAddr=10.214.0.1 NodeHostname=slurm-s0 CPUs=4 State=UNKNOWN",
                     "NodeName=slurm-s1 NodeAddr=10.214.0.2 NodeHostname=slurm-s1 CPUs=4 State=UNKNOWN"]

"""granndis_hpc/mpistart.py: the GPU is set from the launcher's local rank before MPI is initialised,
MPI starts with thread support, and a thread level too low for GPU training is refused by name."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from granndis_hpc import mpistart
from granndis_hpc.mpistart import early_gpu, local_rank, requested_device, init_mpi, thread_level_problem

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Log(list):
    pass


class FakeCuda:
    def __init__(self, log, gpus):
        self.log, self.gpus = log, gpus

    def is_available(self):
        self.log.append("cuda.is_available")
        return self.gpus > 0

    def device_count(self):
        return self.gpus

    def set_device(self, index):
        self.log.append(f"cuda.set_device({index})")


class FakeMPI:
    THREAD_MULTIPLE, THREAD_SERIALIZED = 3, 2

    def __init__(self, log, initialised=False, provides=3):
        self.log, self.initialised, self.provides = log, initialised, provides

    def Is_initialized(self):
        return self.initialised

    def Query_thread(self):
        return self.provides

    def Init_thread(self, required):
        self.log.append(f"MPI.Init_thread({required})")
        self.initialised = True
        return self.provides


class FakeMPI4py:
    __name__ = "fake_mpi4py"

    def __init__(self, mpi):
        self.MPI = mpi
        self.rc = type("Rc", (), {"initialize": True, "finalize": None})()


def _start(env, gpus=2, device="auto", initialised=False):
    log = _Log()
    pkg = FakeMPI4py(FakeMPI(log, initialised))
    facts = init_mpi(device, env, cuda=FakeCuda(log, gpus), mpi4py_module=pkg)
    return log, facts, pkg


@pytest.mark.parametrize("var", mpistart.LOCAL_RANK_VARS)
def test_the_gpu_is_set_from_each_launchers_local_rank_before_mpi_starts(var):
    log, facts, pkg = _start({var: "3"}, gpus=2)
    assert log == ["cuda.is_available", "cuda.set_device(1)", "MPI.Init_thread(3)"]
    assert facts == {"gpu": 1, "local_rank": 3, "source": var, "thread_level": 3, "already": False}
    assert pkg.rc.initialize is False and pkg.rc.finalize is True


def test_cpu_runs_touch_no_gpu_and_a_started_mpi_is_left_alone():
    log, facts, _ = _start({"SLURM_LOCALID": "1"}, device="cpu")
    assert log == ["MPI.Init_thread(3)"] and facts["gpu"] is None
    log, facts, _ = _start({}, gpus=0)
    assert log == ["cuda.is_available", "MPI.Init_thread(3)"] and facts["gpu"] is None and facts["local_rank"] == 0
    log, facts, pkg = _start({"SLURM_LOCALID": "1"}, initialised=True)
    assert log == [] and facts["already"] and pkg.rc.initialize is True


def test_local_rank_and_early_choice_are_pure():
    assert local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "2", "SLURM_LOCALID": "5"}) == (2, "OMPI_COMM_WORLD_LOCAL_RANK")
    assert local_rank({"SLURM_LOCALID": "x", "PMI_LOCAL_RANK": "4"}) == (4, "PMI_LOCAL_RANK")
    assert local_rank({}) == (0, "")
    assert [early_gpu(r, 4) for r in range(6)] == [0, 1, 2, 3, 0, 1]
    assert early_gpu(3, 1) == 0 and early_gpu(0, 0) is None


def test_a_thread_level_below_serialized_is_refused_naming_it_and_the_library():
    library = "Open MPI v4.1.4, package: Debian OpenMPI\nmore lines"
    problem = thread_level_problem(1, 2, library)
    assert "MPI_THREAD_FUNNELED" in problem and "MPI_THREAD_SERIALIZED" in problem
    assert "Open MPI v4.1.4, package: Debian OpenMPI" in problem and "more lines" not in problem
    assert thread_level_problem(2, 2, library) == "" and thread_level_problem(3, 2, library) == ""


def test_the_requested_device_is_read_without_mpi(tmp_path):
    assert requested_device(["--shards", "s", "--device", "cpu"]) == "cpu"
    assert requested_device(["--shards", "s"]) == "auto"
    toml = tmp_path / "run.toml"
    toml.write_text('shards = "s"\ndevice = "cuda"\n')
    assert requested_device(["--config", str(toml)]) == "cuda"
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"shards": "s", "device": "cpu"}))
    assert requested_device(["--resume", str(run)]) == "cpu"
    assert requested_device(["--help"]) == "cpu"
    assert requested_device(["--no-such-flag"]) == "auto"  # the collective parse reports it later


def test_granndis_train_sets_the_gpu_before_mpi_initialises():
    """The real entry point and mpi4py, with a stand-in torch.cuda of 2 GPUs and local rank 1: the
    device is set while MPI is not yet initialised; MPI then starts with thread support."""
    child = textwrap.dedent("""
        import atexit, json, sys
        import torch
        events = []
        def mpi_up():
            mpi = sys.modules.get("mpi4py.MPI")
            return bool(mpi is not None and mpi.Is_initialized())
        torch.cuda.is_available = lambda: True
        torch.cuda.device_count = lambda: 2
        torch.cuda.set_device = lambda i: events.append(["set_device", i, mpi_up()])
        from granndis_hpc import cli, mpistart
        atexit.register(lambda: print("EVENTS " + json.dumps(events + [["mpi", mpi_up(), mpistart.started]])))
        cli.train_main(["--device", "cuda"])  # no --shards: refused by the collective parse, status 2
    """)
    env = {k: v for k, v in os.environ.items() if k not in mpistart.LOCAL_RANK_VARS}
    env.update(MPI_LOCALRANKID="1", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", child], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--shards" in proc.stderr
    events = json.loads(proc.stdout.split("EVENTS ", 1)[1])
    assert events[0] == ["set_device", 1, False]
    assert events[-1][0] == "mpi" and events[-1][1] is True
    assert events[-1][2]["gpu"] == 1 and events[-1][2]["source"] == "MPI_LOCALRANKID"
    assert events[-1][2]["thread_level"] >= 2 and events[-1][2]["already"] is False

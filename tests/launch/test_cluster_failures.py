"""Bad configurations and failing ranks end the whole job with a clear message, never a hang.

Each test launches `mpirun -n 4 python -m granndis_hpc.cluster.selfcheck ...` in a subprocess
(run_mpi) and checks the exit status and what the ranks printed.
"""
import re

import pytest
import torch

from tests.conftest import run_mpi

SELFCHECK = ["-m", "granndis_hpc.cluster.selfcheck"]
TIMEOUT = 180  # generous for a loaded 2-core machine; a hang would hit it


def _ranks_reporting(stderr, pattern):
    return {int(m.group(1)) for m in re.finditer(rf"^\[rank (\d+)\] {pattern}", stderr, re.M)}


def test_selfcheck_passes_on_two_emulated_servers():
    proc = run_mpi([*SELFCHECK, "--ranks-per-server", "2"], timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 server(s) x 2 rank(s)" in proc.stdout
    assert "selfcheck OK" in proc.stdout


def test_ranks_per_server_not_dividing_the_world_fails_on_every_rank():
    proc = run_mpi([*SELFCHECK, "--ranks-per-server", "3"], timeout=TIMEOUT)
    assert proc.returncode != 0
    assert _ranks_reporting(proc.stderr, r"ClusterError: .*does not divide the 4 ranks") == {0}


def test_bad_environment_value_is_named():
    proc = run_mpi(SELFCHECK, timeout=TIMEOUT, env={"GRANNDIS_RANKS_PER_SERVER": "two"})
    assert proc.returncode != 0
    assert _ranks_reporting(proc.stderr, r"ClusterError: .*GRANNDIS_RANKS_PER_SERVER='two' is not an integer") \
        == {0}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised when CUDA is absent")
def test_cuda_requested_without_cuda_fails_on_every_rank():
    proc = run_mpi([*SELFCHECK, "--device", "cuda"], timeout=TIMEOUT)
    assert proc.returncode != 0
    assert _ranks_reporting(proc.stderr, r"ClusterError: .*device=cuda was requested but CUDA is not available") \
        == {0}


def test_a_rank_raising_before_a_collective_aborts_the_job():
    proc = run_mpi([*SELFCHECK, "--ranks-per-server", "2", "--fail-rank", "2"], timeout=TIMEOUT)
    assert proc.returncode != 0
    assert "[rank 2] RuntimeError: --fail-rank 2: failure injected before a collective" in proc.stderr
    assert "selfcheck OK" not in proc.stdout

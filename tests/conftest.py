"""Shared fixtures: where the real datasets are, and how to launch mpirun from a serial test."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DATASETS = pathlib.Path(os.environ.get("GRANNDIS_DATASETS", REPO.parent / "shared" / "datasets"))
PLANETOID = DATASETS / "planetoid"

MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_hwloc_base_binding_policy": "none",
    "PYTHONUNBUFFERED": "1",
    "OMP_NUM_THREADS": "1",
}


@pytest.fixture
def planetoid_root():
    if not (PLANETOID / "ind.cora.graph").exists():
        pytest.skip(f"real Planetoid files not found in {PLANETOID} (set GRANNDIS_DATASETS)")
    return PLANETOID


def run_mpi(args, n=4, timeout=240, env=None, cwd=REPO):
    """Run `mpirun -n N python ARGS...` and return the CompletedProcess (never raises on failure)."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed")
    full_env = dict(os.environ, **MPI_ENV, **(env or {}))
    cmd = ["mpirun", "-n", str(n), sys.executable, *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)

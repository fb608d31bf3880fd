"""Shared fixtures: where the real datasets are, and how to launch mpirun from a serial test.

The real datasets are part of the repository (tests/data/planetoid, 1.6 MB): a missing file fails the
tests that need it instead of skipping them, so a broken checkout cannot pass quietly."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DATASETS = pathlib.Path(os.environ.get("GRANNDIS_DATASETS", REPO / "tests" / "data"))
PLANETOID = DATASETS / "planetoid"
PLANETOID_FILES = [f"ind.{name}.{part}" for name in ("cora", "citeseer")
                   for part in ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")]


def require_planetoid() -> pathlib.Path:
    """The Planetoid directory; fails the calling test (not a skip) when a file is missing."""
    missing = [f for f in PLANETOID_FILES if not (PLANETOID / f).exists()]
    if missing:
        pytest.fail(f"real Planetoid files missing from {PLANETOID}: {', '.join(missing)} (they are part of the "
                    f"repository under tests/data/planetoid; GRANNDIS_DATASETS=DIR points elsewhere)")
    return PLANETOID

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
    return require_planetoid()


def run_mpi(args, n=4, timeout=240, env=None, cwd=REPO):
    """Run `mpirun -n N python ARGS...` and return the CompletedProcess (never raises on failure)."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed")
    full_env = dict(os.environ, **MPI_ENV, **(env or {}))
    cmd = ["mpirun", "-n", str(n), sys.executable, *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)

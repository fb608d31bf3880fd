"""Shared fixtures: where the real datasets are, and how to launch mpirun from a serial test.

The real datasets are part of the repository (tests/data/planetoid, 1.6 MB): a missing file fails the
tests that need it instead of skipping them, so a broken checkout cannot pass quietly."""
import contextlib
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

from emucluster.mpienv import MPI_ENV, RANKS_PER_SERVER  # noqa: F401  (the one MPI environment; tests import it from here)

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



@pytest.fixture
def planetoid_root():
    return require_planetoid()


def mpi_env(env=None) -> dict:
    """os.environ with the MPI environment and `env` on top."""
    return dict(os.environ, **MPI_ENV, **(env or {}))


def mpi_command(args, n=4) -> list:
    """`mpirun -n N python ARGS...`; skips the calling test where mpirun is not installed."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed")
    return ["mpirun", "-n", str(n), sys.executable, *map(str, args)]


def run_mpi(args, n=4, timeout=240, env=None, cwd=REPO):
    """Run `mpirun -n N python ARGS...` and return the CompletedProcess (never raises on failure)."""
    return subprocess.run(mpi_command(args, n), cwd=cwd, env=mpi_env(env), capture_output=True, text=True,
                          timeout=timeout)


def start_mpi(args, log, n=4, env=None):
    """Start `mpirun -n N python ARGS...` in the background, its output to the open file `log`."""
    return subprocess.Popen(mpi_command(args, n), cwd=REPO, env=mpi_env(env), stdout=log, stderr=subprocess.STDOUT)


@contextlib.contextmanager
def mounted_tmpfs(mnt: pathlib.Path, size: str):
    """A tmpfs of `size` (e.g. "16m") mounted at `mnt` for the block, unmounted afterwards: a small, full-able
    disk for the full-disk tests (mounting needs root, as CI runs)."""
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True,
                         text=True)
    if res.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs for the full-disk test (run as root): {res.stderr}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


class FakeCudaEvent:
    """A torch.cuda.Event stand-in for the timing code's tests on CPU: the host time it was created at
    (monkeypatched in as cluster.hostsync._event)."""

    def __init__(self):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3

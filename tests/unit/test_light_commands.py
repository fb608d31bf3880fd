"""Commands that neither train nor communicate start neither torch (seconds to import) nor MPI (MPI_Init):
the help of every command, `preprocess info` and `preprocess verify` of a shard set.  Each runs in a fresh
interpreter, which then reports what it imported."""
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.unit.test_shards import build, make_graph

PROBE = """import contextlib, io, sys
sys.argv = ["granndis", *sys.argv[1:]]
from granndis_hpc.cli import main
try:
    with contextlib.redirect_stdout(io.StringIO()):
        status = main()
except SystemExit as exc:
    status = exc.code
print(status, *sorted(m for m in ("torch", "mpi4py.MPI", "h5py") if m in sys.modules))
"""


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("light") / "set"
    build(make_graph(n=120, m=400), out, servers=2, gpus_per_server=1)
    return out


def _imported(*argv):
    proc = subprocess.run([sys.executable, "-c", PROBE, *map(str, argv)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    status, *modules = proc.stdout.split()
    return int(status or 0), set(modules)


@pytest.mark.parametrize("argv", [["--help"], ["preprocess", "--help"], ["preprocess", "info", "--help"],
                                  ["preprocess", "verify", "--help"], ["preprocess", "build", "--help"],
                                  ["preprocess", "plan", "--help"], ["train", "--help"],
                                  ["train", "--shards", "x", "-h"], ["predict", "--help"], ["report", "--help"]],
                         ids=" ".join)
def test_help_imports_neither_torch_nor_mpi(argv):
    status, modules = _imported(*argv)
    assert status == 0
    assert not modules & {"torch", "mpi4py.MPI"}, modules


@pytest.mark.parametrize("command", ["info", "verify"])
def test_info_and_verify_of_a_shard_set_import_neither_torch_nor_mpi(shard_set, command):
    status, modules = _imported("preprocess", command, shard_set)
    assert status == 0
    assert not modules & {"torch", "mpi4py.MPI"}, modules
    if command == "verify":
        assert "h5py" in modules  # it did read the server files

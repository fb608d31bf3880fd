"""The one MPI environment (emucluster/mpienv.py: what the Makefile, the shell scripts, the tests and
bench/harness.py read) and the results page every bench script writes."""
import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

import harness
from tests.conftest import MPI_ENV, REPO, mpi_env

HARNESS = os.path.join(REPO, "bench", "harness.py")
EXPECTED = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_hwloc_base_binding_policy": "none",
            "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def test_the_tests_use_the_harness_environment():
    from emucluster import mpienv

    assert MPI_ENV is harness.MPI_ENV is mpienv.MPI_ENV and MPI_ENV == EXPECTED
    assert all(mpi_env({"X": "y"})[k] == v for k, v in {**EXPECTED, "X": "y"}.items())


@pytest.mark.parametrize("command", [["-m", "emucluster.mpienv"], [HARNESS]], ids=["module", "bench-harness"])
def test_printed_environment_is_the_same_for_make_and_shell(command):
    # Run from the checkout without the package installed, as the Makefile's system python3 does.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def out(*args):
        return subprocess.run([sys.executable, *command, *args], cwd=REPO, env=env, capture_output=True, text=True,
                              check=True).stdout

    words = out("env")
    assert dict(w.split("=", 1) for w in words.split()) == EXPECTED
    exports = [shlex.split(line) for line in out("env", "--shell").splitlines()]
    assert all(e[0] == "export" for e in exports) and dict(e[1].split("=", 1) for e in exports) == EXPECTED
    assert out("ranks-per-server").strip() == str(harness.RANKS_PER_SERVER) == "2"


@pytest.mark.skipif(shutil.which("make") is None or shutil.which("python3") is None, reason="needs make, python3")
def test_makefile_exports_the_harness_environment():
    env = {k: v for k, v in os.environ.items() if k not in EXPECTED and not k.startswith("MAKE")}
    res = subprocess.run(["make", "-s", "--no-print-directory", "--eval", "show-env: ; @env", "show-env"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    seen = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    assert {k: seen.get(k) for k in EXPECTED} == EXPECTED


def test_mpi_env_can_leave_the_thread_count_alone(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert harness.mpi_env(threads=False)["OMP_NUM_THREADS"] == "7"
    assert harness.mpi_env()["OMP_NUM_THREADS"] == "1"
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert "OMP_NUM_THREADS" not in harness.mpi_env(threads=False)
    assert harness.mpi_env(GRANNDIS_BUILD_PROFILE=3)["GRANNDIS_BUILD_PROFILE"] == "3"


def test_results_page_ends_with_the_commands_and_may_carry_json(tmp_path, capsys):
    page = tmp_path / "docs" / "bench-x.md"
    harness.write_page(str(page), ["# Title", "", "| a |", ""], "bench/bench_x.py", ["--fast"], ["mpirun -n 4 y"],
                       data={"runs": [1, 2]})
    text = page.read_text()
    assert text == "# Title\n\n| a |\n\n## Commands\n\n```\npython bench/bench_x.py --fast\nmpirun -n 4 y\n```\n"
    assert json.loads((tmp_path / "docs" / "bench-x.json").read_text()) == {"runs": [1, 2]}
    assert "## Commands" in capsys.readouterr().out
    # commands that name files inside the checkout are written relative to it
    harness.write_page(str(page), ["# T"], "bench/bench_x.py", [], [f"mpirun -n 2 {REPO}/.venv/bin/python -m x"])
    repo = str(REPO)
    assert "mpirun -n 2 .venv/bin/python -m x" in page.read_text() and repo not in page.read_text()

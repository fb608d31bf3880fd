"""The tests of tests/unit/test_memory_model.py that start their own mpirun (run one at a time by `make test`)."""
import json

from tests.unit.test_memory_model_cli import SYN  # noqa: F401


def test_hops_auto_error_on_every_rank(tmp_path):
    from tests.conftest import run_mpi

    res = run_mpi(["-m", "granndis_hpc.preprocess", "build", *SYN, "--servers", "2", "--gpus-per-server", "2",
                   "--layers", "3",
                   "--partitioner", "metis", "--out", str(tmp_path / "x"), "--hops", "auto"], n=2, timeout=120)
    assert res.returncode != 0
    assert "error (rank 0)" in res.stderr and "error (rank 1)" not in res.stderr and "--memory-per-gpu" in res.stderr


def test_plan_under_mpirun_equals_one_rank(tmp_path):
    """The collective plan (servers split over ranks, world send lists all-reduced) gives the same
    options as one rank; the table is printed once."""
    from tests.conftest import run_mpi

    args = ["plan", *SYN, "--servers", "2", "--gpus-per-server", "2", "--layers", "3", "--partitioner", "metis",
            "--hidden", "16", "--cob-batches", "2", "--memory-per-gpu", "1GiB"]
    res = run_mpi(["-m", "granndis_hpc.preprocess", *args, "--json", str(tmp_path / "mpi.json")], n=2, timeout=180)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("recommendation:") == 1
    from granndis_hpc.preprocess.__main__ import main
    assert main([*args, "--json", str(tmp_path / "one.json")]) == 0
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("mpi.json", "one.json"))
    assert a["options"] == b["options"] and a["decision"] == b["decision"]

"""`--model pyg` code that calls sys.exit(0) while it is imported, under `mpirun -n 2`: uncaught, it would
end the job with status 0 and an empty run directory.  It is the one-line error, said once by rank 0, exit
status 1 on every rank, no traceback (tests/unit/test_pyg_load_errors.py has every other failure, in one process)."""
import pytest

from tests.conftest import run_mpi
from tests.unit.test_shards import build, make_graph


def test_user_code_exiting_at_import_fails_the_job_with_one_line(tmp_path):
    pytest.importorskip("torch_geometric")
    build(make_graph(n=120, m=400), tmp_path / "set", servers=1, gpus_per_server=2)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "exits_at_import.py").write_text("import sys\nsys.exit(0)\n")
    run = tmp_path / "run"
    r = run_mpi(["-m", "granndis_hpc.cli", "train", "--shards", tmp_path / "set", "--ranks-per-server", "2",
                 "--mode", "fb", "--layers", "2", "--hidden", "8", "--epochs", "1", "--model", "pyg",
                 "--model-option", "module=exits_at_import", "--out", run, "--quiet"],
                n=2, timeout=180, env={"PYTHONPATH": str(tmp_path / "code")})
    assert r.returncode == 1, r.stdout + r.stderr
    line = ("[rank 0] ClusterError: ranks 0,1: ModelCodeError: --model pyg: importing exits_at_import raised "
            "SystemExit: 0; fix it or name other code with --model-option module=... factory=...")
    assert r.stderr.count(line) == 1, r.stderr
    assert "Traceback" not in r.stderr and "[rank 1]" not in r.stderr, r.stderr

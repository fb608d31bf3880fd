"""The tests of tests/unit/test_partition_digest.py that start their own mpirun (run one at a time by `make test`)."""
import pytest

from granndis_hpc import shards
from granndis_hpc.preprocess.__main__ import main
from tests.conftest import run_mpi
from tests.unit.test_partition_digest import file_hashes, owners_from_files, reference_digest  # noqa: F401


@pytest.mark.timeout(240)
def test_parmetis_cli_builds_in_separate_processes_are_identical(tmp_path, planetoid_root, capsys):
    # The reported failure: two `mpirun ... build --partitioner parmetis` runs of Cora with the same seed
    # gave different partitions (PT-Scotch's threads).  Each build is its own mpirun.
    outs = [tmp_path / f"pm-{i}" for i in range(2)]
    for out in outs:
        res = run_mpi(["-m", "granndis_hpc.preprocess", "build", "--source", "planetoid", "--name", "cora", "--root",
                       str(planetoid_root), "--servers", "2", "--gpus-per-server", "2", "--layers", "2",
                       "--partitioner", "parmetis", "--seed", "3", "--out", str(out)], n=2, timeout=200)
        assert res.returncode == 0, res.stderr
    m = [shards.read_manifest(out) for out in outs]
    owner = owners_from_files(outs[0], 2, 2, 2708)
    assert m[0]["partition_digest"] == m[1]["partition_digest"] == reference_digest(owner // 2, owner % 2, 2, 2)
    assert file_hashes(outs[0], 2) == file_hashes(outs[1], 2)
    assert main(["verify", str(outs[1])]) == 0

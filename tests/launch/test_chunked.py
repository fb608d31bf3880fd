"""The tests of tests/unit/test_chunked.py that start their own mpirun (run one at a time by `make test`)."""
from tests.conftest import run_mpi
from tests.unit.test_chunked import _copy, _truncate, cora_dir  # noqa: F401


def test_build_from_bad_chunks_fails_on_every_rank_and_writes_nothing(tmp_path, cora_dir):
    d = _copy(cora_dir, tmp_path / "bad")
    _truncate(d / "labels-00002.npy")
    out = tmp_path / "shards"
    r = run_mpi(["-m", "granndis_hpc.preprocess", "build", "--source", "chunked", "--path", d, "--servers", "2",
                 "--gpus-per-server", "1", "--layers", "1", "--partitioner", "metis", "--out", out], n=2, timeout=120)
    assert r.returncode != 0
    # Said once, by rank 0, for both ranks: every rank stops, one prints.
    assert "preprocess build: error (rank 0):" in r.stderr and "error (rank 1)" not in r.stderr, r.stderr
    assert "labels-00002.npy: cannot read" in r.stderr, r.stderr
    assert not out.exists()

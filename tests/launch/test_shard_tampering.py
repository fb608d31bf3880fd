"""The tests of tests/unit/test_shard_tampering.py that start their own mpirun (run one at a time by `make test`)."""
import pytest

from tests.unit.test_shard_tampering import _set, _train_rows, read_metrics_lines, shard_set, tamper  # noqa: F401


@pytest.mark.timeout(300)
def test_training_refuses_a_narrow_feature_file_on_every_rank(shard_set, tmp_path, mode="flx"):
    """Features cut in one server file (checksums recomputed): unchecked, they crashed fb with
    `malloc_consolidate(): invalid chunk size` and hung flx."""
    import re

    from tests.conftest import run_mpi

    bad = tamper(shard_set, tmp_path / "bad", 1, "features", lambda a: a[:, :3])
    res = run_mpi(["-m", "granndis_hpc.cli", "train", "--shards", bad, "--ranks-per-server", "2", "--mode", mode,
                   "--layers", "2", "--epochs", "1"], timeout=120)
    assert res.returncode != 0
    assert "Traceback" not in res.stderr and "malloc" not in res.stderr, res.stderr[-3000:]
    assert re.search(r"server-0001\.h5: dataset 'features' has shape \[\d+, 3\], expected \[\d+, 7\]", res.stderr), \
        res.stderr[-3000:]


@pytest.mark.timeout(600)
def test_training_with_verify_content_refuses_the_tampered_set_on_resume(shard_set, tmp_path):
    """At training: the tampered set above (one training label changed, the file's sha256 recomputed,
    content_sha256 left as built) would be accepted by `--resume` as the same dataset.  With
    --verify-content the job's ranks recompute the digest from the rows they read and refuse it, on
    every rank, before any epoch (tests/mpi/test_verify_content.py checks the digest itself)."""
    from tests.conftest import run_mpi

    run = tmp_path / "run"
    common = ["-m", "granndis_hpc.cli", "train", "--ranks-per-server", "2", "--mode", "flx", "--layers", "2",
              "--quiet", "--verify-content"]
    res = run_mpi([*common, "--shards", shard_set, "--epochs", "1", "--out", run], timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]  # the set as built passes
    row = int(_train_rows(shard_set, 1)[0])
    bad = tamper(shard_set, tmp_path / "label", 1, "labels", lambda a: _set(a, row, (a[row] + 1) % 5))
    res = run_mpi([*common, "--resume", run, "--shards", bad, "--epochs", "2"], timeout=240)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "--verify-content: manifest.json dataset.content_sha256 is" in res.stderr, res.stderr[-3000:]
    assert f"preprocess verify {bad}" in res.stderr, res.stderr[-3000:]
    assert len(read_metrics_lines(run)) == 1  # nothing trained on the tampered set

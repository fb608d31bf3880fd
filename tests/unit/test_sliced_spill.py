"""slices.spilled: the partition phase holds a slice's features, labels and edges in a
temporary file instead of memory; after the block they are back, the same bytes, and a rank that
cannot write its file gets a clear error with nothing left behind."""
import glob
import os

import numpy as np
import pytest

from granndis_hpc.preprocess.build.sliced import GraphSlice
from granndis_hpc.preprocess.build.slices import spilled


def _slice():
    rng = np.random.default_rng(0)
    n, e = 50, 300
    indptr = np.zeros(n + 1, dtype=np.int64)
    indptr[1:] = np.cumsum(rng.multinomial(e, np.full(n, 1 / n)))
    return GraphSlice(name="t", num_vertices=n, num_edges=e, num_classes=3, vtxdist=np.array([0, n]), lo=0,
                      hi=n, edge_offset=0, indptr=indptr, indices=rng.integers(0, n, e),
                      features=rng.standard_normal((n, 7)).astype(np.float32)[:, ::-1],  # not contiguous
                      labels=rng.integers(0, 3, n), train_mask=rng.random(n) < 0.5,
                      val_mask=np.zeros(n, bool), test_mask=np.zeros(n, bool))


def test_spilled_round_trip_and_cleanup(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read $TMPDIR
    part = _slice()
    want = {f: getattr(part, f).copy() for f in ("features", "labels", "indices")}
    with spilled(None, part, ("features", "labels", "indices")):
        assert part.features is None and part.labels is None and part.indices is None
        assert part.indptr is not None and part.train_mask is not None  # the others stay
        files = glob.glob(str(tmp_path / "granndis-spill-*" / "*.npy"))
        assert sorted(os.path.basename(f) for f in files) == ["features.npy", "indices.npy", "labels.npy"]
    for f, a in want.items():
        got = getattr(part, f)
        assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)
    assert part.features.flags.c_contiguous
    assert not os.listdir(tmp_path)  # the temporary directory is gone


def test_spilled_restores_after_an_error_in_the_block(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    part = _slice()
    want = part.indices.copy()
    with pytest.raises(ValueError, match="boom"):
        with spilled(None, part, ("indices",)):
            raise ValueError("boom")
    assert np.array_equal(part.indices, want)
    assert not os.listdir(tmp_path)


def test_spilled_unwritable_tmpdir_is_a_clear_error(tmp_path, monkeypatch):
    missing = tmp_path / "no-such-dir"
    monkeypatch.setenv("TMPDIR", str(missing))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    part = _slice()
    # tempfile falls back to other directories when $TMPDIR is unusable; force the failure instead.
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **k: (_ for _ in ()).throw(
        FileNotFoundError(2, "No such file or directory", str(missing))))
    with pytest.raises(FileNotFoundError, match="no-such-dir"):
        with spilled(None, part, ("features",)):
            pass
    assert part.features is not None  # nothing was taken away

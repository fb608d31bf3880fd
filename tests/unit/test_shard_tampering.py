"""Shard contents a hostile or unlucky user can hand the engine: a server
file rewritten with its checksum recomputed (what anyone who can write the file can do).  Each must be
refused at load with the file, the HDF5 dataset and the fix, never reach a kernel, an exchange or the
loss (before: heap corruption in the exchange, hangs, IndexError/PlanError tracebacks, or training that
exits 0 with another test accuracy)."""
import json
import os
import shutil

import h5py
import numpy as np
import pytest

from granndis_hpc import shards
from granndis_hpc.shards.manifest import sha256_file
from tests.unit.test_shards import build, make_graph


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("tamper") / "set"
    # 2 servers x 2 GPUs, 2 layers, full preload; locality blocks of 16 rows, so verify's content pass
    # reads runs of several blocks per (GPU, hop)
    build(make_graph(), out, row_block_rows=16)
    return out


def tamper(src, dst, server, dataset, edit):
    """Copy the set, replace one dataset of one server file with edit(old array), and record the file's
    new sha256 and size in the manifest (its field digests do not cover "files")."""
    shutil.copytree(src, dst)
    name = shards.server_file_name(server)
    with h5py.File(dst / name, "r+") as f:
        new = edit(f[dataset][()])
        del f[dataset]
        f.create_dataset(dataset, data=new)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": sha256_file(str(dst / name)), "bytes": os.path.getsize(dst / name)}
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def _set(a, idx, value):
    a = a.copy()
    a[idx] = value
    return a


def _train_rows(path, server):
    with h5py.File(os.path.join(path, shards.server_file_name(server)), "r") as f:
        return np.flatnonzero(f["split/train"][()])


CASES = {
    # width and dtype (an MPI row sized from local data corrupted the heap or hung)
    "features cut to 3 columns": ("features", lambda a: a[:, :3], "has shape"),
    "features as float64": ("features", lambda a: a.astype(np.float64), "dtype float64"),
    "indices as int32": ("graph/indices", lambda a: a.astype(np.int32), "dtype int32"),
    # bounds and invariants the indexing relies on
    "an index 10**9": ("graph/indices", lambda a: _set(a, 5, 10**9), "outside [0,"),
    "an index -1": ("graph/indices", lambda a: _set(a, 5, -1), "outside [0,"),
    "indptr decreasing": ("graph/indptr", lambda a: _set(a, 3, a[3] + 10**6), "CSR pointer"),
    "world sources out of range": ("world/src_global_id", lambda a: _set(a, 0, 10**9), "outside [0,"),
    "src_rank out of range": ("world/src_rank", lambda a: _set(a, 0, 7), "outside [0, 4)"),
    "offsets beyond the file": ("vertices/offsets", lambda a: _set(a, 1, 10**6), "not a partition"),
    "labels -100 (cross-entropy's ignore_index)": ("labels", lambda a: np.full_like(a, -100), "labels"),
    "labels 100": ("labels", lambda a: np.full_like(a, 100), "outside [0, 5)"),
    "test flags copied from train": ("split/test", None, "more than one of train, val and test"),
    # non-finite features
    "NaN features": ("features", lambda a: _set(a, (slice(None), 0), np.nan), "NaN or infinite"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_tampered_server_file_is_refused_at_load(shard_set, tmp_path, case):
    dataset, edit, needle = CASES[case]
    if edit is None:  # copy the train flags over the test flags
        with h5py.File(shard_set / shards.server_file_name(1), "r") as f:
            train = f["split/train"][()]
        edit = lambda a: train  # noqa: E731
    bad = tamper(shard_set, tmp_path / "bad", 1, dataset, edit)
    manifest = shards.read_manifest(bad)
    shards.verify_checksums(bad, manifest)  # the checksums agree: only the contents can tell
    errors = []
    for gpu in range(2):
        try:
            shards.read_rank_slice(bad, manifest, 1, gpu)
        except shards.ShardError as exc:
            errors.append(str(exc))
    assert errors, f"{case}: no rank refused the file"
    for message in errors:
        assert "server-0001.h5" in message and repr(dataset) in message or dataset.startswith("split"), message
        assert needle in message and "preprocess verify" in message and "--overwrite" in message, message
    # The other server's slices are untouched and still load.
    shards.read_rank_slice(bad, manifest, 0, 0)


def test_read_server_graph_and_rows_check_the_file(shard_set, tmp_path):
    bad = tamper(shard_set, tmp_path / "bad", 0, "graph/indices", lambda a: _set(a, 0, 10**9))
    manifest = shards.read_manifest(bad)
    with pytest.raises(shards.ShardError, match=r"graph/indices.*outside"):
        shards.read_server_graph(bad, manifest, 0)
    wide = tamper(shard_set, tmp_path / "wide", 0, "features", lambda a: np.hstack([a, a]))
    with pytest.raises(shards.ShardError, match=r"'features' has shape \[\d+, 14\], expected \[\d+, 7\]"):
        shards.read_server_rows(wide, shards.read_manifest(wide), 0, [0, 1])
    with pytest.raises(shards.ShardError, match=r"'features' has shape \[\d+, 14\], expected \[\d+, 7\]"):
        shards.read_server_features(wide, shards.read_manifest(wide), 0)
    nan = tamper(shard_set, tmp_path / "nan", 0, "features", lambda a: _set(a, (slice(None), 0), np.nan))
    for read in (lambda m: shards.read_server_graph(nan, m, 0, features=True),
                 lambda m: shards.read_server_features(nan, m, 0)):
        with pytest.raises(shards.ShardError, match=r"server-0000.h5.*features.*NaN or infinite values in \d+ of"):
            read(shards.read_manifest(nan))


def test_verify_reports_non_finite_features(shard_set, tmp_path):
    from granndis_hpc.preprocess.verify.command import verify_shard_set

    assert verify_shard_set(shard_set) == []
    bad = tamper(shard_set, tmp_path / "nan", 1, "features", lambda a: _set(a, (slice(None), 0), np.inf))
    problems = verify_shard_set(bad)
    assert any("server-0001.h5" in p and "not finite" in p for p in problems), problems


def test_verify_reads_features_in_blocks_and_counts_every_non_finite_row(shard_set, tmp_path, monkeypatch):
    """verify never holds a server's features whole: the finite check reads blocks of rows (here 3 rows
    a block), and still counts every bad row and names the first, in whichever block they fall."""
    import granndis_hpc.preprocess.verify.command as verify

    monkeypatch.setattr(verify, "FEATURE_BLOCK_BYTES", 3 * 7 * 4)  # 7 features of float32
    m = shards.read_manifest(shard_set)
    gid = shards.read_server_arrays(shard_set, m, 0, names=["vertices/global_id"])["vertices/global_id"]
    rows = np.array([4, 5, len(gid) - 1])  # two in one block, one in the last (possibly partial) block

    def poison(a):
        a = a.copy()
        a[rows[:2], 1] = np.nan
        a[rows[2], 6] = -np.inf
        return a

    bad = tamper(shard_set, tmp_path / "blocks", 0, "features", poison)
    with shards.open_server(str(bad), m, 0) as f:
        assert verify._nonfinite_rows(f["features"]) == (3, 4)
    problems = verify.verify_shard_set(bad)
    assert any("server-0000.h5" in p and "in 3 rows" in p and f"global id {int(gid[4])}" in p
               for p in problems), problems
    header = shards.read_server_arrays(bad, m, 0, names=["features"], headers=("features",))["features"]
    assert header.shape == (len(gid), 7) and header.dtype == np.float32 and header.ndim == 2


def test_peers_agree_on_the_row_width_before_exchanging():
    """views.build_view's agreement: a peer whose rows have another width or dtype, or that failed to
    plan, makes every peer raise PlanError before any exchange is sized (an all-to-all emulated here)."""
    from granndis_hpc.engine.views import agree_with_peers, row_signature
    from granndis_hpc.graph.planner import PlanError

    x = np.zeros((4, 7), dtype=np.float32)
    ok = row_signature(x)
    agree_with_peers(lambda sent: [ok, ok, ok], 3, ok, None, x)  # everyone alike: no error
    assert row_signature(x[:, :3]) != ok and row_signature(x.astype(np.float64)) != ok
    with pytest.raises(PlanError, match=r"peer\(s\) \[2\] of the view hold rows of another width"):
        agree_with_peers(lambda sent: [ok, ok, row_signature(x[:, :3])], 3, ok, None, x)
    with pytest.raises(PlanError, match=r"peer\(s\) \[1\] of this view could not plan"):
        agree_with_peers(lambda sent: [ok, -1, ok], 3, ok, None, x)
    sent = []
    with pytest.raises(PlanError, match="mine"):
        agree_with_peers(lambda s: sent.extend(s) or [ok] * 3, 3, ok, PlanError("mine"), x)
    assert sent == [-1, -1, -1]  # a rank that failed tells its peers before raising


@pytest.mark.parametrize("block_bytes", [None, 4096])
def test_verify_recomputes_the_content_digest(shard_set, tmp_path, monkeypatch, block_bytes):
    """One training label changed (in range, file checksum recomputed, content_sha256 left as built)
    would pass a checksum-only `verify` and --resume's "the same dataset".  block_bytes=4096: the
    streamed content pass (preprocess/verify/content.py) in blocks of a few dozen vertices, whose
    digest must still equal the build's (and dataset_digest of the graph, checked here directly)."""
    from granndis_hpc.preprocess.verify import content as verify_content
    from granndis_hpc.preprocess.build.pipeline import dataset_digest
    from granndis_hpc.preprocess.verify.command import verify_shard_set

    if block_bytes is not None:
        monkeypatch.setattr(verify_content, "BLOCK_BYTES", block_bytes)
    manifest = json.loads((shard_set / "manifest.json").read_text())
    assert manifest["dataset"]["content_sha256"] == dataset_digest(make_graph())

    assert verify_shard_set(shard_set) == []  # the recomputed digest equals the build's
    row = int(_train_rows(shard_set, 1)[0])
    bad = tamper(shard_set, tmp_path / "label", 1, "labels", lambda a: _set(a, row, (a[row] + 1) % 5))
    problems = verify_shard_set(bad)
    assert any("content_sha256" in p and "edited after the build" in p for p in problems), problems
    with h5py.File(shard_set / shards.server_file_name(0), "r") as f:
        preloaded = int(np.flatnonzero(f["vertices/hop"][()] > 0)[0])
    bad = tamper(shard_set, tmp_path / "copy", 0, "features", lambda a: _set(a, preloaded, a[preloaded] + 1))
    problems = verify_shard_set(bad)
    assert len(problems) == 1 and "preloaded rows' features differ" in problems[0], problems


def read_metrics_lines(run):
    return [line for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_a_read_only_output_is_named_as_such(tmp_path, monkeypatch):
    """`build --overwrite` onto a read-only set names the read-only file system, not "not enough free
    space ... (No space left on device" with 15.0 of 15.0 MiB free."""
    import collections

    from granndis_hpc.shards import writer

    Stat = collections.namedtuple("Stat", "f_flag")
    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda p: Stat(os.ST_RDONLY) if str(p) == str(tmp_path) else real(p))
    with pytest.raises(shards.ShardError, match="read-only file system") as info:
        writer.check_free_space(str(tmp_path), 10, "the set")
    assert "No space left" not in str(info.value)
    monkeypatch.setattr(os, "statvfs", real)
    monkeypatch.setattr(os, "access", lambda p, mode: False)
    with pytest.raises(shards.ShardError, match=r"not writable by this user \(Permission denied\)"):
        writer.check_free_space(str(tmp_path), 10, "the set")

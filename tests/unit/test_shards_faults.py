"""Faults in the shard layer and the build: a full disk, an edited or malformed manifest,
a set killed mid-commit, leftover temporaries, file modes under the umask, and read_server_rows."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from granndis_hpc import shards
from granndis_hpc.shards import writer as shard_writer
from granndis_hpc.preprocess.__main__ import main
from granndis_hpc.preprocess.verify.command import verify_shard_set
from tests.conftest import REPO, mounted_tmpfs
from tests.unit.test_shards import build, make_graph

SYNTHETIC = ["--source", "synthetic", "--vertices", "6000", "--seed", "0", "--servers", "2", "--gpus-per-server", "2",
             "--layers", "2", "--partitioner", "random"]


def _snapshot(out):
    return {name: (out / name).read_bytes() for name in sorted(os.listdir(out))}


@pytest.fixture
def tiny_fs(tmp_path):
    """A 2 MiB tmpfs (needs root, as CI and this machine run); unmounted afterwards."""
    with mounted_tmpfs(tmp_path / "tiny", "2m") as mnt:
        yield mnt


def _build_cli(out, *extra, prelude=""):
    code = prelude + "import sys; from granndis_hpc.preprocess.__main__ import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "build", *SYNTHETIC, "--out", str(out), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_full_disk_is_a_clear_error_with_exit_1_and_the_old_set_kept(tiny_fs):
    out = tiny_fs / "set"
    small = _build_cli(out, prelude="")  # 6000 vertices x 100 features does not fit in 2 MiB
    assert small.returncode == 1, small.stderr[-2000:]
    assert "not enough free space" in small.stderr and "No space left" in small.stderr
    assert "Traceback" not in small.stderr
    assert os.listdir(tiny_fs) == []  # a refused build leaves nothing it created, its --out included
    # An old (small) set survives a failed --overwrite, and no temporaries are left behind.
    old = subprocess.run([sys.executable, "-m", "granndis_hpc.preprocess", "build", "--source", "synthetic",
                          "--vertices", "200",
                          "--seed", "0", "--servers", "1", "--gpus-per-server", "1", "--layers", "1",
                          "--partitioner", "random", "--out", str(out), "--overwrite"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert old.returncode == 0, old.stderr
    before = _snapshot(out)
    again = _build_cli(out, "--overwrite")
    assert again.returncode == 1 and "not enough free space" in again.stderr
    assert _snapshot(out) == before and verify_shard_set(out) == []


def test_a_disk_that_fills_during_the_write_exits_1_not_a_segfault(tiny_fs):
    # Defeat the free-space check, as another process filling the disk after it would: HDF5 itself
    # then meets ENOSPC (it crashed with exit 139 in H5Idec_ref when the chunk cache held the data).
    prelude = ("import granndis_hpc.shards.writer as w; import granndis_hpc.preprocess.build.pipeline as b; "
               "w.check_free_space = b.check_free_space = lambda *a, **k: None; ")
    res = _build_cli(tiny_fs / "set", prelude=prelude)
    assert res.returncode == 1, (res.returncode, res.stderr[-3000:])
    assert "No space left on device" in res.stderr and "preprocess build: error" in res.stderr
    assert not [e for e in os.listdir(tiny_fs / "set") if e.endswith(".tmp")]


def test_a_disk_filled_before_the_reservation_is_one_line_naming_the_file(tiny_fs, monkeypatch, capsys):
    """HDF5 writes a file's first bytes when it creates it: a disk filled after the free-space check (by
    another writer) failed there, before the space reservation, with HDF5's own multi-line text."""
    def filled_after_the_check(directory, needed, what):
        if what.startswith("server-"):
            fd = os.open(tiny_fs / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            try:
                while os.write(fd, b"\0" * 65536):
                    pass
            except OSError:
                pass
            finally:
                os.close(fd)
    monkeypatch.setattr(shard_writer, "check_free_space", filled_after_the_check)
    small = ["--source", "synthetic", "--vertices", "200", "--seed", "0", "--servers", "1", "--gpus-per-server", "1",
             "--layers", "1", "--partitioner", "random"]
    assert main(["build", *small, "--out", str(tiny_fs / "set")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"not enough free space in '{tiny_fs / 'set'}': server-0000.h5 needs about" in err, err
    assert "MiB but 0.0 MiB are free (No space left on device)" in err, err
    assert os.listdir(tiny_fs / "set") == []  # the staged file is removed


def test_free_space_is_checked_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(shard_writer.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 1000))
    with pytest.raises(shards.ShardError, match=r"the shard set \(at least\) needs about .* MiB but 0.0 MiB are free"):
        build(make_graph(), tmp_path / "set")
    assert os.listdir(tmp_path) == []  # the output directory is created only once the space is there


@pytest.mark.parametrize("field,value", [
    ("num_features", 8), ("num_classes", 9), ("num_vertices", 100), ("num_train", 3),
])
def test_an_edited_dataset_count_is_refused_naming_the_field(tmp_path, field, value):
    out = tmp_path / "set"
    build(make_graph(), out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["dataset"][field] = value
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(shards.ShardError, match=rf"field dataset\.{field} was changed"):
        shards.read_manifest(out)
    problems = verify_shard_set(out)
    assert len(problems) == 1 and f"dataset.{field}" in problems[0]


def test_removing_the_digests_is_refused(tmp_path):
    out = tmp_path / "set"
    build(make_graph(), out)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["digests"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(shards.ShardError, match="no field digests"):
        shards.read_manifest(out)


@pytest.mark.parametrize("edit,expect", [
    (lambda m: m.update(servers=None), "servers must be a positive integer, got null"),
    (lambda m: m["files"]["server-0000.h5"].pop("bytes"), "lacks an integer 'bytes'"),
    (lambda m: m.update(files=[]), "files must be an object"),
    (lambda m: m["dataset"].update(num_classes="7"), "dataset.num_classes must be a non-negative integer"),
])
def test_malformed_manifest_is_a_problem_line_not_a_traceback(tmp_path, capsys, edit, expect):
    out = tmp_path / "set"
    build(make_graph(), out)
    manifest = json.loads((out / "manifest.json").read_text())
    edit(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(shards.ShardError, match=expect):
        shards.read_manifest(out)  # what training reads first: a clear error, not a TypeError
    capsys.readouterr()
    assert main(["verify", str(out)]) == 1
    text = capsys.readouterr().out
    assert "PROBLEM" in text and expect in text


def test_a_set_killed_mid_commit_can_be_overwritten_and_leftovers_are_reported_and_cleaned(tmp_path):
    g = make_graph()
    out = tmp_path / "set"
    build(g, out)
    os.unlink(out / "manifest.json")  # killed after renaming the server files, before the manifest
    leftover = out / ".server-0001.h5.abc123.tmp"
    leftover.write_bytes(b"\0" * 4096)
    (out / ".manifest.json.xyz.tmp").write_text("{")
    problems = verify_shard_set(out)
    assert any("--overwrite" in p for p in problems)
    assert any("2 temporary file(s) of an interrupted build" in p and ".server-0001.h5.abc123.tmp" in p
               for p in problems)
    m = build(g, out, overwrite=True)  # the advice verify gave works
    assert sorted(os.listdir(out)) == ["manifest.json", "server-0000.h5", "server-0001.h5"]
    assert verify_shard_set(out) == [] and m["servers"] == 2
    (out / "notes.txt").write_text("mine")  # anything this tool does not write still blocks --overwrite
    with pytest.raises(shards.ShardError, match="notes.txt"):
        build(g, out, overwrite=True)


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_files_respect_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        build(make_graph(), tmp_path / "set")
    finally:
        os.umask(old)
    for name in os.listdir(tmp_path / "set"):
        assert os.stat(tmp_path / "set" / name).st_mode & 0o777 == mode, name


def test_read_server_rows_returns_rows_in_the_callers_order(tmp_path):
    g = make_graph()
    m = build(g, tmp_path / "set")
    gid = shards.read_server_arrays(tmp_path / "set", m, 1)["vertices/global_id"]
    ids = np.random.default_rng(0).permutation(gid.shape[0])[:50]
    np.testing.assert_array_equal(shards.read_server_rows(tmp_path / "set", m, 1, ids), g.features[gid[ids]])
    assert shards.read_server_rows(tmp_path / "set", m, 1, []).shape == (0, g.num_features)
    with pytest.raises(shards.ShardError, match="unique"):
        shards.read_server_rows(tmp_path / "set", m, 1, [3, 3])
    with pytest.raises(shards.ShardError, match="row ids must lie in"):
        shards.read_server_rows(tmp_path / "set", m, 1, [gid.shape[0]])

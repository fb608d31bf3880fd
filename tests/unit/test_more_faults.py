"""More ordinary faults answered with a traceback or a misleading message."""
import json
import os
import shutil

import pytest

from granndis_hpc import shards
from granndis_hpc.options.train import TrainConfig
from granndis_hpc.options import ConfigError, load_config_file
from granndis_hpc.shards.manifest import manifest_digests


@pytest.mark.parametrize("content", [bytes(range(256)), b"lr = 0.01 # caf\xe9\n", b"x = " + b"[" * 100000])
def test_a_toml_file_of_bytes_or_deep_nesting_is_a_config_error(tmp_path, content):
    path = tmp_path / "c.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=r"c.toml' is not valid TOML"):
        load_config_file(str(path), TrainConfig)


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory):
    from tests.unit.test_shards import build, make_graph

    out = tmp_path_factory.mktemp("faults") / "set"
    build(make_graph(), out)
    return out


def _edited(src, dst, edit):
    """A copy whose manifest is edited with its field digests recomputed (a deliberate edit)."""
    shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    edit(m)
    m["digests"] = manifest_digests(m)
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def test_info_on_a_null_partitioner_is_one_line(shard_set, tmp_path, capsys):
    from granndis_hpc.preprocess.__main__ import main

    bad = _edited(shard_set, tmp_path / "null", lambda m: m.update(partitioner=None, stats="x"))
    assert main(["info", str(bad)]) == 0  # what it can show, without an AttributeError
    bad = _edited(shard_set, tmp_path / "pre", lambda m: m.update(seed={"a": 1}, files={**m["files"], "x": 1}))
    rc = main(["info", str(bad)])
    err = capsys.readouterr().err
    assert "Traceback" not in err and (rc == 0 or "preprocess info: error" in err)


def test_an_absurd_class_count_is_refused_by_verify(shard_set, tmp_path):
    from granndis_hpc.preprocess.verify.command import verify_shard_set

    bad = _edited(shard_set, tmp_path / "classes", lambda m: m["dataset"].update(num_classes=2 ** 40))
    assert any("num_classes 1099511627776 exceeds the 523 vertices" in p for p in verify_shard_set(bad))


def test_a_permission_denied_set_says_so(shard_set, monkeypatch):
    """As a user without read access (root reads anything, so os.access is answered here): it said
    "has no manifest.json ... rebuild it with --overwrite"."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if os.fspath(p) == str(shard_set) else real(p, mode))
    with pytest.raises(shards.ShardError, match=r"cannot be read by this user \(Permission denied\)") as info:
        shards.read_manifest(shard_set)
    assert "--overwrite" not in str(info.value)


def _bundle(path, classes=None, train=True, n=60):
    import numpy as np

    rng = np.random.default_rng(0)
    src = rng.integers(0, n, 4 * n)
    dst = (src + rng.integers(1, n, 4 * n)) % n
    split = np.arange(n) % 3
    arrays = {"edge_index": np.stack([src, dst]), "features": rng.standard_normal((n, 4)).astype(np.float32),
              "labels": rng.integers(0, 3, n), "train_mask": (split == 0) & train, "val_mask": split == 1,
              "test_mask": split == 2}
    if classes is not None:
        arrays["num_classes"] = np.array([classes])
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("build", ["whole graph", "distributed", "hops auto"])
@pytest.mark.parametrize("case,message", [
    ({"classes": 2 ** 40}, "num_classes=1099511627776 exceeds the 60 vertices"),
    ({"train": False}, "the train split is empty"),
])
def test_the_build_refuses_an_absurd_class_count_and_an_empty_train_split(tmp_path, capsys, build, case, message):
    """Both are refused by `preprocess build` itself, not only by verify and training afterwards.  The whole-
    graph build reads a bundle; the distributed one (preprocess/build/distributed.py) the chunked format made
    from it.  Refused before anything is written, with the fix."""
    from granndis_hpc.preprocess.__main__ import main

    source = ["--source", "bundle", "--path", str(_bundle(tmp_path / "g.npz", **case))]
    if build == "distributed":
        assert main(["chunk", *source, "--chunks", "2", "--out", str(tmp_path / "chunks")]) == 0
        source = ["--source", "chunked", "--path", str(tmp_path / "chunks")]
    if build == "hops auto":  # the memory model must not size the output layer first ("needs 3.1e+03 TiB")
        source += ["--hops", "auto", "--memory-per-gpu", "1GiB"]
    out = tmp_path / "set"
    rc = main(["build", *source, "--servers", "2", "--gpus-per-server", "1", "--layers", "2", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1 and message in err and "Fix:" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_info_into_a_closed_pipe_ends_quietly(shard_set):
    """`granndis preprocess info SET | head -1`: the reader has closed the pipe; no BrokenPipe traceback,
    the status a shell gives a tool stopped by a closed pipe."""
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe fails: the reader is gone
    try:
        proc = subprocess.run([sys.executable, "-m", "granndis_hpc.cli", "preprocess", "info", str(shard_set)],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode == 141

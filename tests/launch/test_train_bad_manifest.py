"""Training refuses an edited or malformed manifest.json on every rank with a message naming the field
(it crashed with raw torch errors, or a TypeError for "servers": null, or silently used the edit)."""
import json
import re
import shutil

import pytest

from tests.conftest import run_mpi
from tests.unit.test_shards import build, make_graph


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("set") / "set"
    build(make_graph(), out)  # 2 servers x 2 GPUs, 2 layers, full preload
    return out


def _train_with(shard_set, tmp_path, edit):
    bad = tmp_path / "edited"
    shutil.copytree(shard_set, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    edit(manifest)
    (bad / "manifest.json").write_text(json.dumps(manifest))
    return run_mpi(["-m", "granndis_hpc.cli", "train", "--shards", bad, "--ranks-per-server", "2", "--mode", "flx",
                    "--layers", "2", "--epochs", "1", "--out", tmp_path / "run"], timeout=180)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("edit,needle", [
    (lambda m: m["dataset"].update(num_features=3), "field dataset.num_features was changed"),
    (lambda m: m.update(servers=None), "servers must be a positive integer, got null"),
])
def test_training_refuses_the_manifest_on_every_rank(shard_set, tmp_path, edit, needle):
    res = _train_with(shard_set, tmp_path, edit)
    assert res.returncode != 0, res.stdout + res.stderr
    ranks = {int(r) for r in re.findall(r"^\[rank (\d+)\] .*" + re.escape(needle), res.stderr, re.M)}
    assert ranks == {0}, res.stderr[-3000:]  # said once, by rank 0
    assert "ranks 0,1,2,3: " in res.stderr
    assert "TypeError" not in res.stderr and "Traceback" not in res.stderr

"""`granndis predict` on one rank: a killed job leaves nothing that looks complete; the model's dataset and
shape are checked; model files are found in a run directory, a best-model.pt or a checkpoint.

The model is a best-model.pt written here (random parameters of a 2-layer sage for a toy graph); the
exactness of the distributed forward is tests/mpi/test_predict.py's."""
import hashlib
import json
import os
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

from granndis_hpc import cli, shards
from granndis_hpc.cluster.errors import ClusterError
from granndis_hpc.rundir.checkpoint_files import FORMAT_VERSION
from granndis_hpc.engine.model_source import ModelSourceError, model_provenance, read_model_source
from granndis_hpc.engine.predict_io import read_output
from granndis_hpc.nn.models import build_model
from tests.conftest import REPO, mpi_env
from tests.dense_reference import dense_logits
from tests.unit.test_shards import build, make_graph

ARCH = {"model": "sage", "hidden": 8, "layers": 2, "norm": False, "dropout": 0.0, "input_dropout": 0.0,
        "model_option": None}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    base = tmp_path_factory.mktemp("predict")
    graph = make_graph(n=200, m=800)
    build(graph, base / "shards", servers=1, gpus_per_server=1)
    manifest = shards.read_manifest(str(base / "shards"))
    torch.manual_seed(1)
    model = build_model("sage", 7, 8, 5, 2, dropout=0.0, norm=False)
    run = base / "run"
    run.mkdir()
    obj = {"epoch": 4, "train_acc": 0.0, "val_acc": 0.0, "test_acc": 0.0, "model": model.state_dict(),
           "provenance": model_provenance(dict(ARCH, shards=str(base / "shards")), manifest)}
    torch.save(obj, run / "best-model.pt")
    return base, graph, model


def predict(base, *extra):
    return cli.run_predict(["--model", str(base / "run"), "--shards", str(base / "shards"),
                            "--ranks-per-server", "1", "--quiet", *map(str, extra)])


def test_one_rank_predict_matches_dense_forward(toy):
    base, graph, model = toy
    predict(base, "--out", base / "p.h5", "--layer", "0")
    got, prov = read_output(str(base / "p.h5"))
    want = dense_logits("sage", model, graph.indptr, graph.indices, torch.from_numpy(graph.features)).detach()
    np.testing.assert_allclose(got["logits"], want.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(got["embeddings"], graph.features)  # layer 0 reads the input features
    assert prov["model"]["epoch"] == 4 and prov["dataset_sha256"] == prov["model"]["dataset_sha256"]
    with h5py.File(base / "p.h5") as f:
        assert f.attrs["complete"] and f["logits"].chunks is not None


def test_killed_predict_leaves_nothing_that_looks_complete(toy):
    """SIGKILL in the middle of writing (after the first rows, before the rename): no --out appears, and
    the partial file left beside it is hidden and says it is not complete."""
    base, _, _ = toy
    out = base / "killed.h5"
    script = (
        "import os, signal, sys\n"
        "from granndis_hpc import cli\n"
        "from granndis_hpc.engine import predict_io\n"
        "write = predict_io._write_h5\n"
        "def write_then_die(*a):\n"
        "    write(*a)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "predict_io._write_h5 = write_then_die\n"
        f"cli.main(['predict', '--model', {str(base / 'run')!r}, '--shards', {str(base / 'shards')!r},\n"
        f"          '--out', {str(out)!r}, '--ranks-per-server', '1', '--quiet'])\n")
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=mpi_env(), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    assert not out.exists()
    left = [n for n in os.listdir(base) if n.startswith(".killed.h5.partial-")]
    assert len(left) == 1
    with h5py.File(base / left[0]) as f:
        assert not f.attrs["complete"] and "provenance" not in f.attrs


def test_other_dataset_and_other_model_refused(toy, tmp_path):
    base, _, _ = toy
    obj = torch.load(base / "run" / "best-model.pt", weights_only=True)
    other = tmp_path / "other"
    other.mkdir()
    torch.save(dict(obj, provenance=dict(obj["provenance"], dataset_sha256="0" * 64)), other / "best-model.pt")
    with pytest.raises(ClusterError, match="was trained on another dataset than .* the graph, features"):
        cli.run_predict(["--model", str(other), "--shards", str(base / "shards"), "--out", str(tmp_path / "a.h5"),
                         "--ranks-per-server", "1"])
    wide = dict(obj["provenance"], config=dict(obj["provenance"]["config"], hidden=16))
    torch.save(dict(obj, provenance=wide), other / "best-model.pt")
    with pytest.raises(ClusterError, match=r"do not fit the model built here.*convs.0.lin_self.weight \(8, 7\) \(here "
                                           r"\(16, 7\)\)"):
        cli.run_predict(["--model", str(other), "--shards", str(base / "shards"), "--out", str(tmp_path / "a.h5"),
                         "--ranks-per-server", "1"])
    assert os.listdir(tmp_path) == ["other"]


def test_model_sources(toy, tmp_path):
    """A best-model.pt without provenance takes the config.json beside it; a checkpoint directory its
    COMPLETE.json's fingerprint; a directory with neither is refused."""
    base, _, _ = toy
    obj = torch.load(base / "run" / "best-model.pt", weights_only=True)
    torch.save({k: v for k, v in obj.items() if k != "provenance"}, tmp_path / "best-model.pt")
    with pytest.raises(ModelSourceError, match="config.json cannot be read"):
        read_model_source(str(tmp_path / "best-model.pt"))
    (tmp_path / "config.json").write_text(json.dumps(obj["provenance"]["config"]))
    src = read_model_source(str(tmp_path))
    assert src.kind == "best-model" and src.config["hidden"] == 8
    assert src.dataset_sha256 == obj["provenance"]["dataset_sha256"]  # from the shard set config.json names
    ck = tmp_path / "checkpoints" / "epoch-000002"
    ck.mkdir(parents=True)
    torch.save({"epoch": 2, "elapsed_s": 0.0, "model": obj["model"], "optimizer": {}}, ck / "state.pt")
    data = (ck / "state.pt").read_bytes()
    entry = {"name": "state.pt", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ck / "COMPLETE.json").write_text(json.dumps({"format_version": FORMAT_VERSION, "epoch": 2, "world_size": 1,
                                                  "files": {"state.pt": entry},
                                                  "fingerprint": {"dataset": "toy", "dataset_sha256": "ab"}}))
    src = read_model_source(str(ck / "state.pt"))
    assert (src.kind, src.epoch, src.dataset_sha256, src.config["layers"]) == ("checkpoint", 2, "ab", 2)
    with pytest.raises(ModelSourceError, match="holds neither best-model.pt nor a complete checkpoint"):
        read_model_source(str(ck.parent))


def test_eval_only_needs_a_model_and_no_resume(tmp_path):
    from granndis_hpc.options.train import TrainConfig
    from granndis_hpc.options import ConfigError
    with pytest.raises(ConfigError, match="--eval-only evaluates a saved model: give it with --init-from"):
        TrainConfig(shards="x", eval_only=True)
    with pytest.raises(ConfigError, match="nothing to --resume"):
        TrainConfig(shards="x", eval_only=True, init_from="m", resume=str(tmp_path), out=str(tmp_path))


def test_a_model_with_a_linear_head_is_rebuilt_with_it():
    """A run with --linear-layers saves a model whose last layers are Linear: predict and --eval-only
    rebuild it with them (its parameters load, the message-passing depth is the aggregating layers)."""
    from granndis_hpc.engine.model_source import ModelSource
    from granndis_hpc.engine.predict import build_from_source
    from granndis_hpc.nn.models import build_model

    torch.manual_seed(1)
    trained = build_model("sage", 10, 8, 3, 4, dropout=0.0, norm=True, linear_layers=1)
    config = {"model": "sage", "hidden": 8, "layers": 4, "linear_layers": 1, "norm": True, "dropout": 0.0,
              "input_dropout": 0.0, "model_option": None}
    source = ModelSource("best-model.pt", "best-model", trained.state_dict(), config)
    rebuilt = build_from_source(source, {"dataset": {"num_features": 10, "num_classes": 3}}, "cpu")
    assert rebuilt.num_layers == 3
    for (name, a), (_, b) in zip(trained.state_dict().items(), rebuilt.state_dict().items()):
        assert torch.equal(a, b), name

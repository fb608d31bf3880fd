"""--checkpoint-initial: the run's initial parameters, before the first step, as the checkpoint of epoch 0
(one rank, a 1x1 set).  They equal a model built here with the run's seed; pruning keeps them; and
--init-from, --resume and `granndis predict` take them as any checkpoint."""
import shutil

import numpy as np
import pytest
import torch

from granndis_hpc import cli
from granndis_hpc.cluster.errors import ClusterError
from granndis_hpc.engine.predict_io import read_output
from granndis_hpc.nn.models import build_model
from granndis_hpc.rundir import checkpoint as ck
from granndis_hpc.rundir import checkpoint_files as cf
from tests.dense_reference import dense_logits
from tests.unit.test_shards import build, make_graph

pytest.importorskip("mpi4py")
SEED, HIDDEN, EPOCHS = 7, 8, 3


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    graph = make_graph(n=200, m=800, seed=5)
    out = tmp_path_factory.mktemp("initial") / "set"
    build(graph, out, servers=1, gpus_per_server=1)
    return graph, out


def _train(shards, *extra):
    return cli.run_training(["--shards", str(shards), "--ranks-per-server", "1", "--layers", "2", "--hidden",
                             str(HIDDEN), "--dropout", "0.5", "--seed", str(SEED), "--epochs", str(EPOCHS),
                             "--eval-every", "0", "--quiet", *map(str, extra)])


def _model(run_dir, epoch):
    path = cf.epoch_dir(str(run_dir), epoch)
    return ck.read_payload(path, cf.read_complete(path)["files"][cf.SHARED_FILE])["model"]


def _fresh(graph):
    torch.manual_seed(SEED)
    return build_model("sage", graph.features.shape[1], HIDDEN, int(np.max(graph.labels)) + 1, 2, dropout=0.5)


def test_the_initial_checkpoint_holds_the_seeded_model_and_every_reader_takes_it(toy, tmp_path):
    graph, shards = toy
    run = tmp_path / "run"
    _train(shards, "--out", run, "--checkpoint-initial", "--checkpoint-every", "1")
    # Epoch 0 is kept beside the newest two (1 and 2 were pruned).
    assert [(e, c) for e, _, c in cf.list_checkpoints(str(run))] == [(0, True), (EPOCHS - 1, True), (EPOCHS, True)]
    initial, final = _model(run, 0), _model(run, EPOCHS)
    fresh = _fresh(graph).state_dict()
    assert sorted(initial) == sorted(fresh)
    for name, tensor in fresh.items():
        assert torch.equal(initial[name], tensor), name  # bit for bit
    assert any(not torch.equal(initial[n], final[n]) for n in initial)  # training moved them

    # --init-from the epoch-0 checkpoint: the same start, so (one rank, CPU) the same trajectory.
    warm = tmp_path / "warm"
    _train(shards, "--out", warm, "--init-from", cf.epoch_dir(str(run), 0), "--checkpoint-every", str(EPOCHS))
    for name, tensor in _model(warm, EPOCHS).items():
        assert torch.equal(tensor, final[name]), name

    # --resume with epoch 0 the newest checkpoint: continues from it, to the same end.
    for epoch in (EPOCHS - 1, EPOCHS):
        shutil.rmtree(cf.epoch_dir(str(run), epoch))
    (run / "summary.json").unlink()
    _train(shards, "--resume", run)
    for name, tensor in _model(run, EPOCHS).items():
        assert torch.equal(tensor, final[name]), name

    # granndis predict --model RUN/checkpoints/epoch-000000: the initial model's logits.
    cli.run_predict(["--model", cf.epoch_dir(str(run), 0), "--shards", str(shards), "--ranks-per-server", "1",
                     "--out", str(tmp_path / "p.h5"), "--quiet"])
    got, prov = read_output(str(tmp_path / "p.h5"))
    model = _fresh(graph).eval()
    want = dense_logits("sage", model, graph.indptr, graph.indices, torch.from_numpy(graph.features)).detach()
    np.testing.assert_allclose(got["logits"], want.numpy(), rtol=1e-4, atol=1e-5)
    assert prov["model"]["epoch"] == 0 and prov["model"]["model_kind"] == "checkpoint"


def test_checkpoint_initial_needs_a_run_directory(toy):
    with pytest.raises(ClusterError, match="--checkpoint-initial needs a run directory"):
        _train(toy[1], "--checkpoint-initial")

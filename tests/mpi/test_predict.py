"""`granndis predict` on real Cora, inside one mpirun -n 4 job (2 servers x 2 ranks, and 4 x 1 emulated).

A model trained for 3 epochs on 2 x 2 (run directory with best-model.pt) is applied through the command
line (cli.run_predict) to the 2 x 2 shard set (a directory of .npy files, every vertex, layer-1 embeddings)
and to the 4 x 1 set of the same dataset (HDF5, the test split, probabilities).  Both equal a
single-process dense forward of best-model.pt's parameters (tests/dense_reference.py, float64) to
float32 rounding, in global-id order; an existing --out is refused on every rank and left as it was.
"""
import json
import os

import numpy as np
import pytest
import torch
from mpi4py import MPI

from granndis_hpc import cli
from granndis_hpc.cluster.errors import ClusterError
from granndis_hpc.engine.predict_io import read_output
from tests.dense_reference import dense_logits
from tests.mpi.conftest import make_trainer, on_rank0, shared_tmpdir

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD


@pytest.fixture(scope="module")
def trained(cora_shapes):
    base = shared_tmpdir("granndis-predict-")
    run = os.path.join(base, "run")
    trainer = make_trainer(cora_shapes[2], "fb", epochs=3, eval_every=1, out=run, dropout=0.5)
    try:
        trainer.run()
    finally:
        trainer.close()
    return base, run


def reference(cora, run):
    state = torch.load(os.path.join(run, "best-model.pt"), weights_only=True)["model"]
    args = (cora.indptr, cora.indices, torch.from_numpy(cora.features))
    deg = torch.from_numpy(cora.in_degree())
    logits = dense_logits("sage", state, *args, degrees=deg)
    first = {k: v for k, v in state.items() if k.startswith("convs.0.")}  # norm off: layer 1 reads relu(conv 0)
    return logits, torch.relu(dense_logits("sage", first, *args, degrees=deg))


def test_predict_equals_single_process_forward_on_two_shapes(cora, cora_shapes, trained):
    base, run = trained
    npy_dir, h5 = os.path.join(base, "all-2x2"), os.path.join(base, "test-4x1.h5")
    cli.run_predict(["--model", run, "--shards", cora_shapes[2], "--out", npy_dir, "--layer", "1",
                     "--ranks-per-server", "2", "--quiet"])
    cli.run_predict(["--model", os.path.join(run, "best-model.pt"), "--shards", cora_shapes[1], "--out", h5,
                     "--split", "test", "--probabilities", "--ranks-per-server", "1", "--quiet"])

    def check():
        want, emb = reference(cora, run)
        got, prov = read_output(npy_dir)
        assert prov["complete"] and prov["rows"] == cora.num_vertices and prov["layer"] == 1
        assert sorted(got) == ["embeddings", "global_id", "logits", "prediction"]
        np.testing.assert_array_equal(got["global_id"], np.arange(cora.num_vertices))
        np.testing.assert_allclose(got["logits"], want.numpy(), rtol=1e-4, atol=2e-5)
        np.testing.assert_allclose(got["embeddings"], emb.numpy(), rtol=1e-4, atol=2e-5)
        assert (got["prediction"] == want.argmax(1).numpy()).mean() > 0.999  # float32 ties aside
        test_ids = np.flatnonzero(cora.test_mask)
        got, prov = read_output(h5)
        assert prov["split"] == "test" and prov["servers"] == 4 and prov["model"]["epoch"] >= 1
        np.testing.assert_array_equal(got["global_id"], test_ids)
        np.testing.assert_allclose(got["probabilities"], torch.softmax(want, 1)[test_ids].numpy(), atol=1e-6)
        assert [n for n in os.listdir(base) if ".partial" in n] == []
        return os.path.getmtime(h5)

    mtime = on_rank0(check)
    with pytest.raises(ClusterError, match="already exists and holds predictions .*; give --overwrite to replace it"):
        cli.run_predict(["--model", run, "--shards", cora_shapes[1], "--out", h5, "--ranks-per-server", "1"])
    on_rank0(lambda: os.path.getmtime(h5) == mtime or pytest.fail("the existing output was touched"))
    with pytest.raises(ClusterError, match="--layer 3: the model has 3 message-passing layers"):
        cli.run_predict(["--model", run, "--shards", cora_shapes[2], "--out", os.path.join(base, "x.h5"),
                         "--layer", "3", "--ranks-per-server", "2"])


def test_eval_only_and_init_from_on_another_shape(cora, cora_shapes, trained):
    """--eval-only on 4 x 1 reports the dense forward's accuracies of best-model.pt; --init-from starts a new
    run from those parameters (on 4 x 1, mode flx) with a fresh Adam, equal to 2 dense Adam epochs from them;
    another width is refused on every rank."""
    from tests.dense_reference import assert_parameters_close, train_dense
    from granndis_hpc.nn.models import build_model

    base, run = trained
    common = ["--shards", cora_shapes[1], "--ranks-per-server", "1", "--layers", "3", "--hidden", "16",
              "--quiet", "--init-from", run]
    summary = cli.run_training(common + ["--eval-only", "--mode", "fb", "--out", os.path.join(base, "eval")])
    cli.run_training(common + ["--mode", "flx", "--epochs", "2", "--lr", "0.01", "--dropout", "0",
                               "--checkpoint-every", "2", "--out", os.path.join(base, "warm")])

    def check():
        want, _ = reference(cora, run)
        pred = want.argmax(1).numpy()
        for split, mask in (("train", cora.train_mask), ("val", cora.val_mask), ("test", cora.test_mask)):
            assert summary["accuracy"][split] == pytest.approx((pred[mask] == cora.labels[mask]).mean(), abs=1e-12)
        assert summary["epochs"] == 0 and summary["init_from"]["epoch"] >= 1
        with open(os.path.join(base, "eval", "summary.json")) as f:
            assert json.load(f)["accuracy"] == summary["accuracy"]
        model = build_model("sage", cora.features.shape[1], 16, 7, 3, dropout=0.0, norm=False)
        model.load_state_dict(torch.load(os.path.join(run, "best-model.pt"), weights_only=True)["model"])
        ref = train_dense(cora, model, epochs=2, lr=0.01)
        final = build_model("sage", cora.features.shape[1], 16, 7, 3, dropout=0.0, norm=False)
        final.load_state_dict(torch.load(os.path.join(base, "warm", "checkpoints", "epoch-000002", "state.pt"),
                                         weights_only=True)["model"])
        assert_parameters_close(final, ref)  # Adam normalises tiny gradients: float32 rounding shows at 1e-5
    on_rank0(check)
    with pytest.raises(ClusterError, match=r"--hidden 32 \(the model: 16\)"):
        cli.run_training(["--shards", cora_shapes[2], "--ranks-per-server", "2", "--layers", "3", "--hidden", "32",
                          "--mode", "fb", "--init-from", run, "--quiet"])

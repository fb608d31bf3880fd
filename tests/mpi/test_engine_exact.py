"""Exactness of the distributed engine on real Cora, 2 servers x 2 ranks (mpirun -n 4).

The reference is tests/dense_reference.py: plain dense torch on the whole graph with the same weights,
written from the formulas, not from the engine's layers.  `fb` (world view, halo every layer) and `flx`
(full preload, intra-server exchange only) must give the same logits and, after 8 epochs of training
with dropout 0, the same parameters as single-process full-graph training."""
import copy
import numpy as np
import pytest
import torch
from mpi4py import MPI

from tests.dense_reference import assert_parameters_close, dense_logits, train_dense
from tests.mpi.conftest import gather_by_global_id, make_trainer

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD


def _trainer(shards, mode, model, layers, epochs=1, lr=0.01):
    return make_trainer(shards, mode, model, layers, epochs=epochs, lr=lr)


def _reference(cora, model):
    return dense_logits(model.name, model, cora.indptr, cora.indices, torch.from_numpy(cora.features),
                        degrees=torch.from_numpy(cora.in_degree())).detach().numpy()


def _assert_close(got, want, tol):
    scale = np.abs(want).max()
    err = np.abs(got - want).max() / scale
    assert err < tol, f"max relative error {err:.3e} >= {tol}"


@pytest.mark.parametrize("model,layers", [("sage", 3), ("gcn", 3), ("ressage", 8)])
def test_logits_equal_dense_reference(cora, cora_shards, model, layers):
    for mode in ("fb", "flx"):
        trainer = _trainer(cora_shards[('full', layers)], mode, model, layers)
        try:
            trainer.model.eval()
            with torch.no_grad():
                train_view_logits = trainer.logits(trainer.train_view, "halo")
                world_logits = trainer.inner_logits()
            got_train = gather_by_global_id(trainer, train_view_logits)
            got_world = gather_by_global_id(trainer, world_logits)
            if WORLD.rank == 0:
                want = _reference(cora, trainer.model)
                _assert_close(got_train, want, 1e-4)
                _assert_close(got_world, want, 1e-4)
        finally:
            trainer.close()


@pytest.mark.parametrize("mode", ["fb", "flx"])
def test_parameters_after_training_equal_reference(cora, cora_shards, mode):
    trainer = _trainer(cora_shards[('full', 3)], mode, "sage", 3, epochs=8)
    try:
        initial = copy.deepcopy(trainer.model)
        trainer.run()
        if WORLD.rank == 0:
            ref = train_dense(cora, initial, 8, 0.01)
            assert_parameters_close(trainer.model, ref, 1e-4)
    finally:
        trainer.close()

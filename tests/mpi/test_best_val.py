"""Best-validation selection in one mpirun -n 4 job (2 servers x 2 ranks), real Cora, the GCN recipe.

* The summary's best_val is the evaluated epoch with the highest validation accuracy (ties: the
  earlier), recomputed here from metrics.jsonl; RUN_DIR/best-model.pt holds that epoch's parameters:
  evaluated again they give exactly its recorded accuracies.
* A run stopped after a checkpoint and resumed keeps the best epoch it had (record and parameters)
  and ends with the uninterrupted run's best_val and best-model.pt.
"""
import os

import pytest
import torch
from mpi4py import MPI

from granndis_hpc.metrics import read_metrics
from granndis_hpc.rundir.best_model import BEST_MODEL
from tests.mpi.conftest import make_trainer, shared_tmpdir

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
EPOCHS, STOP = 14, 7
RECIPE = dict(epochs=EPOCHS, eval_every=1, dropout=0.5, input_dropout=0.5, weight_decay=5e-4,
              weight_decay_on="first", seed=1)


@pytest.fixture(scope="module")
def base():
    return shared_tmpdir("granndis-best-")


def _load_best(run_dir):
    return torch.load(os.path.join(run_dir, BEST_MODEL), weights_only=True)


def _expected_best(records):
    """The first record with the highest val_acc (an independent recomputation of the rule)."""
    evaluated = [r for r in records if "val_acc" in r]
    top = max(r["val_acc"] for r in evaluated)
    return next(r for r in evaluated if r["val_acc"] == top)


@pytest.mark.timeout(300)
def test_best_validation_epoch_is_selected_kept_and_survives_resume(cora_shards, base):
    shards = cora_shards[("full", 3)]
    whole = os.path.join(base, "whole")
    trainer = make_trainer(shards, "fb", "gcn", 3, out=whole, **RECIPE)
    try:
        summary = trainer.run()
        best = summary["best_val"]
        records = read_metrics(whole) if WORLD.rank == 0 else None
        want = WORLD.bcast(_expected_best(records) if WORLD.rank == 0 else None)
        assert best["epoch"] == want["epoch"] and best["val"] == want["val_acc"] and best["test"] == want["test_acc"]
        assert summary["accuracy"]["test"] == want["test_acc"] or best["epoch"] != EPOCHS - 1
        # The kept parameters are that epoch's: loaded into the model they give its accuracies again.
        saved = WORLD.bcast(_load_best(whole) if WORLD.rank == 0 else None)
        assert saved["epoch"] == best["epoch"] and saved["test_acc"] == best["test"]
        trainer.model.load_state_dict(saved["model"])
        again = trainer.evaluate()
        assert (again["val"], again["test"]) == (best["val"], best["test"])
    finally:
        trainer.close()

    # Stop after STOP epochs with a checkpoint, then resume to the end.
    resumed_dir = os.path.join(base, "resumed")
    first = make_trainer(shards, "fb", "gcn", 3, out=resumed_dir, checkpoint_every=STOP,
                         **{**RECIPE, "epochs": STOP})
    try:
        first.run()
    finally:
        first.close()
    at_stop = WORLD.bcast(_load_best(resumed_dir) if WORLD.rank == 0 else None)
    second = make_trainer(shards, "fb", "gcn", 3, out=resumed_dir, resume=resumed_dir, checkpoint_every=STOP,
                          **RECIPE)
    try:
        # Restored from the checkpoint before any epoch runs: the best epoch up to STOP, parameters too.
        assert second.best_val.record["epoch"] == at_stop["epoch"] < STOP
        if WORLD.rank == 0:
            for key, value in at_stop["model"].items():
                assert torch.equal(second.best_val.state[key], value), key
        summary2 = second.run()
    finally:
        second.close()
    assert summary2["best_val"] == summary["best_val"]
    if WORLD.rank == 0:
        end = _load_best(resumed_dir)
        ref = _load_best(whole)
        assert end["epoch"] == ref["epoch"]
        for key, value in ref["model"].items():
            assert torch.allclose(end["model"][key], value, atol=1e-6, rtol=0), key

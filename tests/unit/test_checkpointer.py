"""engine/checkpointer.py on one process, built from its explicit inputs alone (no Trainer): the cadence
of --checkpoint-every, a stop request, --checkpoint-initial and an early stop, the best-validation record
a checkpoint carries, and a resume into fresh state holders that restores exactly what was saved.

The same component under mpirun (a stop on one rank, resumed runs equal to uninterrupted ones) is
tested through the Trainer in tests/mpi/test_resume.py and tests/mpi/test_best_val.py."""
import logging
import os

import numpy as np
import pytest
import torch
from mpi4py import MPI

from granndis_hpc.engine import signals
from granndis_hpc.engine.checkpointer import BestValidation, Checkpointer, CheckpointSettings
from granndis_hpc.engine.steps import TrainingError
from granndis_hpc.metric_names import split_keys
from granndis_hpc.rundir import checkpoint_files as cf
from granndis_hpc.rundir.best_model import BEST_MODEL
from granndis_hpc.rundir.directory import RunDirectory
from tests.unit.test_checkpoint import FP, SELF

KEYS = split_keys("accuracy")


class SelfComm:
    """The one collective the checkpointer calls, over a one-process job (cluster.Communicator's)."""

    def allreduce_scalar(self, values, op="sum"):
        ops = {"sum": MPI.SUM, "max": MPI.MAX}
        return np.asarray(MPI.COMM_SELF.allreduce(np.asarray(values), op=ops[op]))


def _model_and_optimizer(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _step(model, opt):
    opt.zero_grad()
    model(torch.randn(9, 4)).square().sum().backward()
    opt.step()


def _settings(**given):
    values = dict(every=2, initial=False, epochs=6, eval_only=False, verify_content=True)
    values.update(given)
    return CheckpointSettings(**values)


def _record(epoch, val):
    return {"epoch": epoch, "loss": 1.0, KEYS["train"]: 0.5, KEYS["val"]: val, KEYS["test"]: val / 2}


@pytest.fixture
def stop_flag(monkeypatch):
    monkeypatch.delenv(signals.ENV_STOP_FILE, raising=False)
    return signals.StopSignals()


def _checkpointer(tmp_path, seed, stop, resume=False, **settings):
    model, opt = _model_and_optimizer(seed)
    run_dir = RunDirectory(SELF, str(tmp_path), resume=resume, overwrite_run=False)
    run_dir.claim()
    best = BestValidation(KEYS, model, keep_parameters=True)
    ckpt = Checkpointer(_settings(**settings), run_dir, SELF, SelfComm(), model, opt, None, torch.device("cpu"),
                        FP, best, stop)
    return ckpt, model, opt, best


def test_best_validation_keeps_the_first_highest_and_its_parameters():
    model, opt = _model_and_optimizer(0)
    best = BestValidation(KEYS, model, keep_parameters=True)
    kept = {}
    for epoch, val in enumerate([0.5, 0.7, 0.7, 0.6]):
        _step(model, opt)
        if epoch == 1:
            kept = {k: v.clone() for k, v in model.state_dict().items()}
        best.observe(_record(epoch, val))
    assert best.record == {"epoch": 1, **{k: _record(1, 0.7)[k] for k in KEYS.values()}}
    assert set(best.state) == set(kept) and all(torch.equal(best.state[k], v) for k, v in kept.items())
    others = BestValidation(KEYS, model, keep_parameters=False)  # a rank other than 0: the record only
    others.observe(_record(0, 0.5))
    assert others.record["epoch"] == 0 and others.state is None


def test_cadence_best_record_and_resume_into_fresh_state(tmp_path, stop_flag):
    ckpt, model, opt, best = _checkpointer(tmp_path, 0, stop_flag)
    saved = {}
    for epoch in range(1, 5):
        _step(model, opt)
        if epoch == 3:
            best.observe(_record(epoch - 1, 0.8))
        assert ckpt.after_epoch(epoch, last=False, elapsed_s=float(epoch), metrics_errno=0) is False
        saved[epoch] = ({k: v.clone() for k, v in model.state_dict().items()}, opt.state_dict())
    # Every second epoch, the newest two kept; best-model.pt holds the best record's parameters.
    assert [e for e, _, complete in cf.list_checkpoints(str(tmp_path)) if complete] == [2, 4]
    assert ckpt.saved_epoch == 4 and ckpt.stopped_checkpoint is None
    on_disk = torch.load(os.path.join(tmp_path, BEST_MODEL), weights_only=True)
    assert on_disk["epoch"] == 2 and all(torch.equal(on_disk["model"][k], v) for k, v in best.state.items())
    ckpt.run_dir.close()

    resumed, model2, opt2, best2 = _checkpointer(tmp_path, 1, stop_flag, resume=True)
    where = resumed.resume()
    assert (where.epoch, where.elapsed_s, where.path) == (4, 4.0, cf.epoch_dir(str(tmp_path), 4))
    params, opt_state = saved[4]
    assert all(torch.equal(model2.state_dict()[k], v) for k, v in params.items())
    restored, want = opt2.state_dict()["state"], opt_state["state"]
    assert float(restored[0]["step"]) == float(want[0]["step"]) == 4.0
    assert all(torch.equal(restored[i][m], want[i][m]) for i in want for m in ("exp_avg", "exp_avg_sq"))
    assert best2.record == best.record and all(torch.equal(best2.state[k], v) for k, v in best.state.items())
    resumed.run_dir.close()


def test_a_stop_request_checkpoints_and_stops_unless_the_run_has_ended(tmp_path, stop_flag, caplog):
    ckpt, model, opt, _ = _checkpointer(tmp_path, 0, stop_flag, every=0)
    assert ckpt.stopped_during_set_up(0) is False  # no request yet
    assert ckpt.after_epoch(1, last=False, elapsed_s=1.0, metrics_errno=0) is False
    assert cf.list_checkpoints(str(tmp_path)) == []  # --checkpoint-every 0: none due
    stop_flag.request()
    assert ckpt.stopped_during_set_up(3) is True and ckpt.stopped_during_set_up(6) is False  # 6 = --epochs
    with caplog.at_level(logging.INFO):
        assert ckpt.after_epoch(2, last=False, elapsed_s=2.0, metrics_errno=0) is True
    assert ckpt.stopped_checkpoint == cf.epoch_dir(str(tmp_path), 2)
    assert f"stopped after 2 epochs with a checkpoint in {ckpt.stopped_checkpoint}; continue with --resume " \
           f"{tmp_path}" in caplog.text
    # A request during the last epoch: checkpointed, but the run has finished (no stop).
    assert ckpt.after_epoch(6, last=True, elapsed_s=6.0, metrics_errno=0) is False
    assert cf.latest_complete(str(tmp_path)).epoch == 6
    # Rank 0's failed metrics.jsonl append, agreed in the same reduction, ends the run on every rank.
    with pytest.raises(TrainingError, match=r"metrics.jsonl .*No space left on device; stopped after 3 epochs") as err:
        ckpt.after_epoch(3, last=False, elapsed_s=3.0, metrics_errno=28)
    assert err.value.collective
    ckpt.run_dir.close()


@pytest.mark.parametrize("initial,eval_only,epoch,written", [
    (True, False, 0, True), (False, False, 0, False), (True, True, 0, False), (True, False, 3, False)])
def test_the_initial_checkpoint_only_for_a_new_training_run(tmp_path, stop_flag, initial, eval_only, epoch, written):
    ckpt, _, _, _ = _checkpointer(tmp_path, 0, stop_flag, initial=initial, eval_only=eval_only)
    ckpt.save_initial(epoch)
    assert [e for e, _, _ in cf.list_checkpoints(str(tmp_path))] == ([0] if written else [])
    ckpt.run_dir.close()


def test_an_early_stop_writes_no_second_checkpoint_of_the_same_epoch(tmp_path, stop_flag):
    ckpt, _, _, _ = _checkpointer(tmp_path, 0, stop_flag, every=3)
    ckpt.after_epoch(3, last=True, elapsed_s=3.0, metrics_errno=0)
    stamp = os.stat(os.path.join(cf.epoch_dir(str(tmp_path), 3), cf.COMPLETE)).st_mtime_ns
    ckpt.save_unless_saved(3, 3.5)  # already written after epoch 3: kept as it is
    assert os.stat(os.path.join(cf.epoch_dir(str(tmp_path), 3), cf.COMPLETE)).st_mtime_ns == stamp
    ckpt.save_unless_saved(4, 4.0)
    assert [e for e, _, _ in cf.list_checkpoints(str(tmp_path))] == [3, 4]
    ckpt.run_dir.close()

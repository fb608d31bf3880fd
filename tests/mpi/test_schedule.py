"""Optimizers and schedules on real Cora, 2 servers x 2 ranks (fb), against single-process references.

* AdamW with weight decay, cosine schedule after a 3-epoch warm-up, gradient clipping by global norm and
  early stopping (--patience): the run equals a single-process dense loop written here (plain torch:
  torch.optim.AdamW, torch.nn.utils.clip_grad_norm_, the schedule's formula, early stopping on the
  dense validation accuracy): the same learning rates, the same stopping epoch, the same parameters.
  The same run stopped by a stop request after epoch 5 (past the warm-up, inside the decay) and resumed
  equals it exactly: learning rates, losses, the stopping epoch and the parameters; so does a 200-epoch
  run (with keyed dropout) stopped after epoch 100 and resumed.
* SGD with Nesterov momentum and the plateau schedule: equals the dense loop with torch's own
  ReduceLROnPlateau (patience - 1: torch decays after `patience` bad epochs have passed, this option on
  the patience-th).
"""
import math
import os
import signal

import numpy as np
import pytest
import torch
from mpi4py import MPI

from granndis_hpc.metrics import read_metrics
from tests.dense_reference import dense_logits
from tests.mpi.conftest import make_trainer, on_rank0, shared_tmpdir

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
EPOCHS = 30
COSINE = dict(optimizer="adamw", weight_decay=5e-4, lr=0.03, lr_schedule="cosine", warmup_epochs=3, min_lr=0.001,
              clip_grad_norm=0.5, patience=3, eval_every=1, epochs=EPOCHS, hidden=16, dropout=0.0, seed=2)
PLATEAU = dict(optimizer="sgd", momentum=0.9, nesterov=True, lr=0.5, lr_schedule="plateau", plateau_patience=2,
               gamma=0.5, min_lr=0.01, eval_every=1, epochs=11, hidden=16, dropout=0.0, seed=2)


def dense_run(cora, model, o):
    """The single-process loop: returns (parameters, learning rates per epoch, stopping epoch or None)."""
    import copy
    model = copy.deepcopy(model).double()
    x, y = torch.from_numpy(cora.features).double(), torch.from_numpy(cora.labels)
    train, val = (torch.from_numpy(np.flatnonzero(m)) for m in (cora.train_mask, cora.val_mask))
    deg = torch.from_numpy(cora.in_degree())
    params = list(model.parameters())
    if o["optimizer"] == "adamw":
        opt = torch.optim.AdamW(params, lr=o["lr"], weight_decay=o["weight_decay"])
    else:
        opt = torch.optim.SGD(params, lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"])
    plateau = (torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=o["gamma"],
                                                          patience=o["plateau_patience"] - 1, threshold=0.0,
                                                          threshold_mode="abs", min_lr=o["min_lr"])
               if o["lr_schedule"] == "plateau" else None)
    lrs, best, since = [], None, 0
    for e in range(o["epochs"]):
        if o["lr_schedule"] == "cosine":
            w, t = o["warmup_epochs"], o["epochs"]
            lr = o["lr"] * (e + 1) / w if e < w else \
                o["min_lr"] + (o["lr"] - o["min_lr"]) * (1 + math.cos(math.pi * (e - w) / (t - w))) / 2
            for g in opt.param_groups:
                g["lr"] = lr
        lrs.append(opt.param_groups[0]["lr"])
        opt.zero_grad()
        logits = dense_logits("sage", model, cora.indptr, cora.indices, x, degrees=deg)
        loss = torch.nn.functional.cross_entropy(logits[train], y[train], reduction="sum") / len(train)
        loss.backward()
        if o.get("clip_grad_norm"):
            torch.nn.utils.clip_grad_norm_(params, o["clip_grad_norm"])
        opt.step()
        with torch.no_grad():
            pred = dense_logits("sage", model, cora.indptr, cora.indices, x, degrees=deg).argmax(1)
        acc = float((pred[val] == y[val]).double().mean())
        if plateau is not None:
            plateau.step(acc)
        since = 0 if best is None or acc > best else since + 1
        best = acc if best is None or acc > best else best
        if o.get("patience") and since >= o["patience"] and e + 1 < o["epochs"]:
            return params, lrs, e + 1
    return params, lrs, None


def run(shards, out, stop_after=None, **o):
    trainer = make_trainer(shards, "fb", out=out, **o)
    if stop_after is not None and WORLD.rank == 3:  # a real stop request to one rank during that epoch
        train_epoch = trainer.train_epoch

        def signalled():
            if trainer.epoch == stop_after - 1:
                os.kill(os.getpid(), signal.SIGTERM)
            return train_epoch()
        trainer.train_epoch = signalled
    try:
        summary = trainer.run()
        return summary, [p.detach().clone() for p in trainer.model.parameters()], trainer
    finally:
        trainer.close()


def initial_model(cora, **o):
    """The parameters every rank starts from: the trainer seeds torch with --seed, then builds the model."""
    from granndis_hpc.nn.models import build_model
    torch.manual_seed(o["seed"])
    return build_model("sage", cora.features.shape[1], o["hidden"], 7, 3, dropout=o["dropout"], norm=False)


def assert_same_run(rec_a, rec_b, params_a, params_b):
    """Resumed equals uninterrupted: learning rates exactly, losses and parameters to float32 noise."""
    assert [r["lr"] for r in rec_b] == [r["lr"] for r in rec_a]
    assert np.allclose([r["loss"] for r in rec_b], [r["loss"] for r in rec_a], rtol=0, atol=1e-6)
    for pa, pb in zip(params_a, params_b):
        assert torch.allclose(pa, pb, rtol=0, atol=1e-6)


def metrics(run_dir):
    WORLD.Barrier()
    return read_metrics(run_dir)


def test_cosine_warmup_clipping_early_stopping_resumed_equals_uninterrupted_and_reference(cora, cora_shards):
    shards, base = cora_shards[("full", 3)], shared_tmpdir("granndis-schedule-")
    model0 = initial_model(cora, **COSINE)
    summary, params, _ = run(shards, os.path.join(base, "a"), **COSINE)
    stopped = summary["optimizer"]["stopped_early_after_epoch"]
    rec_a = metrics(os.path.join(base, "a"))
    assert stopped is not None and 8 < stopped < EPOCHS and summary["epochs"] == stopped
    assert max(r["grad_norm"] for r in rec_a) > COSINE["clip_grad_norm"]  # clipping took effect

    def against_reference():
        want, lrs, stop = dense_run(cora, model0, COSINE)
        assert stop == stopped
        np.testing.assert_allclose([r["lr"] for r in rec_a], lrs, rtol=1e-12)
        for got, ref in zip(params, want):
            np.testing.assert_allclose(got.double().numpy(), ref.detach().numpy(), rtol=0, atol=2e-5)
    on_rank0(against_reference)

    run_b = os.path.join(base, "b")
    first, _, trainer = run(shards, run_b, stop_after=5, **COSINE)
    assert first is None and trainer.epoch == 5
    summary_b, params_b, _ = run(shards, run_b, resume=run_b, **COSINE)
    assert summary_b["optimizer"]["stopped_early_after_epoch"] == stopped
    assert_same_run(rec_a, metrics(run_b), params, params_b)
    assert os.path.isfile(os.path.join(run_b, "best-model.pt"))
    assert os.path.isdir(os.path.join(run_b, "checkpoints", f"epoch-{stopped:06d}"))


def test_sgd_nesterov_plateau_equals_reference(cora, cora_shards):
    shards = cora_shards[("full", 3)]
    model0 = initial_model(cora, **PLATEAU)
    base = shared_tmpdir("granndis-plateau-")
    _, params, _ = run(shards, os.path.join(base, "p"), **PLATEAU)
    rec = metrics(os.path.join(base, "p"))

    def against_reference():
        want, lrs, _ = dense_run(cora, model0, PLATEAU)
        np.testing.assert_allclose([r["lr"] for r in rec], lrs, rtol=1e-12)
        assert len(set(lrs)) > 1  # the plateau schedule decayed at least once
        for got, ref in zip(params, want):
            np.testing.assert_allclose(got.double().numpy(), ref.detach().numpy(), rtol=0, atol=2e-5)
    on_rank0(against_reference)


LONG = dict(COSINE, epochs=80, lr=0.01, warmup_epochs=10, patience=25, eval_every=4, dropout=0.5)


def test_80_epochs_resumed_at_40_equal_the_uninterrupted_run(cora_shards):
    """The whole schedule (warm-up, cosine decay, clipping, early stopping's counter, the keyed dropout
    and Adam's moments) continues exactly across a stop after epoch 40 of 80."""
    shards, base = cora_shards[("full", 3)], shared_tmpdir("granndis-schedule-long-")
    summary, params, _ = run(shards, os.path.join(base, "a"), **LONG)
    stopped = summary["optimizer"]["stopped_early_after_epoch"]
    assert stopped is None or stopped > 40, stopped  # early stopping ends it after the stop, if at all
    rec_a = metrics(os.path.join(base, "a"))
    run_b = os.path.join(base, "b")
    first, _, trainer = run(shards, run_b, stop_after=40, **LONG)
    assert first is None and trainer.epoch == 40
    summary_b, params_b, _ = run(shards, run_b, resume=run_b, **LONG)
    assert summary_b["epochs"] == summary["epochs"]
    assert summary_b["optimizer"]["stopped_early_after_epoch"] == stopped
    assert_same_run(rec_a, metrics(run_b), params, params_b)

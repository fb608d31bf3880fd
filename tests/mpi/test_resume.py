"""Checkpoint and resume inside one mpirun -n 4 job (2 servers x 2 ranks), real Cora, dropout on.

* A stop requested on ONE rank (a real SIGTERM to that process) stops every rank after the same epoch;
  a new Trainer resuming the run directory ends with exactly the parameters and losses of an
  uninterrupted run.
* A checkpoint of another model, width, or mode that samples is refused on every rank (continuing on
  another layout or shard set: tests/mpi/test_resume_shape.py).
* A write failure on one rank fails the checkpoint on every rank and leaves the previous one newest.
"""
import os
import signal

import numpy as np
import pytest
import torch
from mpi4py import MPI

from granndis_hpc.cluster.errors import ClusterError
from granndis_hpc.rundir import checkpoint as ck
from granndis_hpc.rundir import checkpoint_files as cf
from granndis_hpc.metrics import read_metrics
from tests.mpi.conftest import make_trainer, shared_tmpdir

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
EPOCHS = 6
COMMON = dict(hidden=16, dropout=0.5, lr=0.01, layers=3)


@pytest.fixture(scope="module")
def base():
    return shared_tmpdir("granndis-resume-")


def _run_to_end(trainer):
    try:
        result = trainer.run()
        return result, [p.detach().clone() for p in trainer.model.parameters()]
    finally:
        trainer.close()


def _losses(run_dir):
    WORLD.Barrier()  # rank 0 wrote the file
    return [r["loss"] for r in read_metrics(run_dir)]


@pytest.fixture(scope="module")
def uninterrupted(cora_shards, base):
    run_a = os.path.join(base, "a")
    trainer = make_trainer(cora_shards[("full", 3)], "flx", epochs=EPOCHS, out=run_a, checkpoint_every=3, **COMMON)
    summary, params = _run_to_end(trainer)
    assert summary["epochs"] == EPOCHS
    return run_a, params


def _stop_on_rank_3_then_resume(shards, run_b, mode, **options):
    """Stop by a real SIGTERM to rank 3 alone during its third epoch, check that every rank stopped after
    that epoch, resume in a new Trainer; returns the resumed run's final parameters."""
    trainer = make_trainer(shards, mode, epochs=EPOCHS, out=run_b, **options)
    if WORLD.rank == 3:
        train_epoch = trainer.train_epoch

        def signalled_epoch():
            if trainer.epoch == 2:
                os.kill(os.getpid(), signal.SIGTERM)
            return train_epoch()
        trainer.train_epoch = signalled_epoch
    result, _ = _run_to_end(trainer)
    assert result is None and trainer.epoch == 3  # every rank stopped after the same epoch
    assert trainer.checkpointer.stopped_checkpoint == cf.epoch_dir(run_b, 3)
    assert cf.latest_complete(run_b).epoch == 3

    resumed = make_trainer(shards, mode, epochs=EPOCHS, out=run_b, resume=run_b, **options)
    assert resumed.epoch == 3
    summary, params_b = _run_to_end(resumed)
    assert summary["epochs"] == EPOCHS
    # ... and the parameters are the same on every rank.
    flat = torch.cat([p.flatten() for p in params_b]).double().numpy()
    assert np.array_equal(WORLD.bcast(flat, root=0), flat)
    return params_b


def _assert_same_run(run_a, params_a, run_b, params_b):
    for pa, pb in zip(params_a, params_b):
        assert torch.allclose(pa, pb, rtol=0, atol=1e-6)
    losses_a, losses_b = _losses(run_a), _losses(run_b)
    assert len(losses_b) == EPOCHS and np.allclose(losses_a, losses_b, rtol=0, atol=1e-6)


def test_stop_on_one_rank_and_resume_equals_uninterrupted(cora_shards, base, uninterrupted):
    run_a, params_a = uninterrupted
    run_b = os.path.join(base, "b")
    params_b = _stop_on_rank_3_then_resume(cora_shards[("full", 3)], run_b, "flx", **COMMON)
    _assert_same_run(run_a, params_a, run_b, params_b)


def test_cooperative_batching_resumes_with_its_sampler(cora_shards, base):
    """cob: two co-batches per epoch, sampled with fanout 5: the sampler's state and the per-epoch
    sample streams must continue where they stopped."""
    shards, options = cora_shards[("full", 3)], dict(COMMON, batches_per_epoch=2, fanout=5)
    run_a, run_b = os.path.join(base, "cob-a"), os.path.join(base, "cob-b")
    _, params_a = _run_to_end(make_trainer(shards, "cob", epochs=EPOCHS, out=run_a, **options))
    params_b = _stop_on_rank_3_then_resume(shards, run_b, "cob", **options)
    _assert_same_run(run_a, params_a, run_b, params_b)
    # The saved sampler state is checked on resume: another sampler configuration is refused.
    with pytest.raises(ClusterError, match="SamplerError: sampler state"):
        make_trainer(shards, "cob", epochs=EPOCHS, out=run_b, resume=run_b, **dict(options, batches_per_epoch=3))


@pytest.mark.parametrize("change,expected", [
    ({"hidden": 32}, "written by another run (hidden: checkpoint 16, this run 32)"),
    ({"model": "gcn"}, "written by another run (model: checkpoint 'sage', this run 'gcn')"),
    ({"mode": "cob"}, "cannot continue on this run's shape (mode: checkpoint 'flx', this run 'cob')"),
])
def test_checkpoint_of_another_run_is_refused_on_every_rank(cora_shards, uninterrupted, change, expected):
    run_a, _ = uninterrupted
    options = dict(COMMON, epochs=EPOCHS, out=run_a, resume=run_a)
    options.update(change)
    mode = options.pop("mode", "flx")
    with pytest.raises(ClusterError) as err:
        make_trainer(cora_shards[("full", 3)], mode, **options)
    assert err.value.collective
    assert "ranks 0,1,2,3: CheckpointError" in str(err.value) and expected in str(err.value)


def test_write_failure_on_one_rank_fails_everywhere_and_keeps_the_previous(cora_shards, base, monkeypatch):
    run_c = os.path.join(base, "c")
    trainer = make_trainer(cora_shards[("full", 3)], "flx", epochs=3, out=run_c, checkpoint_every=1, **COMMON)
    if WORLD.rank == 2:
        write = ck.write_payload

        def failing(directory, name, payload):
            if directory.endswith("epoch-000002"):
                raise OSError(122, "Disk quota exceeded")
            return write(directory, name, payload)
        monkeypatch.setattr(ck, "write_payload", failing)
    try:
        with pytest.raises(ClusterError, match=r"rank 2: writing checkpoint .*epoch-000002 failed.*quota"):
            trainer.run()
    finally:
        trainer.close()
    WORLD.Barrier()
    assert cf.latest_complete(run_c).epoch == 1
    assert not os.path.exists(os.path.join(cf.epoch_dir(run_c, 2), cf.COMPLETE))

"""Resume on another cluster shape, real Cora, dropout 0.5, inside one mpirun -n 4 job.

A requeued job may land on other nodes: `granndis-train --resume RUN_DIR --shards OTHER_SET
--ranks-per-server G` continues the same trajectory when OTHER_SET is the same dataset (the manifests'
dataset.content_sha256) built for another S x G, in the exact modes fb and flx (rundir/checkpoint.py).
The other shapes are emulated inside the 4-rank world with --ranks-per-server 1 and 4, as
tests/mpi/test_dropout_exact.py does.

* One run: 3 epochs of flx on 2 x 2, stopped by a stop request on ONE rank (with a checkpoint); continued
  through the command line on 4 x 1 with `--mode fb` up to epoch 6; then on 1 x 4 with flx and 2
  preloaded layers up to epoch 9.  Its parameters equal 9 epochs of single-process dense training with
  the same dropout masks (tests/dense_reference.train_dense) within 1e-5, and not those of another seed.
* Refused on every rank through the command line (exit status 1, the differences named, nothing in the
  run directory changed): another dataset (Cora with one training flag flipped), a shard set built
  before the build recorded the content digest, a cob checkpoint on another layout, and an exact
  checkpoint continued by cob on another layout.
"""
import copy
import dataclasses
import hashlib
import json
import os
import shutil

import numpy as np
import pytest
import torch
from mpi4py import MPI

from granndis_hpc import cli
from granndis_hpc.rundir import checkpoint_files as cf
from granndis_hpc.metrics import read_metrics
from granndis_hpc.shards.manifest import manifest_digests
from tests.dense_reference import assert_parameters_close, train_dense
from tests.mpi.conftest import make_trainer, on_rank0, shared_tmpdir

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
P, LR, SEED, LAYERS, EPOCHS = 0.5, 0.01, 3, 3, 9
COMMON = dict(layers=LAYERS, hidden=16, lr=LR, dropout=P, seed=SEED)


@pytest.fixture(scope="module")
def base():
    return shared_tmpdir("granndis-resume-shape-")


@pytest.fixture(scope="module")
def refused_sets(cora, cora_shapes, base):
    """4 x 1 shard sets the checkpoints must not continue on: Cora with one training flag flipped, and
    Cora's 4 x 1 set as a build before dataset.content_sha256 wrote it (the field and its digest gone)."""
    from granndis_hpc.preprocess.build.pipeline import build_shards

    def build():
        dirs = {"resplit": os.path.join(base, "resplit-4x1"), "old": os.path.join(base, "old-4x1")}
        train = cora.train_mask.copy()  # one more training vertex, taken from no split (a valid split)
        train[np.flatnonzero(~(cora.train_mask | cora.val_mask | cora.test_mask))[0]] = True
        build_shards(dataclasses.replace(cora, train_mask=train), dirs["resplit"], servers=4, gpus_per_server=1,
                     layers=LAYERS, preload="full", partitioner="metis", comm=MPI.COMM_SELF, seed=0)
        shutil.copytree(cora_shapes[1], dirs["old"])
        path = os.path.join(dirs["old"], "manifest.json")
        with open(path) as f:
            manifest = json.load(f)
        del manifest["dataset"]["content_sha256"]
        manifest["digests"] = manifest_digests(manifest)
        with open(path, "w") as f:
            json.dump(manifest, f)
        return dirs
    return on_rank0(build)


def _parameters(trainer):
    return {k: v.detach().double().clone() for k, v in trainer.model.named_parameters()}


def test_exact_run_continues_on_4x1_then_1x4_as_one_single_process_run(cora, cora_shapes, base, capsys):
    run = os.path.join(base, "moved")
    # 2 x 2, flx: a stop request on rank 1 alone during the third epoch (a Slurm time-limit warning
    # that reached one rank first); every rank stops after epoch 3 with a checkpoint.
    trainer = make_trainer(cora_shapes[2], "flx", epochs=EPOCHS, out=run, checkpoint_every=3, **COMMON)
    initial = copy.deepcopy(trainer.model)
    if WORLD.rank == 1:
        train_epoch = trainer.train_epoch

        def requested_epoch():
            if trainer.epoch == 2:
                trainer.stop_signals.request()
            return train_epoch()
        trainer.train_epoch = requested_epoch
    try:
        assert trainer.run() is None and trainer.epoch == 3
    finally:
        trainer.close()

    # 4 x 1 through the command line, with fb (exact, like flx): up to epoch 6.
    summary = cli.run_training(["--resume", run, "--shards", cora_shapes[1], "--ranks-per-server", "1",
                                "--mode", "fb", "--epochs", "6"])
    assert summary["epochs"] == 6 and summary["plan"]["mode"] == "fb"
    if WORLD.rank == 0:
        assert "written on 2 x 2 (flx), on 4 x 1 (fb)" in capsys.readouterr().err
    WORLD.Barrier()
    info = cf.latest_complete(run)
    assert info.epoch == 6 and sorted(info.manifest["files"]) == [cf.rank_file(r) for r in range(4)] + [cf.SHARED_FILE]
    assert (info.manifest["fingerprint"]["servers"], info.manifest["fingerprint"]["ranks_per_server"]) == (4, 1)

    # 1 x 4, flx with 2 of its 3 preloaded hops: up to epoch 9.
    resumed = make_trainer(cora_shapes[4], "flx", epochs=EPOCHS, out=run, resume=run, checkpoint_every=3,
                           ranks_per_server=4, preloaded_layers=2, **COMMON)
    assert resumed.epoch == 6
    try:
        assert resumed.run()["epochs"] == EPOCHS
        got = _parameters(resumed)
    finally:
        resumed.close()
    flat = torch.cat([v.flatten() for v in got.values()]).numpy()
    assert np.array_equal(WORLD.bcast(flat), flat)  # the same parameters on every rank
    WORLD.Barrier()
    assert [r["epoch"] for r in read_metrics(run)] == list(range(EPOCHS))
    with open(os.path.join(run, "config.json")) as f:
        config = json.load(f)
    assert (config["shards"], config["ranks_per_server"], config["mode"]) == (cora_shapes[4], 4, "flx")
    if WORLD.rank != 0:
        return
    want = train_dense(cora, copy.deepcopy(initial).double(), EPOCHS, LR, dropout=P, seed=SEED)
    err = max((got[k] - v.detach()).abs().max().item() for k, v in want.named_parameters())
    print(f"\n2x2 flx -> 4x1 fb -> 1x4 flx k=2, {EPOCHS} epochs: max |parameter - single-process reference| "
          f"= {err:.2e}")
    moved = max((v.detach().double() - want.get_parameter(k).detach()).abs().max().item()
                for k, v in initial.named_parameters())
    assert moved > 1e-2  # training moved the parameters
    # float32 sums in three shapes' orders against one process's: 1.0e-5 measured after 9 epochs
    assert_parameters_close(resumed.model, want, rel_tol=5e-5, label="resumed on 4x1 and 1x4: ")
    # ... and the comparison tells trajectories apart: another seed's masks end elsewhere.
    other = train_dense(cora, copy.deepcopy(initial).double(), EPOCHS, LR, dropout=P, seed=SEED + 1)
    assert max((got[k] - v.detach()).abs().max().item() for k, v in other.named_parameters()) > 1e-3


@pytest.fixture(scope="module")
def checkpoints(cora_shapes, base):
    """One-epoch runs on 2 x 2 with a checkpoint: flx (exact) and cob (samples per server)."""
    runs = {}
    for mode in ("flx", "cob"):
        runs[mode] = os.path.join(base, f"one-epoch-{mode}")
        trainer = make_trainer(cora_shapes[2], mode, epochs=1, out=runs[mode], checkpoint_every=1, **COMMON)
        try:
            trainer.run()
        finally:
            trainer.close()
    return runs


def _snapshot(run_dir):
    """Every file under the run directory with its sha256 (rank 0's view; the others get it too)."""
    def files():
        out = {}
        for root, _, names in os.walk(run_dir):
            for name in names:
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    out[os.path.relpath(path, run_dir)] = hashlib.sha256(f.read()).hexdigest()
        return out
    WORLD.Barrier()
    return on_rank0(files)


@pytest.mark.parametrize("run,shards,extra,expected", [
    ("flx", "resplit", [], ["was written by another run (dataset_sha256: checkpoint '",
                            "the shard sets hold different data"]),
    ("flx", "old", [], ["has no dataset content digest (built by an older granndis-hpc): rebuild it"]),
    ("cob", "4x1", [], ["cannot continue on this run's shape (ranks_per_server: checkpoint 2, this run 1; "
                        "servers: checkpoint 2, this run 4; shard_set: checkpoint '",
                        "the checkpoint's run depends on it: mode cob samples its co-batches per server",
                        "(2 servers x 2 ranks per server, mode 'cob'"]),
    ("flx", "4x1", ["--mode", "cob"], ["cannot continue on this run's shape (mode: checkpoint 'flx', this run 'cob'",
                                       "this run depends on it: mode cob samples its co-batches per server"]),
])
def test_resume_on_another_shape_is_refused_on_every_rank(cora_shapes, refused_sets, checkpoints, capsys, run,
                                                          shards, extra, expected):
    run_dir = checkpoints[run]
    other = cora_shapes[1] if shards == "4x1" else refused_sets[shards]
    before = _snapshot(run_dir)
    with pytest.raises(SystemExit) as exit_:
        cli.train_main(["--resume", run_dir, "--shards", other, "--ranks-per-server", "1", *extra])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    if WORLD.rank == 0:  # said once, by rank 0, for every rank
        assert "[rank 0] ClusterError: ranks 0,1,2,3: CheckpointError" in err, err
        for text in expected:
            assert text in err, err
    else:
        assert "ClusterError" not in err, err
    assert _snapshot(run_dir) == before  # nothing written: not config.json, metrics or checkpoints

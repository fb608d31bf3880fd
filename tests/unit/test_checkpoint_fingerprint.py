"""rundir/fingerprint.py: which runs may continue which checkpoints (the same trajectory options and data;
the shape only in the exact modes), on one process with the checkpoints of tests/unit/test_checkpoint.py."""
import dataclasses
import os
import re

import pytest
import torch

from granndis_hpc.cluster.errors import ClusterError
from granndis_hpc.options.train import TrainConfig
from granndis_hpc.rundir import checkpoint as ck
from granndis_hpc.rundir import checkpoint_files as cf
from granndis_hpc.rundir import fingerprint as fpr
from granndis_hpc.rundir import rngstate as rng
from tests.unit.test_checkpoint import FP, SELF, _save, _trained

# The fingerprint of a run held to its shape (a sampling mode).
COB = dict(FP, mode="cob", shape_dependent="mode cob samples its co-batches per server")


@pytest.mark.parametrize("key,value", [("model", "gcn"), ("hidden", 32), ("layers", 3), ("dataset", "citeseer")])
def test_checkpoint_of_another_run_is_refused(tmp_path, key, value):
    model, opt = _trained()
    _save(tmp_path, 1, model, opt)
    other = dict(FP, **{key: value})
    with pytest.raises(ClusterError, match=rf"written by another run \({key}: checkpoint {FP[key]!r}, "
                                           rf"this run {value!r}\).*start a new run"):
        ck.load_latest(SELF, str(tmp_path), other)


@pytest.mark.parametrize("key,value", [("mode", "fb"), ("servers", 2), ("ranks_per_server", 2),
                                       ("shard_set", "other"), ("preloaded_layers", 1)])
def test_a_shape_dependent_checkpoint_continues_only_on_its_own_shape(tmp_path, key, value):
    model, opt = _trained()
    _save(tmp_path, 1, model, opt, fp=COB)
    with pytest.raises(ClusterError) as err:
        ck.load_latest(SELF, str(tmp_path), dict(COB, **{key: value}))
    text = str(err.value)
    assert f"cannot continue on this run's shape ({key}: checkpoint {COB[key]!r}, this run {value!r})" in text
    assert "only in the exact modes fb and flx, and the checkpoint's run depends on it: mode cob samples" in text
    assert "resume it with the mode, shard set and layout it was written with (1 servers x 1 ranks per " \
           "server, mode 'cob'" in text


def test_an_exact_checkpoint_continues_on_another_shape_of_the_same_dataset():
    """fb and flx follow one trajectory whatever the layout, shard set, mode or preloaded depth."""
    moved = dict(FP, servers=4, ranks_per_server=1, shard_set="other", mode="fb", preloaded_layers=2)
    fpr.check_fingerprint(FP, moved, "checkpoint X")
    fpr.check_fingerprint(moved, FP, "checkpoint X")
    # ... but not onto a run that is held to its shape, or with any trajectory option changed.
    with pytest.raises(cf.CheckpointError, match="and this run depends on it: mode cob samples"):
        fpr.check_fingerprint(FP, dict(COB, servers=4), "checkpoint X")
    with pytest.raises(cf.CheckpointError, match=r"written by another run \(lr: checkpoint 0.01, this run 0.1\)"):
        fpr.check_fingerprint(dict(FP, lr=0.01), dict(moved, lr=0.1), "checkpoint X")


def test_another_dataset_is_refused_naming_the_differences():
    other = dict(FP, servers=4, shard_set="other", dataset_sha256="d2")
    with pytest.raises(cf.CheckpointError) as err:
        fpr.check_fingerprint(FP, other, "checkpoint X")
    text = str(err.value)
    # Only the data is named: the layout and shard set may differ in an exact mode.
    assert "written by another run (dataset_sha256: checkpoint 'd1', this run 'd2'); " in text
    assert "the shard sets hold different data (the graph, features, labels or split differ" in text
    # Even on the same layout and mode (the shard set is then a shape key that may not differ either).
    with pytest.raises(cf.CheckpointError, match="dataset_sha256: checkpoint 'd1', this run 'd2'"):
        fpr.check_fingerprint(FP, dict(FP, dataset_sha256="d2", shard_set="other"), "checkpoint X")


def test_a_shard_set_without_content_digest_holds_the_run_to_its_shard_set():
    """Shard sets built before the build recorded dataset.content_sha256: nothing shows that another
    set holds the same data, so the shard set and layout may not change; the same set is fine."""
    old = dict(FP, dataset_sha256=None)
    fpr.check_fingerprint(old, dict(old), "checkpoint X")  # the same files: the same data
    fpr.check_fingerprint(old, dict(old, mode="fb", preloaded_layers=1), "checkpoint X")  # ... in another exact mode
    with pytest.raises(cf.CheckpointError) as err:
        fpr.check_fingerprint(old, dict(FP, servers=4, shard_set="other"), "checkpoint X")
    assert "cannot continue on this run's shape (servers: checkpoint 1, this run 4; shard_set: " in str(err.value)
    assert "written on a shard set without a dataset content digest" in str(err.value)
    with pytest.raises(cf.CheckpointError) as err:
        fpr.check_fingerprint(FP, dict(old, servers=4, shard_set="other"), "checkpoint X")
    assert "this run's shard set (--shards) has no dataset content digest" in str(err.value)
    assert "rebuild it with this version (`granndis preprocess build ... --overwrite`)" in str(err.value)
    assert "dataset_sha256" not in str(err.value)  # unknown is not "different"


def test_on_another_layout_the_rank_files_are_not_restored(tmp_path):
    """The model and optimizer come back; the per-rank RNG states stay as they are (rank r of a 4x1 job
    is not rank r of the 2x2 job that wrote the checkpoint, and the exact modes draw nothing from them)."""
    model, opt = _trained()
    saved = dict(FP, servers=2, ranks_per_server=2)
    ck.save(SELF, str(tmp_path), 3, saved, {"epoch": 3, "elapsed_s": 1.0, "model": model.state_dict(),
                                             "optimizer": opt.state_dict()},
            {"rng": rng.rng_state(torch.device("cpu"))})
    torch.manual_seed(11)
    fresh, fresh_opt = _trained(seed=1)
    before = rng.rng_state(torch.device("cpu"))
    resumed = ck.CheckpointManager(SELF, str(tmp_path), dict(FP, servers=4, ranks_per_server=1), fresh, fresh_opt,
                                   torch.device("cpu")).load(max_epoch=5)
    assert resumed.epoch == 3
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))
    assert torch.equal(rng.rng_state(torch.device("cpu"))["torch"], before["torch"])
    # The rank file is not even read: a missing one is no obstacle on another layout.
    os.unlink(os.path.join(cf.epoch_dir(tmp_path, 3), cf.rank_file(0)))
    ck.load_latest(SELF, str(tmp_path), dict(FP, servers=1, ranks_per_server=4))


def test_fingerprint_names_the_shard_set():
    Cfg = TrainConfig(shards="s", model="sage", mode="flx", layers=2, hidden=16, norm=False)
    manifest = {"dataset": {"name": "cora", "content_sha256": "d1"},
                "files": {"server-0000.h5": {"sha256": "aa"}, "server-0001.h5": {"sha256": "bb"}}}
    fp = fpr.fingerprint(Cfg, 2, 2, manifest, shape_dependent=None)
    assert fp["dataset"] == "cora" and fp["servers"] == 2 and fp["ranks_per_server"] == 2
    assert fp["dataset_sha256"] == "d1" and fp["mode"] == "flx" and fp["shape_dependent"] is None
    assert fpr.fingerprint(Cfg, 2, 2, {"dataset": {"name": "cora"}}, shape_dependent=None)["dataset_sha256"] is None
    changed = {"dataset": {"name": "cora"}, "files": {"server-0000.h5": {"sha256": "aa"},
                                                      "server-0001.h5": {"sha256": "cc"}}}
    assert fpr.shard_set_id(changed) != fp["shard_set"]
    reordered = {"dataset": {"name": "cora"}, "files": dict(reversed(list(manifest["files"].items())))}
    assert fpr.shard_set_id(reordered) == fp["shard_set"]


def test_fingerprint_covers_every_trajectory_option():
    base = TrainConfig(shards="s", out="/r")
    manifest = {"dataset": {"name": "cora"}, "files": {}}
    fp = fpr.fingerprint(base, 2, 2, manifest, shape_dependent=None)
    for change in ({"seed": 1}, {"lr": 0.02}, {"weight_decay": 5e-4}, {"dropout": 0.1}, {"norm": True},
                   {"hidden": 32}, {"layers": 4}, {"model": "gcn"}, {"mode": "fb"}, {"device": "cpu"},
                   {"preloaded_layers": 2}):
        other = fpr.fingerprint(dataclasses.replace(base, **change), 2, 2, manifest, shape_dependent=None)
        (key,) = change
        assert other[key] != fp[key], change
    # ... and not the options that may change on resume (nor the sampler's, which its state checks).
    for change in ({"epochs": 5}, {"eval_every": 0}, {"checkpoint_every": 3}, {"quiet": True}, {"shards": "t"},
                   {"out": "/elsewhere"}, {"progress": True}, {"overwrite_run": True}, {"batches_per_epoch": 2}):
        assert fpr.fingerprint(dataclasses.replace(base, **change), 2, 2, manifest, shape_dependent=None) == fp, change


def test_checkpoint_of_another_lr_or_seed_is_refused(tmp_path):
    """Defect: the fingerprint left out seed and lr, so a run directory's old checkpoints passed as
    another run's."""
    manifest = {"dataset": {"name": "cora"}, "files": {}}
    cfg = TrainConfig(shards="s", out=str(tmp_path))
    model, opt = _trained()
    _save(tmp_path, 1, model, opt, fp=fpr.fingerprint(cfg, 1, 1, manifest, shape_dependent=None))
    for change, expected in (({"lr": 0.5}, "lr: checkpoint 0.01, this run 0.5"), ({"seed": 7}, "seed: checkpoint 0")):
        other = fpr.fingerprint(dataclasses.replace(cfg, **change), 1, 1, manifest, shape_dependent=None)
        with pytest.raises(ClusterError, match=re.escape(expected)):
            ck.load_latest(SELF, str(tmp_path), other)

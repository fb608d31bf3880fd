"""rundir/checkpoint.py on one process (MPI.COMM_SELF): layout, atomicity under crashes, pruning,
damage detection and crafted files, the CheckpointManager, the run-directory helpers, and
(moved beside it, tested here) options/resume.py resume_config, metrics.truncate_metrics and signals.StopSignals.

The multi-rank behaviour (kill and resume under mpirun, refusals on every rank) is in
tests/launch/test_resume.py and tests/mpi/test_resume.py; which runs may continue which checkpoints
(the fingerprint) in tests/unit/test_checkpoint_fingerprint.py."""
import json
import os
import random
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from mpi4py import MPI

from granndis_hpc.options import resume as options_resume
from granndis_hpc.cluster.errors import ClusterError
from granndis_hpc.rundir import checkpoint as ck
from granndis_hpc.rundir import checkpoint_files as cf
from granndis_hpc.rundir import rngstate as rng
from granndis_hpc.rundir import directory as rd
from granndis_hpc.engine import signals
from granndis_hpc.metrics import truncate_metrics
from tests.conftest import REPO


class SelfTopology:
    """The collectives checkpoint.save/load_latest use, as a cluster.Topology of a one-process job has them."""
    rank, world_size, world = 0, 1, MPI.COMM_SELF

    def gather_object(self, obj, root=0):
        return self.world.gather(obj, root=root)

    def bcast_object(self, obj, root=0):
        return self.world.bcast(obj, root=root)


SELF = SelfTopology()

FP = {"model": "sage", "mode": "flx", "preloaded_layers": None, "layers": 2, "hidden": 16, "norm": False, "servers": 1,
      "ranks_per_server": 1, "dataset": "toy", "dataset_sha256": "d1", "shard_set": "abc", "shape_dependent": None}


def _trained(seed=0):
    """A small model and Adam after two steps, so the optimizer holds state worth checking."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(11, 5)).square().sum().backward()
        opt.step()
    return model, opt


def _save(run_dir, epoch, model, opt, fp=FP):
    shared = {"epoch": epoch, "elapsed_s": 1.5, "model": model.state_dict(), "optimizer": opt.state_dict()}
    mine = {"rng": rng.rng_state(torch.device("cpu")), "sampler": {"seed": 3, "key": np.arange(4, dtype=np.uint32)}}
    return ck.save(SELF, str(run_dir), epoch, fp, shared, mine)


def test_layout_and_round_trip(tmp_path):
    model, opt = _trained()
    path = _save(tmp_path, 7, model, opt)
    assert path == os.path.join(tmp_path, "checkpoints", "epoch-000007")
    assert sorted(os.listdir(path)) == ["COMPLETE.json", "rank-0000.pt", "state.pt"]
    manifest = json.load(open(os.path.join(path, "COMPLETE.json")))
    assert manifest["epoch"] == 7 and manifest["world_size"] == 1 and manifest["fingerprint"] == FP
    assert set(manifest["files"]) == {"rank-0000.pt", "state.pt"}

    loaded = ck.load_latest(SELF, str(tmp_path), FP)
    assert loaded.info.epoch == 7
    assert loaded.shared["epoch"] == 7 and loaded.shared["elapsed_s"] == 1.5
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.shared["model"][name], tensor)
    fresh_model, fresh_opt = _trained(seed=1)
    fresh_model.load_state_dict(loaded.shared["model"])
    fresh_opt.load_state_dict(loaded.shared["optimizer"])
    for p_ref, p_new in zip(opt.state.values(), fresh_opt.state.values()):
        assert torch.equal(p_ref["exp_avg"], p_new["exp_avg"]) and torch.equal(p_ref["exp_avg_sq"], p_new["exp_avg_sq"])
    sampler = loaded.mine["sampler"]
    assert sampler["seed"] == 3 and sampler["key"].dtype == np.uint32 and list(sampler["key"]) == [0, 1, 2, 3]


def test_rng_state_restores_every_stream():
    state = rng.rng_state(torch.device("cpu"))
    expected = (torch.rand(5), np.random.random(5), [random.random() for _ in range(5)])
    torch.rand(3), np.random.random(3), random.random()  # move the streams on
    rng.set_rng_state(state, torch.device("cpu"))
    again = (torch.rand(5), np.random.random(5), [random.random() for _ in range(5)])
    assert torch.equal(expected[0], again[0])
    assert np.array_equal(expected[1], again[1])
    assert expected[2] == again[2]


def test_prune_keeps_the_newest_two_complete(tmp_path):
    model, opt = _trained()
    os.makedirs(cf.epoch_dir(tmp_path, 1))  # an interrupted write from long ago: incomplete
    for epoch in (2, 4, 6, 8):
        _save(tmp_path, epoch, model, opt)
    assert [e for e, _, c in cf.list_checkpoints(str(tmp_path)) if c] == [6, 8]
    assert [e for e, _, _ in cf.list_checkpoints(str(tmp_path))] == [6, 8]
    assert cf.latest_complete(str(tmp_path)).epoch == 8


def _crash_script(run_dir, stage):
    """A process that writes a complete checkpoint at epoch 1, then dies (os._exit: no clean-up, like
    SIGKILL) at `stage` while writing epoch 2."""
    return textwrap.dedent(f"""
        import os, sys, torch
        sys.path.insert(0, {str(REPO)!r})
        from mpi4py import MPI
        from granndis_hpc import fsutil
        from granndis_hpc.rundir import checkpoint as ck
        from tests.unit.test_checkpoint import FP, _save, _trained
        model, opt = _trained()
        _save({str(run_dir)!r}, 1, model, opt)
        if {stage!r} == "mid-file":
            def dying_write(path, data):
                with fsutil.atomic_path(path) as tmp:
                    with open(tmp, "wb") as f:
                        f.write(data[: len(data) // 2])
                        f.flush()
                    os._exit(9)
            ck.atomic_write_bytes = dying_write
        else:  # every data file written, killed before the COMPLETE marker
            def dying_json(path, obj):
                os._exit(9)
            ck.atomic_write_json = dying_json
        _save({str(run_dir)!r}, 2, model, opt)
    """)


@pytest.mark.parametrize("stage", ["mid-file", "before-marker"])
def test_crash_while_writing_leaves_the_previous_checkpoint_newest(tmp_path, stage):
    res = subprocess.run([sys.executable, "-c", _crash_script(tmp_path, stage)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 9, res.stdout + res.stderr
    names = sorted(os.listdir(cf.epoch_dir(tmp_path, 2)))
    assert "COMPLETE.json" not in names
    if stage == "mid-file":  # only the temporary file exists: no half file under the final name
        assert len(names) == 1 and names[0].startswith(".rank-0000.pt.") and names[0].endswith(".tmp")
    else:
        assert names == ["rank-0000.pt", "state.pt"]
    info = cf.latest_complete(str(tmp_path))
    assert info.epoch == 1
    loaded = ck.load_latest(SELF, str(tmp_path), FP)
    assert loaded.shared["epoch"] == 1
    # The next successful checkpoint replaces the leftovers and keeps epoch 1 as the second newest.
    model, opt = _trained()
    _save(tmp_path, 2, model, opt)
    assert [(e, c) for e, _, c in cf.list_checkpoints(str(tmp_path))] == [(1, True), (2, True)]
    assert not [n for n in os.listdir(cf.epoch_dir(tmp_path, 2)) if n.endswith(".tmp")]


def test_failed_write_raises_and_writes_no_marker(tmp_path, monkeypatch):
    model, opt = _trained()
    _save(tmp_path, 1, model, opt)

    def full_disk(path, data):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(ck, "atomic_write_bytes", full_disk)
    with pytest.raises(ClusterError, match="writing checkpoint .*epoch-000002 failed: OSError.*No space left"):
        _save(tmp_path, 2, model, opt)
    assert not os.path.exists(os.path.join(cf.epoch_dir(tmp_path, 2), "COMPLETE.json"))
    assert cf.latest_complete(str(tmp_path)).epoch == 1


def test_damaged_files_are_detected(tmp_path):
    model, opt = _trained()
    _save(tmp_path, 1, model, opt)
    path2 = _save(tmp_path, 2, model, opt)
    # Truncated file: the size check in COMPLETE.json makes the checkpoint not complete.
    with open(os.path.join(path2, "state.pt"), "r+b") as f:
        f.truncate(100)
    assert cf.latest_complete(str(tmp_path)).epoch == 1
    # Same size, different bytes: found as complete, refused on load with the way out.
    path1 = cf.epoch_dir(tmp_path, 1)
    with open(os.path.join(path1, "rank-0000.pt"), "r+b") as f:
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.unlink(os.path.join(path2, "COMPLETE.json"))
    with pytest.raises(ClusterError, match=r"rank-0000.pt: size or sha256 differs .* delete .*epoch-000001"):
        ck.load_latest(SELF, str(tmp_path), FP)


def test_no_checkpoint_gives_none(tmp_path):
    assert cf.latest_complete(str(tmp_path)) is None
    os.makedirs(cf.epoch_dir(tmp_path, 3))
    assert ck.load_latest(SELF, str(tmp_path), FP) is None
    assert cf.prune(str(tmp_path)) == []  # nothing complete: nothing is deleted


def test_a_checkpoint_of_an_older_format_is_refused_with_the_fix(tmp_path):
    model, opt = _trained()
    path = _save(tmp_path, 1, model, opt)
    manifest = json.loads(open(os.path.join(path, cf.COMPLETE)).read())
    manifest["format_version"] = 2
    with open(os.path.join(path, cf.COMPLETE), "w") as f:
        json.dump(manifest, f)
    with pytest.raises(ClusterError, match="has checkpoint format 2, this program reads 3: finish the run with"):
        ck.load_latest(SELF, str(tmp_path), FP)


DEFAULTS = {"shards": None, "mode": "flx", "model": "sage", "hidden": 64, "lr": 0.01, "epochs": 200,
            "eval_every": 10, "out": None, "resume": None, "checkpoint_every": 0, "quiet": False,
            "batches_per_epoch": 1}
SAVED = {"shards": "/s", "mode": "flx", "model": "sage", "hidden": 16, "lr": 0.01, "epochs": 30,
         "eval_every": 10, "out": "/runs/a", "resume": None, "checkpoint_every": 5, "quiet": True,
         "something_from_a_newer_version": 1}


def test_resume_config_takes_the_saved_options(tmp_path):
    merged = options_resume.resume_config(SAVED, {"resume": str(tmp_path)}, str(tmp_path), DEFAULTS)
    assert merged["hidden"] == 16 and merged["checkpoint_every"] == 5 and merged["quiet"] is True
    assert merged["out"] == merged["resume"] == str(tmp_path)
    assert merged["batches_per_epoch"] == 1  # missing from an older config.json: the default it ran with
    assert "something_from_a_newer_version" not in merged
    # Safe options change; options repeated with the same value (as slurm/train.sbatch does) are fine.
    given = {"resume": str(tmp_path), "epochs": 50, "eval_every": 0, "hidden": 16, "mode": "flx",
             "out": str(tmp_path) + "/", "shards": "/moved/s"}
    merged = options_resume.resume_config(SAVED, given, str(tmp_path), DEFAULTS)
    assert merged["epochs"] == 50 and merged["eval_every"] == 0 and merged["shards"] == "/moved/s"
    # The shape may be given again: the checkpoint's fingerprint decides (another shard set, layout or
    # exact mode of the same dataset: rundir/checkpoint.py).
    given = {"resume": str(tmp_path), "shards": "/other/4x1", "ranks_per_server": 1, "mode": "fb",
             "preloaded_layers": 2}
    merged = options_resume.resume_config(SAVED, given, str(tmp_path), dict(DEFAULTS, ranks_per_server=None,
                                                                 preloaded_layers=None))
    assert {k: merged[k] for k in given if k != "resume"} == {k: v for k, v in given.items() if k != "resume"}


def test_resume_config_refuses_other_settings(tmp_path):
    given = {"resume": str(tmp_path), "lr": 0.1, "hidden": 32, "batches_per_epoch": 4}
    with pytest.raises(cf.CheckpointError) as err:
        options_resume.resume_config(SAVED, given, str(tmp_path), DEFAULTS)
    text = str(err.value)
    assert "lr=0.1 (the run has 0.01)" in text and "hidden=32 (the run has 16)" in text
    assert "batches_per_epoch=4 (the run has 1)" in text and "epochs" in text and "another --out" in text
    with pytest.raises(cf.CheckpointError, match="out='/elsewhere' .*writes into the run directory"):
        options_resume.resume_config(SAVED, {"out": "/elsewhere"}, str(tmp_path), DEFAULTS)


def test_truncate_metrics_drops_epochs_after_the_checkpoint(tmp_path):
    lines = [json.dumps({"epoch": e, "loss": 1.0 / (e + 1)}) + "\n" for e in range(7)]
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.writelines(lines)
        f.write('{"epoch": 7, "lo')  # the line the kill cut short
    kept = truncate_metrics(str(tmp_path), 4)
    assert [r["epoch"] for r in kept] == [0, 1, 2, 3]
    assert [json.loads(l)["epoch"] for l in open(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3]
    os.makedirs(tmp_path / "fresh")  # a run stopped before its first epoch has no metrics.jsonl yet
    assert truncate_metrics(str(tmp_path / "fresh"), 0) == []


def test_stop_signals_set_a_flag_and_restore_handlers():
    before = {s: signal.getsignal(s) for s in signals.STOP_SIGNALS}
    stop = signals.StopSignals()
    assert stop.install()
    try:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):  # Python runs the handler at the next bytecode boundary
            if stop.requested:
                break
        assert stop.received == signal.SIGUSR1  # the first one is kept
    finally:
        stop.uninstall()
    assert {s: signal.getsignal(s) for s in signals.STOP_SIGNALS} == before


def _replace_file(path, data):
    """Replace a checkpoint file AND its COMPLETE.json entry, as a crafted checkpoint would."""
    import hashlib
    with open(path, "wb") as f:
        f.write(data)
    marker = os.path.join(os.path.dirname(path), "COMPLETE.json")
    manifest = json.load(open(marker))
    entry = manifest["files"][os.path.basename(path)]
    entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    with open(marker, "w") as f:
        json.dump(manifest, f)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def _torch_bytes(obj):
    import io
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.mark.parametrize("name, data, why", [
    ("state.pt", lambda: _torch_bytes({"model": _Exploit()}), "holds a Python object"),
    ("rank-0000.pt", lambda: _torch_bytes(_Exploit()), "holds a Python object"),
    ("state.pt", lambda: b"not a torch file at all", "not a file written by torch.save"),
    ("state.pt", lambda: _torch_bytes([1, 2, 3]), "holds a list, not a dict"),
    ("state.pt", lambda: _torch_bytes({"epoch": 1, "elapsed_s": 0.0, "model": {}}), "has no 'optimizer'"),
    ("rank-0000.pt", lambda: _torch_bytes({"sampler": None}), "has no 'rng'"),
])
def test_crafted_file_is_not_a_valid_checkpoint(tmp_path, name, data, why):
    model, opt = _trained()
    path = os.path.join(_save(tmp_path, 1, model, opt), name)
    _replace_file(path, data())
    with pytest.raises(ClusterError) as err:
        ck.load_latest(SELF, str(tmp_path), FP)
    text = str(err.value)
    assert f"checkpoint file {path} is not a valid granndis checkpoint" in text and why in text, text
    assert "weights_only" not in text and "Weights only" not in text, text  # PyTorch's unsafe advice


class _Sampler:
    def __init__(self, seed):
        self.seed = seed

    def state_dict(self):
        return {"seed": self.seed, "key": np.arange(3, dtype=np.uint32)}

    def load_state_dict(self, state):
        if state["seed"] != self.seed:
            raise ValueError(f"sampler state {state} is not this sampler's")


def test_manager_restores_model_optimizer_sampler_rng_and_metrics(tmp_path):
    model, opt = _trained()
    manager = ck.CheckpointManager(SELF, str(tmp_path), FP, model, opt, torch.device("cpu"), sampler=_Sampler(3))
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps({"epoch": e, "loss": 1.0}) + "\n" for e in range(6))
    assert manager.save(4, elapsed_s=2.5) == cf.epoch_dir(tmp_path, 4)
    expected = torch.rand(3)  # the stream right after the checkpoint
    fresh, fresh_opt = _trained(seed=1)
    resumed = ck.CheckpointManager(SELF, str(tmp_path), FP, fresh, fresh_opt, torch.device("cpu"),
                                   sampler=_Sampler(3)).load(max_epoch=10)
    assert (resumed.epoch, resumed.elapsed_s, resumed.path) == (4, 2.5, cf.epoch_dir(tmp_path, 4))
    assert [r["epoch"] for r in resumed.records] == [0, 1, 2, 3]  # the metrics cursor
    assert [json.loads(line)["epoch"] for line in open(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3]
    assert torch.equal(torch.rand(3), expected)
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)
    assert fresh_opt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    with pytest.raises(ClusterError, match="beyond --epochs 3"):
        ck.CheckpointManager(SELF, str(tmp_path), FP, fresh, fresh_opt, torch.device("cpu")).load(max_epoch=3)
    with pytest.raises(ClusterError, match="sampler state .* is not this sampler's"):
        ck.CheckpointManager(SELF, str(tmp_path), FP, fresh, fresh_opt, torch.device("cpu"),
                             sampler=_Sampler(4)).load(max_epoch=10)
    # No checkpoint yet: start at epoch 0 (a job stopped before its first checkpoint).
    empty = tmp_path / "empty"
    empty.mkdir()
    start = ck.CheckpointManager(SELF, str(empty), FP, fresh, fresh_opt, torch.device("cpu")).load(max_epoch=10)
    assert (start.epoch, start.path, start.records) == (0, None, [])


def test_run_contents_and_move_aside(tmp_path):
    assert rd.run_contents(str(tmp_path)) == []
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "notes.txt").write_text("the user's own file")
    assert rd.run_contents(str(tmp_path)) == []  # an empty checkpoints/ holds nothing
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "checkpoints" / "epoch-000001").mkdir()
    assert rd.run_contents(str(tmp_path)) == ["config.json", "metrics.jsonl", "checkpoints/"]
    aside = rd.move_run_aside(str(tmp_path))
    assert os.path.dirname(aside) == str(tmp_path) and os.path.basename(aside).startswith(".")
    assert sorted(os.listdir(aside)) == ["checkpoints", "config.json", "metrics.jsonl"]
    assert rd.run_contents(str(tmp_path)) == [] and (tmp_path / "notes.txt").exists()
    assert rd.move_run_aside(str(tmp_path / "checkpoints")) is None


def test_replace_run_deletes_the_old_run_only_after_the_new_config(tmp_path):
    def old_run():
        (tmp_path / "config.json").write_text('{"lr": 0.01}')
        (tmp_path / "metrics.jsonl").write_text('{"epoch": 0}\n')
        os.makedirs(tmp_path / "checkpoints" / "epoch-000002")

    old_run()
    seen = {}

    def failing_write():
        seen["during"] = rd.run_contents(str(tmp_path))  # the old run is aside while the config is written
        raise OSError(28, "No space left on device")
    with pytest.raises(OSError, match="No space left"):
        rd.replace_run(str(tmp_path), failing_write)
    assert seen["during"] == []
    assert (tmp_path / "config.json").read_text() == '{"lr": 0.01}'  # moved back, whole
    assert rd.run_contents(str(tmp_path)) == ["config.json", "metrics.jsonl", "checkpoints/"]
    assert sorted(os.listdir(tmp_path)) == ["checkpoints", "config.json", "metrics.jsonl"]

    assert rd.replace_run(str(tmp_path), lambda: (tmp_path / "config.json").write_text('{"lr": 0.5}'))
    assert sorted(os.listdir(tmp_path)) == ["config.json"] and "0.5" in (tmp_path / "config.json").read_text()
    assert not rd.replace_run(str(tmp_path / "checkpoints"), lambda: None)  # nothing to replace

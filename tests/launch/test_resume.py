"""Kill and resume through the command line, under `mpirun -n 4` (2 servers x 2 ranks), real Cora.

Run A trains uninterrupted.  Run B gets SIGUSR1 on mpirun part-way (Open MPI 4.1's mpirun forwards
SIGUSR1 to every rank; SIGTERM aborts the job with exit status 1: test_mpirun_signals.py), stops with a
checkpoint and exit 0, and is continued with
`--resume RUN_DIR` alone; that continuation gets SIGTERM on ONE rank only (every rank must stop after
the same epoch), and is resumed again to the end.  Dropout is on, so B matches A only if every rank's
RNG state came back each time: the loss of every epoch and the final parameters and optimizer state
must equal A's.
"""
import json
import os
import shutil
import signal
import time

import pytest
import torch

from granndis_hpc.rundir import checkpoint as ck
from granndis_hpc.rundir import checkpoint_files as cf
from tests.conftest import require_planetoid, start_mpi

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")
EPOCHS, EVERY = 20, 10
TRAIN = ["--ranks-per-server", "2", "--layers", "2", "--hidden", "16", "--dropout", "0.5", "--lr", "0.01",
         "--epochs", str(EPOCHS), "--eval-every", "0", "--checkpoint-every", str(EVERY), "--quiet"]


def cora_shards(out, servers, gpus_per_server):
    """Real Cora, 2-layer full preload, METIS on this process: the shard set these CLI tests train on."""
    from mpi4py import MPI
    from granndis_hpc.preprocess.build.pipeline import build_shards
    from granndis_hpc.preprocess.sources import load

    graph = load("planetoid", name="cora", root=str(require_planetoid()))
    build_shards(graph, out, servers=servers, gpus_per_server=gpus_per_server, layers=2, preload="full",
                 partitioner="metis", comm=MPI.COMM_SELF)
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return cora_shards(tmp_path_factory.mktemp("resume") / "cora-2x2", 2, 2)


def _launch(args, log):
    return start_mpi(["-m", "granndis_hpc.cli", "train", *args], log)


def _run(args, tmp_path, name, timeout=120):
    with open(tmp_path / f"{name}.log", "w+") as log:
        proc = _launch(args, log)
        rc = proc.wait(timeout=timeout)
        log.seek(0)
        return rc, log.read()


def _metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _wait_for_epochs(proc, run_dir, epochs, timeout=240):
    path = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "training ended before it could be interrupted"
        if os.path.exists(path):
            with open(path) as f:
                if sum(1 for _ in f) >= epochs:
                    return
        time.sleep(0.02)
    raise AssertionError(f"{path} did not reach {epochs} epochs in {timeout} s")


def _interrupted(args, tmp_path, name, send, after, run_dir=None):
    """Launch, wait until metrics.jsonl holds `after` + 3 epochs, call send(proc), wait for the end;
    returns (exit status, output)."""
    run_dir = args[args.index("--out") + 1] if run_dir is None else run_dir
    with open(tmp_path / f"{name}.log", "w+") as log:
        proc = _launch(args, log)
        try:
            _wait_for_epochs(proc, run_dir, after + 3)
            send(proc)
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        log.seek(0)
        return rc, log.read()


def _rank_pids(mpirun_pid):
    """{world rank: pid} of mpirun's children (the ranks, launched locally)."""
    ranks = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != mpirun_pid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except (OSError, ValueError, IndexError):
            continue
        if b"OMPI_COMM_WORLD_RANK" in env:
            ranks[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(entry)
    return ranks


def _final_state(run_dir):
    info = cf.latest_complete(str(run_dir))
    assert info is not None and info.epoch == EPOCHS
    return ck.read_payload(info.path, info.manifest["files"][cf.SHARED_FILE])


@pytest.fixture(scope="module")
def uninterrupted(shards, tmp_path_factory):
    run_a = tmp_path_factory.mktemp("run") / "a"
    rc, log = _run(["--shards", shards, "--out", run_a, *TRAIN], run_a.parent, "a")
    assert rc == 0, log
    return run_a


def _term_rank_3(proc):
    """SIGTERM to ONE rank process (not to mpirun): the others learn of it only through the trainer's
    per-epoch max-reduction of the stop flag."""
    pids = _rank_pids(proc.pid)
    assert sorted(pids) == [0, 1, 2, 3], pids
    os.kill(pids[3], signal.SIGTERM)


def _check_stopped(run_dir, log, after=0):
    """A clean stop: exit 0 was checked by the caller; a complete 4-rank checkpoint at the epoch every
    rank stopped after, metrics up to it, no summary."""
    stopped = cf.latest_complete(str(run_dir))
    assert stopped is not None and after + 3 <= stopped.epoch < EPOCHS, log
    assert f"stopped after {stopped.epoch} epochs" in log and f"--resume {run_dir}" in log, log
    assert sorted(stopped.manifest["files"]) == ["rank-0000.pt", "rank-0001.pt", "rank-0002.pt", "rank-0003.pt",
                                                 "state.pt"]
    assert [r["epoch"] for r in _metrics(run_dir)] == list(range(stopped.epoch))
    assert not (run_dir / "summary.json").exists(), "a stopped run must not look finished"
    return stopped.epoch


def test_stop_and_resume_twice_repeats_the_uninterrupted_run(shards, uninterrupted, tmp_path):
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs /proc to find the rank processes")
    run_b = tmp_path / "b"
    # 1. SIGUSR1 to mpirun, which forwards it to every rank.
    rc, log = _interrupted(["--shards", shards, "--out", run_b, *TRAIN], tmp_path, "b1",
                           lambda proc: proc.send_signal(signal.SIGUSR1), after=0)
    assert rc == 0, log
    first = _check_stopped(run_b, log)
    # 2. `--resume RUN_DIR` and nothing else; SIGTERM to rank 3 only, part-way.
    rc, log = _interrupted(["--resume", run_b], tmp_path, "b2", _term_rank_3, after=first, run_dir=run_b)
    assert rc == 0, log
    second = _check_stopped(run_b, log, after=first)
    # 3. Resume to the end.
    rc, log = _run(["--resume", run_b], tmp_path, "b3")
    assert rc == 0, log

    a, b = _metrics(uninterrupted), _metrics(run_b)
    assert [r["epoch"] for r in b] == list(range(EPOCHS))  # appended, no duplicates
    worst = max(abs(ra["loss"] - rb["loss"]) for ra, rb in zip(a, b))
    assert worst <= 1e-6, f"loss trajectories differ by {worst}"
    assert len({round(r["loss"], 6) for r in a}) > EPOCHS // 2  # training moved (not a constant loss)
    with open(run_b / "summary.json") as f:
        assert json.load(f)["epochs"] == EPOCHS
    # Final parameters and optimizer state, from the checkpoint each run wrote after its last epoch.
    sa, sb = _final_state(uninterrupted), _final_state(run_b)
    for name, ta in sa["model"].items():
        assert torch.allclose(ta, sb["model"][name], rtol=0, atol=1e-6), name
    for key, st in sa["optimizer"]["torch"]["state"].items():
        for field in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(st[field], sb["optimizer"]["torch"]["state"][key][field], rtol=0, atol=1e-6)
    # Only the newest two complete checkpoints are kept (older stop and periodic ones were pruned).
    newest_two = sorted({first, second, EVERY, EPOCHS})[-2:]
    assert [(e, c) for e, _, c in cf.list_checkpoints(str(run_b))] == [(e, True) for e in newest_two]


def _snapshot(run_dir):
    """{relative path: bytes} of every file under RUN_DIR."""
    out = {}
    for root, _, files in os.walk(run_dir):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, run_dir)] = f.read()
    return out


SHORT = ["--ranks-per-server", "2", "--layers", "2", "--hidden", "16", "--epochs", "4", "--eval-every", "0", "--quiet"]


@pytest.fixture(scope="module")
def short_run(shards, tmp_path_factory):
    """A finished 4-epoch run with checkpoints at epochs 2 and 4 (and a learning rate that is not the
    default, so a resume that read no options would differ); each test works on its own copy."""
    base = tmp_path_factory.mktemp("short")
    run = base / "run"
    rc, log = _run(["--shards", shards, "--out", run, *SHORT, "--lr", "0.02", "--checkpoint-every", "2"], base,
                   "first")
    assert rc == 0, log
    return run


def _copy(run, tmp_path, name):
    shutil.copytree(run, tmp_path / name)
    return tmp_path / name


def test_new_run_in_a_run_directory_is_refused_and_overwrite_replaces_it(shards, short_run, tmp_path):
    """Defect: a second run with the same --out overwrote config.json and metrics.jsonl, kept the old
    checkpoints, and pruning then deleted the new run's."""
    run = _copy(short_run, tmp_path, "a")
    before = _snapshot(run)
    assert "checkpoints/epoch-000004/COMPLETE.json" in before and "summary.json" in before

    again = ["--shards", shards, "--out", run, *SHORT, "--lr", "0.05", "--seed", "3", "--checkpoint-every", "1"]
    rc, log = _run(again, tmp_path, "again")
    assert rc != 0, log
    assert f"run directory {run} already holds a run" in log and f"--resume {run}" in log
    assert "--overwrite-run" in log and "Traceback" not in log
    assert _snapshot(run) == before  # nothing of the old run was touched

    rc, log = _run([*again, "--overwrite-run"], tmp_path, "overwrite")
    assert rc == 0, log
    with open(run / "config.json") as f:
        config = json.load(f)
    assert (config["lr"], config["seed"]) == (0.05, 3)
    assert [(e, c) for e, _, c in cf.list_checkpoints(str(run))] == [(3, True), (4, True)]  # the new run's
    assert cf.latest_complete(str(run)).manifest["fingerprint"]["lr"] == 0.05
    assert [r["epoch"] for r in _metrics(run)] == [0, 1, 2, 3]
    # The old run is gone (no hidden aside directory); .lock names the run directory's holder (rundir/lock.py).
    assert not [n for n in os.listdir(run) if n.startswith(".") and n != ".lock"], os.listdir(run)


def test_resume_of_a_run_without_checkpoint_restarts_it(short_run, tmp_path):
    """What a Slurm job requeued before its first checkpoint does (slurm/train.sbatch adds --resume):
    its own unfinished run starts again from epoch 0 with the run's options."""
    run = _copy(short_run, tmp_path, "r")
    # As if killed after 2 epochs, before any checkpoint.
    shutil.rmtree(run / "checkpoints")
    os.unlink(run / "summary.json")
    with open(run / "metrics.jsonl") as f:
        lines = f.readlines()
    with open(run / "metrics.jsonl", "w") as f:
        f.writelines(lines[:2])
    rc, log = _run(["--resume", run], tmp_path, "restart")
    assert rc == 0, log
    assert "holds no complete checkpoint: starting from epoch 0" in log
    assert [r["epoch"] for r in _metrics(run)] == [0, 1, 2, 3]
    assert [r["loss"] for r in _metrics(run)] == [json.loads(line)["loss"] for line in lines]  # same run again


def test_crafted_state_file_is_refused_with_one_clear_message(short_run, tmp_path):
    """Defect: a crafted state.pt (its COMPLETE.json entry updated to match) was refused with a traceback
    and PyTorch's text advising weights_only=False, the unsafe option."""
    import hashlib
    import io

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    run = _copy(short_run, tmp_path, "c")
    info = cf.latest_complete(str(run))
    buf = io.BytesIO()
    torch.save({"epoch": 4, "elapsed_s": 0.0, "model": Exploit(), "optimizer": {}}, buf)
    data = buf.getvalue()
    with open(os.path.join(info.path, cf.SHARED_FILE), "wb") as f:
        f.write(data)
    manifest = dict(info.manifest)
    manifest["files"][cf.SHARED_FILE].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    with open(os.path.join(info.path, cf.COMPLETE), "w") as f:
        json.dump(manifest, f)
    rc, log = _run(["--resume", run, "--epochs", "6"], tmp_path, "crafted")
    assert rc == 1, log
    state = os.path.join(info.path, cf.SHARED_FILE)
    assert f"checkpoint file {state} is not a valid granndis checkpoint" in log, log
    assert "weights_only" not in log and "Traceback" not in log, log
    assert not (tmp_path / "pwned").exists()

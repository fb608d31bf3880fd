"""`make test-slurm`: the real slurm/train.sbatch under a real Slurm 22.05 on two emulated servers
(slurm/testing/slurmcluster.py, cred_expire 10 s, KillWait 15 s), in the ways jobs end on a cluster:

- a time-limited job: Slurm's --signal=B:USR1@60 warning, checkpoint, self-requeue, resume, as many
  times as it takes; the losses must equal the uninterrupted run's, epoch for epoch;
- a stop signal while the ranks are still setting up: honoured, no requeue loop;
- a time limit too short to make progress: stops with the reason instead of requeueing forever;
- plain `scancel`, `scancel --signal=TERM --batch`, `scontrol requeue` of a running job;
- a job that fails in every attempt: it stops.
Every interrupted run is then finished (by Slurm's requeue or a new job on its run directory) and must
equal the uninterrupted run.  Measurements go to $GRANNDIS_SLURM_RESULTS (default
bench-out/slurm/results.json); docs/slurm-scenarios.md reports them.  ~10 minutes on 2 busy cores."""
import json
import os
import re
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests import slurm_real as sr

CPU_FORM = ["--nodes=2", "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1"]
EPOCHS = 60
TRAIN = ["--epochs", str(EPOCHS), "--hidden", "64", "--dropout", "0.5", "--eval-every", "0"]
RESULTS = Path(os.environ.get("GRANNDIS_SLURM_RESULTS", REPO / "bench-out" / "slurm" / "results.json"))
pytestmark = pytest.mark.timeout(900)


def _seconds(clock):
    """'1:23' / '01:02:03' / '15:37:47' -> seconds."""
    total = 0
    for part in clock.split(":"):
        total = total * 60 + int(part)
    return total


def record(name, **values):
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[name] = values
    RESULTS.write_text(json.dumps(data, indent=1, sort_keys=True))


@pytest.fixture(scope="module")
def cluster():
    with sr.slurm_cluster(cred_expire=10, kill_wait=15) as info:
        record("cluster", setup_s=info["setup_s"], nodes=2, cpus_per_node=4, cred_expire_s=10, kill_wait_s=15)
        yield info


@pytest.fixture(scope="module")
def shards(cluster, tmp_path_factory):
    return sr.preprocess(tmp_path_factory.mktemp("slurm"), layers=2)


@pytest.fixture(scope="module")
def reference(shards, tmp_path_factory):
    """The uninterrupted run: the same options under a plain mpirun."""
    out = tmp_path_factory.mktemp("ref") / "run"
    t0 = time.monotonic()
    sr.plain_mpirun(["--shards", str(shards), "--mode", "flx", "--model", "sage", "--layers", "2", *TRAIN], out)
    record("reference", seconds=round(time.monotonic() - t0, 1), epochs=EPOCHS)
    losses = sr.losses(out)
    assert len(losses) == EPOCHS
    return losses


def train_job(shards, run_dir, log, sbatch_args=(), args=(), **env):
    return sr.submit(REPO / "slurm" / "train.sbatch", [*CPU_FORM, *sbatch_args], [*TRAIN, *args],
                     env=sr.job_env(GRANNDIS_SHARDS=shards, GRANNDIS_RUN_DIR=run_dir, **env), log=log)


def finish_in_new_job(shards, run_dir, tmp_path, reference):
    """Continue an interrupted run with a new job on its run directory; it must end equal to the
    uninterrupted run."""
    log = tmp_path / "continue.out"
    info = sr.wait(train_job(shards, run_dir, log), 400)
    text = log.read_text(errors="replace")
    assert info["JobState"] == "COMPLETED", (info, text[-3000:])
    assert "--resume" in text
    assert sr.losses(run_dir) == reference
    return text


def _check_requeues(text, restarts):
    """The self-requeues the log shows; each next attempt started only after cred_expire (10 s) + 1 s."""
    requeues = re.findall(r"checkpoint of epoch (\d+) \(this attempt: epoch (\d+) -> (\d+)\)", text)
    assert len(requeues) == restarts, text[-4000:]
    requeued_at = [_seconds(t) for t in re.findall(r"requeueing job \d+ at (\S+) UTC", text)]
    started_at = [_seconds(t) for t in re.findall(r"attempt \d+ started at (\S+) UTC", text)]
    waits = [(b - a) % 86400 for a, b in zip(requeued_at, started_at[1:])]
    assert len(waits) == restarts and all(w >= 10 for w in waits), (requeued_at, started_at)
    return [int(b) - max(int(a), 0) for _, a, b in requeues], waits


def test_time_limit_warnings_requeue_and_resume_to_the_uninterrupted_run(shards, reference, tmp_path):
    """The time-limit warning, twice, at chosen moments: `scancel --signal=USR1 --batch` is what
    --signal=B:USR1@T sends (to the batch shell only).  Each time the ranks checkpoint, the job requeues
    itself and resumes; the losses must equal the uninterrupted run's, epoch for epoch (dropout on: every
    rank's RNG state must come back too)."""
    run_dir, log = tmp_path / "run", tmp_path / "job.out"
    t0 = time.monotonic()
    job = train_job(shards, run_dir, log)
    for k in (1, 2):
        _running_epochs(run_dir, job, 15 * k)  # this attempt is training
        sr.signal_job(job, "USR1", batch=True)
        deadline = time.monotonic() + 120
        while int(sr.job_info(job).get("Restarts", 0)) < k:
            assert time.monotonic() < deadline, (sr.job_info(job), log.read_text(errors="replace")[-3000:])
            time.sleep(0.2)
    info = sr.wait(job, 400)
    text = log.read_text(errors="replace")
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, text[-4000:])
    assert int(info["Restarts"]) == 2, text[-4000:]
    epochs, waits = _check_requeues(text, 2)
    assert all(e > 0 for e in epochs)
    assert sr.losses(run_dir) == reference
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == EPOCHS and summary["hosts"] == ["slurm-s0", "slurm-s1"]
    record("warning_requeues", restarts=2, epochs_per_attempt=epochs, requeue_to_restart_s=waits,
           wall_s=round(time.monotonic() - t0, 1), losses_equal=True)


def _times_left_at_signal(text):
    """The job's time left at each SIGUSR1 that train.sbatch logged ("got SIGUSR1 at ... (time left: T)")."""
    return re.findall(r"got SIGUSR1 at \S+ UTC \(time left: (\S+)\)", text)


def test_real_time_limit(shards, reference, tmp_path):
    """A real time limit with the script's warning (--time=2:00, --signal=B:USR1@60): the job ends
    COMPLETED with the uninterrupted run's losses, however many attempts the load on this machine made
    it take; the warning comes at least the asked 60 s before the limit (slurm/README.md: up to a
    minute earlier), and every self-requeue waits cred_expire + 1 s."""
    run_dir, log = tmp_path / "run", tmp_path / "job.out"
    t0 = time.monotonic()
    job = train_job(shards, run_dir, log, ["--time=00:02:00", "--signal=B:USR1@60"])
    info = sr.wait(job, 840)
    text = log.read_text(errors="replace")
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, text[-4000:])
    restarts = int(info["Restarts"])
    left = [_seconds(t) for t in _times_left_at_signal(text)]
    assert all(t >= 60 for t in left), left  # (a fast machine may finish before the first warning)
    epochs, waits = _check_requeues(text, restarts)
    assert sr.losses(run_dir) == reference
    record("time_limit", restarts=restarts, epochs_per_attempt=epochs, requeue_to_restart_s=waits,
           time_left_at_signal_s=left, wall_s=round(time.monotonic() - t0, 1), losses_equal=True)


def test_stop_signal_during_set_up_is_honoured_and_not_requeued(shards, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "job.out"
    job = train_job(shards, run_dir, log)
    sr.wait_for_ranks(job, 4, 120)  # the ranks run and catch SIGUSR1: they are importing torch now
    sr.signal_job(job, "USR1", batch=True)  # what --signal=B:USR1@T does
    info = sr.wait(job, 180)
    text = log.read_text(errors="replace")
    assert int(info["Restarts"]) == 0, text[-4000:]
    assert "during set-up: stopped before training" in text, text[-4000:]
    assert "made no progress in this attempt" in text and "not requeued" in text
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "3:0", info
    assert "User defined signal 1" not in text  # no rank was killed by it
    record("signal_during_set_up", state=info["JobState"], exit=info["ExitCode"], restarts=0)


def test_time_limit_too_short_for_progress_stops(shards, tmp_path):
    """--signal lead >= the time limit: the warning comes at once, every attempt: one requeue at most
    (after the progress of the first attempt), then a stop with the reason."""
    run_dir, log = tmp_path / "run", tmp_path / "job.out"
    t0 = time.monotonic()
    job = train_job(shards, run_dir, log, ["--time=00:01:00", "--signal=B:USR1@120"])
    info = sr.wait(job, 600)
    text = log.read_text(errors="replace")
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "3:0", (info, text[-4000:])
    assert int(info["Restarts"]) <= 2 and "made no progress in this attempt" in text, text[-4000:]
    record("time_limit_too_short", restarts=int(info["Restarts"]), wall_s=round(time.monotonic() - t0, 1),
           time_left_at_signal=_times_left_at_signal(text))


def _running_epochs(run_dir, job, epochs, timeout_s=240):
    path = Path(run_dir) / "metrics.jsonl"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= epochs:
            return
        assert sr.job_info(job).get("JobState") in ("PENDING", "RUNNING", "CONFIGURING"), sr.job_info(job)
        time.sleep(0.2)
    raise AssertionError(f"{path}: fewer than {epochs} epochs in {timeout_s} s")


def test_scancel_signal_term_batch_checkpoints(shards, reference, tmp_path):
    """scancel --signal=TERM --batch: the batch shell passes SIGUSR1 on (passing SIGTERM,
    srun would kill every rank: no checkpoint, FAILED 137)."""
    run_dir, log = tmp_path / "run", tmp_path / "job.out"
    job = train_job(shards, run_dir, log)
    _running_epochs(run_dir, job, 10)
    sr.signal_job(job, "TERM", batch=True)
    info = sr.wait(job, 180)
    text = log.read_text(errors="replace")
    assert "got SIGTERM" in text and "passing SIGUSR1" in text
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, text[-4000:])
    m = re.search(r"stopped after (\d+) epochs with a checkpoint", text)
    assert m and not (run_dir / "summary.json").exists(), text[-4000:]
    finish_in_new_job(shards, run_dir, tmp_path, reference)
    record("scancel_term_batch", state=info["JobState"], exit=info["ExitCode"], checkpoint_epoch=int(m.group(1)),
           resumed_equal=True)


def test_plain_scancel(shards, reference, tmp_path):
    """scancel: SIGTERM to every process of the job (srun too, which then kills the step), SIGKILL
    after KillWait.  The job ends CANCELLED; whatever it left, a new job on its run directory finishes
    it to the uninterrupted run."""
    run_dir, log = tmp_path / "run", tmp_path / "job.out"
    job = train_job(shards, run_dir, log, args=["--checkpoint-every", "10"])
    _running_epochs(run_dir, job, 15)
    t0 = time.monotonic()
    sr.sc.run(["scancel", str(job)])
    info = sr.wait(job, 120)
    ended_s = round(time.monotonic() - t0, 1)
    text = log.read_text(errors="replace")
    assert info["JobState"] == "CANCELLED", (info, text[-4000:])
    stopped = re.search(r"stopped after (\d+) epochs with a checkpoint", text)
    finish_in_new_job(shards, run_dir, tmp_path, reference)
    record("scancel", state=info["JobState"], ended_after_s=ended_s,
           stop_checkpoint_epoch=int(stopped.group(1)) if stopped else None,
           step_killed="forcing job termination" in text or "Killed" in text, resumed_equal=True)


def test_scontrol_requeue_of_a_running_job_resumes(shards, reference, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "job.out"
    job = train_job(shards, run_dir, log, args=["--checkpoint-every", "10"])
    _running_epochs(run_dir, job, 15)
    t0 = time.monotonic()
    sr.sc.run(["scontrol", "requeue", str(job)])
    info = sr.wait(job, 600, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"))
    text = log.read_text(errors="replace")
    # a requeued job may be held back once more by Slurm ("JobHeldAdmin") on some versions: not here
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 1, (info, text[-4000:])
    assert "--resume" in text.split("restart 1")[-1] or "resuming from" in text, text[-4000:]
    assert sr.losses(run_dir) == reference
    record("scontrol_requeue", restarts=1, wall_after_requeue_s=round(time.monotonic() - t0, 1),
           stop_checkpoint=bool(re.search(r"stopped after \d+ epochs with a checkpoint", text)), losses_equal=True)


def test_job_failing_every_attempt_stops(shards, tmp_path):
    """Broken input, --requeue in the script and a time limit that signals: the job fails once and
    stops (Slurm requeues only node failures and preemption; the script only after progress)."""
    bad = tmp_path / "bad-shards"
    bad.mkdir()
    (bad / "manifest.json").write_text('{"layers": 2, "format_version": 999}')
    run_dir, log = tmp_path / "run", tmp_path / "job.out"
    job = train_job(bad, run_dir, log, ["--time=00:01:00", "--signal=B:USR1@120"])
    info = sr.wait(job, 240)
    time.sleep(15)  # a requeue would show within cred_expire + 1 s
    info = sr.job_info(job)
    text = log.read_text(errors="replace")
    assert info["JobState"] == "FAILED" and int(info["Restarts"]) == 0, (info, text[-4000:])
    assert not re.search(r"granndis slurm: requeueing", text) and "not requeueing job" in text
    record("failing_job", state=info["JobState"], exit=info["ExitCode"], restarts=int(info["Restarts"]))


def test_pmi2_with_debian_open_mpi_fails_with_the_reason(shards, tmp_path):
    """Debian's Open MPI has no PMI2 support: the job fails at once, and the log says why and
    what to set instead."""
    run_dir, log = tmp_path / "run", tmp_path / "job.out"
    job = train_job(shards, run_dir, log, GRANNDIS_SRUN_MPI="pmi2")
    info = sr.wait(job, 180)
    text = log.read_text(errors="replace")
    assert info["JobState"] == "FAILED", (info, text[-4000:])
    assert "not built with SLURM's PMI support" in text, text[-4000:]
    assert "cannot start under srun --mpi=pmi2" in text and "GRANNDIS_SRUN_MPI=pmix" in text
    job = train_job(shards, run_dir, log, GRANNDIS_SRUN_MPI="pmi7")
    info = sr.wait(job, 60)
    assert info["JobState"] == "FAILED" and "no 'pmi7' MPI plugin" in log.read_text(errors="replace")
    record("pmi2", state=info["JobState"], message="OMPI was not built with SLURM's PMI support")

"""Helpers for the tests that submit the real slurm/*.sbatch to a real Slurm (slurm/testing/slurmcluster.py)
on the emulated servers: the cluster fixture, submitting, waiting, reading job logs and runs.

Skipped, with the reason, where the cluster cannot exist (not root, no namespaces, Slurm not installed:
`make setup` installs it where root)."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import MPI_ENV, REPO

import slurmcluster as sc  # noqa: E402  (slurm/testing is on pytest's pythonpath: pyproject.toml)

LOCK = "/tmp/granndis-emu-slurm.lock"   # one Slurm test cluster at a time on this machine
PLANETOID = REPO / "tests" / "data" / "planetoid"


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def slurm_cluster(cpus=4, cred_expire=10, kill_wait=15, lock_timeout_s=600):
    """A 2-node Slurm for the duration of the block; torn down after, also on failure or SIGTERM."""
    with instance_environment():
        try:
            sc.preflight()
        except sc.emu.EmuError as exc:
            pytest.skip(f"no real Slurm cluster here: {exc}")
        with _locked_cluster(cpus, cred_expire, kill_wait, lock_timeout_s) as info:
            yield info


@contextlib.contextmanager
def instance_environment():
    """slurmcluster points emucluster at its instance through the environment: undo that afterwards, so
    that other tests in this process see the default instance."""
    keys = (sc.emu.ENV_INSTANCE, sc.emu.ENV_SUBNET, sc.emu.ENV_STATE_DIR)
    before = {k: os.environ.get(k) for k in keys}
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _locked_cluster(cpus, cred_expire, kill_wait, lock_timeout_s):
    with open(LOCK, "w") as lock:
        deadline = time.monotonic() + lock_timeout_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"{LOCK} held for {lock_timeout_s} s by another Slurm test cluster")
                time.sleep(0.5)
        previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
        try:
            info = sc.setup(servers=2, cpus=cpus, cred_expire=cred_expire, kill_wait=kill_wait, quiet=True)
            yield info
        finally:
            sc.teardown(quiet=True)
            for s, h in previous.items():
                signal.signal(s, h)


def job_env(**extra):
    """The submitting shell's environment (sbatch passes it on): the checkout's venv first on PATH, no
    emulated-server setting (the job must find its servers itself)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GRANNDIS_", "SLURM_", "OMPI_COMM_", "PMIX_"))}
    env["PATH"] = f"{REPO / '.venv' / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in extra.items() if v is not None})
    return env


def submit(script, sbatch_args=(), args=(), env=None, cwd=REPO, log=None):
    """sbatch [sbatch_args] slurm/SCRIPT [args]; returns the job id.  The job log goes to `log`."""
    words = ["sbatch", "--parsable", *([f"--output={log}"] if log else []), *sbatch_args, str(script), *args]
    p = sc.run(words, env=env, cwd=str(cwd))
    return int(p.stdout.strip().split(";")[0])


def wait(job_id, timeout_s, states=sc.FINAL_STATES):
    return sc.wait_job(job_id, timeout_s, states)


def wait_for_log(path, pattern, timeout_s, job_id=None):
    """Wait until the job log matches `pattern` (regex); returns the log text."""
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = Path(path).read_text(errors="replace") if Path(path).exists() else ""
        if re.search(pattern, text):
            return text
        if job_id is not None and sc.job_info(job_id).get("JobState") in sc.FINAL_STATES:
            break
        time.sleep(0.2)
    raise AssertionError(f"{path} did not show {pattern!r} within {timeout_s} s:\n{text[-3000:]}")


def signal_job(job_id, sig, batch=False):
    sc.run(["scancel", f"--signal={sig}", *(["--batch"] if batch else []), str(job_id)])


def losses(run_dir):
    with open(Path(run_dir) / "metrics.jsonl") as f:
        return [json.loads(line)["loss"] for line in f]


def logged_train_args(log_text):
    """The granndis-train words of the last `running: srun ... granndis-train ...` line of a job log."""
    lines = [ln for ln in log_text.splitlines() if ln.startswith("granndis slurm: running: ")]
    assert lines, log_text[-3000:]
    words = lines[-1][len("granndis slurm: running: "):].split()
    return words[words.index("granndis-train") + 1:]


def plain_mpirun(train_args, out, timeout_s=300):
    """The same training under a plain `mpirun -n 4` on this machine (2 emulated servers x 2 ranks)."""
    args = list(train_args)
    for flag in ("--out", "--resume"):
        while flag in args:
            i = args.index(flag)
            del args[i:i + 2]
    cmd = ["mpirun", "-n", "4", str(REPO / ".venv" / "bin" / "granndis-train"), *args, "--out", str(out)]
    env = dict(job_env(), **MPI_ENV, GRANNDIS_RANKS_PER_SERVER="2")
    p = subprocess.run(["timeout", "--kill-after=10", str(timeout_s), *cmd], cwd=REPO, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def preprocess(tmp, layers=2, timeout_s=180, cwd=REPO):
    """preprocess.sbatch with its own resource defaults: Cora shards for 2 servers x 2."""
    shards, log = tmp / "shards", tmp / "preprocess.out"
    job = submit(REPO / "slurm" / "preprocess.sbatch",
                 args=["--source", "planetoid", "--name", "cora", "--root", str(PLANETOID)],
                 env=job_env(GRANNDIS_SERVERS=2, GRANNDIS_GPUS_PER_SERVER=2, GRANNDIS_LAYERS=layers,
                             GRANNDIS_SHARDS=shards), log=log, cwd=cwd)
    info = wait(job, timeout_s)
    assert info["JobState"] == "COMPLETED", (info, log.read_text(errors="replace")[-3000:])
    return shards


def _environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError:
        return {}


def catches_usr1(pid):
    """Has the process a handler for SIGUSR1 (/proc/PID/status SigCgt)?"""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    except (OSError, StopIteration):
        return False
    return bool(int(caught, 16) >> (signal.SIGUSR1 - 1) & 1)


def rank_pids(job_id):
    """{task rank: pid} of a job's granndis-train ranks (they run in the emulated servers' namespaces,
    in this machine's process table)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        env = _environ(entry)
        if env.get(b"SLURM_JOB_ID") != str(job_id).encode() or b"SLURM_PROCID" not in env:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"granndis-train" in cmd or b"granndis_hpc" in cmd:
            out[int(env[b"SLURM_PROCID"])] = int(entry)
    return out


def wait_for_ranks(job_id, n, timeout_s, handler=True):
    """Wait until the job's n ranks run (and, with handler, catch SIGUSR1); returns their pids."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = rank_pids(job_id)
        if len(pids) == n and (not handler or all(map(catches_usr1, pids.values()))):
            return pids
        time.sleep(0.01)
    raise AssertionError(f"job {job_id}: {n} ranks not running within {timeout_s} s (found {rank_pids(job_id)})")


job_info = sc.job_info

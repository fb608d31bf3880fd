"""slurm/*.sbatch run under plain bash with SLURM_* variables set and srun/mpirun/scontrol/module replaced
by fakes on PATH that record their argv: checks the launched command, resume, requeue and errors.
No Slurm, no network."""
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from tests.conftest import REPO

SLURM = REPO / "slurm"
SCRIPTS = ["train.sbatch", "preprocess.sbatch", "lib.sh"]

FAKE_LAUNCHER = r"""#!/bin/bash
# Records argv (NUL-separated) and the environment the ranks would see; optionally waits for a signal.
# `srun --mpi=list` and `scontrol show job` answer as Slurm 22.05 does and are not recorded.
name="$(basename "$0")"
log="$FAKE_LOG/$name"
if [ "$name" = srun ] && [ "${1:-}" = --mpi=list ]; then
    printf 'MPI plugin types are...\n\tpmix\n\tnone\n\tcray_shasta\n\tpmi2\n'
    printf 'specific pmix plugin versions available: pmix_v4\n'
    exit 0
fi
if [ "$name" = scontrol ] && [ "${1:-}" = show ]; then
    [ -n "${FAKE_COMMAND:-}" ] && echo "JobId=$SLURM_JOB_ID JobName=x Command=$FAKE_COMMAND WorkDir=/w"
    exit 0
fi
printf '%s\0' "$@" > "$log.argv"
env > "$log.env"
[ -n "${FAKE_STDERR:-}" ] && echo "$FAKE_STDERR" >&2
if [ -n "${FAKE_WAIT_FOR_SIGNAL:-}" ] && [ "$name" != scontrol ]; then
    sleep 30 & sleeper=$!
    # FAKE_PROGRESS=DIR: the ranks write a complete checkpoint of epoch 10 when they stop (progress made)
    checkpoint() { [ -n "${FAKE_PROGRESS:-}" ] && mkdir -p "$FAKE_PROGRESS/checkpoints/epoch-000010" && \
                   echo '{}' > "$FAKE_PROGRESS/checkpoints/epoch-000010/COMPLETE.json"; }
    trap 'echo USR1 >> "$log.signals"; [ -e "${GRANNDIS_STOP_FILE:-/nonexistent}" ] && touch "$log.stopfile"
          checkpoint; kill $sleeper; exit ${FAKE_RC:-0}' USR1
    trap 'echo TERM >> "$log.signals"; kill $sleeper; exit 143' TERM
    touch "$log.ready"
    wait $sleeper
    exit 99
fi
exit "${FAKE_RC:-0}"
"""
FAKE_MODULE = """#!/bin/bash
echo "$*" >> "$FAKE_LOG/module.calls"
"""


@pytest.fixture
def job(tmp_path):
    """A fake job: bin dir with the fakes first on PATH, a log dir, a clean environment, cwd = submit dir."""
    fakebin, log, work = tmp_path / "bin", tmp_path / "log", tmp_path / "work"
    for d in (fakebin, log, work):
        d.mkdir()
    for name in ("srun", "mpirun", "scontrol"):
        (fakebin / name).write_text(FAKE_LAUNCHER)
    (fakebin / "module").write_text(FAKE_MODULE)
    for f in fakebin.iterdir():
        f.chmod(0o755)
    (work / "shards" / "cora").mkdir(parents=True)  # what preprocess.sbatch leaves: the manifest's depth
    (work / "shards" / "cora" / "manifest.json").write_text('{"layers": 3, "servers": 2}')
    env = {"PATH": f"{fakebin}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C", "FAKE_LOG": str(log),
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "granndis-train", "SLURM_NNODES": "2",
           "SLURM_NTASKS_PER_NODE": "2", "SLURM_NTASKS": "4", "SLURM_CPUS_PER_TASK": "3",
           "SLURM_SUBMIT_DIR": str(work), "GRANNDIS_SHARDS": "shards/cora", "GRANNDIS_SIGNAL_GRACE_S": "0"}
    return {"env": env, "log": log, "work": work, "tmp": tmp_path}


def run_script(job, script, *args, **env):
    full_env = {k: v for k, v in {**job["env"], **env}.items() if v is not None}
    script_path = script if os.path.isabs(str(script)) else SLURM / script
    return subprocess.run(["bash", str(script_path), *args], cwd=job["work"], env=full_env,
                          capture_output=True, text=True, timeout=60)


def recorded(job, name):
    path = job["log"] / f"{name}.argv"
    if not path.exists():
        return None
    return path.read_bytes().decode().split("\0")[:-1]


def recorded_env(job, name):
    lines = (job["log"] / f"{name}.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def split_at(argv, program):
    i = argv.index(program)
    return argv[:i], argv[i + 1:]


def options(words):
    """['--a', '1', '--b', '2'] -> {'--a': '1', '--b': '2'} (checks that every option has one value)."""
    assert len(words) % 2 == 0 and all(w.startswith("--") for w in words[::2]), words
    return dict(zip(words[::2], words[1::2]))


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", str(SLURM / script)], check=True)


def test_sbatch_directives():
    text = (SLURM / "train.sbatch").read_text()
    for directive in ("--requeue", "--signal=B:USR1@120", "--ntasks-per-node=", "--gpus-per-node="):
        assert f"#SBATCH {directive}" in text, directive
    assert "#SBATCH --ntasks-per-node=" in (SLURM / "preprocess.sbatch").read_text()


@pytest.mark.parametrize("nodes, per_node, give_per_node", [(2, 2, True), (4, 4, True), (2, 4, False)])
def test_train_srun_command(job, nodes, per_node, give_per_node):
    res = run_script(job, "train.sbatch", "--lr", "0.005", SLURM_NNODES=str(nodes),
                     SLURM_NTASKS=str(nodes * per_node),
                     SLURM_NTASKS_PER_NODE=str(per_node) if give_per_node else None)
    assert res.returncode == 0, res.stderr
    launcher, train = split_at(recorded(job, "srun"), "granndis-train")
    assert launcher == ["--mpi=pmix", f"--nodes={nodes}", f"--ntasks={nodes * per_node}",
                        f"--ntasks-per-node={per_node}", "--distribution=block:block", "--kill-on-bad-exit=1",
                        "--cpus-per-task=3"]
    assert options(train) == {"--shards": "shards/cora", "--mode": "flx", "--model": "sage", "--layers": "3",
                              "--hidden": "64", "--epochs": "200", "--out": "runs/granndis-train-4242",
                              "--device": "auto", "--lr": "0.005"}
    assert train[-2:] == ["--lr", "0.005"]  # extra flags last, so they override the script's
    env = recorded_env(job, "srun")
    # Real nodes: the ranks find the servers themselves (not forced, which would report them "emulated")
    assert "GRANNDIS_RANKS_PER_SERVER" not in env and env["OMP_NUM_THREADS"] == "3"
    assert (job["work"] / "runs" / "granndis-train-4242").is_dir()
    assert "granndis-train --shards shards/cora" in res.stderr  # the command is shown in the job log


@pytest.mark.parametrize("env, args, device", [
    ({"SLURM_JOB_GPUS": "0,1"}, [], "cuda"),  # a GPU job: a rank without a usable GPU stops it
    ({"SLURM_GPUS_PER_NODE": "a100:2"}, [], "cuda"),
    ({"SLURM_GPUS_PER_NODE": "0", "CUDA_VISIBLE_DEVICES": "NoDevFiles"}, [], "auto"),
    ({"SLURM_GPUS_ON_NODE": "2", "GRANNDIS_DEVICE": "cpu"}, [], "cpu"),  # the CPU deliberately
    ({"SLURM_GPUS_ON_NODE": "2"}, ["--device", "cpu"], "cpu"),
])
def test_train_device_follows_the_jobs_gpus(job, env, args, device):
    res = run_script(job, "train.sbatch", *args, **env)
    assert res.returncode == 0, res.stderr
    train = split_at(recorded(job, "srun"), "granndis-train")[1]
    assert options(train)["--device"] == device and train.count("--device") == 1


def test_train_settings_from_environment(job):
    (job["work"] / "run.toml").write_text("lr = 0.01\n")
    res = run_script(job, "train.sbatch", GRANNDIS_MODE="eas", GRANNDIS_MODEL="gcn", GRANNDIS_LAYERS="5",
                     GRANNDIS_HIDDEN="128", GRANNDIS_EPOCHS="7", GRANNDIS_CONFIG="run.toml",
                     GRANNDIS_RUN_DIR="runs/mine", GRANNDIS_SRUN_MPI="pmi2", GRANNDIS_GPU_BIND="closest",
                     GRANNDIS_LAUNCHER_ARGS="--exclusive --label", SLURM_GPUS_ON_NODE="4")
    assert res.returncode == 0, res.stderr
    launcher, train = split_at(recorded(job, "srun"), "granndis-train")
    assert launcher[0] == "--mpi=pmi2" and "--gpu-bind=closest" in launcher and launcher[-2:] == ["--exclusive",
                                                                                                  "--label"]
    assert options(train) == {"--shards": "shards/cora", "--mode": "eas", "--model": "gcn", "--layers": "5",
                              "--hidden": "128", "--epochs": "7", "--out": "runs/mine", "--device": "cuda",
                              "--config": "run.toml"}
    res = run_script(job, "train.sbatch", GRANNDIS_CONFIG="missing.toml")
    assert res.returncode == 2 and "GRANNDIS_CONFIG=missing.toml" in res.stderr


def test_train_mpirun_alternative(job):
    res = run_script(job, "train.sbatch", GRANNDIS_LAUNCHER="mpirun", NCCL_DEBUG="INFO")
    assert res.returncode == 0, res.stderr
    assert recorded(job, "srun") is None
    launcher, train = split_at(recorded(job, "mpirun"), "granndis-train")
    assert launcher[:6] == ["-n", "4", "--map-by", "ppr:2:node:PE=3", "--bind-to", "core"]
    exported = set(launcher[7::2])
    assert set(launcher[6::2]) == {"-x"}
    assert {"PATH", "GRANNDIS_SHARDS", "NCCL_DEBUG", "OMP_NUM_THREADS"} <= exported
    assert "GRANNDIS_RANKS_PER_SERVER" not in exported
    assert options(train)["--out"] == "runs/granndis-train-4242" and "--resume" not in train


def test_resume_when_checkpoint_exists(job):
    run_dir = job["work"] / "runs" / "granndis-train-4242"
    (run_dir / "checkpoints").mkdir(parents=True)
    # requeued before the first checkpoint: nothing to resume from, start fresh (and say so)
    res = run_script(job, "train.sbatch", SLURM_RESTART_COUNT="1")
    assert res.returncode == 0, res.stderr
    assert "--resume" not in recorded(job, "srun") and "starting from scratch" in res.stderr

    (run_dir / "checkpoints" / "epoch-00050.pt").write_bytes(b"x")
    for restarts in ("1", None):  # after a requeue, and on a resubmission into the same run directory
        res = run_script(job, "train.sbatch", SLURM_RESTART_COUNT=restarts)
        assert res.returncode == 0, res.stderr
        _, train = split_at(recorded(job, "srun"), "granndis-train")
        assert options(train)["--resume"] == "runs/granndis-train-4242"
        assert options(train)["--out"] == "runs/granndis-train-4242"


def test_requeue_before_first_checkpoint_restarts_its_own_run(job):
    """granndis-train refuses a new run in a directory that holds one, so a requeued job whose run wrote
    config.json but no checkpoint must come back through --resume (which starts at epoch 0)."""
    run_dir = job["work"] / "runs" / "granndis-train-4242"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text("{}")
    (run_dir / "metrics.jsonl").write_text("")
    res = run_script(job, "train.sbatch", SLURM_RESTART_COUNT="1")
    assert res.returncode == 0, res.stderr
    _, train = split_at(recorded(job, "srun"), "granndis-train")
    assert options(train)["--resume"] == "runs/granndis-train-4242" and "from epoch 0" in res.stderr
    # A first start (not a requeue of this job) meeting such a directory does not take it over, and a
    # finished run (summary.json) is never restarted: granndis-train's refusal says what to do.
    for restarts, finished in ((None, False), ("1", True)):
        if finished:
            (run_dir / "summary.json").write_text("{}")
        res = run_script(job, "train.sbatch", SLURM_RESTART_COUNT=restarts)
        assert res.returncode == 0, res.stderr
        assert "--resume" not in recorded(job, "srun"), (restarts, finished)


def test_site_environment_hooks(job):
    venv = job["tmp"] / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text('export VENV_MARK="active:$GRANNDIS_SHARDS"\n')
    res = run_script(job, "train.sbatch", GRANNDIS_MODULES="cuda/12.1,openmpi/4.1.5 nccl",
                     GRANNDIS_VENV=str(venv))
    assert res.returncode == 0, res.stderr
    assert (job["log"] / "module.calls").read_text().splitlines() == ["load cuda/12.1", "load openmpi/4.1.5",
                                                                      "load nccl"]
    assert recorded_env(job, "srun")["VENV_MARK"] == "active:shards/cora"
    res = run_script(job, "train.sbatch", GRANNDIS_VENV=str(job["tmp"] / "nope"))
    assert res.returncode == 2 and "has no bin/activate" in res.stderr and recorded(job, "srun") is not None


def test_script_copied_to_spool_finds_lib_through_submit_dir(job):
    spool = job["tmp"] / "spool"
    spool.mkdir()
    shutil.copy(SLURM / "train.sbatch", spool / "slurm_script")
    res = run_script(job, spool / "slurm_script", SLURM_SUBMIT_DIR=str(REPO))
    assert res.returncode == 0, res.stderr
    assert options(split_at(recorded(job, "srun"), "granndis-train")[1])["--mode"] == "flx"
    res = run_script(job, spool / "slurm_script")  # submit dir without slurm/lib.sh
    assert res.returncode == 2 and "slurm/lib.sh not found" in res.stderr


@pytest.mark.parametrize("env, message", [
    ({"SLURM_NNODES": "2", "SLURM_NTASKS": "5", "SLURM_NTASKS_PER_NODE": None}, "uneven"),
    ({"SLURM_NNODES": "2", "SLURM_NTASKS": "6", "SLURM_NTASKS_PER_NODE": "2"}, "same number of ranks"),
    ({"SLURM_NTASKS_PER_NODE": "two"}, "SLURM_NTASKS_PER_NODE='two'"),
    ({"SLURM_JOB_ID": None}, "submit this script with sbatch"),
    ({"GRANNDIS_SHARDS": None}, "set GRANNDIS_SHARDS"),
    ({"GRANNDIS_LAUNCHER": "aprun"}, "use srun or mpirun"),
    ({"GRANNDIS_MODULES": "cuda", "PATH": "/usr/bin:/bin"}, "no 'module' command"),
])
def test_train_bad_settings_fail_clearly_without_launching(job, env, message):
    if env.get("PATH"):
        env["PATH"] = f"{job['env']['PATH'].split(':')[0]}-empty:" + env["PATH"]
        if shutil.which("module", path=env["PATH"]):
            pytest.skip("a real `module` command is installed here")
    res = run_script(job, "train.sbatch", MODULESHOME=None, **env)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and res.stderr.startswith("granndis slurm: error: ")
    assert recorded(job, "srun") is None


def wait_for(path, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


@pytest.mark.parametrize("sig, finished, progress, expect_requeue, expect_rc", [
    (signal.SIGUSR1, False, True, True, 0),    # time limit near: ranks checkpoint, job goes back to the queue
    (signal.SIGUSR1, True, True, False, 0),    # ... unless training already wrote its summary
    (signal.SIGUSR1, False, False, False, 3),  # ... or the attempt made no progress (it would loop forever)
    # preemption / scancel --signal=TERM --batch: the ranks get USR1 (srun kills the step on TERM),
    # checkpoint and stop; Slurm decides about requeueing
    (signal.SIGTERM, False, True, False, 0),
])
def test_signal_is_forwarded_and_job_requeued(job, sig, finished, progress, expect_requeue, expect_rc):
    run_dir = job["work"] / "runs" / "granndis-train-4242"
    if finished:
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text("{}")
    env = {**job["env"], "FAKE_WAIT_FOR_SIGNAL": "1"}
    if progress:
        env["FAKE_PROGRESS"] = str(run_dir)
    proc = subprocess.Popen(["bash", str(SLURM / "train.sbatch")], cwd=job["work"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(job["log"] / "srun.ready")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (job["log"] / "srun.signals").read_text().split() == ["USR1"], err
    # the stop file too: srun drops a signal that comes before it started the tasks
    assert (job["log"] / "srun.stopfile").exists()
    assert proc.returncode == expect_rc, err
    if expect_requeue:
        assert recorded(job, "scontrol") == ["requeue", "4242"]
        assert re.search(r"requeueing job 4242 at \S+ UTC to continue from the checkpoint of epoch 10", err), err
    else:
        assert recorded(job, "scontrol") is None
    if not progress:
        assert "made no progress in this attempt" in err and "not requeued" in err


def test_young_launcher_gets_the_signal_after_the_grace_period(job):
    """A signal in the launcher's first seconds is passed on only once it is GRANNDIS_SIGNAL_GRACE_S old
    (a rank signalled before granndis-train installs its handlers dies); the stop file at once."""
    proc = subprocess.Popen(["bash", str(SLURM / "train.sbatch")], cwd=job["work"],
                            env={**job["env"], "FAKE_WAIT_FOR_SIGNAL": "1", "GRANNDIS_SIGNAL_GRACE_S": "3"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(job["log"] / "srun.ready")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGUSR1)
        _, err = proc.communicate(timeout=120)
        waited = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (job["log"] / "srun.signals").read_text().split() == ["USR1"], err
    assert (job["log"] / "srun.stopfile").exists() and waited >= 1.5, (waited, err)


def test_failing_ranks_after_the_time_limit_signal_are_not_requeued(job):
    """A job whose ranks fail must stop, not requeue itself each attempt (even with a checkpoint)."""
    run_dir = job["work"] / "runs" / "granndis-train-4242"
    proc = subprocess.Popen(["bash", str(SLURM / "train.sbatch")], cwd=job["work"],
                            env={**job["env"], "FAKE_WAIT_FOR_SIGNAL": "1", "FAKE_RC": "1",
                                 "FAKE_PROGRESS": str(run_dir)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(job["log"] / "srun.ready")
        proc.send_signal(signal.SIGUSR1)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and recorded(job, "scontrol") is None, err
    assert "the ranks failed (exit 1) after the time-limit signal: not requeueing" in err


def test_each_option_once_and_layers_from_the_shards(job):
    """Flags after the script replace the script's defaults (the logged command shows each once), and
    the layer count comes from the shards' manifest unless given."""
    res = run_script(job, "train.sbatch", "--epochs", "50", "--mode=fb")
    assert res.returncode == 0, res.stderr
    _, train = split_at(recorded(job, "srun"), "granndis-train")
    assert train.count("--epochs") == 1 and "--mode" not in train and "--mode=fb" in train
    assert options([w for w in train if w != "--mode=fb"])["--layers"] == "3"  # the manifest's depth
    assert "--epochs 200" not in res.stderr and "--epochs 50" in res.stderr
    (job["work"] / "shards" / "cora" / "manifest.json").write_text('{"layers": 5}')
    res = run_script(job, "train.sbatch")
    assert options(split_at(recorded(job, "srun"), "granndis-train")[1])["--layers"] == "5"
    res = run_script(job, "train.sbatch", "--layers", "2", GRANNDIS_SHARDS="shards/none")
    assert res.returncode == 0 and split_at(recorded(job, "srun"), "granndis-train")[1].count("--layers") == 1
    res = run_script(job, "train.sbatch", GRANNDIS_SHARDS="shards/none")
    assert res.returncode == 2 and "cannot read the layer count from shards/none/manifest.json" in res.stderr
    res = run_script(job, "preprocess.sbatch", "--source", "x", "--layers", "2", GRANNDIS_SERVERS="2",
                     GRANNDIS_GPUS_PER_SERVER="2")
    assert res.returncode == 0 and split_at(recorded(job, "srun"), "python")[1].count("--layers") == 1


def test_user_ranks_per_server_is_passed_on(job):
    res = run_script(job, "train.sbatch", GRANNDIS_RANKS_PER_SERVER="1")
    assert res.returncode == 0, res.stderr
    assert recorded_env(job, "srun")["GRANNDIS_RANKS_PER_SERVER"] == "1" and "emulated servers" in res.stderr


def test_mpi_plugin_problems_are_explained(job):
    res = run_script(job, "train.sbatch", GRANNDIS_SRUN_MPI="pmi7")
    assert res.returncode == 2 and recorded(job, "srun") is None
    assert "no 'pmi7' MPI plugin" in res.stderr and "pmix" in res.stderr
    # what Debian's Open MPI prints under srun --mpi=pmi2 (measured)
    res = run_script(job, "train.sbatch", GRANNDIS_SRUN_MPI="pmi2", FAKE_RC="1",
                     FAKE_STDERR="OMPI was not built with SLURM's PMI support and therefore cannot execute.")
    assert res.returncode == 1
    assert "cannot start under srun --mpi=pmi2" in res.stderr and "GRANNDIS_SRUN_MPI=pmix" in res.stderr


def test_spool_copy_finds_lib_next_to_the_submitted_script(job):
    """Submitted by its path from outside the checkout: no GRANNDIS_HOME needed (the job's Command)."""
    spool = job["tmp"] / "spool"
    spool.mkdir()
    shutil.copy(SLURM / "train.sbatch", spool / "slurm_script")
    res = run_script(job, spool / "slurm_script", FAKE_COMMAND=str(SLURM / "train.sbatch"))
    assert res.returncode == 0, res.stderr


def test_preprocess_command(job):
    res = run_script(job, "preprocess.sbatch", "--source", "planetoid", "--name", "cora", "--root", "/data/pl",
                     SLURM_JOB_ID="777", SLURM_JOB_NAME="granndis preprocess", SLURM_NNODES="1",
                     SLURM_NTASKS_PER_NODE="4", SLURM_NTASKS="4", GRANNDIS_SHARDS=None,
                     GRANNDIS_SERVERS="2", GRANNDIS_GPUS_PER_SERVER="4", GRANNDIS_PYTHON="/opt/venv/bin/python")
    assert res.returncode == 0, res.stderr
    launcher, build = split_at(recorded(job, "srun"), "/opt/venv/bin/python")
    assert launcher[:4] == ["--mpi=pmix", "--nodes=1", "--ntasks=4", "--ntasks-per-node=4"]
    assert build[:3] == ["-m", "granndis_hpc.preprocess", "build"]
    assert options(build[3:]) == {"--servers": "2", "--gpus-per-server": "4", "--layers": "3", "--preload": "full",
                                  "--out": "shards/granndis preprocess-777", "--source": "planetoid",
                                  "--name": "cora", "--root": "/data/pl"}

    res = run_script(job, "preprocess.sbatch", "--source", "synthetic", GRANNDIS_LAUNCHER="mpirun",
                     GRANNDIS_SERVERS="4", GRANNDIS_GPUS_PER_SERVER="4", GRANNDIS_PRELOAD="eas", GRANNDIS_LAYERS="2")
    assert res.returncode == 0, res.stderr
    launcher, build = split_at(recorded(job, "mpirun"), "python")
    assert launcher[:4] == ["-n", "4", "--map-by", "ppr:2:node:PE=3"]
    assert options(build[3:]) == {"--servers": "4", "--gpus-per-server": "4", "--layers": "2", "--preload": "eas",
                                  "--out": "shards/cora", "--source": "synthetic"}


@pytest.mark.parametrize("env, args, message", [
    ({"GRANNDIS_GPUS_PER_SERVER": "4"}, ["--source", "x"], "set GRANNDIS_SERVERS"),
    ({"GRANNDIS_SERVERS": "2", "GRANNDIS_GPUS_PER_SERVER": "0"}, ["--source", "x"], "set GRANNDIS_GPUS_PER_SERVER"),
    ({"GRANNDIS_SERVERS": "2", "GRANNDIS_GPUS_PER_SERVER": "4"}, [], "give the dataset"),
])
def test_preprocess_bad_settings(job, env, args, message):
    res = run_script(job, "preprocess.sbatch", *args, **env)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert recorded(job, "srun") is None

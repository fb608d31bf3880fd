"""A real Slurm (Debian's slurm-wlm 22.05 + munge) on the emulated cluster of emucluster/, for tests.

    slurm/testing/slurm-cluster install                 # apt-get install (root; idempotent; no services)
    slurm/testing/slurm-cluster setup [--servers 2 --cpus 4 --cred-expire 10]
    slurm/testing/slurm-cluster run -- sbatch ...        # a client command, in server 0's namespaces
    slurm/testing/slurm-cluster teardown                 # idempotent: daemons, jobs, namespaces
    slurm/testing/slurm-cluster session -- CMD ...       # setup, CMD (with SLURM_CLUSTER_RUN set), teardown

What is where (measured on Debian 12, see slurm/README.md "Testing under a real Slurm"):
- The cluster is its own emulated-cluster *instance* (emucluster/cluster.py, instance "slurm":
  namespaces gslurm-s*, hosts slurm-s0..., subnet 10.214.0.0/24, state /run/granndis-emu-slurm), so it
  never meets the default instance a benchmark may be using.
- One munged in the machine's own namespaces, with its own key and socket; every daemon and client
  reaches it through `AuthInfo=socket=...` (a unix socket crosses network namespaces; its directory
  must be world-executable).
- slurmctld runs in server 0's network and UTS namespaces; so do the client commands (the machine's
  own namespace has no route to the emulated subnet).  One `slurmd -N slurm-sI` per server in its
  namespaces.  Both slurmd share the file system, so everything per node carries `%n`, TmpFS too (the
  pmix plugin's spmix_appdir_* collide without it).
- proctrack/linuxproc and task/none (no cgroups needed), select/cons_tres with CR_CPU, and
  SlurmdParameters=config_overrides so that a node may declare more CPUs than the machine has.
- AuthInfo cred_expire lowered (default 10 s): a requeued job waits cred_expire + 1 s before it may
  start again (121 s with Slurm's default).
- Teardown ends every process inside this instance's namespaces (daemons, slurmstepd, job ranks: all
  started here), then munged by its pid, then removes the namespaces.  Every step is bounded in time.

Standard library only.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
from emucluster import cluster as emu  # noqa: E402
# The pieces beside this module (re-exported): slurm.conf's text, and the processes' helpers.
from slurmconf import CLUSTER_NAME, PARTITION, slurm_conf  # noqa: E402,F401
from slurmprocs import (CMD_TIMEOUT_S, alive, cmdline, namespace_pids, read_json, spawn, stop_pids,  # noqa: E402,F401
                        write_json)

INSTANCE = "slurm"
SUBNET = "10.214.0"
# libpmix-dev: Slurm's mpi/pmix plugin dlopens libpmix.so (the unversioned name; Open MPI's -dev package
# brings it too)
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "libpmix-dev")
BINARIES = ("slurmctld", "slurmd", "slurmstepd", "sbatch", "srun", "scontrol", "squeue", "scancel", "munged")
EXIT_SKIP = 3  # emucluster's EXIT_REFUSED: this machine cannot host it (the reason is printed)


class SlurmClusterError(emu.EmuError):
    pass


def use_instance():
    """Point emucluster at this cluster's instance (in this process and every child)."""
    os.environ[emu.ENV_INSTANCE] = INSTANCE
    os.environ.setdefault(emu.ENV_SUBNET, SUBNET)
    os.environ.pop(emu.ENV_STATE_DIR, None)


def state_dir():
    use_instance()
    return emu.state_dir()


def slurm_dir():
    return os.path.join(state_dir(), "slurm")


def conf_path():
    return os.path.join(slurm_dir(), "slurm.conf")


# ---------------------------------------------------------------------------------------------
# Packages


def missing_binaries(which=shutil.which):
    missing = [b for b in BINARIES if which(b) is None and not os.path.exists(f"/usr/sbin/{b}")]
    if not any(os.path.exists(os.path.join(d, "libpmix.so")) for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64",
                                                                     "/usr/lib", "/usr/lib/aarch64-linux-gnu")):
        missing.append("libpmix.so")
    return missing


def install(timeout_s=600, quiet=False):
    """apt-get install the packages when missing (root).  The packages' own services must not start
    (they would take the default ports and /run/munge): an absent /usr/sbin/policy-rc.d is put in place
    for the install and removed after; systemd's deb-systemd-invoke honours it too."""
    if not missing_binaries():
        if not quiet:
            print("slurm-cluster: Slurm and munge are installed")
        return False
    if os.geteuid() != 0:
        raise SlurmClusterError(f"Slurm is not installed (missing {', '.join(missing_binaries())}); as root: "
                                f"apt-get install {' '.join(PACKAGES)}", code=EXIT_SKIP)
    if shutil.which("apt-get") is None:
        raise SlurmClusterError("Slurm is not installed and there is no apt-get here; install "
                                f"{' '.join(PACKAGES)} by hand", code=EXIT_SKIP)
    policy = "/usr/sbin/policy-rc.d"
    made_policy = not os.path.exists(policy)
    if made_policy:
        with open(policy, "w") as f:
            f.write("#!/bin/sh\n# granndis slurm-cluster install: keep services from starting\nexit 101\n")
        os.chmod(policy, 0o755)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        base = ["timeout", "--kill-after=10", str(timeout_s), "apt-get", "-o", "DPkg::Lock::Timeout=120"]
        p = subprocess.run(base + ["install", "-y", "-qq", "--no-install-recommends", *PACKAGES], env=env,
                           capture_output=True, text=True)
        if p.returncode != 0:  # a fresh machine may not have package lists yet
            subprocess.run(base + ["update", "-qq"], env=env, capture_output=True, text=True)
            p = subprocess.run(base + ["install", "-y", "-qq", "--no-install-recommends", *PACKAGES], env=env,
                               capture_output=True, text=True)
        if p.returncode != 0:
            raise SlurmClusterError(f"apt-get install {' '.join(PACKAGES)} failed ({p.returncode}): "
                                    f"{(p.stderr or p.stdout).strip()[-2000:]}")
    finally:
        if made_policy:
            os.unlink(policy)
    if missing_binaries():
        raise SlurmClusterError(f"after apt-get install still missing: {', '.join(missing_binaries())}")
    if not quiet:
        print(f"slurm-cluster: installed {' '.join(PACKAGES)}")
    return True


def preflight():
    """Refuse (exit 3, with the reason) where this cluster cannot exist: not root, no namespaces, no Slurm."""
    use_instance()
    emu.preflight()
    missing = missing_binaries()
    if missing:
        raise SlurmClusterError(f"Slurm is not installed (missing {', '.join(missing)}); run "
                                f"`slurm/testing/slurm-cluster install` as root (apt-get install "
                                f"{' '.join(PACKAGES)})", code=EXIT_SKIP)


# ---------------------------------------------------------------------------------------------
# The cluster


def teardown(quiet=False):
    """Stop every job and daemon of this cluster, then remove its namespaces.  Idempotent."""
    use_instance()
    sdir = slurm_dir()
    info = read_json(os.path.join(sdir, "cluster.json")) or {}
    ns = sorted(n for n in (os.listdir("/run/netns") if os.path.isdir("/run/netns") else [])
                if n.startswith(emu.instance_names()["ns_prefix"]))
    # Jobs first (their ranks, slurmstepd), then the daemons; all live in our namespaces.
    for _ in range(2):
        pids = [p for n in ns for p in namespace_pids(n)]
        if not pids:
            break
        stop_pids(pids)
    munged = info.get("munged_pid")
    if munged and (cmdline(munged) or "").endswith("munged"):
        stop_pids([munged])
    emu.teardown(quiet=True)
    if os.path.isdir(sdir):
        shutil.rmtree(sdir, ignore_errors=True)
    if not quiet:
        print("slurm-cluster: torn down")


def client_env(env=None):
    env = dict(os.environ if env is None else env)
    env["SLURM_CONF"] = conf_path()
    return env


def client_argv(argv):
    """argv of a Slurm client command run in server 0's namespaces (where slurmctld listens)."""
    use_instance()
    state = emu.read_state()
    return emu.enter_argv(state["hosts"][0], list(argv))


def run(argv, env=None, cwd=None, timeout=CMD_TIMEOUT_S, check=True):
    cmd = client_argv(argv)
    try:
        p = subprocess.run(cmd, env=client_env(env), cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmClusterError(f"`{' '.join(argv)}` did not finish in {timeout} s") from None
    if check and p.returncode != 0:
        raise SlurmClusterError(f"`{' '.join(argv)}` failed ({p.returncode}): {(p.stderr or p.stdout).strip()}")
    return p


def _wait(what, probe, timeout_s, logs=()):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        ok, last = probe()
        if ok:
            return last
        time.sleep(0.2)
    tail = ""
    for log in logs:
        try:
            with open(log, errors="replace") as f:
                tail += f"\n--- {log}:\n" + "".join(f.readlines()[-15:])
        except OSError:
            pass
    raise SlurmClusterError(f"{what} not within {timeout_s} s (last: {last}){tail}")


def setup(servers=2, cpus=4, cred_expire=10, kill_wait=15, timeout_s=60, quiet=False):
    """Build the emulated servers and start munged, slurmctld and one slurmd per server.  Anything left
    from an earlier cluster is removed first; on any failure (or a signal turned into an exception)
    everything is torn down again."""
    preflight()
    teardown(quiet=True)
    t0 = time.monotonic()
    try:
        state = emu.setup(servers, None, quiet=True)
        sdir = slurm_dir()
        os.makedirs(sdir, exist_ok=True)
        os.chmod(state["state_dir"], 0o755)
        os.chmod(sdir, 0o755)
        mdir = os.path.join(sdir, "munge")
        os.makedirs(mdir, exist_ok=True)
        os.chmod(mdir, 0o755)  # clients of other users need to reach the socket
        key = os.path.join(mdir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        sock = os.path.join(mdir, "munge.socket")
        munged = ["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                  f"--pid-file={mdir}/munged.pid", f"--log-file={mdir}/munged.log", f"--seed-file={mdir}/munged.seed"]
        info = {"munged_pid": spawn(munged, os.path.join(mdir, "munged.out")), "servers": servers}
        write_json(os.path.join(sdir, "cluster.json"), info)
        _wait("munged's socket", lambda: (os.path.exists(sock), sock), 10, [os.path.join(mdir, "munged.log")])
        for d in ["ctld"] + [f"{k}-{h['hostname']}" for h in state["hosts"] for k in ("spool", "tmp")]:
            os.makedirs(os.path.join(sdir, d), exist_ok=True)
        os.chmod(os.path.join(sdir, "ctld"), 0o755)
        for h in state["hosts"]:
            os.chmod(os.path.join(sdir, f"tmp-{h['hostname']}"), 0o1777)
        conf = conf_path()
        with open(conf, "w") as f:
            f.write(slurm_conf(state, sdir, cpus, cred_expire, kill_wait, sock))
        h0 = state["hosts"][0]
        info["slurmctld_pid"] = spawn(emu.enter_argv(h0, ["slurmctld", "-D", "-i", "-f", conf]),
                                       os.path.join(sdir, "slurmctld.out"))
        info["slurmd_pids"] = [spawn(emu.enter_argv(h, ["slurmd", "-D", "-N", h["hostname"], "-f", conf]),
                                      os.path.join(sdir, f"slurmd-{h['hostname']}.out")) for h in state["hosts"]]
        write_json(os.path.join(sdir, "cluster.json"), info)
        logs = [os.path.join(sdir, n) for n in ("slurmctld.out", "slurmctld.log")]

        def nodes_idle():
            p = run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, timeout=10)
            st = dict(line.split()[:2] for line in p.stdout.splitlines() if len(line.split()) >= 2)
            ok = p.returncode == 0 and len(st) == servers and all(s == "idle" for s in st.values())
            return ok, st or (p.stderr.strip() or p.stdout.strip())

        _wait(f"{servers} idle nodes", nodes_idle, timeout_s,
              logs + [os.path.join(sdir, f"slurmd-{h['hostname']}.{e}") for h in state["hosts"] for e in ("out",
                                                                                                          "log")])
        info["setup_s"] = round(time.monotonic() - t0, 2)
        write_json(os.path.join(sdir, "cluster.json"), info)
    except BaseException:
        teardown(quiet=True)
        raise
    if not quiet:
        print(f"slurm-cluster: {servers} nodes x {cpus} CPUs up in {info['setup_s']} s "
              f"(SLURM_CONF={conf}; client commands: slurm/testing/slurm-cluster run -- CMD)")
    return info


# ---------------------------------------------------------------------------------------------
# Jobs (for tests)


def sbatch(args, env=None, cwd=None):
    """Submit; returns the job id."""
    p = run(["sbatch", "--parsable", *args], env=env, cwd=cwd)
    return int(p.stdout.strip().split(";")[0])


def job_info(job_id):
    """`scontrol show job -o` as a dict (JobState, RestartCnt, ExitCode, Reason, ...)."""
    p = run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
    out = {}
    for word in p.stdout.split():
        if "=" in word:
            k, v = word.split("=", 1)
            out.setdefault(k, v)
    return out


FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                "DEADLINE", "PREEMPTED")


def wait_job(job_id, timeout_s, states=FINAL_STATES, poll_s=0.5):
    """Wait until the job reaches one of `states`; returns job_info.  Cancels it on timeout."""
    deadline = time.monotonic() + timeout_s
    info = {}
    while time.monotonic() < deadline:
        info = job_info(job_id)
        if info.get("JobState") in states:
            return info
        time.sleep(poll_s)
    run(["scancel", str(job_id)], check=False)
    raise SlurmClusterError(f"job {job_id} did not reach {'/'.join(states)} within {timeout_s} s "
                            f"(state {info.get('JobState')}, reason {info.get('Reason')})")


# ---------------------------------------------------------------------------------------------
# Command line


def _on_signal(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None):
    p = argparse.ArgumentParser(prog="slurm-cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install", help="apt-get install slurmctld slurmd slurm-client munge when missing")
    sub.add_parser("probe", help="exit 0 when the cluster can be built here, else 3 with the reason")
    for name in ("setup", "session"):
        s = sub.add_parser(name)
        s.add_argument("--servers", type=int, default=2)
        s.add_argument("--cpus", type=int, default=4, help="CPUs each node declares")
        s.add_argument("--cred-expire", type=int, default=10, help="seconds; a requeued job waits this + 1 s")
        s.add_argument("--kill-wait", type=int, default=15, help="seconds between SIGTERM and SIGKILL")
        if name == "session":
            s.add_argument("--timeout", type=int, default=1800)
            s.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("teardown")
    s = sub.add_parser("run", help="a Slurm client command in server 0's namespaces")
    s.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    try:
        if args.cmd == "install":
            install()
        elif args.cmd == "probe":
            preflight()
            print("slurm-cluster: this machine can host the Slurm test cluster")
        elif args.cmd == "setup":
            setup(args.servers, args.cpus, args.cred_expire, args.kill_wait)
        elif args.cmd == "teardown":
            teardown()
        elif args.cmd == "run":
            cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
            return subprocess.run(client_argv(cmd), env=client_env()).returncode
        elif args.cmd == "session":
            cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
            if not cmd:
                raise SlurmClusterError("session: give a command after --", code=2)
            try:
                setup(args.servers, args.cpus, args.cred_expire, args.kill_wait)
                env = client_env()
                env["SLURM_CLUSTER_RUN"] = f"{sys.executable} {os.path.abspath(__file__)} run --"
                return emu.run_bounded(["timeout", "--kill-after=15", str(args.timeout), *cmd], env=env).returncode
            finally:
                teardown()
        return 0
    except emu.EmuError as exc:
        print(f"slurm-cluster: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt as exc:
        print(f"slurm-cluster: interrupted ({exc}); torn down", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""How commands reach the emulated servers: the rsh agent's nsenter line, the mpirun that emu-mpirun runs,
and a subprocess that passes a stop on to its child (standard library only)."""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys

from .config import ENV_STATE_DIR, HERE, REPO, EmuError, host_index


def enter_argv(host, argv):
    """argv that runs `argv` inside an emulated server's network and UTS namespaces."""
    return ["nsenter", f"--net=/run/netns/{host['netns']}", f"--uts={host['uts']}", "--", *argv]


def agent_argv(args, state):
    """The command the rsh agent executes for Open MPI's `AGENT [options] HOST COMMAND...`.

    Like ssh, the remote command is the remaining words joined by spaces and run by a shell (Open MPI
    sends shell syntax: `PATH=...; export PATH; orted ...`).  Leading options (Open MPI's
    plm_rsh_args, ssh's -x) are ignored: there is nothing to forward."""
    rest = list(args)
    while rest and rest[0].startswith("-"):
        rest.pop(0)
    if len(rest) < 2:
        raise EmuError(f"rsh-agent: expected HOST COMMAND..., got {' '.join(map(shlex.quote, args)) or 'nothing'}",
                       code=255)
    host = state["hosts"][host_index(state, rest[0])]
    command = " ".join(rest[1:]).strip()
    if not command:
        raise EmuError(f"rsh-agent: empty command for {rest[0]}", code=255)
    return enter_argv(host, ["/bin/sh", "-c", command])


EXPORTED_ENV = ("OMP_NUM_THREADS", "PYTHONUNBUFFERED", "PYTHONPATH", "MASTER_PORT")


def split_np(argv):
    """(number of ranks, the other mpirun arguments) from an mpirun-style argv."""
    rest, n, i = [], None, 0
    while i < len(argv):
        a = argv[i]
        if a in ("-n", "-np", "--np", "--n", "-c"):
            if i + 1 >= len(argv):
                raise ValueError(f"{a} needs a number of ranks")
            n, i = argv[i + 1], i + 2
            continue
        m = re.fullmatch(r"(?:-n|-np|--np)=?(\d+)", a)
        if m:
            n, i = m.group(1), i + 1
            continue
        rest.append(a)
        i += 1
    if n is None:
        raise ValueError("give the number of ranks with -n N (N = servers x ranks per server)")
    try:
        n = int(n)
    except ValueError:
        raise ValueError(f"-n {n!r} is not a number of ranks") from None
    if n < 1:
        raise ValueError(f"-n must be at least 1, got {n}")
    return n, rest


# Every emulated server offers its ranks as slots, so Open MPI never sees that they all share this
# machine's cores and keeps its default for a node it believes it does not oversubscribe: a rank waiting
# in MPI spins, taking a core from a rank still computing, and an exchange round costs scheduler time
# slices.  Plain mpirun on one oversubscribed node yields instead; emu-mpirun asks for the same when the
# job has more ranks than the machine has cores (unless the environment sets it): measured in
# docs/emulated-cluster.md, epochs up to twice as fast.
YIELD_MCA = "OMPI_MCA_mpi_yield_when_idle"


def launcher_argv(argv, state, timeout_s, env=None):
    """(argv, extra environment) of the mpirun that `emu-mpirun ARGV` runs on the emulated cluster."""
    env = os.environ if env is None else env
    n, rest = split_np(argv)
    servers = state["servers"]
    if n % servers:
        raise ValueError(f"-n {n} ranks cannot be spread evenly over {servers} emulated servers; give a "
                         f"multiple of {servers} (every server needs the same number of ranks)")
    if not rest:
        raise ValueError("no program given: emu-mpirun -n N PROGRAM [ARGS...]")
    per = n // servers
    hosts = state["hosts"]
    master = hosts[0]["address"]
    extra_env = {"MASTER_ADDR": master, "GLOO_SOCKET_IFNAME": state["ifname"],
                 "TP_SOCKET_IFNAME": state["ifname"], ENV_STATE_DIR: state["state_dir"]}
    agent = os.path.join(HERE, "rsh-agent")
    mpi = ["mpirun", "-n", str(n), "--host", ",".join(f"{h['hostname']}:{per}" for h in hosts),
           "--map-by", "slot", "--bind-to", "none",
           "--mca", "plm_rsh_agent", agent,
           "--mca", "pml", "ob1", "--mca", "btl", "tcp,self,vader",
           "--mca", "btl_tcp_if_include", state["subnet"], "--mca", "oob_tcp_if_include", state["subnet"]]
    if n > (os.cpu_count() or 1) and YIELD_MCA not in env:
        mpi += ["--mca", "mpi_yield_when_idle", "1"]
    for name in sorted(extra_env) + [k for k in EXPORTED_ENV if k in env] + \
            sorted(k for k in env if k.startswith("GRANNDIS_") and k not in extra_env):
        mpi += ["-x", name]
    # `timeout` bounds the whole job: SIGTERM to mpirun (which ends its ranks), SIGKILL 15 s later.
    full = ["timeout", "--kill-after=15", str(int(timeout_s)), *enter_argv(hosts[0], mpi + rest)]
    return full, extra_env


def run_bounded(cmd, env=None, capture=False, grace_s=20, cwd=None):
    """subprocess.run that passes a stop on: on any exception here (SIGTERM/SIGHUP turned into
    KeyboardInterrupt by install_signal_teardown, Ctrl-C) the child gets SIGTERM, then SIGKILL after
    `grace_s`.  subprocess.run would SIGKILL `timeout` at once and orphan the mpirun under it."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, text=True, stdout=subprocess.PIPE if capture else None,
                            stderr=subprocess.PIPE if capture else None)
    try:
        out, err = proc.communicate()
    except BaseException:
        proc.send_signal(signal.SIGTERM)  # `timeout` forwards it to its child
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def default_python():
    venv = os.path.join(REPO, ".venv", "bin", "python")
    return venv if os.path.exists(venv) else sys.executable

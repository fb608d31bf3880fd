"""An emulated multi-server cluster on one Linux machine: namespaces, shaped links and an mpirun launcher.

    emucluster/emu-cluster setup --servers 2 --rate 100mbit    # build (idempotent: rebuilds)
    emucluster/emu-cluster shape --rate 25mbit                  # change the link rate in place
    emucluster/emu-cluster selfcheck                            # MPI ping-pong: is the shaping real?
    emucluster/emu-mpirun -n 4 .venv/bin/python -m granndis_hpc.cli train ...
    emucluster/emu-cluster teardown                             # idempotent
    emucluster/emu-cluster session --servers 2 --rate 100mbit -- CMD ...   # setup, CMD, teardown
    emucluster/emu-cluster --instance slurm setup --servers 2    # a second cluster beside the default:
        # namespaces gslurm-s*, hosts slurm-s*, subnet 10.214.0.0/24 (GRANNDIS_EMU_SUBNET), state in
        # /run/granndis-emu-slurm; GRANNDIS_EMU_INSTANCE=slurm does the same for every command

Why each piece (measured on this kind of machine, see docs/emulated-cluster.md):
- A server is a network namespace *and* a UTS namespace with its own hostname.  With network
  namespaces alone every rank reports the same hostname, Open MPI treats them as one node, uses shared
  memory (vader) across the namespaces and the ranks crash.  With a hostname per server each server gets
  its own orted, ranks inside a server keep shared memory, and `MPI.Comm.Split_type(COMM_TYPE_SHARED)`
  (the project's topology) finds the servers by itself.
- Two servers are joined by one veth pair; more by a bridge that lives in a hub namespace of its own, so
  nothing is added to the machine's own network.  `tc tbf` on every egress (both ends of a veth; the
  server side and the bridge side of every port) gives each server an R-up, R-down link, like a NIC on a
  switch.  Addresses are 10.213.0.0/24 and exist only inside these namespaces.
- mpirun runs in server 0's namespaces and starts the other servers' daemons through `plm_rsh_agent` =
  emucluster/rsh-agent, which enters the target server's namespaces (nsenter) instead of ssh.
- netem (delay) is not in every kernel (it is not in this one); --delay probes it and refuses clearly.

This module does the system side (namespaces, links, shaping) and the command line; the pure pieces
live beside it and are re-exported here: config.py (names per instance, rate parsing, the layout and
its state file), launch.py (the rsh agent's and emu-mpirun's command lines, a stop-passing
subprocess), check.py (the self-check's verdict and printout).

Standard library only: the rsh agent runs under the system python3 before any virtual environment.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

# The pieces (re-exported here: emucluster is the one module its users import).
from .config import (HERE, REPO, ENV_STATE_DIR, DEFAULT_STATE_DIR, NS_PREFIX, HUB_NS, BRIDGE, IFNAME,
                       SUBNET_PREFIX, SUBNET, HOST_PREFIX, ENV_INSTANCE, ENV_SUBNET, INSTANCE_RE,
                       MAX_SERVERS, CMD_TIMEOUT_S, DEFAULT_RUN_TIMEOUT_S, TBF_LATENCY, EXIT_USAGE,
                       EXIT_REFUSED, RATE_UNITS, DELAY_UNITS, UNSHAPED, NETEM_MISSING, EmuError, parse_rate,
                       format_rate, parse_delay, tbf_burst_bytes, qdisc_commands, instance_names, state_dir,
                       layout, read_state, write_state, host_index)  # noqa: F401
from .launch import (enter_argv, agent_argv, EXPORTED_ENV, split_np, launcher_argv, run_bounded,
                       default_python, YIELD_MCA)  # noqa: F401
from .check import check_measurement, format_selfcheck  # noqa: F401

# ---------------------------------------------------------------------------------------------
# System side


def _run(cmd, check=True, timeout=CMD_TIMEOUT_S):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise EmuError(f"`{' '.join(cmd)}` did not finish in {timeout} s") from None
    if check and p.returncode != 0:
        raise EmuError(f"`{' '.join(cmd)}` failed ({p.returncode}): {(p.stderr or p.stdout).strip()}")
    return p


REQUIRED_TOOLS = {"ip": "iproute2", "tc": "iproute2", "nsenter": "util-linux", "unshare": "util-linux",
                  "mount": "mount", "umount": "mount", "timeout": "coreutils", "mpirun": "openmpi-bin"}


def preflight(euid=None, which=shutil.which, platform=sys.platform):
    """Refuse clearly (EmuError, exit 3) where the emulated cluster cannot exist."""
    if not platform.startswith("linux"):
        raise EmuError(f"the emulated cluster needs Linux network namespaces; this is {platform}",
                       code=EXIT_REFUSED)
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        raise EmuError("the emulated cluster needs root: network namespaces, veth links and tc shaping need "
                       "CAP_SYS_ADMIN and CAP_NET_ADMIN (run it as root, e.g. `sudo make bench-cluster`)",
                       code=EXIT_REFUSED)
    missing = [f"{tool} (Debian package {pkg})" for tool, pkg in REQUIRED_TOOLS.items() if which(tool) is None]
    if missing:
        raise EmuError("missing tools: " + ", ".join(missing), code=EXIT_REFUSED)


def _namespaces_refused(what, exc):
    return EmuError(f"cannot create {what} here ({exc}); the emulated cluster needs root with "
                    f"CAP_SYS_ADMIN in the machine's own namespaces (a container without --privileged, or "
                    f"whose seccomp profile blocks unshare(), cannot host it)", code=EXIT_REFUSED)


def probe(sdir=None):
    """Can this machine host the cluster?  Creates and removes one throwaway namespace of each kind."""
    preflight()
    sdir = sdir or state_dir()
    name = instance_names()["probe_ns"]
    _run(["ip", "netns", "del", name], check=False)
    try:
        _run(["ip", "netns", "add", name])
    except EmuError as exc:
        raise _namespaces_refused("network namespaces", exc) from None
    try:
        try:
            _run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"])
            _run(["ip", "netns", "exec", name, "tc", "qdisc", "replace", "dev", "lo", "root", "tbf", "rate",
                  "1gbit", "burst", "65536", "latency", TBF_LATENCY])
        except EmuError as exc:
            raise EmuError(f"tc cannot shape links here: {exc} (needs the sch_tbf qdisc)", code=EXIT_REFUSED) from None
        os.makedirs(sdir, exist_ok=True)
        uts = os.path.join(sdir, "uts-probe")
        open(uts, "a").close()
        try:
            _run(["unshare", f"--uts={uts}", "hostname", name])
        except EmuError as exc:
            raise _namespaces_refused("UTS namespaces", exc) from None
        finally:
            _run(["umount", uts], check=False)
            os.unlink(uts)
    finally:
        _run(["ip", "netns", "del", name], check=False)


def teardown(sdir=None, quiet=False):
    """Remove every namespace and mount this tool made.  Idempotent; needs no state file."""
    sdir = sdir or state_dir()
    nm = instance_names()
    removed = []
    # Only this instance's names: another instance (a benchmark, a Slurm cluster) may be running.
    names = sorted(n for n in (os.listdir("/run/netns") if os.path.isdir("/run/netns") else [])
                   if re.fullmatch(re.escape(nm["ns_prefix"]) + r"\d+", n) or n in (nm["hub_ns"], nm["probe_ns"]))
    for name in names:
        _run(["ip", "netns", "del", name], check=False)
        removed.append(name)
    if os.path.isdir(sdir):
        for f in sorted(os.listdir(sdir)):
            path = os.path.join(sdir, f)
            if f.startswith("uts-"):
                _run(["umount", path], check=False)
                removed.append(path)
            if f.startswith("uts-") or f.startswith("state.json"):
                try:
                    os.unlink(path)
                except OSError:
                    pass
    if not quiet:
        print("emu-cluster: torn down" + (f" ({', '.join(removed)})" if removed else " (nothing was set up)"))
    return removed


def apply_shaping(state, bps, delay_s=None):
    """Shape every egress of the cluster at `bps` (None = unshaped), with netem delay if asked."""
    for ns, dev in state["egress"]:
        for cmd in qdisc_commands(ns, dev, bps, delay_s):
            p = _run(cmd, check=False)
            if p.returncode == 0:
                continue
            detail = (p.stderr or p.stdout).strip()
            if cmd[6] == "del" and ("No such file" in detail or "Cannot delete qdisc with handle of zero" in detail
                                    or "Invalid handle" in detail):
                continue  # was not shaped: nothing to remove
            if delay_s is not None and "netem" in cmd and ("unknown" in detail.lower() or "not found" in detail):
                raise EmuError(NETEM_MISSING.format(detail=detail), code=EXIT_REFUSED)
            raise EmuError(f"`{' '.join(cmd)}` failed: {detail}")
    state["rate_bps"], state["delay_s"] = bps, delay_s
    write_state(state)


def _wait_links_up(state, timeout=10.0):
    deadline = time.monotonic() + timeout
    ifname = state["ifname"]
    for h in state["hosts"]:
        while True:
            out = _run(["ip", "-n", h["netns"], "-o", "link", "show", ifname]).stdout
            if "state UP" in out or "LOWER_UP" in out:
                break
            if time.monotonic() > deadline:
                raise EmuError(f"link {ifname} in {h['netns']} did not come up in {timeout} s: {out.strip()}")
            time.sleep(0.05)


def setup(servers, bps, delay_s=None, sdir=None, quiet=False):
    """Build the cluster from scratch (anything left from before is removed first)."""
    preflight()
    state = layout(servers, sdir)
    teardown(state["state_dir"], quiet=True)
    os.makedirs(state["state_dir"], exist_ok=True)
    try:
        for h in state["hosts"]:
            try:
                _run(["ip", "netns", "add", h["netns"]])
            except EmuError as exc:
                raise _namespaces_refused("network namespaces", exc) from None
            _run(["ip", "-n", h["netns"], "link", "set", "lo", "up"])
            open(h["uts"], "a").close()
            try:  # a persistent UTS namespace, bind-mounted on the file, holding the server's hostname
                _run(["unshare", f"--uts={h['uts']}", "hostname", h["hostname"]])
            except EmuError as exc:
                raise _namespaces_refused("UTS namespaces", exc) from None
        nm, ifname = state["names"], state["ifname"]
        if servers == 2:
            a, b = state["hosts"]
            _run(["ip", "link", "add", ifname, "netns", a["netns"], "type", "veth", "peer", "name", ifname,
                  "netns", b["netns"]])
        else:
            hub, bridge = nm["hub_ns"], nm["bridge"]
            _run(["ip", "netns", "add", hub])
            _run(["ip", "-n", hub, "link", "add", bridge, "type", "bridge"])
            _run(["ip", "-n", hub, "link", "set", bridge, "up"])
            for h in state["hosts"]:
                port = f"{nm['port_prefix']}{h['index']}"
                _run(["ip", "link", "add", ifname, "netns", h["netns"], "type", "veth", "peer", "name", port,
                      "netns", hub])
                _run(["ip", "-n", hub, "link", "set", port, "master", bridge])
                _run(["ip", "-n", hub, "link", "set", port, "up"])
        for h in state["hosts"]:
            _run(["ip", "-n", h["netns"], "addr", "add", f"{h['address']}/24", "dev", ifname])
            _run(["ip", "-n", h["netns"], "link", "set", ifname, "up"])
        _wait_links_up(state)
        apply_shaping(state, bps, delay_s)
    except BaseException:
        teardown(state["state_dir"], quiet=True)
        raise
    if not quiet:
        print(describe(state))
    return state


def describe(state):
    lines = [f"emulated cluster: {state['servers']} servers, {'bridge' if state['bridge'] else 'veth'} on "
             f"{state['subnet']}, link rate {format_rate(state.get('rate_bps'))} per direction"
             + (f", delay {state['delay_s'] * 1e3:g} ms" if state.get("delay_s") else "")]
    for h in state["hosts"]:
        lines.append(f"  {h['hostname']:<8} {h['address']:<12} netns {h['netns']}")
    return "\n".join(lines)


def shape(bps, delay_s=None):
    preflight()
    state = read_state()
    apply_shaping(state, bps, delay_s)
    print(f"emu-cluster: link rate now {format_rate(bps)}" + (f", delay {delay_s * 1e3:g} ms" if delay_s else ""))
    return state


def emu_mpirun(argv, timeout_s=DEFAULT_RUN_TIMEOUT_S, capture=False):
    """Run mpirun on the emulated cluster; returns the CompletedProcess (or exits on a usage error)."""
    preflight()
    state = read_state()
    cmd, extra = launcher_argv(argv, state, timeout_s)
    env = dict(os.environ, **extra)
    p = run_bounded(cmd, env=env, capture=capture)
    if p.returncode in (124, 137):
        print(f"emu-mpirun: the job ran past its {timeout_s} s limit and was stopped "
              f"(raise it with --emu-timeout S)", file=sys.stderr)
    return p


def selfcheck(ranks_per_server=2, high=1.15, low=0.5, python=None, timeout_s=120, attempts=3, capacity_Bps=None):
    """Measure intra- and inter-server bandwidth by MPI ping-pong; report whether shaping holds.

    Returns the measurement dict with "problems" (empty when shaping holds) and "fatal" (a problem no
    retry can fix: the link faster than configured, or Open MPI not seeing the servers).  Inter-server
    bandwidth must lie within [low, high] x the configured rate (bytes/s = rate / 8); the low bound is
    taken against min(rate, capacity_Bps) when the machine's unshaped capacity is known, because on 2
    busy cores TCP over veth may not reach a fast configured rate at all.  A slow measurement is retried
    (up to `attempts` jobs): on a shared machine CPU starvation slows a trial, it never speeds one up."""
    state = read_state()
    bps = state.get("rate_bps")
    # Size each inter transfer to ~0.2 s at the configured rate: long against the tbf bucket (64 KiB or
    # 1 ms), short enough that 3 trials x 3 round trips stay a few seconds at 25mbit.
    size = 8 << 20 if bps is None else int(min(max(bps / 8 * 0.2, 1 << 20), 16 << 20))
    n = state["servers"] * ranks_per_server
    best = None
    for attempt in range(max(1, attempts)):
        p = emu_mpirun(["-n", str(n), python or default_python(), os.path.join(HERE, "pingpong.py"),
                        "--bytes", str(size), "--ranks-per-server", str(ranks_per_server)],
                       timeout_s=timeout_s, capture=True)
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("PINGPONG ")]
        if p.returncode != 0 or not line:
            raise EmuError(f"self-check: the ping-pong job failed (exit {p.returncode}):\n{p.stdout[-3000:]}\n"
                           f"{p.stderr[-3000:]}")
        m = json.loads(line[-1][len("PINGPONG "):])
        m["rate_bps"], m["attempts"] = bps, attempt + 1
        m["problems"], m["fatal"] = check_measurement(m, state["servers"], ranks_per_server, bps, high, low,
                                                      capacity_Bps, with_fatal=True)
        if best is None or min(m["inter_Bps"].values()) > min(best["inter_Bps"].values()):
            best = dict(m, attempts=attempt + 1)
        if not m["problems"] or m["fatal"]:
            return m
    return best


# ---------------------------------------------------------------------------------------------
# Command line


def build_parser():
    p = argparse.ArgumentParser(prog="emu-cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage="emu-cluster [--instance NAME] "
                                      "{setup,shape,teardown,status,probe,selfcheck,session} ...")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("setup", help="build the cluster (removes an old one first)")
    s.add_argument("--servers", type=int, default=2)
    s.add_argument("--rate", default="unshaped", help="per-direction link rate: 25mbit, 1gbit, unshaped")
    s.add_argument("--delay", default=None, help="one-way delay (needs netem in the kernel), e.g. 5ms")
    s = sub.add_parser("shape", help="change the rate (and delay) of an existing cluster")
    s.add_argument("--rate", required=True)
    s.add_argument("--delay", default=None)
    sub.add_parser("teardown", help="remove everything setup made (idempotent)")
    sub.add_parser("status", help="print the cluster")
    sub.add_parser("probe", help="exit 0 when this machine can host the cluster, else 3 and say why")
    s = sub.add_parser("selfcheck", help="MPI ping-pong inside and between servers; fails if shaping is off")
    s.add_argument("--ranks-per-server", type=int, default=2)
    s.add_argument("--high", type=float, default=1.15, help="max measured/configured inter bandwidth")
    s.add_argument("--low", type=float, default=0.5, help="min measured/configured inter bandwidth")
    s.add_argument("--python", default=None, help="python with mpi4py (default: the repo's .venv)")
    s = sub.add_parser("session", help="setup, run COMMAND, teardown (also on failure or a signal)")
    s.add_argument("--servers", type=int, default=2)
    s.add_argument("--rate", default="unshaped")
    s.add_argument("--delay", default=None)
    s.add_argument("--timeout", type=int, default=DEFAULT_RUN_TIMEOUT_S)
    s.add_argument("command", nargs=argparse.REMAINDER)
    return p


def _on_signal(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def install_signal_teardown():
    """SIGTERM/SIGHUP become KeyboardInterrupt, so `finally: teardown()` runs on them too."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)


def _rate_delay(args):
    try:
        bps = parse_rate(args.rate)
        delay = None if args.delay is None else parse_delay(args.delay)
    except ValueError as exc:
        raise EmuError(str(exc), code=EXIT_USAGE) from None
    return bps, delay


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        # --instance NAME (before the subcommand) = GRANNDIS_EMU_INSTANCE=NAME, for this process and the
        # commands it starts (emu-mpirun's rsh agent finds the instance through its state directory).
        while argv[:1] == ["--instance"] or (argv and argv[0].startswith("--instance=")):
            if argv[0] == "--instance":
                if len(argv) < 2:
                    raise EmuError("--instance needs a name", code=EXIT_USAGE)
                name, argv = argv[1], argv[2:]
            else:
                name, argv = argv[0].split("=", 1)[1], argv[1:]
            os.environ[ENV_INSTANCE] = name
            instance_names()  # refuse a bad name before anything is built
        if argv and argv[0] == "agent":   # the rsh agent: exec, never return
            cmd = agent_argv(argv[1:], read_state())
            try:
                os.execvp(cmd[0], cmd)  # replaces this process
            except OSError as exc:
                raise EmuError(f"rsh-agent: cannot run {cmd[0]}: {exc}", code=255) from None
            return 127  # only reached when execvp is replaced (tests)
        if argv and argv[0] == "mpirun":  # emu-mpirun
            rest, timeout_s = list(argv[1:]), DEFAULT_RUN_TIMEOUT_S
            if "--emu-timeout" in rest:
                i = rest.index("--emu-timeout")
                try:
                    timeout_s = int(rest[i + 1])
                except (IndexError, ValueError):
                    raise EmuError("--emu-timeout needs a number of seconds", code=EXIT_USAGE) from None
                del rest[i:i + 2]
            install_signal_teardown()  # a SIGTERM to emu-mpirun reaches mpirun (run_bounded)
            try:
                return emu_mpirun(rest, timeout_s).returncode
            except ValueError as exc:
                raise EmuError(f"emu-mpirun: {exc}", code=EXIT_USAGE) from None
        args = build_parser().parse_args(argv)
        if args.cmd == "setup":
            bps, delay = _rate_delay(args)
            try:
                layout(args.servers)
            except ValueError as exc:
                raise EmuError(str(exc), code=EXIT_USAGE) from None
            setup(args.servers, bps, delay)
        elif args.cmd == "shape":
            shape(*_rate_delay(args))
        elif args.cmd == "teardown":
            preflight()
            teardown()
        elif args.cmd == "status":
            print(describe(read_state()))
        elif args.cmd == "probe":
            probe()
            print("emu-cluster: this machine can host the emulated cluster")
        elif args.cmd == "selfcheck":
            preflight()
            m = selfcheck(args.ranks_per_server, args.high, args.low, args.python)
            print(format_selfcheck(m))
            if m["problems"]:
                raise EmuError("self-check FAILED:\n  " + "\n  ".join(m["problems"]))
            print("self-check OK")
        elif args.cmd == "session":
            bps, delay = _rate_delay(args)
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            if not command:
                raise EmuError("session: give a command after --", code=EXIT_USAGE)
            install_signal_teardown()
            try:
                setup(args.servers, bps, delay)
                return run_bounded(["timeout", "--kill-after=15", str(args.timeout), *command]).returncode
            finally:
                teardown()
        return 0
    except EmuError as exc:
        print(f"emu-cluster: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt as exc:
        print(f"emu-cluster: interrupted ({exc})", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""An emulated multi-server cluster on one Linux machine: namespaces, shaped links and an mpirun launcher.

    bench/cluster/emu-cluster setup --servers 2 --rate 100mbit    # build (idempotent: rebuilds)
    bench/cluster/emu-cluster shape --rate 25mbit                  # change the link rate in place
    bench/cluster/emu-cluster selfcheck                            # MPI ping-pong: is the shaping real?
    bench/cluster/emu-mpirun -n 4 .venv/bin/python -m granndis_hpc.cli train ...
    bench/cluster/emu-cluster teardown                             # idempotent
    bench/cluster/emu-cluster session --servers 2 --rate 100mbit -- CMD ...   # setup, CMD, teardown
    bench/cluster/emu-cluster --instance slurm setup --servers 2    # a second cluster beside the default:
        # namespaces gslurm-s*, hosts slurm-s*, subnet 10.214.0.0/24 (GRANNDIS_EMU_SUBNET), state in
        # /run/granndis-emu-slurm; GRANNDIS_EMU_INSTANCE=slurm does the same for every command

Why each piece (measured on this kind of machine, see docs/cluster.md):
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
  bench/cluster/rsh-agent, which enters the target server's namespaces (nsenter) instead of ssh.
- netem (delay) is not in every kernel (it is not in this one); --delay probes it and refuses clearly.

Standard library only: the rsh agent runs under the system python3 before any virtual environment.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ENV_STATE_DIR = "GRANNDIS_EMU_STATE_DIR"
DEFAULT_STATE_DIR = "/run/granndis-emu"
NS_PREFIX = "gemu-s"          # network namespaces gemu-s0, gemu-s1, ... (under /run/netns)
HUB_NS = "gemu-hub"           # holds the bridge when there are more than 2 servers
BRIDGE = "gemubr0"
IFNAME = "gemu0"              # the same interface name in every server: GLOO_SOCKET_IFNAME can be global
SUBNET_PREFIX = "10.213.0"    # server i has 10.213.0.(i+1); only inside our namespaces
SUBNET = SUBNET_PREFIX + ".0/24"
HOST_PREFIX = "emu-s"
# Instances: several emulated clusters may exist side by side (a benchmark on the default one, a Slurm
# cluster on another).  GRANNDIS_EMU_INSTANCE=NAME (or --instance NAME) gives every name its own
# prefix, subnet and state directory; unset or empty = the names above, unchanged.
ENV_INSTANCE = "GRANNDIS_EMU_INSTANCE"
ENV_SUBNET = "GRANNDIS_EMU_SUBNET"          # e.g. 10.214.0 (a /24); default 10.214.0 for named instances
INSTANCE_RE = r"[a-z][a-z0-9]{0,7}"
MAX_SERVERS = 16
CMD_TIMEOUT_S = 30            # every ip/tc/nsenter call is bounded
DEFAULT_RUN_TIMEOUT_S = 1800  # emu-mpirun's default bound on a whole job
# tbf: the queue may hold this much time of traffic before dropping; TCP backs off long before.
TBF_LATENCY = "200ms"
EXIT_USAGE, EXIT_REFUSED = 2, 3

RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
DELAY_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
UNSHAPED = ("unshaped", "none", "off")
NETEM_MISSING = ("this kernel has no netem qdisc (sch_netem), so --delay cannot be emulated here "
                 "(tc said: {detail}); run without --delay (links are then shaped by rate only), or on a "
                 "kernel built with CONFIG_NET_SCH_NETEM")


class EmuError(RuntimeError):
    """A clear, user-facing problem; `code` is the exit status."""

    def __init__(self, message, code=1):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------------------------
# Parsing


def parse_rate(text):
    """'100mbit' -> 100_000_000 (bits/s); 'unshaped' / 'none' / 'off' -> None.  tc's decimal units."""
    t = str(text).strip().lower()
    if t in UNSHAPED:
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", t)
    if m and m.group(2) in ("mbps", "gbps", "kbps", "bps", "m", "g", "k", "mb", "gb", "kb"):
        raise ValueError(f"link rate {text!r} is ambiguous (bytes or bits?); write bits per second with a "
                         f"unit, e.g. 100mbit or 1gbit")
    if not m or m.group(2) not in RATE_UNITS:
        raise ValueError(f"link rate {text!r} not understood; write e.g. 25mbit, 100mbit, 1gbit "
                         f"(units: {', '.join(RATE_UNITS)}) or 'unshaped'")
    bps = float(m.group(1)) * RATE_UNITS[m.group(2)]
    if not 10**5 <= bps <= 10**11:
        raise ValueError(f"link rate {text!r} is outside 100kbit..100gbit")
    return int(bps)


def format_rate(bps):
    if bps is None:
        return "unshaped"
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= scale and bps % scale == 0:
            return f"{bps // scale}{unit}"
    return f"{bps}bit"


def parse_delay(text):
    """'5ms' -> 0.005 (s)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(us|ms|s)", str(text).strip().lower())
    if not m:
        raise ValueError(f"delay {text!r} not understood; write e.g. 100us, 5ms or 0.1s")
    seconds = float(m.group(1)) * DELAY_UNITS[m.group(2)]
    if not 0 < seconds <= 10:
        raise ValueError(f"delay {text!r} must be above 0 and at most 10s")
    return seconds


def tbf_burst_bytes(bps):
    """Bucket size: 1 ms of traffic, at least 64 KiB (one GSO super-packet on veth must fit, or tbf
    drops it).  Small against the MB-sized halo messages, so the measured rate stays near R."""
    return max(64 * 1024, bps // 8 // 1000)


def qdisc_commands(ns, dev, bps, delay_s=None):
    """The tc command lines that shape egress of `dev` in namespace `ns` (list of argv lists)."""
    base = ["ip", "netns", "exec", ns, "tc", "qdisc"]
    if delay_s is None and bps is None:
        return [base + ["del", "dev", dev, "root"]]
    if delay_s is not None:
        # netem does both: its own rate limiter sits after the delay line.
        cmd = base + ["replace", "dev", dev, "root", "netem", "delay", f"{delay_s * 1e6:.0f}us"]
        if bps is not None:
            cmd += ["rate", f"{bps}bit"]
        return [cmd]
    return [base + ["replace", "dev", dev, "root", "tbf", "rate", f"{bps}bit",
                    "burst", str(tbf_burst_bytes(bps)), "latency", TBF_LATENCY]]


# ---------------------------------------------------------------------------------------------
# Layout of the emulated cluster (pure: no system calls)


def instance_names(instance=None, env=None):
    """Every name and address of one emulated cluster instance (pure).  `instance` None: from the
    environment.  Names never overlap between instances: teardown of one leaves the others alone."""
    env = os.environ if env is None else env
    inst = env.get(ENV_INSTANCE, "") if instance is None else instance
    if not inst:
        return {"instance": "", "ns_prefix": NS_PREFIX, "hub_ns": HUB_NS, "bridge": BRIDGE, "ifname": IFNAME,
                "subnet_prefix": SUBNET_PREFIX, "host_prefix": HOST_PREFIX, "probe_ns": "gemu-probe",
                "port_prefix": "gemup", "state_dir": DEFAULT_STATE_DIR}
    if not re.fullmatch(INSTANCE_RE, inst) or inst == "emu":
        raise EmuError(f"emulated cluster instance {inst!r} must be 1-8 lower-case letters or digits starting "
                       f"with a letter, and not 'emu' (the default instance's names)", code=EXIT_USAGE)
    sub = env.get(ENV_SUBNET) or "10.214.0"
    if not re.fullmatch(r"10\.\d{1,3}\.\d{1,3}", sub) or max(map(int, sub.split(".")[1:])) > 255:
        raise EmuError(f"{ENV_SUBNET}={sub!r} must be the first three numbers of a 10.x.y.0/24 subnet, "
                       f"e.g. 10.214.0", code=EXIT_USAGE)
    return {"instance": inst, "ns_prefix": f"g{inst}-s", "hub_ns": f"g{inst}-hub", "bridge": f"g{inst}br0",
            "ifname": f"g{inst}0", "subnet_prefix": sub, "host_prefix": f"{inst}-s", "probe_ns": f"g{inst}-probe",
            "port_prefix": f"g{inst}p", "state_dir": f"{DEFAULT_STATE_DIR}-{inst}"}


def state_dir():
    return os.environ.get(ENV_STATE_DIR) or instance_names()["state_dir"]


def layout(servers, sdir=None):
    """Names and addresses of an emulated cluster of `servers` servers."""
    if not isinstance(servers, int) or not 2 <= servers <= MAX_SERVERS:
        raise ValueError(f"--servers must be an integer from 2 to {MAX_SERVERS}, got {servers!r}")
    nm = instance_names()
    sdir = sdir or state_dir()
    hp, sp = nm["host_prefix"], nm["subnet_prefix"]
    hosts = [{"index": i, "hostname": f"{hp}{i}", "netns": f"{nm['ns_prefix']}{i}",
              "uts": os.path.join(sdir, f"uts-{hp}{i}"), "address": f"{sp}.{i + 1}"}
             for i in range(servers)]
    # Every egress that tc shapes: (namespace, device).
    egress = [(h["netns"], nm["ifname"]) for h in hosts]
    if servers > 2:
        egress += [(nm["hub_ns"], f"{nm['port_prefix']}{i}") for i in range(servers)]
    return {"servers": servers, "subnet": f"{sp}.0/24", "ifname": nm["ifname"], "bridge": servers > 2,
            "hosts": hosts, "egress": egress, "state_dir": sdir, "names": nm}


def read_state(sdir=None):
    path = os.path.join(sdir or state_dir(), "state.json")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise EmuError("no emulated cluster is set up (no " + path + "); run "
                       "`bench/cluster/emu-cluster setup --servers 2 --rate 100mbit` first", code=EXIT_USAGE) from None
    except (OSError, ValueError) as exc:
        raise EmuError(f"cannot read {path}: {exc}; run `bench/cluster/emu-cluster teardown` and set up again")


def write_state(state):
    sdir = state["state_dir"]
    os.makedirs(sdir, exist_ok=True)
    tmp = os.path.join(sdir, "state.json.tmp")
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, os.path.join(sdir, "state.json"))


def host_index(state, target):
    """Index of the server an rsh target names (hostname, user@hostname or address)."""
    name = target.rsplit("@", 1)[-1]
    for h in state["hosts"]:
        if name in (h["hostname"], h["address"]):
            return h["index"]
    known = ", ".join(h["hostname"] for h in state["hosts"])
    raise EmuError(f"rsh-agent: {target!r} is not a server of the emulated cluster (servers: {known})",
                   code=255)


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
    for name in sorted(extra_env) + [k for k in EXPORTED_ENV if k in env] + \
            sorted(k for k in env if k.startswith("GRANNDIS_") and k not in extra_env):
        mpi += ["-x", name]
    # `timeout` bounds the whole job: SIGTERM to mpirun (which ends its ranks), SIGKILL 15 s later.
    full = ["timeout", "--kill-after=15", str(int(timeout_s)), *enter_argv(hosts[0], mpi + rest)]
    return full, extra_env


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


def default_python():
    venv = os.path.join(REPO, ".venv", "bin", "python")
    return venv if os.path.exists(venv) else sys.executable


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


def check_measurement(m, servers, ranks_per_server, bps, high=1.15, low=0.5, capacity_Bps=None,
                      with_fatal=False):
    """Problems (list of str) with a ping-pong measurement; empty when shaping holds.

    with_fatal: return (problems, fatal) where fatal says a problem is structural (not load)."""
    problems, fatal = [], False
    hosts = m["hosts"]
    if len(set(hosts)) != servers:
        problems.append(f"Open MPI sees {len(set(hosts))} host(s) ({sorted(set(hosts))}), expected {servers}: "
                        f"the UTS namespaces are not in effect")
        fatal = True
    for s in range(servers):
        mine = set(hosts[s * ranks_per_server:(s + 1) * ranks_per_server])
        if len(mine) != 1:
            problems.append(f"server {s}'s ranks are on several hosts {sorted(mine)}")
            fatal = True
    if bps is not None:
        want = bps / 8
        floor = want if capacity_Bps is None else min(want, capacity_Bps)
        for peer, bw in m["inter_Bps"].items():
            ratio = bw / want
            if ratio > high:
                problems.append(f"inter-server bandwidth to server {peer}: {bw / 1e6:.2f} MB/s = {ratio:.2f}x "
                                f"the configured {format_rate(bps)} ({want / 1e6:.2f} MB/s); allowed at most "
                                f"{high:g}x: the link is not shaped as configured")
                fatal = True
            elif bw < low * floor:
                what = "the configured rate" if floor == want else "this machine's unshaped capacity"
                problems.append(f"inter-server bandwidth to server {peer}: {bw / 1e6:.2f} MB/s = {ratio:.2f}x "
                                f"the configured {format_rate(bps)} ({want / 1e6:.2f} MB/s), under {low:g}x "
                                f"{what} ({floor / 1e6:.2f} MB/s): the link is not shaped as configured "
                                f"(or the machine is too busy to drive it; try again when it is idle)")
        inter_best = max(m["inter_Bps"].values()) if m["inter_Bps"] else 0.0
        if m.get("intra_Bps") is not None and m["intra_Bps"] < 1.5 * inter_best:
            problems.append(f"intra-server bandwidth {m['intra_Bps'] / 1e6:.1f} MB/s is not above the shaped "
                            f"inter-server link ({inter_best / 1e6:.1f} MB/s): ranks inside a server are not "
                            f"using shared memory")
            fatal = True
    return (problems, fatal) if with_fatal else problems


# ---------------------------------------------------------------------------------------------
# Command line


def build_parser():
    p = argparse.ArgumentParser(prog="emu-cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage="emu-cluster [--instance NAME] {setup,shape,teardown,status,probe,selfcheck,session} ...")
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


def format_selfcheck(m):
    rate = format_rate(m.get("rate_bps"))
    lines = [f"hosts by rank: {' '.join(m['hosts'])}",
             f"intra-server (rank 0 <-> 1, shared memory): {m['intra_Bps'] / 1e6:9.1f} MB/s"
             if m.get("intra_Bps") is not None else "intra-server: (one rank per server, not measured)"]
    for peer, bw in m["inter_Bps"].items():
        ratio = "" if m.get("rate_bps") is None else f" = {bw / (m['rate_bps'] / 8):.2f}x the {rate} limit"
        lines.append(f"inter-server (server 0 <-> {peer}):            {bw / 1e6:9.2f} MB/s{ratio}")
    lines.append(f"message size {m['bytes']:,} B, {m['reps']} round trips each, best of {m.get('trials', 1)} trials"
                 f" (job {m.get('attempts', 1)})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

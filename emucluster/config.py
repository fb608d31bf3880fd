"""The emulated cluster's names, link-rate parsing and layout (pure: no system calls; standard library only).

Every name the emulated cluster uses (namespaces, hosts, subnet, state directory) comes from here, per
instance, so that two clusters can exist side by side; cluster.py builds what this describes."""
from __future__ import annotations

import json
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
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
# tbf: the queue may hold this much time of traffic before dropping.  TCP mostly backs off before it fills;
# at 10 Mbit/s a few packets a run are dropped and retransmitted (docs/emulated-cluster.md).
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
                       "`emucluster/emu-cluster setup --servers 2 --rate 100mbit` first", code=EXIT_USAGE) from None
    except (OSError, ValueError) as exc:
        raise EmuError(f"cannot read {path}: {exc}; run `emucluster/emu-cluster teardown` and set up again")


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

"""The test cluster's processes: state files, finding, spawning and stopping them (standard library only).
Every pid handled here was started by slurmcluster.py (or runs inside its namespaces)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

CMD_TIMEOUT_S = 30



def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return None


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_pids(pids, grace_s=5.0):
    """SIGTERM, then SIGKILL after grace_s, to the given pids (already known to be ours)."""
    pids = [p for p in pids if p and p != os.getpid() and alive(p)]
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    for p in pids:
        if alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
    for p in pids:  # reap our own children
        try:
            os.waitpid(p, os.WNOHANG)
        except OSError:
            pass


def namespace_pids(netns):
    """Every process inside one of this instance's network namespaces (all started by this cluster)."""
    p = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    return [int(x) for x in p.stdout.split() if x.isdigit()] if p.returncode == 0 else []


def spawn(argv, log):
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc.pid

"""An advisory lock on a run directory, held by the job that trains in it.

Without it, `--overwrite-run`, `--resume` or a new run started while another job still trains in the
same directory mixed the two runs' files.  The lock is `flock` on the directory, taken by rank 0 for
the whole run: the kernel drops it when the process ends, however it ends, so a killed job leaves no
stale lock.  RUN_DIR/.lock names the holder (host, pid, job id) so a refusal can say who holds it; it
is only read while the directory is locked, by the job that wrote it once that job has started its run.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket

from granndis_hpc.fsutil import atomic_write_bytes

LOCK_FILE = ".lock"
_JOB_ID_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID")


class RunLockedError(RuntimeError):
    """The run directory is locked by a live job; the message names it."""


def _holder() -> dict:
    job = next((os.environ[v] for v in _JOB_ID_VARS if os.environ.get(v)), None)
    return {"host": socket.gethostname(), "pid": os.getpid(), "job": job}


def describe_holder(text: str) -> str:
    try:
        h = json.loads(text)
        return f"host {h.get('host')}, pid {h.get('pid')}, job id {h.get('job') or 'none'}"
    except (ValueError, AttributeError):
        return "a process that did not say who it is"


class RunLock:
    """Hold the lock on RUN_DIR until release() (or the end of the process).  Raises RunLockedError
    when another live process holds it, naming that process (as it recorded itself with announce();
    a holder still starting up has not yet, and the file may then name an earlier holder) and what to
    do.  The flock is on the directory itself, so taking it writes nothing."""

    def __init__(self, run_dir: str, action: str = "train in it"):
        run_dir = os.fspath(run_dir)
        self.path = os.path.join(run_dir, LOCK_FILE)
        os.makedirs(run_dir, exist_ok=True)
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            try:
                with open(self.path, encoding="utf-8", errors="replace") as f:
                    holder = f.read(4096)
            except OSError:
                holder = ""
            raise RunLockedError(
                f"run directory {run_dir} is in use by a running job ({describe_holder(holder)}): a second job "
                f"cannot {action} while it runs; wait for it to end or stop it (scancel / kill), or choose "
                f"another --out") from None
        self._fd = fd

    def announce(self) -> None:
        """Write RUN_DIR/.lock naming this process (host, pid, job id), for a refused job's message.  The
        trainer calls it when the run starts writing, so a job refused for another reason (the directory
        holds a run, a checkpoint of another shape) leaves the directory exactly as it was."""
        atomic_write_bytes(self.path, json.dumps(_holder()).encode())

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None

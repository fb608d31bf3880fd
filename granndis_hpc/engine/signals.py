"""Stopping cleanly on SIGUSR1/SIGTERM: a signal only sets a flag, which the training loop polls.

The trainer reduces that flag (max over ranks) after every epoch, so a signal that reaches only some
ranks, or reaches them at different times, still stops every rank after the same epoch; they write a
checkpoint and exit 0.  Measured with Open MPI 4.1.4: mpirun forwards SIGUSR1 to every rank, but
SIGTERM or SIGINT to mpirun aborts the job: the ranks get SIGCONT, odls_base_sigkill_timeout seconds
(default 1) later SIGTERM, as long again later SIGKILL, and mpirun exits 1 whatever they did.  The
ranks checkpoint if that fits in the wait; under mpirun send SIGUSR1 for a stop with exit status 0
(docs/checkpoints.md, tests/launch/test_mpirun_signals.py).  Under Slurm,
scancel and preemption send SIGTERM to every task and SIGKILL after KillWait / GraceTime (Slurm's
documentation; not measured here).

Measured under Slurm 22.05 (slurm/README.md): srun relays SIGUSR1 to every task but answers SIGTERM by
killing the step, so slurm/lib.sh passes SIGUSR1 to either launcher.  A signal may arrive while a rank
is still starting (importing torch, MPI_Init, reading shards: seconds): `install_early()` is the first
thing `granndis-train` does, before any of that, and the Trainer takes over what it recorded, so a stop
requested during set-up is honoured (the run stops before its first epoch) instead of killing the rank.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Any, Dict, Optional

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
# A file whose existence asks for a stop as a signal does (slurm/lib.sh creates it when the batch shell
# gets the time-limit warning): srun drops a signal that comes before it has started the tasks
# (measured, Slurm 22.05), the file is still there when they start.  Polled where the flag is.
ENV_STOP_FILE = "GRANNDIS_STOP_FILE"


class StopSignals:
    """SIGUSR1/SIGTERM set a flag (the handler does nothing else: it may run between any two bytecodes);
    the training loop polls it after each epoch."""

    def __init__(self, stop_file: Optional[str] = None):
        self.received: Optional[int] = None
        self._previous: Dict[int, Any] = {}  # signal.getsignal's: a handler, SIG_DFL/SIG_IGN or None
        self.stop_file = stop_file if stop_file is not None else os.environ.get(ENV_STOP_FILE) or None

    def install(self) -> bool:
        """Install the handlers (again: a library may have replaced them; the first previous handler is
        what uninstall restores)."""
        if threading.current_thread() is not threading.main_thread():
            return False  # Python only lets the main thread install handlers
        for sig in STOP_SIGNALS:
            previous = signal.signal(sig, self._handle)
            self._previous.setdefault(sig, previous)
        return True

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum

    def request(self, signum: int = signal.SIGUSR1) -> None:
        """Ask for a stop as a signal would (used by tests and by code that wants a clean stop)."""
        self._handle(signum, None)

    @property
    def requested(self) -> bool:
        return self.received is not None or (self.stop_file is not None and os.path.exists(self.stop_file))

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def ignore_warnings_after(self) -> None:
        """After the run has ended (finished, or stopped with its checkpoint): leave SIGUSR1 ignored when
        the handlers are uninstalled.  A time-limit warning that comes while the ranks shut down has
        nothing left to stop, and must not kill them (measured under Slurm: a job that finished its last
        epoch, then got the warning during MPI_Finalize, ended FAILED).  SIGTERM keeps its effect."""
        if signal.SIGUSR1 in self._previous:
            self._previous[signal.SIGUSR1] = signal.SIG_IGN

    def uninstall_and_redeliver(self) -> None:
        """Restore the previous handlers; a signal received meanwhile is raised again under them (for a
        run that cannot checkpoint: without a run directory a stop signal keeps its usual effect)."""
        received = self.received
        self.uninstall()
        if received is not None:
            self.received = None
            signal.raise_signal(received)


_early: Optional[StopSignals] = None


def install_early() -> StopSignals:
    """Install the stop handlers now, before a slow set-up; `take_early` hands them to the Trainer."""
    global _early
    if _early is None:
        _early = StopSignals()
        _early.install()
    return _early


def take_early() -> StopSignals:
    """The handlers install_early put in place (with any signal already received), or new ones."""
    global _early
    early, _early = _early, None
    return early if early is not None else StopSignals()


__all__ = ["ENV_STOP_FILE", "STOP_SIGNALS", "StopSignals", "install_early", "take_early"]

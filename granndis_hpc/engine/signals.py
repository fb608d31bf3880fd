"""Stopping cleanly on SIGUSR1/SIGTERM: a signal only sets a flag, which the training loop polls.

The trainer reduces that flag (max over ranks) after every epoch, so a signal that reaches only some
ranks, or reaches them at different times, still stops every rank after the same epoch; they write a
checkpoint and exit 0.  Measured with Open MPI 4.1.4: mpirun forwards SIGUSR1 to every rank, but on
SIGTERM it tears the job down (the ranks get SIGTERM and are killed about a second later,
odls_base_sigkill_timeout=1), too soon for a checkpoint, so under mpirun send SIGUSR1.  Under Slurm,
scancel and preemption send SIGTERM to every task and SIGKILL after KillWait / GraceTime (Slurm's
documentation; not measured here).
"""
from __future__ import annotations

import signal
import threading
from typing import Dict, Optional

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class StopSignals:
    """SIGUSR1/SIGTERM set a flag (the handler does nothing else: it may run between any two bytecodes);
    the training loop polls it after each epoch."""

    def __init__(self):
        self.received: Optional[int] = None
        self._previous: Dict[int, object] = {}

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False  # Python only lets the main thread install handlers
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return True

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum

    def request(self, signum: int = signal.SIGUSR1) -> None:
        """Ask for a stop as a signal would (used by tests and by code that wants a clean stop)."""
        self._handle(signum, None)

    @property
    def requested(self) -> bool:
        return self.received is not None

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}


__all__ = ["STOP_SIGNALS", "StopSignals"]

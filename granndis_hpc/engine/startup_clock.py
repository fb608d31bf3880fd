"""Where a rank's start-up goes: from the creation of its process to the first epoch, in phases.

A short run spends most of its wall time before its first epoch (the interpreter and torch's imports,
MPI and the process groups, reading and checking the shards, planning the views), which the epochs'
times do not show.  The clock starts at the process's creation as the kernel records it (Linux:
/proc/self/stat's start time), so the imports before any of this package's code ran are counted too;
elsewhere it starts when this module is imported.
"""
from __future__ import annotations

import os
import time
from typing import Dict, Optional

# The phases a training rank's start-up is cut into, in order (Trainer marks the end of each).
PHASES = ("launch", "world", "shards", "views", "model")
PHASE_HELP = {
    "launch": "process creation to the trainer: the interpreter, imports, MPI initialisation",
    "world": "the topology: communicators, process groups, the device",
    "shards": "the manifest read and checked, the checksums verified",
    "views": "this rank's slice read, the world view and the mode's training plan built",
    "model": "the model, its parameters (--init-from), the optimizer, checkpoints (--resume)",
}


def process_start_time() -> Optional[float]:
    """The wall-clock time (time.time()) this process was created, or None where the system does not say."""
    try:
        with open("/proc/self/stat") as f:
            # Field 22, after the command name in parentheses (which may hold spaces): clock ticks since boot.
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


_IMPORTED_AT = time.time()


class StartupClock:
    """Phase durations of one rank's start-up, marked in order; `origin` is the process's creation."""

    def __init__(self, origin: Optional[float] = None):
        start = process_start_time() if origin is None else origin
        # The kernel's start time has a resolution of one clock tick (10 ms): never after the import.
        self.origin = min(start, _IMPORTED_AT) if start is not None else _IMPORTED_AT
        self._last = self.origin
        self.phases: Dict[str, float] = {}

    def mark(self, phase: str) -> None:
        """End `phase` now (its duration: since the previous mark, or since the process was created)."""
        if phase not in PHASES:
            raise ValueError(f"unknown start-up phase {phase!r}; one of {', '.join(PHASES)}")
        now = time.time()
        self.phases[phase] = self.phases.get(phase, 0.0) + (now - self._last)
        self._last = now

    def elapsed(self) -> float:
        """Seconds since the process was created."""
        return time.time() - self.origin

    def vector(self) -> list:
        """The phases' seconds in PHASES order (0 for a phase not marked), for a reduction over ranks."""
        return [float(self.phases.get(p, 0.0)) for p in PHASES]

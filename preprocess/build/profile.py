"""The build's profile ($GRANNDIS_BUILD_PROFILE, bench/bench_build_scaling.py reads it): every rank's wall
and CPU seconds and peak RSS per phase, measured by pipeline.PhaseLog and written as JSON by rank 0.

A profile file that cannot be written is refused before the build starts, not after it: the profile is
what the variable was set for, so a build that ran for hours without being able to record it would be
wasted, and the refusal costs nothing up front.  A write that fails anyway at the end (the disk filled,
the directory was removed meanwhile) only warns: the shard set is complete and verified by then, and
failing the build would throw away what the user needs most for a measurement beside it.
"""
from __future__ import annotations

import json
import logging
import os

log = logging.getLogger(__name__)


def _peak_rss() -> int | None:
    """This process's peak resident set since the last reset, in bytes (Linux VmHWM; None elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs); no-op elsewhere."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def check_profile_path(variable: str, path: str | None) -> None:
    """ValueError saying why the profile file `path` (named by the environment variable `variable`; None:
    no profile) cannot be written: its directory is missing or not writable, or it is a directory."""
    if not path:
        return
    directory = os.path.dirname(os.path.abspath(path))
    problem = (f"directory {directory} does not exist" if not os.path.isdir(directory) else
               f"{path} is a directory" if os.path.isdir(path) else
               f"directory {directory} is not writable by this user" if not os.access(directory, os.W_OK | os.X_OK)
               else "")
    if problem:
        raise ValueError(f"{variable}={path}: {problem}, so the build's profile could not be written; give a "
                         f"writable file path, or unset {variable}")


def write_profile(phase_log, path: str | None) -> None:
    """Collective: rank 0 writes every rank's per-phase profile (phase_log.profile) as JSON to `path`
    (None: nothing); a failed write is a warning (module docstring)."""
    profiles = phase_log.group.gather_object(phase_log.profile)
    if path and phase_log.rank == 0:
        try:
            with open(path, "w") as f:
                json.dump({"ranks": profiles}, f, indent=1)
        except OSError as exc:
            log.warning(f"[preprocess] the shard set is complete, but its build profile could not be written to "
                        f"{path} ({exc.strerror or exc})")

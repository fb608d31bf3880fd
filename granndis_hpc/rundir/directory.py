"""The run directory (RUN_DIR = --out): one object owns its files and the rules for writing them.

    RUN_DIR/config.json       the resolved options (config.write_resolved_config)
    RUN_DIR/metrics.jsonl     one record per epoch (metrics.MetricsWriter), appended as they finish
    RUN_DIR/summary.json      the run's summary, written once it has finished
    RUN_DIR/best-model.pt     the parameters of the best-validation epoch (refreshed with checkpoints)
    RUN_DIR/checkpoints/      rundir/checkpoint.py (layout: rundir/checkpoint_files.py)
    RUN_DIR/.lock             lock.RunLock: held by rank 0 while a job uses the directory

Every method is collective over the job's topology (rank 0 writes; a failure raises the same error on
every rank, collective_errors).  A new run refuses a directory that holds one unless --overwrite-run,
which moves the old run aside and deletes it only once the new config.json is written.  --overwrite-run
replaces only a run of granndis-train (recognised by its config.json), and only the files above: other
files in the directory stay; links, devices, the current directory and the run --init-from reads are
refused (granndis_hpc/outputs.py).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Dict, List, Optional, Sequence

from granndis_hpc.cluster.errors import collective_errors
from granndis_hpc.rundir.config_file import CONFIG_FILE_NAME, load_resolved_config, write_resolved_config
from granndis_hpc.options import ConfigError
from granndis_hpc.rundir.checkpoint_files import CHECKPOINTS, CheckpointError, checkpoints_dir, note
from granndis_hpc.fsutil import remove_temporaries
from granndis_hpc.metrics import METRICS_FILE, MetricsWriter, write_summary
from granndis_hpc.outputs import OutputKind, check_output_place, check_place_type
from granndis_hpc.rundir.best_model import BEST_MODEL, write_best_model
from granndis_hpc.rundir.lock import RunLock, RunLockedError

SUMMARY_FILE = "summary.json"

# What the trainer writes into a run directory; any of them there means the directory holds a run.
RUN_OUTPUTS = (CONFIG_FILE_NAME, METRICS_FILE, SUMMARY_FILE, BEST_MODEL, CHECKPOINTS)
_ASIDE_PREFIX = ".replaced-run-"


def run_contents(run_dir: str) -> List[str]:
    """The trainer's outputs present in RUN_DIR (an empty checkpoints/ does not count: nothing was
    written into it)."""
    found = []
    for name in RUN_OUTPUTS:
        path = os.path.join(os.fspath(run_dir), name)
        if name == CHECKPOINTS:
            if os.path.isdir(path) and os.listdir(path):
                found.append(name + "/")
        elif os.path.lexists(path):
            found.append(name)
    return found


def check_run_files(run_dir: str) -> None:
    """Before a resume trains: every run file it rewrites is a file (or absent).  A directory in a file's
    place failed only at the first write of it, epochs later, blamed on free space."""
    for name in RUN_OUTPUTS:
        path = os.path.join(os.fspath(run_dir), name)
        if name != CHECKPOINTS and os.path.isdir(path):
            raise CheckpointError(f"{path} is a directory, not the run's {name}: the run writes {name} there; move "
                                  f"the directory away and resume again")


def refuse_new_run_in(run_dir: str, found: List[str]) -> CheckpointError:
    return CheckpointError(
        f"run directory {run_dir} already holds a run ({', '.join(found)}); a new run there would mix with "
        f"or destroy it: continue it with --resume {run_dir}, start a new run in another --out, or replace "
        f"it with --overwrite-run")


def is_run(run_dir: str) -> bool:
    """Whether RUN_DIR's config.json holds a training run's resolved options (write_resolved_config)."""
    try:
        saved = load_resolved_config(run_dir)
    except ConfigError:
        return False
    return {"shards", "mode", "epochs"} <= set(saved)


# What --overwrite-run may replace (granndis_hpc/outputs.py): the trainer's own outputs of an earlier run.
RUN = OutputKind(tool="granndis train", what="a training run", recognise=is_run, overwrite="--overwrite-run",
                 members=RUN_OUTPUTS, existing=lambda path, _: str(refuse_new_run_in(path, run_contents(path))))


def move_run_aside(run_dir: str) -> Optional[str]:
    """Move the trainer's outputs in RUN_DIR into a hidden directory inside it, so a new run can write
    its config before the old run is deleted (renames only: nothing is lost if the job dies here).
    Returns that directory, or None when there was nothing to move."""
    run_dir = os.fspath(run_dir)
    present = [name for name in RUN_OUTPUTS if os.path.lexists(os.path.join(run_dir, name))]
    if not present:
        return None
    aside = tempfile.mkdtemp(prefix=_ASIDE_PREFIX, dir=run_dir)
    for name in present:
        os.rename(os.path.join(run_dir, name), os.path.join(aside, name))
    return aside


def replace_run(run_dir: str, write_new_config) -> bool:
    """--overwrite-run: move the old run's outputs aside, call write_new_config(), then delete the old
    run.  If writing the new config fails, the old run is moved back (and the error raised), so at no
    point is the old run gone without the new one's config in its place.  Returns whether there was a
    run to replace; a failure to delete the old one after success is only reported (disk space)."""
    aside = move_run_aside(run_dir)
    try:
        write_new_config()
    except BaseException:
        if aside is not None:
            for name in os.listdir(aside):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(run_dir, name))  # a half-made new file (atomic writes leave none)
                os.rename(os.path.join(aside, name), os.path.join(run_dir, name))
            os.rmdir(aside)
        raise
    if aside is None:
        return False
    try:
        shutil.rmtree(aside)
    except OSError as exc:
        note(f"--overwrite-run: the new run is in {run_dir}, but the old one in {aside} could not be deleted: {exc}")
    return True


class RunDirectory:
    """One run's directory: claimed (locked, checked) at set-up, opened before the first epoch, written
    by rank 0, released by close().  `path` is --out (or --resume's directory, the same)."""

    def __init__(self, topo, path: str, resume: bool, overwrite_run: bool, reads: Sequence = (),
                 provenance: Optional[Dict] = None):
        self.topo, self.path = topo, os.fspath(path)
        self.resume, self.overwrite_run = bool(resume), bool(overwrite_run)
        self.reads = tuple(reads)  # (path, option) of what the job reads: never replaced
        self._lock: Optional[RunLock] = None
        self.writer: Optional[MetricsWriter] = None
        # Written into best-model.pt: the run's options and its dataset's digest (model_source.model_provenance).
        self.provenance = provenance

    @property
    def checkpoints(self) -> str:
        return checkpoints_dir(self.path)

    def claim(self) -> None:
        """Collective: rank 0 takes the lock (held until close(): no second job touches the run
        meanwhile), removes a killed writer's temporaries, and refuses a new run in a directory that
        holds one (unless --overwrite-run)."""
        with collective_errors(self.topo.world, "", catch=(CheckpointError, OSError, RunLockedError)):
            if self.topo.rank != 0:
                return
            if not self.resume:  # before the lock, which creates the directory
                check_place_type(self.path, RUN, error=CheckpointError)
            self._lock = RunLock(self.path, "resume it" if self.resume else
                                 "replace its run (--overwrite-run)" if self.overwrite_run else "start a run in it")
            # With the lock held no one else writes here: temporaries are a killed writer's leftovers.
            stale = remove_temporaries(self.path, [n for n in RUN_OUTPUTS if n != CHECKPOINTS])
            if stale:
                note(f"removed {len(stale)} temporary file(s) of a job killed while writing: {', '.join(stale)}")
            if self.resume:
                check_run_files(self.path)
            if not self.resume:  # a run there is refused unless --overwrite-run, which replaces only a run
                check_output_place(self.path, RUN, self.overwrite_run, self.reads, error=CheckpointError)

    def open(self, cfg) -> Optional[MetricsWriter]:
        """Collective: rank 0 writes config.json and opens metrics.jsonl (appending on resume: the
        checkpoint manager cut it at the checkpoint).  With --overwrite-run the old run's outputs are
        moved aside first and deleted only once the new config.json is written (replace_run)."""
        with collective_errors(self.topo.world, f"preparing run directory {self.path}", catch=(OSError, ConfigError)):
            if self.topo.rank == 0:
                os.makedirs(self.path, exist_ok=True)
                self._lock.announce()  # RUN_DIR/.lock: who holds the run directory (host, pid, job id)
                if self.overwrite_run and not self.resume:
                    if replace_run(self.path, lambda: write_resolved_config(cfg, self.path)):
                        note(f"--overwrite-run: replaced the run that was in {self.path}")
                else:
                    write_resolved_config(cfg, self.path)
                self.writer = MetricsWriter(self.path, append=self.resume)
        return self.writer

    def failed_write(self, name: str) -> str:
        """What a failed write of a run file says (a full disk): the file, and what is still usable."""
        return (f"writing {os.path.join(self.path, name)} (free space, then continue with --resume {self.path}: the "
                f"run's newest complete checkpoint in {self.checkpoints} stays usable, and metrics.jsonl holds "
                f"whole records only)")

    def write_best_model(self, best: Optional[Dict], state: Optional[Dict]) -> None:
        """Collective: rank 0 writes best-model.pt (atomically) when an epoch was evaluated."""
        with collective_errors(self.topo.world, self.failed_write(BEST_MODEL), catch=(OSError,)):
            if self.topo.rank == 0 and best is not None:
                write_best_model(self.path, best, state, self.provenance)

    def finish(self, summary: Dict) -> None:
        """Collective: close metrics.jsonl and write summary.json (the run has finished)."""
        with collective_errors(self.topo.world, self.failed_write(SUMMARY_FILE), catch=(OSError,)):
            if self.writer is not None:
                self.close_metrics()
                write_summary(self.path, summary)

    def close_metrics(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def close(self) -> None:
        """Release what the directory holds (metrics.jsonl, the lock); safe after a failed set-up."""
        self.close_metrics()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

"""The training run's checkpoint component, composed into the Trainer as torchtitan composes its
CheckpointManager: when a checkpoint is written (every --checkpoint-every epochs, when a stop is requested,
--checkpoint-initial, at an early stop), what it holds beside the model and the optimizer (the
best-validation record), and how a run continues from one (--resume).  The files themselves are
rundir/checkpoint.py's CheckpointManager; the run directory is rundir/directory.py's.

Everything the component reads is given to its constructor (CheckpointSettings: the options it reads;
the run directory, the job's topology and communicator, the state holders, the fingerprint, the stop
flag); the epoch is an argument of each method, so the trainer keeps its own count and nothing here
reads the trainer.  Every method of Checkpointer is collective over the job.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Protocol

import numpy as np
import torch

from granndis_hpc.cluster.comm import Communicator
from granndis_hpc.cluster.errors import raised_everywhere
from granndis_hpc.cluster.topology import Topology
from granndis_hpc.engine.signals import StopSignals
from granndis_hpc.engine.steps import TrainingError
from granndis_hpc.metrics import METRICS_FILE
from granndis_hpc.options.train import TrainConfig
from granndis_hpc.rundir import checkpoint
from granndis_hpc.rundir.directory import RunDirectory


class Stateful(Protocol):
    """What a checkpoint saves and restores: the optimizer (with its schedule) and a mode's sampler."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


class BestValidation:
    """Best-validation selection: the evaluated epoch with the highest validation metric (a tie keeps
    the earlier one, as PyG's examples/gcn.py does).  The metrics are exact reductions, so every rank
    decides alike; with keep_parameters (rank 0) a CPU copy of that epoch's parameters, identical on
    every rank, for best-model.pt and checkpoints.

    keys: split -> the key of its metric in an epoch record (metric_names.split_keys)."""

    def __init__(self, keys: Mapping[str, str], model: torch.nn.Module, keep_parameters: bool):
        self.keys = dict(keys)
        self.model = model
        self.keep_parameters = keep_parameters
        self.record: Optional[Dict[str, Any]] = None  # {"epoch", and the metric of every split}
        self.state: Optional[Dict[str, Any]] = None  # its parameters (keep_parameters only)

    def observe(self, rec: Mapping[str, Any]) -> None:
        """An evaluated epoch's record: kept when its validation metric beats the best so far."""
        val = self.keys["val"]
        if self.record is not None and not rec[val] > self.record[val]:
            return
        self.record = {"epoch": int(rec["epoch"]), **{k: rec[k] for k in self.keys.values()}}
        if self.keep_parameters:
            self.state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def checkpoint_entry(self) -> Optional[Dict[str, Any]]:
        """What a checkpoint stores: the record with its parameters under "model" (None: none evaluated)."""
        return None if self.record is None else dict(self.record, model=self.state)

    def restore(self, entry: Optional[Mapping[str, Any]]) -> None:
        """After a resume: a checkpoint's entry (record, and parameters where they are kept)."""
        if entry is None:
            self.record, self.state = None, None
            return
        self.record = {k: entry[k] for k in ("epoch", *self.keys.values())}
        self.state = entry.get("model") if self.keep_parameters else None


def shape_dependence(cfg: TrainConfig, mode_reason: Optional[str], precision_exact: bool, wire_exact: bool,
                     keyed: bool) -> Optional[str]:
    """Why a run's trajectory depends on S x G and the partition, or None when it does not (then its
    checkpoints may continue on another layout or shard set of the same dataset, in fb or flx): the
    mode's own reason (Mode.shape_dependence), then the layers' precision, the halo's wire dtype
    (`wire_exact`: the world exchange group's) and a model whose dropout is not `keyed` (its contract)."""
    reason = mode_reason
    if reason is None and not precision_exact:
        reason = (f"--precision {cfg.precision} rounds what the layers compute, and which sums a rank "
                  f"computes follows the partition")
    if reason is None and not wire_exact:
        reason = (f"--halo-dtype {cfg.halo_dtype} rounds the halo rows, and which rows are halo rows "
                  f"follows the partition")
    if reason is None and cfg.dropout > 0 and not keyed:
        reason = (f"model {cfg.model} draws its dropout masks from each rank's own generator (its forward "
                  f"takes no `dropout`), so they follow the layout")
    return reason


def open_run_directory(path: str, cfg: TrainConfig, topo: Topology, provenance: Dict[str, Any]) -> RunDirectory:
    """Collective: claim `path`, --out (rundir/directory.py: its lock; a new run refused where one is, unless
    --overwrite-run; the files the job reads never replaced).  `provenance`: what best-model.pt records
    beside the parameters (model_source.model_provenance).  A refusal releases the directory and raises.
    (Option rules that need no files, e.g. --checkpoint-every without --out, are TrainConfig's.)"""
    reads = ((cfg.init_from, "--init-from"), (cfg.shards, "--shards"))
    run_dir = RunDirectory(topo, path, bool(cfg.resume), cfg.overwrite_run, reads, provenance=provenance)
    try:
        run_dir.claim()
    except BaseException:
        run_dir.close()
        raise
    return run_dir


@dataclass(frozen=True)
class CheckpointSettings:
    """The options the checkpointer reads."""
    every: int  # --checkpoint-every (0: only when a stop is requested, and at an early stop)
    initial: bool  # --checkpoint-initial
    epochs: int  # --epochs: the last epoch a checkpoint may be of
    eval_only: bool  # --eval-only: nothing is trained, so there is no initial checkpoint to write
    verify_content: bool  # --verify-content: a resume without it says what was not checked

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> CheckpointSettings:
        return cls(every=cfg.checkpoint_every, initial=cfg.checkpoint_initial, epochs=cfg.epochs,
                   eval_only=cfg.eval_only, verify_content=cfg.verify_content)


class Checkpointer:
    """One run's checkpoints in `run_dir` (claimed by the caller): saves and restores `model`,
    `optimizer`, `sampler` (None when the mode has no state), every rank's RNG streams and `best`;
    `fingerprint` says which runs may continue them (rundir/fingerprint.py); `stop_signals` is this
    rank's stop flag, agreed over `comm` after every epoch."""

    def __init__(self, settings: CheckpointSettings, run_dir: RunDirectory, topo: Topology, comm: Communicator,
                 model: torch.nn.Module, optimizer: Stateful, sampler: Optional[Stateful], device: torch.device,
                 fingerprint: Dict[str, Any], best: BestValidation, stop_signals: StopSignals):
        self.settings, self.run_dir, self.comm, self.best = settings, run_dir, comm, best
        self.stop_signals = stop_signals
        self.rank = topo.rank
        self.manager = checkpoint.CheckpointManager(topo, run_dir.path, fingerprint, model, optimizer, device,
                                                    sampler=sampler)
        self.saved_epoch: Optional[int] = None  # the epoch of the newest checkpoint this attempt wrote
        self.stopped_checkpoint: Optional[str] = None  # the checkpoint a stop request ended the run with

    def save(self, epoch: int, elapsed_s: float = 0.0) -> str:
        """Checkpoint the state after `epoch` epochs into RUN_DIR/checkpoints/, with the best-validation
        epoch so far (its parameters too), and refresh RUN_DIR/best-model.pt."""
        path = self.manager.save(epoch, elapsed_s, best=self.best.checkpoint_entry())
        self.saved_epoch = epoch
        self.run_dir.write_best_model(self.best.record, self.best.state)
        return path

    def save_unless_saved(self, epoch: int, elapsed_s: float) -> None:
        """At an early stop: checkpoint `epoch` unless this attempt did so after that epoch already."""
        if self.saved_epoch != epoch:
            self.save(epoch, elapsed_s)

    def after_epoch(self, epoch: int, last: bool, elapsed_s: float, metrics_errno: int) -> bool:
        """After every epoch: agree whether any rank was asked to stop (a signal may reach only some
        ranks, or reach them at different times: one max-reduction makes all stop after the same
        epoch), then checkpoint when asked or due.  `metrics_errno`: rank 0's errno of a failed
        metrics.jsonl append (0: none), agreed in the same reduction.  True when the run must stop here."""
        flags = self.comm.allreduce_scalar(np.array([int(self.stop_signals.requested), metrics_errno],
                                                    dtype=np.int64), "max")
        stop = bool(flags[0])
        if flags[1]:
            raise raised_everywhere(TrainingError(
                f"{self.run_dir.failed_write(METRICS_FILE)}: {os.strerror(int(flags[1]))}; stopped after "
                f"{epoch} epochs"))
        due = self.settings.every > 0 and epoch % self.settings.every == 0
        if not (stop or due):
            return False
        path = self.save(epoch, elapsed_s)
        if not stop or last:
            return False  # a stop requested during the last epoch: the run is finished anyway
        self.stopped_checkpoint = path
        if self.rank == 0:
            checkpoint.note(f"stop requested (SIGUSR1/SIGTERM): stopped after {epoch} epochs "
                            f"with a checkpoint in {path}; continue with --resume {self.run_dir.path}")
        return True

    def save_initial(self, epoch: int) -> None:
        """--checkpoint-initial: before the first step of a new run (not a resumed one, nor --eval-only):
        the parameters as built (or read by --init-from), the optimizer's initial state and every rank's
        RNG state, as the checkpoint of epoch 0, which pruning keeps."""
        if self.settings.initial and epoch == 0 and not self.settings.eval_only:
            path = self.save(0, 0.0)
            if self.rank == 0:
                checkpoint.note(f"the initial parameters (epoch 0) are in {path}")

    def stopped_during_set_up(self, epoch: int) -> bool:
        """Was any rank asked to stop before the first epoch of this attempt?  Then stop at once: nothing
        was trained, so there is nothing new to checkpoint (the newest checkpoint, if any, stays the
        newest; slurm/lib.sh sees that no progress was made)."""
        if epoch >= self.settings.epochs:
            return False
        if not self.comm.allreduce_scalar(int(self.stop_signals.requested), "max"):
            return False
        if self.rank == 0:
            checkpoint.note(f"stop requested (SIGUSR1/SIGTERM) during set-up: stopped before training, at "
                            f"epoch {epoch} of {self.settings.epochs} (nothing new to checkpoint); continue "
                            f"with --resume {self.run_dir.path}")
        return True

    def resume(self) -> checkpoint.Resumed:
        """Restore the newest complete checkpoint (model, optimizer, sampler, RNG streams and the best
        record) and cut metrics.jsonl to match; returns where to continue (epoch 0 when there is none,
        as a job stopped before its first checkpoint must)."""
        resumed = self.manager.load(max_epoch=self.settings.epochs)
        if resumed.path is None and self.rank == 0:
            checkpoint.note(f"{self.run_dir.checkpoints} holds no complete checkpoint: starting from epoch 0")
        elif self.rank == 0 and not self.settings.verify_content:
            # Files edited with their checksums recomputed pass the checksum check: only the content
            # digest catches them, and it costs a pass over the data, so it is asked for, and said.
            checkpoint.note(f"continuing {resumed.path} after {resumed.epoch} epochs; the shard set's content was "
                            f"not checked (its files' checksums were): add --verify-content to check it against "
                            f"the build's digest")
        self.best.restore(resumed.best)
        return resumed

"""The trainer's checkpoints, resume and best-validation record: the part of engine/trainer.Trainer
that decides when a checkpoint is written, what it holds and how a run continues from one (the files
themselves are rundir/checkpoint.py's).  A mixin of Trainer: it reads the trainer's cfg, topo, comm,
model, optimizer, mode, manifest, run_dir, stop_signals, epoch and best-record attributes."""
from __future__ import annotations

import os
from typing import Dict, Optional

import numpy as np

from granndis_hpc.cluster.errors import raised_everywhere
from granndis_hpc.engine.model_source import model_provenance
from granndis_hpc.engine.steps import TrainingError
from granndis_hpc.metrics import METRICS_FILE
from granndis_hpc.rundir import checkpoint
from granndis_hpc.rundir.directory import RunDirectory
from granndis_hpc.rundir.fingerprint import fingerprint


class TrainerCheckpoints:
    # ---- best-validation selection --------------------------------------------------------------
    def _track_best(self, rec: Dict) -> None:
        """Keep the evaluated epoch with the highest validation metric (a tie keeps the earlier one,
        as PyG's examples/gcn.py does).  The metrics are exact reductions, so every rank decides alike;
        rank 0 keeps a CPU copy of the parameters (identical on every rank) for best-model.pt and checkpoints."""
        val = self.keys["val"]
        if self.best is not None and not rec[val] > self.best[val]:
            return
        self.best = {"epoch": int(rec["epoch"]), **{k: rec[k] for k in self.keys.values()}}
        if self.topo.rank == 0:
            self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def _restore_best(self, best: Optional[Dict]) -> None:
        """After a resume: the checkpoint's best epoch (record, and parameters on rank 0)."""
        if best is None:
            self.best, self.best_state = None, None
            return
        self.best = {k: best[k] for k in ("epoch", *self.keys.values())}
        self.best_state = best.get("model") if self.topo.rank == 0 else None

    # ---- checkpoints and resuming (the layout is described in engine/checkpoint.py) --------------
    def _set_up_checkpoints(self) -> None:
        """Collective: claim the run directory (engine/rundir.py: its lock; a new run refused where one is,
        unless --overwrite-run), make the checkpoint manager, and with --resume restore the newest
        complete checkpoint.  (Option rules that need no files, e.g. --checkpoint-every without --out,
        are TrainConfig.__post_init__'s.)"""
        cfg = self.cfg
        reads = ((cfg.init_from, "--init-from"), (cfg.shards, "--shards"))
        self.run_dir = RunDirectory(self.topo, cfg.out, cfg.resume, cfg.overwrite_run, reads) if cfg.out else None
        if self.run_dir is None:
            return
        self.run_dir.claim()
        self.run_dir.provenance = model_provenance(cfg, self.manifest)
        self.checkpoints = checkpoint.CheckpointManager(
            self.topo, cfg.out, self.checkpoint_fingerprint(), self.model, self.optimizer, self.device,
            sampler=self.mode if self.mode.stateful else None)
        if cfg.resume:
            self._resume()

    def checkpoint_fingerprint(self) -> Dict:
        return fingerprint(self.cfg, self.topo.servers, self.topo.ranks_per_server, self.manifest,
                           shape_dependent=self.shape_dependence())

    def save_checkpoint(self, elapsed_s: float = 0.0) -> str:
        """Collective: checkpoint the state after `self.epoch` epochs into RUN_DIR/checkpoints/, with the
        best-validation epoch so far (its parameters too), and refresh RUN_DIR/best-model.pt."""
        best = None if self.best is None else dict(self.best, model=self.best_state)
        path = self.checkpoints.save(self.epoch, elapsed_s, best=best)
        self._saved_epoch = self.epoch
        self.run_dir.write_best_model(self.best, self.best_state)
        return path

    def _checkpoint_after_epoch(self, last: bool, elapsed_s: float) -> bool:
        """After every epoch: agree whether any rank was asked to stop (a signal may reach only some
        ranks, or reach them at different times: one max-reduction makes all stop after the same
        epoch), then checkpoint when asked or due.  True when the run must stop here."""
        cfg = self.cfg
        if not self.run_dir:
            return False
        # One max-reduction: a stop request on any rank, and rank 0's failure to append metrics.jsonl.
        flags = self.comm.allreduce_scalar(np.array([int(self.stop_signals.requested), self._write_errno],
                                                    dtype=np.int64), "max")
        stop = bool(flags[0])
        if flags[1]:
            raise raised_everywhere(TrainingError(
                f"{self.run_dir.failed_write(METRICS_FILE)}: {os.strerror(int(flags[1]))}; stopped after "
                f"{self.epoch} epochs"))
        due = cfg.checkpoint_every > 0 and self.epoch % cfg.checkpoint_every == 0
        if not (stop or due):
            return False
        path = self.save_checkpoint(elapsed_s)
        if not stop or last:
            return False  # a stop requested during the last epoch: the run is finished anyway
        self.stopped_checkpoint = path
        if self.topo.rank == 0:
            checkpoint.note(f"stop requested (SIGUSR1/SIGTERM): stopped after {self.epoch} epochs "
                            f"with a checkpoint in {path}; continue with --resume {cfg.out}")
        return True

    def _checkpoint_initial(self) -> None:
        """--checkpoint-initial: collective, before the first step of a new run (not a resumed one, nor
        --eval-only): the parameters as built (or read by --init-from), the optimizer's initial state and
        every rank's RNG state, as the checkpoint of epoch 0, which pruning keeps."""
        if self.run_dir and self.cfg.checkpoint_initial and self.epoch == 0 and not self.cfg.eval_only:
            path = self.save_checkpoint(0.0)
            if self.topo.rank == 0:
                checkpoint.note(f"the initial parameters (epoch 0) are in {path}")

    def _stopped_during_set_up(self) -> bool:
        """Collective: was any rank asked to stop before the first epoch of this attempt?  Then stop at
        once: nothing was trained, so there is nothing new to checkpoint (the newest checkpoint, if
        any, stays the newest; slurm/lib.sh sees that no progress was made)."""
        if not self.run_dir or self.epoch >= self.cfg.epochs:
            return False
        if not self.comm.allreduce_scalar(int(self.stop_signals.requested), "max"):
            return False
        if self.topo.rank == 0:
            checkpoint.note(f"stop requested (SIGUSR1/SIGTERM) during set-up: stopped before training, at "
                            f"epoch {self.epoch} of {self.cfg.epochs} (nothing new to checkpoint); continue "
                            f"with --resume {self.cfg.out}")
        return True

    def _resume(self) -> None:
        """Collective: continue from the newest complete checkpoint of cfg.resume (or from epoch 0 when
        there is none, as a job stopped before its first checkpoint must), metrics.jsonl cut to match."""
        resumed = self.checkpoints.load(max_epoch=self.cfg.epochs)
        if resumed.path is None and self.topo.rank == 0:
            checkpoint.note(f"{checkpoint.checkpoints_dir(self.cfg.resume)} holds no complete checkpoint: "
                            f"starting from epoch 0")
        elif self.topo.rank == 0 and not self.cfg.verify_content:
            # Files edited with their checksums recomputed pass the checksum check: only the content
            # digest catches them, and it costs a pass over the data, so it is asked for, and said.
            checkpoint.note(f"continuing {resumed.path} after {resumed.epoch} epochs; the shard set's content was "
                            f"not checked (its files' checksums were): add --verify-content to check it against "
                            f"the build's digest")
        self.epoch, self.prior_elapsed_s, self.prior_records = resumed.epoch, resumed.elapsed_s, resumed.records
        self._restore_best(resumed.best)

    def shape_dependence(self) -> Optional[str]:
        """Why this run's trajectory depends on S x G and the partition, or None when it does not (then
        a checkpoint may continue on another layout or shard set of the same dataset, in fb or flx).
        The mode says its own (Mode.shape_dependence); the wire and the model add theirs."""
        cfg = self.cfg
        reason = self.mode.shape_dependence(self.manifest)
        if reason is None and not self.precision.exact:
            reason = (f"--precision {cfg.precision} rounds what the layers compute, and which sums a rank "
                      f"computes follows the partition")
        if reason is None and not self.groups["world"].exact:
            reason = (f"--halo-dtype {cfg.halo_dtype} rounds the halo rows, and which rows are halo rows "
                      f"follows the partition")
        if reason is None and cfg.dropout > 0 and not self.contract.keyed:
            reason = (f"model {cfg.model} draws its dropout masks from each rank's own generator (its forward "
                      f"takes no `dropout`), so they follow the layout")
        return reason

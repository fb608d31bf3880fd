"""The training loop.  Reads top to bottom: topology -> shards -> views -> model -> epochs -> outputs.

Semantics (docs/design.md §6): loss only on inner training rows (each lies on exactly one rank), summed and
divided by the global training count, so the all-reduced *sum* of gradients equals the single-process
full-graph gradient; parameters identical on every rank from one seed; evaluation is exact
full-graph inference over the world view in every mode.
"""
from __future__ import annotations

import errno
import inspect
import math
import os
import time
from dataclasses import asdict
from typing import Dict, Optional

import numpy as np
import torch

from granndis_hpc import shards
from granndis_hpc.cluster.comm import Communicator
from granndis_hpc.cluster.errors import collective_errors, raised_everywhere
from granndis_hpc.cluster.gradsync import GradientSync
from granndis_hpc.cluster.ledger import Ledger
from granndis_hpc.cluster.topology import init_topology
from granndis_hpc.engine import views
from granndis_hpc.graph import planner
from granndis_hpc.engine.modes import RunContext, Step, TrainingError, make_mode
from granndis_hpc.metrics import (BEST_MODEL, METRICS_FILE, MetricsWriter, epoch_line, peak_memory_bytes,
                                  summarize, summary_fields, write_best_model, write_summary)
from granndis_hpc.nn.dropout import RowDropout
from granndis_hpc.nn.models import MODELS, build_model
from granndis_hpc.progress import progress
from granndis_hpc.runlock import RunLock, RunLockedError
# TrainConfig is declared in config.py (the one declaration of the options); importable from here too.
from granndis_hpc.config import ConfigError, TrainConfig, write_resolved_config
from granndis_hpc.fsutil import remove_temporaries
from granndis_hpc.engine import checkpoint, signals

def check_model(cfg: TrainConfig) -> None:
    if cfg.model not in MODELS:
        raise TrainingError(f"unknown model {cfg.model!r}; choose one of {', '.join(MODELS)}")


def check_input_dropout(cfg: TrainConfig, model, keyed: bool) -> None:
    """--input-dropout needs a model that applies it with keyed masks (nn/models.py input_dropout_rows)."""
    if cfg.input_dropout > 0 and (not keyed or getattr(model, "input_dropout_rows", None) is None):
        raise TrainingError(f"--input-dropout {cfg.input_dropout}: model {cfg.model!r} does not apply input "
                            f"dropout (its class sets no input_dropout_rows, or its forward takes no keyed "
                            f"`dropout`); leave --input-dropout out or use --model sage, gcn or ressage")


def optimizer_groups(model, cfg: TrainConfig):
    """Adam's parameter groups: --weight-decay on every parameter, or (--weight-decay-on first) only on
    the layer reading the input features, as Kipf & Welling's GCN and PyG's examples/gcn.py do."""
    if cfg.weight_decay_on == "all":
        return [{"params": list(model.parameters()), "weight_decay": cfg.weight_decay}]
    prefix = getattr(model, "first_layer_prefix", "convs.0.")
    first = [p for name, p in model.named_parameters() if name.startswith(prefix)]
    rest = [p for name, p in model.named_parameters() if not name.startswith(prefix)]
    if not first:
        raise TrainingError(f"--weight-decay-on first: model {cfg.model!r} has no parameters named {prefix}*; "
                            f"set first_layer_prefix on the model class or use --weight-decay-on all")
    return [{"params": first, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]


def features_entry(manifest: Dict) -> Dict:
    """How the shard set's features were preprocessed (`preprocess build --normalize-features`); shard
    sets built before the option existed hold the raw features."""
    return dict(manifest.get("features") or {"normalization": "none"})


def check_split_totals(totals: Dict, manifest: Dict, path: str) -> None:
    """The inner rows flagged train/val/test, summed over the job, against the manifest's counts: split
    flags edited in a server file (test flags copied from the train flags) would otherwise evaluate on
    other vertices and report a different accuracy with exit status 0."""
    ds = manifest["dataset"]
    wrong = [f"{k} {int(totals[k])} (manifest: {int(ds[f'num_{k}'])})" for k in ("train", "val", "test")
             if int(totals[k]) != int(ds[f"num_{k}"])]
    if wrong:
        raise TrainingError(f"{path}: the server files flag {', '.join(wrong)} inner vertices: their split/* flags "
                            f"were edited after the build; run `python -m preprocess verify {path}` and rebuild the "
                            f"set with `python -m preprocess build ... --overwrite`")
    if int(ds["num_classes"]) > max(int(ds["num_vertices"]), 1):
        raise TrainingError(f"{path}: manifest num_classes {ds['num_classes']} exceeds its {ds['num_vertices']} "
                            f"vertices: the output layer would be that wide; rebuild the set from its source")
    if int(totals["train"]) == 0:
        raise TrainingError(f"{path}: the shards have no training vertices; build the set from a dataset "
                            f"whose split marks training vertices")


class SavedBytes:
    """Counts what autograd keeps for the backward pass (each storage once): the activation memory of
    a step, exact and the same on CPU and GPU.  (Resident-memory deltas are not: the C heap keeps freed
    blocks.)  Recomputed blocks (--checkpoint-activations) save only their inputs, and so count less."""

    def __init__(self):
        self.total, self._seen = 0, set()

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            storage = t.untyped_storage()
            key = (storage.device.type, storage.data_ptr())
            if key not in self._seen:
                self._seen.add(key)
                self.total += storage.nbytes()
        except (RuntimeError, NotImplementedError):  # sparse and other storage-less tensors
            pass
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t


def _share_cpu_threads(topo) -> None:
    """Ranks on one node share its cores: without this every rank starts one torch thread per core and
    they fight (measured: 20x slower on 4 ranks over 2 cores).  OMP_NUM_THREADS, when set, wins."""
    if os.environ.get("OMP_NUM_THREADS"):
        return
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // topo.ranks_on_node))


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        # Installed before set-up (granndis-train installs them before its imports: install_early), so a
        # stop signal during set-up is recorded, not fatal; run() honours it before the first epoch.
        self.stop_signals = signals.take_early()
        self.stop_signals.install()
        try:
            self.topo = init_topology(cfg.ranks_per_server, cfg.device, cfg.intra_transport)
        except BaseException:
            self.stop_signals.uninstall()
            raise
        _share_cpu_threads(self.topo)
        self.world = self.topo.world
        self.ledger = Ledger()
        self.comm = Communicator(self.topo, self.ledger, cfg.intra_transport)
        self.device = self.topo.device
        with collective_errors(self.world, "", catch=(TrainingError,)):
            check_model(cfg)
            mode = make_mode(cfg)
        self.mode = mode.resolve(self.topo)  # `auto` picks the mode (and shard set) that fits
        self.cfg = cfg = self.mode.cfg
        self.manifest = self._open_shards()
        self._set_up_mode()
        torch.manual_seed(cfg.seed)  # same parameters on every rank
        ds = self.manifest["dataset"]
        self.model = build_model(cfg.model, int(ds["num_features"]), cfg.hidden, int(ds["num_classes"]),
                                 cfg.layers, dropout=cfg.dropout, norm=cfg.norm).to(self.device)
        self.model.checkpoint_activations = cfg.checkpoint_activations
        self.model.input_dropout = cfg.input_dropout
        self._keyed_dropout = "dropout" in inspect.signature(self.model.forward).parameters
        with collective_errors(self.world, "", catch=(TrainingError,)):
            check_input_dropout(cfg, self.model, self._keyed_dropout)
            groups = optimizer_groups(self.model, cfg)
        self.optimizer = torch.optim.Adam(groups, lr=cfg.lr)
        # Overlap (--no-overlap turns it off): gradients reduced in buckets during the backward, and the
        # halo in flight while each layer aggregates its own rows (models that accept PendingRows).
        self.gradsync = GradientSync(self.comm, self.model.parameters()) if not cfg.no_overlap else None
        self._overlap_halo = bool(not cfg.no_overlap and getattr(self.model, "accepts_pending_rows", False))
        self._halo_wire = None if cfg.halo_dtype == "float32" else getattr(torch, cfg.halo_dtype)
        if self._input_dropout_sources() and self.train_view is not None:
            self.train_view.source_ids()  # collective: the halo rows' ids, exchanged once at set-up
        self.epoch = 0
        self._write_errno = 0  # rank 0: errno of a failed metrics.jsonl append (0: none)
        # Best-validation selection (run(): the evaluated epoch with the highest val accuracy, ties the
        # earlier): its record, and on rank 0 a CPU copy of its parameters (best-model.pt, checkpoints).
        self.best: Optional[Dict] = None
        self.best_state: Optional[Dict] = None
        self.prior_records, self.prior_elapsed_s, self.stopped_checkpoint = [], 0.0, None
        self.checkpoints: Optional[checkpoint.CheckpointManager] = None  # with --out only
        try:
            self._set_up_checkpoints()
        except BaseException:
            self.close()  # the errors above are raised on every rank together (agree): close together
            raise
        # SIGUSR1/SIGTERM only set a flag; run() stops every rank after the same epoch with a checkpoint
        # (or before the first epoch when it came during set-up), which needs a run directory.  Without
        # --out they keep their usual effect (one received during set-up is delivered now), and a set-up
        # that fails leaves no handler behind (close()).
        if cfg.out:
            self.stop_signals.install()  # again: MPI or torch may have replaced them during set-up
        else:
            self.stop_signals.uninstall_and_redeliver()

    # ---- set-up -------------------------------------------------------------------------------
    def _open_shards(self) -> Dict:
        cfg, topo = self.cfg, self.topo
        with collective_errors(self.world, "", catch=(shards.ShardError, TrainingError, OSError, KeyError,
                                                      ValueError)):
            manifest = shards.read_manifest(cfg.shards)
            shards.check_job(manifest, topo.servers, topo.ranks_per_server, self.mode.shard_layers())
            self.mode.check(manifest)
            if topo.local_rank == 0 and not cfg.skip_checksums:
                shards.verify_checksums(cfg.shards, manifest, servers=[topo.server])
        return manifest

    def _set_up_mode(self) -> None:
        """Read this rank's slice, plan the world view (evaluation in every mode, and the world layers
        of a training plan), then let the mode plan its training."""
        cfg, topo = self.cfg, self.topo
        with collective_errors(self.world, "", catch=(shards.ShardError, OSError, KeyError, ValueError)):
            sl = shards.read_rank_slice(cfg.shards, self.manifest, topo.server, topo.local_rank)
        if cfg.verify_content:  # collective, the same refusal on every rank (shards/content.py)
            with collective_errors(self.world, "", catch=(shards.ShardError,)):
                shards.check_job_content(self.world, sl, self.manifest, cfg.shards)
        self.slice = sl
        # A shard whose rows disagree with its peers' (a view's row width, an edge naming a row nobody
        # holds) is refused by the planner on every rank of the view (views.build_view agrees on it);
        # this makes it the one-line error on every rank of the job.
        with collective_errors(self.world, "", catch=(planner.PlanError,)):
            world_rows = views.world_rows(sl, topo.rank)  # rank-local checks, agreed before any exchange
        with collective_errors(self.world, "", catch=(planner.PlanError,)):
            self.world_view = views.build_view(
                world_rows, topo.world_size, cfg.layers, all_active=True,
                resolve_keys=views.key_resolver_world(sl.global_id[: sl.n_inner]), exchange=self.comm.world_exchange,
                alltoall_counts=lambda counts: topo.exchange_counts(counts, group="world"), device=self.device,
                group="world")
        n_inner = int(sl.n_inner)
        self.labels = torch.as_tensor(sl.labels[:n_inner], device=self.device)
        self.split_rows = {name: torch.as_tensor(np.flatnonzero(mask[:n_inner]), device=self.device)
                           for name, mask in (("train", sl.train_mask), ("val", sl.val_mask),
                                              ("test", sl.test_mask))}
        counts = np.array([len(self.split_rows[k]) for k in ("train", "val", "test")], dtype=np.int64)
        self.split_totals = dict(zip(("train", "val", "test"), self.comm.allreduce_scalar(counts, "sum")))
        with collective_errors(self.world, "", catch=(TrainingError,)):
            check_split_totals(self.split_totals, self.manifest, cfg.shards)
        with collective_errors(self.world, "", catch=(planner.PlanError,)):
            self.mode.setup(RunContext(cfg=cfg, topo=topo, comm=self.comm, device=self.device,
                                       manifest=self.manifest, slice=sl, world_view=self.world_view,
                                       labels=self.labels, split_rows=self.split_rows,
                                       split_totals=self.split_totals))
        self.sampler = self.mode.sampler

    @property
    def train_view(self):
        """The static training plan of a full-graph mode (None for batched modes)."""
        return getattr(self.mode, "view", None)

    # ---- one epoch ----------------------------------------------------------------------------
    def _forward(self, view, phase: str) -> torch.Tensor:
        """The model over a plan: the rows the last layer computes (inner rows, or a step's targets).

        Dropout masks are keyed by (seed, epoch, layer, global row id) (nn/dropout.py), so every shape
        draws the single-process masks.  A registered model whose forward takes no `dropout` keeps the
        documented forward(x, graphs, gather) contract and draws its own."""
        # Training halos travel in --halo-dtype; evaluation stays exact (float32 on the wire).
        gather = view.gather_fn(phase, overlap=self._overlap_halo,
                                wire_dtype=self._halo_wire if phase == "halo" else None)
        if not self._keyed_dropout:
            return self.model(view.input_features, view.graphs, gather)
        # Input dropout reads the ids of layer 0's halo rows too (exchanged once per view, cached).
        sources = view.source_ids() if self.model.training and self._input_dropout_sources() else None
        drop = RowDropout(self.cfg.seed, self.epoch, getattr(view, "row_ids", None), source_ids=sources)
        return self.model(view.input_features, view.graphs, gather, dropout=drop)

    def _input_dropout_sources(self) -> bool:
        return self.cfg.input_dropout > 0 and getattr(self.model, "input_dropout_rows", None) == "sources"

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _step(self, step: Step) -> tuple:
        """Forward, loss over the step's target rows / their global count, backward, gradient sync,
        optimizer step.  Returns (local loss, gradient-sync seconds)."""
        self.optimizer.zero_grad(set_to_none=False)
        saved = SavedBytes()
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            logits = self._forward(step.view, "halo")
            loss = torch.nn.functional.cross_entropy(logits[step.rows], step.labels, reduction="sum") \
                / float(step.num_targets)
        self.activation_bytes = max(self.activation_bytes, saved.total)
        loss.backward()  # with overlap, gradient buckets are already being reduced (cluster/gradsync.py)
        grad_start = time.perf_counter()
        if self.gradsync is not None:
            self.gradsync.finish()  # the reduction not hidden behind the backward
        else:
            self.comm.allreduce_([p.grad for p in self.model.parameters()], phase="gradient")
        self._sync()
        grad_s = time.perf_counter() - grad_start
        self.optimizer.step()
        return float(loss.detach()), grad_s

    def train_epoch(self) -> Dict:
        """One epoch: every step the mode yields (one for full-graph modes, one per co-batch)."""
        self.ledger.reset()
        self.activation_bytes = 0
        self.model.train()
        self._sync()
        start = time.perf_counter()
        loss_sum, grad_s, sampling_s, extra, steps, host = 0.0, 0.0, 0.0, {}, 0, {}
        for step in self.mode.steps(self.epoch):
            loss, g = self._step(step)
            loss_sum, grad_s, sampling_s = loss_sum + loss, grad_s + g, sampling_s + step.sampling_s
            for phase, seconds in (step.host_s or {}).items():
                host[phase] = host.get(phase, 0.0) + seconds
            if steps == 0 and step.accounting is not None:  # rows held/computed, first step of the epoch
                extra = step.accounting()
            steps += 1
        self._sync()
        elapsed = time.perf_counter() - start
        self.epoch += 1
        # Each step's loss is a mean over its targets; the epoch's is the mean over its steps.
        rec = self._epoch_record(elapsed, grad_s, loss_sum / max(steps, 1), sampling_s)
        rec["activation_memory_bytes"] = int(self.comm.allreduce_scalar(self.activation_bytes, "max"))
        if host:  # batched modes (every rank): host seconds per co-batch by phase, on or off the critical path
            names = sorted(host)
            slowest = self.comm.allreduce_scalar(np.array([host[n] / steps for n in names]), "max")
            rec["cobatch_host_s"] = {n: float(v) for n, v in zip(names, slowest)}
        rec.update(extra)
        return rec

    def _epoch_record(self, elapsed: float, grad_s: float, local_loss: float, sampling_s: float = 0.0) -> Dict:
        led = self.ledger
        # Set-up traffic inside an epoch is per-step planning of co-batched training: count it as halo.
        intra = led.seconds("intra", "halo") + led.seconds("intra", "setup")
        inter = led.seconds("inter", "halo") + led.seconds("inter", "setup")
        times = np.array([elapsed, intra, inter, grad_s, elapsed - intra - inter - grad_s - sampling_s,
                          sampling_s])
        # The slowest rank's own breakdown, so that its parts add up to the epoch time (the maxima of
        # each part over ranks came from different ranks and could sum past the epoch: issue 21, item 6).
        # Every rank's row of a world x 6 table, summed: all ranks see every rank's times (outside the
        # timed region; 48 bytes per rank).
        table = np.zeros((self.topo.world_size, times.size))
        table[self.topo.rank] = times
        table = self.comm.allreduce_scalar(table, "sum")
        slowest_rank = int(np.argmax(table[:, 0]))
        slowest = table[slowest_rank]
        # Every rank's loss is its share of the global mean: their sum is the loss.
        loss = float(self.comm.allreduce_scalar(local_loss, "sum"))
        if not math.isfinite(loss):
            # Every rank holds the same all-reduced loss, so every rank raises this together.
            raise raised_everywhere(TrainingError(
                f"loss became {loss} at epoch {self.epoch}; lower --lr or check the features for extreme "
                f"values (`python -m preprocess verify` checks that they are finite)"))
        # Bytes per rank (exact): their sum is the traffic per link class; the busiest rank and the
        # busiest server's inter-server egress are what a slow link waits for.
        per_rank = Ledger.record_classes(led.gather_bytes(self.world))
        inter = per_rank["inter_halo"] + per_rank["inter_grad"]
        per_server = np.zeros(self.topo.servers, dtype=np.int64)
        np.add.at(per_server, self.topo.server_of(np.arange(inter.size)), inter)
        return {
            "epoch": self.epoch - 1, "time_s": float(slowest[0]), "intra_comm_s": float(slowest[1]),
            "inter_comm_s": float(slowest[2]), "grad_sync_s": float(slowest[3]),
            "compute_s": float(slowest[4]), "sampling_s": float(slowest[5]), "slowest_rank": slowest_rank,
            "loss": loss,
            "bytes": {k: int(v.sum()) for k, v in per_rank.items()},
            "max_rank_bytes": {k: int(v.max()) for k, v in per_rank.items()},
            "inter_bytes_per_server": [int(b) for b in per_server],
        }

    # ---- evaluation ---------------------------------------------------------------------------
    @torch.no_grad()
    def inner_logits(self) -> torch.Tensor:
        """Exact full-graph logits of this rank's inner vertices (world view, eval mode)."""
        self.model.eval()
        return self._forward(self.world_view, "evaluation")

    def evaluate(self) -> Dict[str, float]:
        pred = self.inner_logits().argmax(dim=1)
        correct = np.array([int((pred[r] == self.labels[r]).sum()) for r in self.split_rows.values()],
                           dtype=np.int64)
        correct = self.comm.allreduce_scalar(correct, "sum")
        return {name: float(c) / max(int(self.split_totals[name]), 1)
                for name, c in zip(self.split_rows, correct)}

    # ---- the whole run ------------------------------------------------------------------------
    def run(self) -> Dict:
        cfg, rank0 = self.cfg, self.topo.rank == 0
        writer = self._open_run_directory()  # rank 0 with --out: config.json written, metrics.jsonl open
        self._writer = writer  # closed by close() when the run ends with an error
        records, accuracy = [summary_fields(r) for r in self.prior_records], None
        start = time.perf_counter() - self.prior_elapsed_s
        # Rank 0, on a terminal and not --quiet only; epoch lines go through the bar so it stays whole.
        if rank0 and not cfg.quiet:  # the job's layout first: which host each server is
            print(self.topo.describe(), flush=True)
        if self._stopped_during_set_up():
            if writer:
                writer.close()
            return None
        bar = progress(total=cfg.epochs, initial=self.epoch, desc=f"{cfg.mode} epochs", rank=self.topo.rank,
                       quiet=cfg.quiet, unit="epoch", enabled=True if cfg.progress else None)
        while self.epoch < cfg.epochs:
            rec = self.train_epoch()
            last = self.epoch == cfg.epochs
            if last or (cfg.eval_every > 0 and self.epoch % cfg.eval_every == 0):
                accuracy = self.evaluate()
                rec.update(train_acc=accuracy["train"], val_acc=accuracy["val"], test_acc=accuracy["test"])
                self._track_best(rec)
            rec["peak_memory_bytes"] = int(self.comm.allreduce_scalar(peak_memory_bytes(self.device), "max"))
            records.append(summary_fields(rec))  # the whole record goes to metrics.jsonl, not to memory
            if rank0:
                if writer:
                    try:
                        writer.write(rec)
                    except OSError as exc:  # agreed after the epoch (_checkpoint_after_epoch): all stop
                        self._write_errno = exc.errno or errno.EIO
                if not cfg.quiet:
                    line = epoch_line(rec)
                    if bar.disable:
                        print(line, flush=True)
                    else:
                        bar.write(line)
            bar.set_postfix(loss=f"{rec['loss']:.4f}", refresh=False)
            bar.update(1)
            if self._checkpoint_after_epoch(last, time.perf_counter() - start):
                bar.close()
                if writer:
                    writer.close()
                return None  # stopped on request with a checkpoint written: not finished, no summary
        bar.close()
        if accuracy is None:  # resumed after the last epoch: evaluate the parameters it ended with
            accuracy = self.evaluate()
        peak = int(self.comm.allreduce_scalar(peak_memory_bytes(self.device), "max"))
        summary = summarize(records, asdict(cfg), accuracy, peak,
                            {"servers": self.topo.servers, "ranks_per_server": self.topo.ranks_per_server,
                             "hosts": self.topo.hosts, "emulated": self.topo.emulated},
                            time.perf_counter() - start, best=self.best)
        summary["plan"] = self.mode.describe(self.manifest)  # exactness, preloaded layers, auto's decision
        summary["plan"].update(self.communication_entry())
        summary["features"] = features_entry(self.manifest)
        if cfg.out:
            self._write_best_model()  # collective (every rank agrees on the outcome), rank 0 writes
            with collective_errors(self.world, self._run_file_phase("summary.json"), catch=(OSError,)):
                if writer:
                    writer.close()
                    write_summary(cfg.out, summary)
        return summary

    def _run_file_phase(self, name: str) -> str:
        """What a failed write of a run file says (a full disk): the file, and what is still usable."""
        out = self.cfg.out
        return (f"writing {os.path.join(out, name)} (free space, then continue with --resume {out}: the run's "
                f"newest complete checkpoint in {checkpoint.checkpoints_dir(out)} stays usable, and "
                f"metrics.jsonl holds whole records only)")

    # ---- best-validation selection --------------------------------------------------------------
    def _track_best(self, rec: Dict) -> None:
        """Keep the evaluated epoch with the highest validation accuracy (a tie keeps the earlier one,
        as PyG's examples/gcn.py does).  Accuracies are all-reduced, so every rank decides alike; rank 0
        keeps a CPU copy of the parameters (identical on every rank) for best-model.pt and checkpoints."""
        if self.best is not None and not rec["val_acc"] > self.best["val_acc"]:
            return
        self.best = {"epoch": int(rec["epoch"]), "train_acc": rec["train_acc"], "val_acc": rec["val_acc"],
                     "test_acc": rec["test_acc"]}
        if self.topo.rank == 0:
            self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def _write_best_model(self) -> None:
        """Collective: rank 0 writes RUN_DIR/best-model.pt (atomically) when an epoch was evaluated."""
        with collective_errors(self.world, self._run_file_phase(BEST_MODEL), catch=(OSError,)):
            if self.topo.rank == 0 and self.best is not None:
                write_best_model(self.cfg.out, self.best, self.best_state)

    def _restore_best(self, best: Optional[Dict]) -> None:
        """After a resume: the checkpoint's best epoch (record, and parameters on rank 0)."""
        if best is None:
            self.best, self.best_state = None, None
            return
        self.best = {k: best[k] for k in ("epoch", "train_acc", "val_acc", "test_acc")}
        self.best_state = best.get("model") if self.topo.rank == 0 else None

    def communication_entry(self) -> Dict:
        """How training communicated (summary.json's plan): overlap, and the halo wire dtype, which makes
        an otherwise exact mode inexact when it is narrower than float32."""
        entry = {"overlap": not self.cfg.no_overlap, "halo_dtype": self.cfg.halo_dtype}
        if self._halo_wire is not None:
            entry["exact"] = False
            entry["inexact_because"] = f"--halo-dtype {self.cfg.halo_dtype}: halo rows are rounded on the wire"
        return entry

    def close(self) -> None:
        if getattr(self, "_writer", None) is not None:
            self._writer.close()
        if getattr(self, "_run_lock", None) is not None:
            self._run_lock.release()
        if getattr(self, "gradsync", None) is not None:
            self.gradsync.close()
        self.stop_signals.uninstall()
        self.mode.close()
        self.comm.close()
        self.topo.close()

    # ---- checkpoints and resuming (the layout is described in engine/checkpoint.py) --------------
    def _set_up_checkpoints(self) -> None:
        """Collective: refuse a new run in a run directory that holds one (unless --overwrite-run), make
        the checkpoint manager, and with --resume restore the newest complete checkpoint.  (Option rules
        that need no files, e.g. --checkpoint-every without --out, are TrainConfig.__post_init__'s.)"""
        cfg = self.cfg
        if not cfg.out:
            return
        found = None
        with collective_errors(self.world, "", catch=(checkpoint.CheckpointError, OSError, RunLockedError)):
            if self.topo.rank == 0:  # held until close(): no second job touches the run meanwhile
                self._run_lock = RunLock(cfg.out, "resume it" if cfg.resume else
                                         "replace its run (--overwrite-run)" if cfg.overwrite_run else "start a run in it")
                # With the lock held no one else writes here: temporaries are a killed writer's leftovers.
                stale = remove_temporaries(cfg.out, [n for n in checkpoint.RUN_OUTPUTS if n != checkpoint.CHECKPOINTS])
                if stale:
                    checkpoint.note(f"removed {len(stale)} temporary file(s) of a job killed while writing: "
                                    f"{', '.join(stale)}")
            if self.topo.rank == 0 and not cfg.resume:
                found = checkpoint.run_contents(cfg.out)
                if found and not cfg.overwrite_run:
                    raise checkpoint.refuse_new_run_in(cfg.out, found)
        self.checkpoints = checkpoint.CheckpointManager(
            self.topo, cfg.out, self.checkpoint_fingerprint(), self.model, self.optimizer, self.device,
            sampler=self._stateful_sampler())
        if cfg.resume:
            self._resume()

    def checkpoint_fingerprint(self) -> Dict:
        return checkpoint.fingerprint(self.cfg, self.topo.servers, self.topo.ranks_per_server, self.manifest,
                                      shape_dependent=self.shape_dependence())

    def shape_dependence(self) -> Optional[str]:
        """Why this run's trajectory depends on S x G and the partition, or None when it does not (then
        a checkpoint may continue on another layout or shard set of the same dataset, in fb or flx)."""
        cfg, name = self.cfg, self.mode.name
        if not self.mode.exact(self.manifest):
            return f"mode {name} is not exact here (it samples within each server's preload)"
        if cfg.halo_dtype != "float32":
            return (f"--halo-dtype {cfg.halo_dtype} rounds the halo rows, and which rows are halo rows follows "
                    f"the partition")
        if getattr(self, "sampler", None) is not None:
            return (f"mode {name} samples its co-batches per server (each server shuffles its own training "
                    f"vertices), so the batches follow the partition")
        if cfg.dropout > 0 and not self._keyed_dropout:
            return (f"model {cfg.model} draws its dropout masks from each rank's own generator (its forward takes "
                    f"no `dropout`), so they follow the layout")
        return None

    def _stateful_sampler(self):
        """The co-batch sampler when the mode has one that can save its state (None otherwise)."""
        sampler = getattr(self, "sampler", None)
        if sampler is None or not (hasattr(sampler, "state_dict") and hasattr(sampler, "load_state_dict")):
            return None
        return sampler

    def _open_run_directory(self) -> Optional[MetricsWriter]:
        """Collective: rank 0 writes RUN_DIR/config.json and opens metrics.jsonl (appending on resume:
        _resume() cut it at the checkpoint).  With --overwrite-run the old run's outputs are moved aside
        first and deleted only once the new config.json is written, so a crash in between loses nothing."""
        cfg, writer = self.cfg, None
        if not cfg.out:
            return None
        with collective_errors(self.world, f"preparing run directory {cfg.out}", catch=(OSError, ConfigError)):
            if self.topo.rank == 0:
                os.makedirs(cfg.out, exist_ok=True)
                self._run_lock.announce()  # RUN_DIR/.lock: who holds the run directory (host, pid, job id)
                if cfg.overwrite_run and not cfg.resume:
                    if checkpoint.replace_run(cfg.out, lambda: write_resolved_config(cfg, cfg.out)):
                        checkpoint.note(f"--overwrite-run: replaced the run that was in {cfg.out}")
                else:
                    write_resolved_config(cfg, cfg.out)
                writer = MetricsWriter(cfg.out, append=bool(cfg.resume))
        return writer

    def save_checkpoint(self, elapsed_s: float = 0.0) -> str:
        """Collective: checkpoint the state after `self.epoch` epochs into RUN_DIR/checkpoints/, with the
        best-validation epoch so far (its parameters too), and refresh RUN_DIR/best-model.pt."""
        best = None if self.best is None else dict(self.best, model=self.best_state)
        path = self.checkpoints.save(self.epoch, elapsed_s, best=best)
        self._write_best_model()
        return path

    def _checkpoint_after_epoch(self, last: bool, elapsed_s: float) -> bool:
        """After every epoch: agree whether any rank was asked to stop (a signal may reach only some
        ranks, or reach them at different times: one max-reduction makes all stop after the same
        epoch), then checkpoint when asked or due.  True when the run must stop here."""
        cfg = self.cfg
        if not cfg.out:
            return False
        # One max-reduction: a stop request on any rank, and rank 0's failure to append metrics.jsonl.
        flags = self.comm.allreduce_scalar(np.array([int(self.stop_signals.requested), self._write_errno],
                                                    dtype=np.int64), "max")
        stop = bool(flags[0])
        if flags[1]:
            raise raised_everywhere(TrainingError(
                f"{self._run_file_phase(METRICS_FILE)}: {os.strerror(int(flags[1]))}; stopped after "
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

    def _stopped_during_set_up(self) -> bool:
        """Collective: was any rank asked to stop before the first epoch of this attempt?  Then stop at
        once: nothing was trained, so there is nothing new to checkpoint (the newest checkpoint, if
        any, stays the newest; slurm/lib.sh sees that no progress was made)."""
        if not self.cfg.out or self.epoch >= self.cfg.epochs:
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
        self.epoch, self.prior_elapsed_s, self.prior_records = resumed.epoch, resumed.elapsed_s, resumed.records
        self._restore_best(resumed.best)

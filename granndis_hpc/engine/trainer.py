"""The training loop.  Reads top to bottom: topology -> shards -> views -> model -> epochs -> outputs.

Semantics (docs/design.md §6): loss only on inner training rows (each lies on exactly one rank), summed and
divided by the global training count, so the all-reduced *sum* of gradients equals the single-process
full-graph gradient; parameters identical on every rank from one seed; evaluation is exact
full-graph inference over the world view in every mode.
"""
from __future__ import annotations

import dataclasses
import errno
import logging
import os
import time
from dataclasses import asdict
from typing import Dict, List, Optional

import numpy as np
import torch

from granndis_hpc import shards
from granndis_hpc.cluster import trace
from granndis_hpc.cluster.comm import Communicator
from granndis_hpc.cluster.errors import collective_errors
from granndis_hpc.cluster.gradsync import GradientSync
from granndis_hpc.cluster.ledger import Ledger
from granndis_hpc.cluster.linkcheck import measure_links
from granndis_hpc.cluster.topology import init_topology
from granndis_hpc.options.train import TrainConfig
from granndis_hpc.options.train_groups import OVERLAP_HALOS
from granndis_hpc.engine import hostmem, inductive, partial, signals, targets, views
from granndis_hpc.engine.epoch import SavedBytes, epoch_record
from granndis_hpc.cluster.hostsync import Stopwatch
from granndis_hpc.engine.layerclock import LayerClock
from granndis_hpc.engine.checkpointer import (
    BestValidation, Checkpointer, CheckpointSettings, open_run_directory, shape_dependence)
from granndis_hpc.engine.model_source import init_source, load_parameters, model_provenance
from granndis_hpc.engine.source_ids import give_source_ids
from granndis_hpc.engine.modes import make_mode
from granndis_hpc.engine.optim import ScheduledOptimizer
from granndis_hpc.engine.precision import Precision, PrecisionError
from granndis_hpc.engine.preflight import (
    DeterministicKernels, check_input_dropout, check_split_totals, features_entry, optimizer_groups, share_cpu_threads)
from granndis_hpc.engine import run_report
from granndis_hpc.engine.startup_clock import StartupClock
from granndis_hpc.engine.steps import RunContext, Step, TrainingError
from granndis_hpc.graph import planner
from granndis_hpc.engine.peakmem import peak_memory_bytes, peak_reserved_bytes
from granndis_hpc.metric_names import split_keys
from granndis_hpc.metrics import epoch_line, summarize, summary_fields
from granndis_hpc.nn import cpu_kernels
from granndis_hpc.nn.contract import PassSettings
from granndis_hpc.nn.dropout import RowDropout
from granndis_hpc.graph.hetero import types_of
from granndis_hpc.nn.hetero_models import projects_input
from granndis_hpc.nn.models import build_model
from granndis_hpc.progress import progress
from granndis_hpc.registry import model_options
from granndis_hpc.options.startup import topology_args
from granndis_hpc.rundir.directory import RunDirectory
from granndis_hpc.rundir.fingerprint import fingerprint

log = logging.getLogger(__name__)


class Trainer:
    """One training run on this rank (every rank builds one): set-up, epochs, evaluation and outputs.
    With --out it owns the run directory and a Checkpointer (engine/checkpointer.py: checkpoints, stop
    requests, resume), which it calls; the best-validation record is its BestValidation."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.startup = StartupClock()
        self.startup.mark("launch")
        # Installed before set-up (granndis-train installs them before its imports: install_early), so a
        # stop signal during set-up is recorded, not fatal; run() honours it before the first epoch.
        self.stop_signals = signals.take_early()
        self.stop_signals.install()
        try:
            self._set_up(cfg)
        except BaseException as exc:
            # A failed set-up closes what it had opened (a mode's loader thread, the run lock, the stop
            # handlers) and, when every rank raised the error together (collective_errors, agree), the
            # communicators too, together; after a one-rank error main_guard aborts the job instead.
            self.close(collective=getattr(exc, "collective", False) is True)
            raise
        # SIGUSR1/SIGTERM only set a flag; run() stops every rank after the same epoch with a checkpoint
        # (or before the first epoch when it came during set-up), which needs a run directory.  Without
        # --out they keep their usual effect (one received during set-up is delivered now).
        if cfg.out:
            self.stop_signals.install()  # again: MPI or torch may have replaced them during set-up
        else:
            self.stop_signals.uninstall_and_redeliver()

    def _set_up(self, cfg: TrainConfig) -> None:
        self.kernels = DeterministicKernels(cfg.deterministic)  # before any GPU work (cuBLAS's workspace)
        self.topo = init_topology(cfg.ranks_per_server, cfg.device, cfg.intra_transport, **topology_args(cfg))
        self.startup.mark("world")
        self.world = self.topo.world
        self.ledger = Ledger()
        self.comm = Communicator(self.topo, self.ledger, cfg.intra_transport, host_staging=cfg.host_staging)
        # The link classes, measured while the network is quiet (cluster/linkcheck.py; collective).
        # auto's time rule also prices the inter-server link both ways at once, in the run's messages
        self.links = None if cfg.no_link_check else measure_links(
            self.topo, both_ways=cfg.mode == "auto" and cfg.auto_rule == "time", piece_bytes=self.comm.piece_bytes)
        share_cpu_threads(self.topo)
        self.device = self.topo.device
        # The model and mode names were checked where the options are (TrainConfig: choices read from the
        # registries), the one place; every rank holds the same config, so this cannot differ by rank.
        # `auto` picks the mode (and shard set) that fits
        self.mode = make_mode(cfg).resolve(self.topo, self.links, self.comm)
        self.cfg = cfg = self.mode.cfg
        with collective_errors(self.world, "", catch=(PrecisionError,)):
            self.precision = Precision(cfg.precision, self.device)  # --precision (engine/precision.py)
        if self.device.type == "cpu":  # the C kernels (nn/cpu_kernels.py), loaded now, not in the first epoch
            with collective_errors(self.world, "", catch=(cpu_kernels.KernelError,)):
                fallback = cpu_kernels.fallback_reason()
            if fallback and self.topo.rank == 0:  # the same on every rank: said once
                log.warning(fallback)
        # The exchange groups every view uses; training halo rows travel in --halo-dtype on both (under
        # --precision bf16 in bfloat16: the rows are computed in it).
        wire = None if cfg.halo_dtype == "float32" else getattr(torch, cfg.halo_dtype)
        wire = wire or self.precision.wire_dtype()
        self.groups = {name: self.comm.group(name, wire, route=cfg.halo_route) for name in ("world", "server")}
        self.manifest = self._open_shards()
        self.startup.mark("shards")
        self.multilabel = shards.is_multilabel(self.manifest)
        with collective_errors(self.world, "", catch=(TrainingError,)):  # --metric for these targets
            self.metric = targets.resolve_metric(cfg.metric, self.multilabel, cfg.shards)
        self.cfg = cfg = dataclasses.replace(cfg, metric=self.metric)
        self.keys = split_keys(self.metric)  # the metric's keys in the epoch records and the best record
        self._set_up_mode()
        self.startup.mark("views")
        torch.manual_seed(cfg.seed)  # same parameters on every rank
        ds = self.manifest["dataset"]
        # The model's code (a pyg module) and --init-from's file are the user's: what fails in them (an
        # import, a factory, a file that does not fit) is the one-line error on every rank together.
        with collective_errors(self.world, "", catch=(ValueError,)):
            if cfg.init_from:  # --init-from: checked against the run's options before the model is built
                self.init_source = init_source(cfg)
            self.model = build_model(cfg.model, int(ds["num_features"]), cfg.hidden, int(ds["num_classes"]),
                                     cfg.layers, dropout=cfg.dropout, norm=cfg.norm,
                                     linear_layers=cfg.linear_layers or 0, types=types_of(ds),
                                     **model_options(cfg.model, cfg.model_option)).to(self.device)
            if cfg.init_from:  # its parameters (a resume replaces them below)
                load_parameters(self.model, self.init_source)
        # What the engine may ask of the model (nn/contract.py; checked by build_model), read here only,
        # and what this run asks of each of its passes.
        self.contract = self.model.contract
        with collective_errors(self.world, "", catch=(ValueError,)):
            if not self.static_features and not self.contract.input_projection:
                raise ValueError(f"model {cfg.model!r} takes option project but its contract does not declare "
                                 f"input_projection: declare it where the model projects its input "
                                 f"(nn/contract.py ModelContract)")
        self.pass_settings = PassSettings(input_dropout=cfg.input_dropout, row_dtype=self.precision.row_dtype,
                                          checkpoint_activations=cfg.checkpoint_activations)
        with collective_errors(self.world, "", catch=(TrainingError,)):
            check_input_dropout(cfg, self.contract)
            groups = optimizer_groups(self.model, cfg, self.contract)
        # --optimizer with its schedule, clipping and early stopping (engine/optim.py); its state_dict
        # holds the schedule's state too, so checkpoints carry it.
        self.optimizer = ScheduledOptimizer(cfg, groups, self.model.parameters())
        # Overlap (--no-overlap turns it off): gradients reduced in buckets during the backward, and the
        # halo in flight while each layer aggregates its own rows (models that accept PendingRows).
        self.gradsync = GradientSync(self.comm, self.model.named_parameters()) if not cfg.no_overlap else None
        # Per-layer compute of every rank, forward and backward (the overlap limit's per-rank timeline).
        self.layer_clock = LayerClock(self.ledger, cfg.conv_layers, cuda=self.device.type == "cuda")
        self._grad_clock = Stopwatch(self.device)  # CUDA events on a GPU: no device sync in the step
        # The exchange groups whose halos travel while the layer computes (--overlap-halos).
        self._overlap_halo = OVERLAP_HALOS[cfg.overlap_halos] \
            if not cfg.no_overlap and self.contract.pending_rows else frozenset()
        if self._input_dropout_sources() and self.train_view is not None:
            self.train_view.source_ids()  # collective: the halo rows' ids, exchanged once at set-up
        # Collective: graphs whose edges the model keys (attention dropout) or types (a typed model) by ids.
        give_source_ids(self.contract, self.train_view,
                        [self.world_view, *(self.induced.views.values() if self.induced else ())])
        # --halo-payload partial / smaller: which layers and server pairs send partial aggregates (collective;
        # after the source ids: a typed layer's relations and the graphs of its partials come from them), on
        # the world view training runs on (--inductive: the train-induced graph's; evaluation on the others
        # exchanges rows).
        trained = self.induced.views["train"] if self.induced is not None else self.world_view
        trained.payload = partial.payload_of_run(cfg, trained, self.model, self.precision.row_dtype, self.comm,
                                                 self.train_view)
        self.epoch = 0
        self.activation_bytes = 0  # the most bytes one step's autograd graph saved in this epoch
        self._write_errno = 0  # rank 0: errno of a failed metrics.jsonl append (0: none)
        # The best-validation record (on rank 0 with a CPU copy of its parameters: best-model.pt, checkpoints).
        self.best_val = BestValidation(self.keys, self.model, keep_parameters=self.topo.rank == 0)
        self.prior_records: List[Dict] = []  # a resumed run's earlier epochs: their records and seconds
        self.prior_elapsed_s = 0.0
        # --out: the run directory (claimed: locked, a new run refused where one is) and its checkpointer.
        self.run_dir: Optional[RunDirectory] = None
        self.checkpointer: Optional[Checkpointer] = None
        if cfg.out:
            self.run_dir = open_run_directory(cfg.out, cfg, self.topo, model_provenance(cfg, self.manifest))
            fp = fingerprint(cfg, self.topo.servers, self.topo.ranks_per_server, self.manifest,
                             shape_dependent=self.shape_dependence())  # which runs may continue its checkpoints
            self.checkpointer = Checkpointer(
                CheckpointSettings.from_config(cfg), self.run_dir, self.topo, self.comm, self.model, self.optimizer,
                self.mode if self.mode.stateful else None, self.device, fp, self.best_val, self.stop_signals)
        if self.checkpointer is not None and cfg.resume:  # the newest complete checkpoint, restored
            resumed = self.checkpointer.resume()
            self.epoch, self.prior_elapsed_s, self.prior_records = resumed.epoch, resumed.elapsed_s, resumed.records
        if self.device.type == "cpu":  # epochs reuse freed host memory (engine/hostmem.py)
            hostmem.keep_freed_host_memory()
        self.startup.mark("model")

    # ---- set-up -------------------------------------------------------------------------------
    def shape_dependence(self) -> Optional[str]:
        """Why this run's trajectory depends on S x G and the partition, or None (checkpointer.shape_dependence)."""
        return shape_dependence(self.cfg, self.mode.shape_dependence(self.manifest), self.precision.exact,
                                self.groups["world"].exact, self.contract.keyed)

    def _open_shards(self) -> Dict:
        cfg, topo = self.cfg, self.topo
        with collective_errors(self.world, "", catch=(shards.ShardError, TrainingError, OSError, KeyError,
                                                      ValueError)):
            manifest = shards.read_manifest(cfg.shards)
            shards.check_job(manifest, topo.servers, topo.ranks_per_server, self.mode.shard_layers())
            self.mode.check(manifest)
            inductive.check_shards(cfg.inductive, manifest, cfg.shards)
            if topo.local_rank == 0 and not cfg.skip_checksums:
                shards.verify_checksums(cfg.shards, manifest, servers=[topo.server])
        return manifest

    def _set_up_mode(self) -> None:
        """Read this rank's slice, plan the world view (evaluation in every mode, and the world layers
        of a training plan), then let the mode plan its training."""
        cfg, topo = self.cfg, self.topo
        with collective_errors(self.world, "", catch=(shards.ShardError, OSError, KeyError, ValueError)):
            sl = shards.read_rank_slice(cfg.shards, self.manifest, topo.server, topo.local_rank)
            # A model that projects its input first (its contract's input_projection, checked once it is
            # built) exchanges the projected rows at layer 0: the views hold no halo feature rows.
            self.static_features = not projects_input(cfg.model, model_options(cfg.model, cfg.model_option),
                                                      types_of(self.manifest["dataset"]))
        if cfg.verify_content:  # collective, the same refusal on every rank (shards/content.py)
            with collective_errors(self.world, "", catch=(shards.ShardError,)):
                shards.check_job_content(self.world, sl, self.manifest, cfg.shards)
                if cfg.inductive:
                    inductive.check_content(sl, self.manifest, cfg.shards)
        self.slice = sl
        # A shard whose rows disagree with its peers' (a view's row width, an edge naming a row nobody
        # holds) is refused by the planner on every rank of the view (views.build_view agrees on it);
        # this makes it the one-line error on every rank of the job.
        with collective_errors(self.world, "", catch=(planner.PlanError,)):
            world_rows = views.world_rows(sl, topo.rank)  # rank-local checks, agreed before any exchange
        with collective_errors(self.world, "", catch=(planner.PlanError,)):
            self.world_view = views.build_view(
                world_rows, self.groups["world"], cfg.conv_layers, all_active=True,
                resolve_keys=views.key_resolver_world(sl.global_id[: sl.n_inner]), device=self.device,
                static_features=self.static_features)
        n_inner = int(sl.n_inner)
        self.labels = torch.as_tensor(sl.labels[:n_inner], device=self.device)
        self.split_rows = {name: torch.as_tensor(np.flatnonzero(mask[:n_inner]), device=self.device)
                           for name, mask in (("train", sl.train_mask), ("val", sl.val_mask),
                                              ("test", sl.test_mask))}
        counts = np.array([len(self.split_rows[k]) for k in ("train", "val", "test")], dtype=np.int64)
        self.split_totals = dict(zip(("train", "val", "test"), self.comm.allreduce_scalar(counts, "sum")))
        with collective_errors(self.world, "", catch=(TrainingError,)):
            check_split_totals(self.split_totals, self.manifest, cfg.shards)
        self.scorer = targets.Scorer(self.comm, self.world, self.metric, self.multilabel, self.split_totals)
        ctx = RunContext(cfg=cfg, topo=topo, comm=self.comm, device=self.device, manifest=self.manifest, slice=sl,
                         world_view=self.world_view, labels=self.labels, split_rows=self.split_rows,
                         split_totals=self.split_totals, groups=self.groups,
                         static_features=self.static_features)
        self.induced = None  # --inductive: the induced graphs' world views (engine/inductive.py)
        if cfg.inductive:
            with collective_errors(self.world, "", catch=(planner.PlanError,)):
                self.induced = inductive.InducedViews(ctx)
            ctx = self.induced.training_context()
        with collective_errors(self.world, "", catch=(planner.PlanError,)):
            self.mode.setup(ctx)

    @property
    def train_view(self):
        """The static training plan of a full-graph mode (None for batched modes)."""
        return self.mode.static_view

    # ---- one epoch ----------------------------------------------------------------------------
    def logits(self, view, phase: str, clock: Optional[LayerClock] = None) -> torch.Tensor:
        """The model over a plan view (phase "halo": training's exchanges, "evaluation": exact): the
        logits of the rows the last layer computes (inner rows, or a step's targets).

        Dropout masks are keyed by (seed, epoch, layer, global row id) (nn/dropout.py), so every shape
        draws the single-process masks.  A model whose contract is not ``keyed`` is called as
        forward(x, graphs, gather) and draws its own."""
        # Training halos travel in the exchange group's wire dtype; evaluation stays exact.
        gather = view.gather_fn(phase, overlap=self._overlap_halo)
        if clock is not None:
            gather = clock.wrap(gather)
        if not self.contract.keyed:
            with self.precision.autocast():
                return self.model(view.input_features, view.graphs, gather)
        # Input dropout reads the ids of layer 0's halo rows too (exchanged once per view, cached).
        sources = view.source_ids() if self.model.training and self._input_dropout_sources() else None
        drop = RowDropout(self.cfg.seed, self.epoch, view.layer_row_ids, source_ids=sources)
        with self.precision.autocast():  # --precision bf16: the layers compute in bfloat16
            return self.model(view.input_features, view.graphs, gather, dropout=drop, settings=self.pass_settings)

    def _input_dropout_sources(self) -> bool:
        return self.cfg.input_dropout > 0 and self.contract.input_dropout_rows == "sources"

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def train_step(self, step: Step) -> tuple:
        """Forward, loss over the step's target rows / their global count, backward, gradient sync,
        optimizer step.  Returns (local loss, gradient-sync seconds)."""
        trace.mark("step_start")
        self.optimizer.zero_grad(set_to_none=False)
        saved = SavedBytes()
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            self.layer_clock.start_forward()
            logits = self.logits(step.view, "halo", self.layer_clock)
            self.layer_clock.end_forward()
            loss = self.precision.loss(logits[step.rows], step.labels, step.num_targets)  # in float32
        self.activation_bytes = max(self.activation_bytes, saved.total)
        trace.mark("backward")
        self.layer_clock.start_backward()
        loss.backward()  # with overlap, gradient buckets are already being reduced (cluster/gradsync.py)
        self.layer_clock.end_backward()
        trace.mark("backward_end")
        self._grad_clock.start()
        if self.gradsync is not None:
            self.gradsync.finish()  # the reduction not hidden behind the backward
        else:
            self.comm.allreduce_([p.grad for p in self.model.parameters()], phase="gradient")
        grad_s = self._grad_clock.stop()  # on a GPU 0.0 here: train_epoch collects the events
        self.optimizer.step()
        trace.mark("step_end")
        return float(loss.detach()), grad_s

    def train_epoch(self) -> Dict:
        """One epoch: every step the mode yields (one for full-graph modes, one per co-batch)."""
        self.ledger.reset()
        self.layer_clock.reset()
        self.activation_bytes = 0
        self.model.train()
        self._sync()
        start = time.perf_counter()
        loss_sum, grad_s, sampling_s, extra, steps = 0.0, 0.0, 0.0, {}, 0
        host: Dict[str, float] = {}
        for step in self.mode.steps(self.epoch):
            loss, g = self.train_step(step)
            loss_sum, grad_s, sampling_s = loss_sum + loss, grad_s + g, sampling_s + step.sampling_s
            for phase, seconds in (step.host_s or {}).items():
                host[phase] = host.get(phase, 0.0) + seconds
            if steps == 0 and step.accounting is not None:  # rows held/computed, first step of the epoch
                extra = step.accounting()
            steps += 1
        self._sync()
        elapsed = time.perf_counter() - start
        grad_s += self._grad_clock.collect()
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
        """Collective: the record of the epoch just finished (engine/epoch.py epoch_record)."""
        return epoch_record(self.ledger, self.topo, self.comm, self.epoch - 1, elapsed, grad_s, local_loss, sampling_s,
                            layer_seconds=self.layer_clock.seconds)

    # ---- evaluation ---------------------------------------------------------------------------
    @torch.no_grad()
    def inner_logits(self) -> torch.Tensor:
        """Exact full-graph logits of this rank's inner vertices (world view, eval mode)."""
        self.model.eval()
        return self.logits(self.world_view, "evaluation")

    def evaluate(self) -> Dict[str, float]:
        """Collective: the --metric of every split (engine/targets.py), the same on every rank."""
        if self.induced is not None:  # each split on its own graph (engine/inductive.py)
            self.model.eval()
            parts = self.induced.split_outputs(lambda view: self.logits(view, "evaluation"))
        else:
            logits = self.inner_logits()
            parts = {name: (logits[r], self.labels[r]) for name, r in self.split_rows.items()}
        return self.scorer.scores(parts)

    # ---- the whole run ------------------------------------------------------------------------
    def run(self) -> Optional[Dict]:
        """Collective: train (or continue) to --epochs and return the summary (summary.json's content);
        None when a stop request ended the run with a checkpoint (or before the first epoch)."""
        cfg, rank0 = self.cfg, self.topo.rank == 0
        # Rank 0 with --out: config.json written, metrics.jsonl open (closed by close() after an error).
        writer = self.run_dir.open(cfg) if self.run_dir else None
        records, accuracy = [summary_fields(r) for r in self.prior_records], None
        start = time.perf_counter() - self.prior_elapsed_s
        # Rank 0, on a terminal and not --quiet only; epoch lines go through the bar so it stays whole.
        if rank0 and not cfg.quiet:  # what runs, then the job's layout: which host each server is
            print(run_report.header(cfg, self.mode, self.manifest, self.topo, self.links), flush=True)
        ckpt = self.checkpointer
        if ckpt is not None and ckpt.stopped_during_set_up(self.epoch):
            ckpt.run_dir.close_metrics()
            return None
        if ckpt is not None:
            ckpt.save_initial(self.epoch)
        bar = progress(total=cfg.epochs, initial=self.epoch, desc=f"{cfg.mode} epochs", rank=self.topo.rank,
                       quiet=cfg.quiet, unit="epoch", enabled=True if cfg.progress else None)
        stop_early = False
        started_s = self.startup.elapsed()  # this rank's start-up: process creation to the first epoch
        first_epoch, loop_start = self.epoch, time.perf_counter()
        # An early-stopped run (resumed) trains no further; --eval-only trains nothing.
        while self.epoch < cfg.epochs and self.optimizer.stopped_at is None and not cfg.eval_only:
            lr = self.optimizer.start_epoch(self.epoch)
            rec = self.train_epoch()
            rec["lr"] = lr
            if self.optimizer.last_norm is not None:  # --clip-grad-norm: the last step's norm before clipping
                rec["grad_norm"] = self.optimizer.last_norm
            last = self.epoch == cfg.epochs
            if last or (cfg.eval_every > 0 and self.epoch % cfg.eval_every == 0):
                accuracy = self.evaluate()
                rec.update({self.keys[split]: value for split, value in accuracy.items()})
                self.best_val.observe(rec)
                stop_early = self.optimizer.observe(rec[self.keys["val"]], self.epoch, final=last)
            rec["peak_memory_bytes"] = int(self.comm.allreduce_scalar(peak_memory_bytes(self.device), "max"))
            records.append(summary_fields(rec))  # the whole record goes to metrics.jsonl, not to memory
            if rank0:
                if writer:
                    try:
                        writer.write(rec)
                    except OSError as exc:  # agreed after the epoch (Checkpointer.after_epoch): all stop
                        self._write_errno = exc.errno or errno.EIO
                if not cfg.quiet:
                    # ETA: the epochs left at this attempt's mean epoch so far, evaluations included.
                    per_epoch = (time.perf_counter() - loop_start) / max(1, self.epoch - first_epoch)
                    run_report.say(epoch_line(rec, eta_s=per_epoch * (cfg.epochs - self.epoch)), bar)
            bar.set_postfix(loss=f"{rec['loss']:.4f}", refresh=False)
            bar.update(1)
            if ckpt is not None and ckpt.after_epoch(self.epoch, last or stop_early, time.perf_counter() - start,
                                                     self._write_errno):
                bar.close()
                ckpt.run_dir.close_metrics()
                return None  # stopped on request with a checkpoint written: not finished, no summary
            if stop_early:  # --patience: end here, with a checkpoint (best-model.pt is written below)
                if ckpt is not None:
                    ckpt.save_unless_saved(self.epoch, time.perf_counter() - start)
                best = self.best_val.record
                assert best is not None  # this epoch was evaluated: observe() kept a record
                if rank0 and not cfg.quiet:
                    print(run_report.early_stop_line(cfg.patience, rec["epoch"], self.epoch, best), flush=True)
                break
        bar.close()
        if accuracy is None:  # resumed after the last epoch: evaluate the parameters it ended with
            accuracy = self.evaluate()
        peak = int(self.comm.allreduce_scalar(peak_memory_bytes(self.device), "max"))
        summary = summarize(records, asdict(cfg), accuracy, peak,
                            {"servers": self.topo.servers, "ranks_per_server": self.topo.ranks_per_server,
                             "hosts": self.topo.hosts, "emulated": self.topo.emulated},
                            time.perf_counter() - start, best=self.best_val.record, metric=self.metric)
        summary.update(run_report.startup_entries(self.comm, self.startup, started_s))
        summary["links"] = run_report.links_entry(self.links)
        summary["plan"] = self.mode.describe(self.manifest)  # exactness, preloaded layers, auto's decision
        summary["plan"].update(self.communication_entry())
        summary["features"] = features_entry(self.manifest)
        summary["optimizer"] = self.optimizer.summary()
        summary["compute"] = run_report.compute_entry(self.device)
        if cfg.init_from:
            summary["init_from"] = self.init_source.provenance()
        if self.device.type == "cuda":  # beside peak_memory_bytes (allocated): what the GPU held
            summary["peak_reserved_bytes"] = int(self.comm.allreduce_scalar(peak_reserved_bytes(self.device), "max"))
        if self.run_dir:
            self.run_dir.write_best_model(self.best_val.record, self.best_val.state)  # collective, rank 0 writes
            self.run_dir.finish(summary)
            # GRANNDIS_EXCHANGE_TRACE (cluster/trace.py): every rank's exchange events, beside the run's files
            trace.dump(os.path.join(self.run_dir.path, f"exchange-trace-rank{self.topo.rank}.json"))
        return summary

    def communication_entry(self) -> Dict:
        """How training communicated (summary.json's plan): run_report.communication_entry."""
        return run_report.communication_entry(self.cfg, self._overlap_halo, self.gradsync, self.precision,
                                              self.groups["world"].exact)

    def close(self, collective: bool = True) -> None:
        """Release what the trainer holds; safe after a set-up that failed part-way (what was not opened
        is not closed).  collective=False: only this rank's own resources, no collective call (after an
        error only this rank raised, the others are not there to take part)."""
        for name in ("run_dir", "gradsync", "mode", "kernels"):
            part = getattr(self, name, None)
            if part is not None:
                part.close()
        self.stop_signals.uninstall()
        if not collective:
            return
        for name in ("comm", "topo"):
            part = getattr(self, name, None)
            if part is not None:
                part.close()

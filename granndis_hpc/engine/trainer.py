"""The training loop.  Reads top to bottom: topology -> shards -> views -> model -> epochs -> outputs.

Semantics (DESIGN §6): loss only on inner training rows (each lies on exactly one rank), summed and
divided by the global training count, so the all-reduced *sum* of gradients equals the single-process
full-graph gradient; parameters identical on every rank from one seed; evaluation is exact
full-graph inference over the world view in every mode.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict
from typing import Dict, Optional

import numpy as np
import torch
from mpi4py import MPI

from granndis_hpc import shards
from granndis_hpc.cluster.comm import Communicator
from granndis_hpc.cluster.errors import agree, collective_errors
from granndis_hpc.cluster.ledger import Ledger
from granndis_hpc.cluster.topology import init_topology
from granndis_hpc.engine import cobatch, views
from granndis_hpc.graph.sampler import SAMPLERS, CoBatchSampler, SamplerError
from granndis_hpc.metrics import MetricsWriter, epoch_line, peak_memory_bytes, summarize, write_summary
from granndis_hpc.nn.models import MODELS, build_model
from granndis_hpc.progress import progress
# TrainConfig is declared in config.py (the one declaration of the options); importable from here too.
from granndis_hpc.config import ConfigError, TrainConfig, write_resolved_config
from granndis_hpc.engine import checkpoint, signals

MODES = ("fb", "flx", "eas", "cob", "mb")
BATCHED = ("cob", "mb")


class TrainingError(RuntimeError):
    """A problem every rank detects identically (configuration, shard/mode mismatch, NaN loss)."""


def check_mode(manifest: Dict, cfg: TrainConfig) -> None:
    """Refuse a mode the shard set cannot serve, saying how to make one that can."""
    if cfg.mode not in MODES:
        raise TrainingError(f"unknown mode {cfg.mode!r}; choose one of {', '.join(MODES)}")
    if cfg.model not in MODELS:
        raise TrainingError(f"unknown model {cfg.model!r}; choose one of {', '.join(MODELS)}")
    pre = manifest["preload"]
    if cfg.mode == "flx" and (pre["kind"] != "full" or int(pre["hops"]) < cfg.layers):
        raise TrainingError(
            f"mode flx needs a full preload of at least {cfg.layers} hops for a {cfg.layers}-layer model, "
            f"but the shards hold a {pre['kind']} preload of {pre['hops']} hop(s); rebuild them with "
            f"`python -m preprocess build ... --preload full --hops {cfg.layers}`, or use --mode fb")
    if cfg.mode in BATCHED and int(pre["hops"]) < cfg.layers and cfg.sampler != "saint" and pre["kind"] == "full":
        raise TrainingError(
            f"mode {cfg.mode} samples {cfg.layers}-hop dependency graphs inside the server's preload, but the "
            f"shards hold a {pre['hops']}-hop preload; rebuild them with --hops {cfg.layers}")
    if cfg.mode in BATCHED and (cfg.fanout == 0 or cfg.fanout < -1):
        raise TrainingError(f"--fanout must be a positive number of neighbours or -1 for all, got {cfg.fanout}")
    if cfg.mode in BATCHED and cfg.sampler not in SAMPLERS:
        raise TrainingError(f"unknown sampler {cfg.sampler!r}; choose one of {', '.join(SAMPLERS)}")
    if cfg.mode == "eas" and pre["kind"] != "eas":
        raise TrainingError(f"mode eas needs shards built with --preload eas, these hold a {pre['kind']} "
                            f"preload; rebuild with `python -m preprocess build ... --preload eas`")


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


def _share_cpu_threads(world) -> None:
    """Ranks on one node share its cores: without this every rank starts one torch thread per core and
    they fight (measured: 20x slower on 4 ranks over 2 cores).  OMP_NUM_THREADS, when set, wins."""
    if os.environ.get("OMP_NUM_THREADS"):
        return
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // node.Get_size()))
    finally:
        node.Free()


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.stop_signals = signals.StopSignals()  # installed at the end of __init__
        self.topo = init_topology(cfg.ranks_per_server, cfg.device, cfg.intra_transport)
        _share_cpu_threads(self.topo.world)
        self.world = self.topo.world
        self.ledger = Ledger()
        self.comm = Communicator(self.topo, self.ledger, cfg.intra_transport)
        self.device = self.topo.device
        self.manifest = self._open_shards()
        self._build_views()
        torch.manual_seed(cfg.seed)  # same parameters on every rank
        ds = self.manifest["dataset"]
        self.model = build_model(cfg.model, int(ds["num_features"]), cfg.hidden, int(ds["num_classes"]),
                                 cfg.layers, dropout=cfg.dropout, norm=cfg.norm).to(self.device)
        self.model.checkpoint_activations = cfg.checkpoint_activations
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.epoch = 0
        self.prior_records, self.prior_elapsed_s, self.stopped_checkpoint = [], 0.0, None
        self.checkpoints: Optional[checkpoint.CheckpointManager] = None  # with --out only
        try:
            self._set_up_checkpoints()
        except BaseException:
            self.close()  # the errors above are raised on every rank together (agree): close together
            raise
        # From here SIGUSR1/SIGTERM only set a flag; run() stops every rank after the same epoch with a
        # checkpoint, which needs a run directory.  During set-up (nothing to save yet) and without --out
        # they keep their default action, and a set-up that fails leaves no handler behind.
        if cfg.out:
            self.stop_signals.install()

    # ---- set-up -------------------------------------------------------------------------------
    def _open_shards(self) -> Dict:
        cfg, topo = self.cfg, self.topo
        manifest, error = None, ""
        try:
            manifest = shards.read_manifest(cfg.shards)
            # fb reads only the world view, which serves any depth; preloaded modes need the built depth.
            shards.check_job(manifest, topo.servers, topo.ranks_per_server,
                             None if cfg.mode == "fb" else cfg.layers)
            check_mode(manifest, cfg)
            if topo.local_rank == 0 and not cfg.skip_checksums:
                shards.verify_checksums(cfg.shards, manifest, servers=[topo.server])
        except (shards.ShardError, TrainingError, OSError, KeyError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        agree(self.world, not error, error)
        return manifest

    def _build_views(self) -> None:
        cfg, topo = self.cfg, self.topo
        sl, error = None, ""
        try:
            sl = shards.read_rank_slice(cfg.shards, self.manifest, topo.server, topo.local_rank)
        except (shards.ShardError, OSError, KeyError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        agree(self.world, not error, error)
        self.slice = sl
        world_exchange = self.comm.world_exchange
        self.world_view = views.build_view(
            views.world_rows(sl, topo.rank), topo.world_size, cfg.layers, all_active=True,
            resolve_keys=views.key_resolver_world(sl.global_id[: sl.n_inner]), exchange=world_exchange,
            alltoall_counts=self.world.alltoall, device=self.device)
        self.batched = None
        if cfg.mode == "fb":
            self.train_view = self.world_view
        elif cfg.mode in BATCHED:
            self.train_view = None
            self.batched = self._batched_training(sl)
        else:
            self.train_view = views.build_view(
                views.server_rows(sl, exact_degrees=(cfg.mode == "flx")), topo.ranks_per_server, cfg.layers,
                all_active=False, resolve_keys=views.key_resolver_server(sl.global_id.shape[0]),
                exchange=self.comm.intra_exchange, alltoall_counts=topo.server_comm.alltoall,
                device=self.device, exact=(cfg.mode == "flx"))
        n_inner = int(sl.n_inner)
        self.labels = torch.as_tensor(sl.labels[:n_inner], device=self.device)
        self.split_rows = {name: torch.as_tensor(np.flatnonzero(mask[:n_inner]), device=self.device)
                           for name, mask in (("train", sl.train_mask), ("val", sl.val_mask),
                                              ("test", sl.test_mask))}
        counts = np.array([len(self.split_rows[k]) for k in ("train", "val", "test")], dtype=np.int64)
        self.split_totals = dict(zip(("train", "val", "test"), self.comm.allreduce_scalar(counts, "sum")))
        if self.split_totals["train"] == 0:
            raise TrainingError("the shards have no training vertices; check the dataset's split")

    def _batched_training(self, sl) -> "cobatch.BatchedTraining":
        """Co-batches are sampled inside the server's preloaded subgraph, identically on every rank of
        the server (same seed), so each rank reads its server's graph (not its features)."""
        cfg, topo = self.cfg, self.topo
        graph, sampler, error = None, None, ""
        try:
            graph = shards.read_server_graph(cfg.shards, self.manifest, topo.server)
            train_ids = np.flatnonzero(graph["train"] & (graph["hop"] == 0))
            sampler = CoBatchSampler(graph["indptr"], graph["indices"], train_ids, cfg.batches_per_epoch,
                                     cfg.layers, cfg.sampler, cfg.fanout, cfg.seed, topo.server)
        except (shards.ShardError, SamplerError, OSError, KeyError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        agree(self.world, not error, error)
        # Exact (global degrees, complete neighbourhoods) only when nothing is sampled away.
        exact = self.manifest["preload"]["kind"] == "full" and cfg.fanout == -1 and cfg.sampler == "sage"
        self.sampler = sampler
        return cobatch.BatchedTraining(cfg.mode, sl, graph, shards.server_file(cfg.shards, topo.server),
                                       sampler, cfg.layers, exact, self.comm, self.device)

    # ---- one epoch ----------------------------------------------------------------------------
    def _forward(self, view: views.View, phase: str, training: bool) -> torch.Tensor:
        gather = view.gather_fn(phase, input_dropout=self.model_input_dropout, training=training)
        logits = self.model(view.input_features, view.graphs, gather)
        return logits[: int(self.slice.n_inner)]  # the last layer's rows are the inner rows

    @property
    def model_input_dropout(self) -> float:
        return float(getattr(self.model, "input_dropout", 0.0))

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _step(self, view: views.View, labels: torch.Tensor, rows, num_targets: int) -> tuple:
        """Forward, loss over the target rows / the global target count, backward, gradient sync,
        optimizer step.  Returns (local loss, gradient-sync seconds)."""
        self.optimizer.zero_grad(set_to_none=False)
        saved = SavedBytes()
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            logits = self._forward(view, "halo", training=True)
            loss = torch.nn.functional.cross_entropy(logits[rows], labels, reduction="sum") / float(num_targets)
        self.activation_bytes = max(self.activation_bytes, saved.total)
        loss.backward()
        grad_start = time.perf_counter()
        self.comm.allreduce_([p.grad for p in self.model.parameters()], phase="gradient")
        self._sync()
        grad_s = time.perf_counter() - grad_start
        self.optimizer.step()
        return float(loss.detach()), grad_s

    def train_epoch(self) -> Dict:
        self.ledger.reset()
        self.activation_bytes = 0
        self.model.train()
        self._sync()
        start = time.perf_counter()
        extra = {}
        if self.batched is None:
            rows = self.split_rows["train"]
            loss, grad_s = self._step(self.train_view, self.labels[rows], rows,
                                      int(self.split_totals["train"]))
            sampling_s = 0.0
        else:
            loss, grad_s, sampling_s, extra = self._batched_epoch()
        self._sync()
        elapsed = time.perf_counter() - start
        self.epoch += 1
        rec = self._epoch_record(elapsed, grad_s, loss, sampling_s)
        rec["activation_memory_bytes"] = int(self.comm.allreduce_scalar(self.activation_bytes, "max"))
        rec.update(extra)
        return rec

    def _batched_epoch(self):
        """One optimizer step per co-batch; every server runs the same number of co-batches."""
        b = self.batched
        batches = b.targets(self.epoch)
        loss_sum, grad_s, sampling_s, extra = 0.0, 0.0, 0.0, {}
        for it, targets in enumerate(batches):
            step = b.step(targets, self.epoch, it)
            sampling_s += step.sampling_s
            total = int(self.comm.allreduce_scalar(step.num_targets, "sum"))
            rows = torch.arange(step.num_targets, device=self.device)
            loss, g = self._step(step.view, step.labels, rows, total)
            loss_sum += loss
            grad_s += g
            if it == 0:  # rows held / computed per layer and the redundancy factor, first step of the epoch
                extra = self._batch_accounting(step)
        # Each step's loss is already a mean over its co-batch; report the epoch's mean.
        return loss_sum / len(batches), grad_s, sampling_s, extra

    def _batch_accounting(self, step) -> Dict:
        held = [int(g.n_src) for g in step.view.graphs]
        computed = [int(g.n_dst) for g in step.view.graphs]
        per_rank = self.world.gather({"rank": self.topo.rank, "rows_held": held, "rows_computed": computed}, root=0)
        factor = cobatch.redundancy(self.topo.server_comm, step.computed_ids)
        factors = self.world.gather(factor, root=0)
        if self.topo.rank != 0:
            return {}
        return {"rows_per_layer": per_rank, "redundancy": float(np.mean(factors))}

    def _epoch_record(self, elapsed: float, grad_s: float, local_loss: float, sampling_s: float = 0.0) -> Dict:
        led = self.ledger
        # Set-up traffic inside an epoch is per-step planning of co-batched training: count it as halo.
        intra = led.seconds("intra", "halo") + led.seconds("intra", "setup")
        inter = led.seconds("inter", "halo") + led.seconds("inter", "setup")
        times = np.array([elapsed, intra, inter, grad_s, elapsed - intra - inter - grad_s - sampling_s,
                          sampling_s])
        slowest = self.comm.allreduce_scalar(times, "max")  # outside the timed region
        # Every rank's loss is its share of the global mean: their sum is the loss.
        loss = float(self.comm.allreduce_scalar(local_loss, "sum"))
        if not math.isfinite(loss):
            raise TrainingError(f"loss became {loss} at epoch {self.epoch}; lower --lr or check the "
                                f"features for extreme values")
        totals = led.reduce(self.world)
        b = totals["bytes"]
        return {
            "epoch": self.epoch - 1, "time_s": float(slowest[0]), "intra_comm_s": float(slowest[1]),
            "inter_comm_s": float(slowest[2]), "grad_sync_s": float(slowest[3]),
            "compute_s": float(slowest[4]), "sampling_s": float(slowest[5]), "loss": loss,
            "bytes": {"intra_halo": int(b["intra"]["halo"] + b["intra"]["setup"]),
                      "inter_halo": int(b["inter"]["halo"] + b["inter"]["setup"]),
                      "intra_grad": int(b["intra"]["gradient"]), "inter_grad": int(b["inter"]["gradient"])},
        }

    # ---- evaluation ---------------------------------------------------------------------------
    @torch.no_grad()
    def inner_logits(self) -> torch.Tensor:
        """Exact full-graph logits of this rank's inner vertices (world view, eval mode)."""
        self.model.eval()
        return self._forward(self.world_view, "evaluation", training=False)

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
        records, accuracy = list(self.prior_records), None
        start = time.perf_counter() - self.prior_elapsed_s
        # Rank 0, on a terminal and not --quiet only; epoch lines go through the bar so it stays whole.
        bar = progress(total=cfg.epochs, initial=self.epoch, desc=f"{cfg.mode} epochs", rank=self.topo.rank,
                       quiet=cfg.quiet, unit="epoch", enabled=True if cfg.progress else None)
        while self.epoch < cfg.epochs:
            rec = self.train_epoch()
            last = self.epoch == cfg.epochs
            if last or (cfg.eval_every > 0 and self.epoch % cfg.eval_every == 0):
                accuracy = self.evaluate()
                rec.update(train_acc=accuracy["train"], val_acc=accuracy["val"], test_acc=accuracy["test"])
            rec["peak_memory_bytes"] = int(self.comm.allreduce_scalar(peak_memory_bytes(self.device), "max"))
            records.append(rec)
            if rank0:
                if writer:
                    writer.write(rec)
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
        if accuracy is None:
            accuracy = self.evaluate()
        peak = int(self.comm.allreduce_scalar(peak_memory_bytes(self.device), "max"))
        summary = summarize(records, asdict(cfg), accuracy, peak,
                            {"servers": self.topo.servers, "ranks_per_server": self.topo.ranks_per_server},
                            time.perf_counter() - start)
        if writer:
            writer.close()
            write_summary(cfg.out, summary)
        return summary

    def close(self) -> None:
        self.stop_signals.uninstall()
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
        with collective_errors(self.world, "", catch=(checkpoint.CheckpointError, OSError)):
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
        return checkpoint.fingerprint(self.cfg, self.topo.servers, self.topo.ranks_per_server, self.manifest)

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
                if cfg.overwrite_run and not cfg.resume:
                    if checkpoint.replace_run(cfg.out, lambda: write_resolved_config(cfg, cfg.out)):
                        checkpoint.note(f"--overwrite-run: replaced the run that was in {cfg.out}")
                else:
                    write_resolved_config(cfg, cfg.out)
                writer = MetricsWriter(cfg.out, append=bool(cfg.resume))
        return writer

    def save_checkpoint(self, elapsed_s: float = 0.0) -> str:
        """Collective: checkpoint the state after `self.epoch` epochs into RUN_DIR/checkpoints/."""
        return self.checkpoints.save(self.epoch, elapsed_s)

    def _checkpoint_after_epoch(self, last: bool, elapsed_s: float) -> bool:
        """After every epoch: agree whether any rank was asked to stop (a signal may reach only some
        ranks, or reach them at different times: one max-reduction makes all stop after the same
        epoch), then checkpoint when asked or due.  True when the run must stop here."""
        cfg = self.cfg
        if not cfg.out:
            return False
        stop = bool(self.comm.allreduce_scalar(int(self.stop_signals.requested), "max"))
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

    def _resume(self) -> None:
        """Collective: continue from the newest complete checkpoint of cfg.resume (or from epoch 0 when
        there is none, as a job stopped before its first checkpoint must), metrics.jsonl cut to match."""
        resumed = self.checkpoints.load(max_epoch=self.cfg.epochs)
        if resumed.path is None and self.topo.rank == 0:
            checkpoint.note(f"{checkpoint.checkpoints_dir(self.cfg.resume)} holds no complete checkpoint: "
                            f"starting from epoch 0")
        self.epoch, self.prior_elapsed_s, self.prior_records = resumed.epoch, resumed.elapsed_s, resumed.records

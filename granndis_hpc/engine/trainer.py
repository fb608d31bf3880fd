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
from dataclasses import asdict, dataclass, field
from typing import Dict, Optional

import numpy as np
import torch

from granndis_hpc import shards
from granndis_hpc.cluster.comm import Communicator
from granndis_hpc.cluster.errors import agree
from granndis_hpc.cluster.ledger import Ledger
from granndis_hpc.cluster.topology import init_topology
from granndis_hpc.engine import views
from granndis_hpc.metrics import MetricsWriter, epoch_line, peak_memory_bytes, summarize, write_summary
from granndis_hpc.fsutil import atomic_write_json
from granndis_hpc.nn.models import MODELS, build_model

MODES = ("fb", "flx", "eas")


class TrainingError(RuntimeError):
    """A problem every rank detects identically (configuration, shard/mode mismatch, NaN loss)."""


@dataclass
class TrainConfig:
    shards: str
    mode: str = "flx"
    model: str = "sage"
    layers: int = 3
    hidden: int = 64
    epochs: int = 200
    lr: float = 0.01
    weight_decay: float = 0.0
    dropout: float = 0.5
    norm: bool = False
    seed: int = 0
    eval_every: int = 10
    out: Optional[str] = None
    ranks_per_server: Optional[int] = None
    device: str = "auto"
    intra_transport: str = "auto"
    quiet: bool = False
    skip_checksums: bool = False


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
    if cfg.mode == "eas" and pre["kind"] != "eas":
        raise TrainingError(f"mode eas needs shards built with --preload eas, these hold a {pre['kind']} "
                            f"preload; rebuild with `python -m preprocess build ... --preload eas`")


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.topo = init_topology(cfg.ranks_per_server, cfg.device, cfg.intra_transport)
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
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.epoch = 0

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
        if cfg.mode == "fb":
            self.train_view = self.world_view
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

    def train_epoch(self) -> Dict:
        self.ledger.reset()
        self.model.train()
        self._sync()
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=False)
        logits = self._forward(self.train_view, "halo", training=True)
        rows = self.split_rows["train"]
        loss = torch.nn.functional.cross_entropy(logits[rows], self.labels[rows], reduction="sum")
        loss = loss / float(self.split_totals["train"])
        loss.backward()
        grads = [p.grad for p in self.model.parameters()]
        grad_start = time.perf_counter()
        self.comm.allreduce_(grads, phase="gradient")
        self._sync()
        grad_s = time.perf_counter() - grad_start
        self.optimizer.step()
        self._sync()
        elapsed = time.perf_counter() - start
        self.epoch += 1
        return self._epoch_record(elapsed, grad_s, float(loss.detach()))

    def _epoch_record(self, elapsed: float, grad_s: float, local_loss: float) -> Dict:
        led = self.ledger
        intra = led.seconds("intra", "halo")
        inter = led.seconds("inter", "halo")
        times = np.array([elapsed, intra, inter, grad_s, elapsed - intra - inter - grad_s])
        slowest = self.comm.allreduce_scalar(times, "max")  # outside the timed region
        loss = float(self.comm.allreduce_scalar(local_loss, "sum"))
        if not math.isfinite(loss):
            raise TrainingError(f"loss became {loss} at epoch {self.epoch}; lower --lr or check the "
                                f"features for extreme values")
        totals = led.reduce(self.world)
        b = totals["bytes"]
        return {
            "epoch": self.epoch - 1, "time_s": float(slowest[0]), "intra_comm_s": float(slowest[1]),
            "inter_comm_s": float(slowest[2]), "grad_sync_s": float(slowest[3]),
            "compute_s": float(slowest[4]), "sampling_s": 0.0, "loss": loss,
            "bytes": {"intra_halo": int(b["intra"]["halo"]), "inter_halo": int(b["inter"]["halo"]),
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
        writer = None
        if rank0 and cfg.out:
            os.makedirs(cfg.out, exist_ok=True)
            atomic_write_json(os.path.join(cfg.out, "config.json"), asdict(cfg))
            writer = MetricsWriter(cfg.out)
        records, accuracy, start = [], None, time.perf_counter()
        for _ in range(cfg.epochs):
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
                    print(epoch_line(rec), flush=True)
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
        self.comm.close()
        self.topo.close()

"""Cooperative Batching (`cob`) and the conventional per-GPU mini-batch baseline (`mb`).

cob: every iteration each server takes its next co-batch; its dependency graph (sampled inside the
server's preloaded subgraph, identically on every rank of the server) is split over the server's
ranks by the shard's owners and planned by the same planner as static training; halo rows move over
the intra-server transport.

mb: each rank builds the whole dependency graph of its own share of the co-batch's targets (the
targets its GPU owns) from the server's preload, with no exchange: what CoB saves is the overlap
between these per-GPU graphs.

Both plan every co-batch as index arrays over one fixed per-rank structure (engine/cobplan.py, One-Hop
Graph Masking) from the server's graph and features in host memory, with no communication, so the
whole of co-batch i+1 (sample, split, plan, device tensors, aggregation matrices) is built in a
background thread while step i computes; on a GPU its tensors are made on the loader's own CUDA stream,
which the step's stream waits for by an event (engine/cobstream.py).
"""
from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from granndis_hpc import registry
from granndis_hpc.cluster.exchange_group import local_group
from granndis_hpc.engine import cobplan, views
from granndis_hpc.engine.cobstream import LoaderStream
from granndis_hpc.engine.steps import Step, rows_accounting
from granndis_hpc.graph.csr import owner_of
from granndis_hpc.graph.sampler import CoBatchSampler

PHASES = ("sample", "split", "plan", "to_torch", "matrices")


def _on_device(built: "Built") -> views.View:
    """A co-batch's view, which exists once its device tensors are made (CoBatchLoader._ready)."""
    if built.view is None:
        raise RuntimeError("a co-batch was used before its device tensors were made")
    return built.view


@dataclass
class Built:
    """One co-batch, ready for its step on this rank (host work done, or the host plan on a GPU)."""

    targets: np.ndarray  # sorted targets of the co-batch (what a deterministic draw depends on)
    host: cobplan.HostPlan
    timings: Dict[str, float]
    view: Optional[views.View] = None  # once on the device
    ready: object = None  # the loader stream's event after the device tensors (engine/cobstream.py)
    rows: Optional[torch.Tensor] = None
    labels: Optional[torch.Tensor] = None
    computed: List[np.ndarray] = field(default_factory=list)  # ids computed per layer (redundancy)


class MatrixKeys:
    """Which aggregation matrices the model builds on each layer's graph, learnt from the first step's
    graphs while that step runs (LayerGraph.on_build), so that the loader prepares them for the next
    co-batch during the step, key by key, instead of after it: with one co-batch per epoch the next
    one's matrices were built between the epochs, on the critical path of the second epoch.

    Keys are kept per layer, as (layer, key): layers aggregate differently (a 3-layer SAGE builds the
    whole matrix and its transpose on layer 0, whose input is static, and the own/halo split ones on
    the others), and preparing every layer's keys on every graph built about 1.8x the matrices the
    step uses, most of them on the largest graph, layer 0's."""

    def __init__(self):
        self._cond = threading.Condition()
        self._keys: list = []  # (layer, key), in the order the first step built them
        self._graphs = None  # the graphs watched (the first step's)
        self.known = False  # the first step ended (or the run closes): no key will be added

    @property
    def watching(self) -> bool:
        return self._graphs is not None

    def watch(self, graphs) -> None:
        """Main thread, before the first step: record what its graphs build."""
        self._graphs = list(graphs)
        for layer, g in enumerate(self._graphs):
            g.on_build = functools.partial(self._add, layer)

    def _add(self, layer: int, key) -> None:
        with self._cond:
            if (layer, key) not in self._keys:
                self._keys.append((layer, key))
                self._cond.notify_all()

    def finish(self) -> None:
        """After the first step (or on close): the keys are complete; a loader following them returns."""
        for g in self._graphs or ():
            g.on_build = None
        with self._cond:
            self.known = True
            self._cond.notify_all()

    def keys(self) -> list:
        """(layer, key) pairs learnt so far."""
        with self._cond:
            return list(self._keys)

    def follow(self, prepare) -> None:
        """Loader thread: prepare(new (layer, key) pairs) as they are learnt, until the first step ends."""
        seen = 0
        while True:
            with self._cond:
                while seen == len(self._keys) and not self.known:
                    self._cond.wait()
                new, done = self._keys[seen:], self.known
                seen = len(self._keys)
            if new:
                prepare(new)
            elif done:
                return


class BatchedSteps:
    """The steps of a batched epoch: a sampler (which vertices and edges a co-batch needs) composed
    with a split (which of them this rank computes, and how it gets the rest), planned by the one
    planner.  One optimizer step per co-batch; every server runs the same number of co-batches.

    prefetch: build co-batch i+1 (the next epoch's first after an epoch's last) in a background thread
    while step i computes (as SALIENT pipelines its sampling), so host work leaves the critical path;
    the first epoch's first co-batch is started at set-up (`start`), while the trainer builds the model
    and the rest of the run.  Samples depend only on (seed, server, epoch, iteration) and plans need no
    communication, so the result is the same either way.  A co-batch whose sample is a function of its
    targets (fanout -1, or the saint sampler) and whose targets are the previous co-batch's (one
    co-batch per epoch) reuses that plan, aggregation matrices included, as flx reuses its plan every
    epoch."""

    def __init__(self, ctx, sampler: CoBatchSampler, split, prefetch: bool = True):
        self.ctx, self.sampler, self.split, self.prefetch = ctx, sampler, split, prefetch
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cobatch-loader") if prefetch else None
        self._ahead: Optional[Tuple[int, Future]] = None  # (epoch, future) of an epoch's first co-batch built ahead
        self._last: Optional[Built] = None  # the latest co-batch built (reused when its draw repeats)
        self.keys = MatrixKeys()  # aggregation matrices the model builds (learnt during the first step)
        # The device tensors are made in the loader too, on its own stream on a GPU (--host-staging: that
        # logic emulated on the CPU); the step's stream waits for them (engine/cobstream.py).
        self.loader = LoaderStream(ctx.device, emulate=getattr(ctx.cfg, "host_staging", False))
        self._in_use: Optional[Built] = None  # the co-batch of the step last handed out

    def start(self, epoch: int) -> None:
        """Start building `epoch`'s first co-batch now (set-up: the first epoch's; a resumed run that
        starts at another epoch drops it)."""
        if self.prefetch and self._ahead is None:
            first = self.sampler.epoch_targets(epoch)[0]
            self._ahead = (epoch, self._submit(first, epoch, 0))

    def steps(self, epoch: int):
        batches = self.sampler.epoch_targets(epoch)
        if not self.prefetch:
            for iteration, targets in enumerate(batches):
                start = time.perf_counter()
                built = self._ready(self._build(targets, epoch, iteration))
                self._watch(built)
                yield self._step(built, time.perf_counter() - start)  # all of it on the critical path
                self._learnt()
            return
        pending = None
        if self._ahead is not None:
            if self._ahead[0] == epoch:
                pending = self._ahead[1]
            else:
                self._ahead[1].cancel()  # (a resumed run: built for epoch 0; done or not, unused)
        self._ahead = None
        if pending is None:
            pending = self._submit(batches[0], epoch, 0)
        for iteration in range(len(batches)):
            waited = time.perf_counter()
            built = self._ready(pending.result())
            waited = time.perf_counter() - waited  # the host work left on the critical path
            self._watch(built)  # before the next co-batch is started: it follows the keys
            if iteration + 1 < len(batches):
                pending = self._submit(batches[iteration + 1], epoch, iteration + 1)
            elif epoch + 1 < self.ctx.cfg.epochs:
                nxt = self.sampler.epoch_targets(epoch + 1)[0]
                self._ahead = (epoch + 1, self._submit(nxt, epoch + 1, 0))
            yield self._step(built, waited)
            self._learnt()

    def _submit(self, targets, epoch: int, iteration: int) -> Future:
        """Build a co-batch in the loader thread (prefetch only)."""
        assert self._pool is not None  # (prefetch: made in __init__)
        return self._pool.submit(self._build, targets, epoch, iteration)

    def close(self) -> None:
        self.keys.finish()  # a loader following the keys of a step that will not end returns
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    # ---- host side (the loader thread when prefetching) ----------------------------------------
    def _build(self, targets, epoch: int, iteration: int) -> Built:
        targets = np.sort(np.asarray(targets, dtype=np.int64))
        last = self._last
        if self.sampler.deterministic and last is not None and np.array_equal(last.targets, targets):
            return Built(targets=targets, host=last.host, timings={p: 0.0 for p in PHASES}, view=last.view,
                         rows=last.rows, labels=last.labels, computed=last.computed, ready=last.ready)
        timings = {p: 0.0 for p in PHASES}
        start = cobplan.clock()
        draw = self.sampler.draw(self.split.targets(targets), epoch, iteration)
        timings["sample"] = cobplan.clock() - start
        built = Built(targets=targets, host=self.split.plan(draw, timings), timings=timings)
        with self.loader.building():
            self._to_device(built)
            built.ready = self.loader.ready()  # after every copy and kernel of the co-batch
        self._last = built
        return built

    def _to_device(self, built: Built) -> None:
        ctx, hp, put = self.ctx, built.host, (self.loader.put if self.loader.active else None)
        start = cobplan.clock()
        graphs = cobplan.layer_graphs(hp, ctx.device, put)
        built.view = cobplan.assemble_view(hp, graphs, self.split.group, ctx.device, put,
                                           source_ids_on_graphs=registry.typed(ctx.cfg.model),
                                           static_features=ctx.static_features)
        n_targets = int((hp.own_hop == 0).sum())
        built.rows = torch.arange(n_targets, device=ctx.device)
        labels = ctx.slice.labels[hp.ids[:n_targets] - ctx.slice.row_offset]
        built.labels = put(labels) if put else torch.as_tensor(labels, device=ctx.device)
        built.computed = [hp.ids[: lp.n_dst] for lp in hp.plan.layers]
        built.timings["to_torch"] += cobplan.clock() - start
        self._prepare(built)

    def _prepare(self, built: Built) -> None:
        """The aggregation matrices of a new co-batch's graphs: those the model builds, once known; while
        the first step runs (the keys being learnt), each one as soon as that step has built it; before
        the first step (the first co-batch) none: that step builds them."""
        start = cobplan.clock()
        graphs = _on_device(built).graphs
        if self.keys.known:
            cobplan.prepare_matrices(graphs, self.keys.keys())
        elif self.keys.watching:
            self.keys.follow(lambda keys: cobplan.prepare_matrices(graphs, keys))
        built.timings["matrices"] += cobplan.clock() - start

    def _ready(self, built: Built) -> Built:
        """Main thread: the step's stream waits for the co-batch's tensors; the previous co-batch is
        retired (freed once the work queued on it so far has run)."""
        self.loader.wait(built.ready)
        if self._in_use is not None and self._in_use.view is not built.view:
            self.loader.retire(self._in_use)
        self._in_use = built
        return built

    def _watch(self, built: Built) -> None:
        """Before the run's first step: learn the matrix keys from its graphs while it runs."""
        if not self.keys.known and not self.keys.watching:
            self.keys.watch(_on_device(built).graphs)

    def _learnt(self) -> None:
        if not self.keys.known:
            self.keys.finish()

    # ---- main thread ---------------------------------------------------------------------------
    def _step(self, built: Built, waited: float) -> Step:
        view = _on_device(built)
        assert built.rows is not None and built.labels is not None  # (set with the view)
        n_targets = int(built.rows.shape[0])
        return Step(view=view, rows=built.rows, labels=built.labels,
                    num_targets=int(self.ctx.comm.allreduce_scalar(n_targets, "sum")), sampling_s=waited,
                    host_s=dict(built.timings), accounting=lambda: self._accounting(view, built.computed))

    def _accounting(self, view, computed_ids) -> Dict:
        """Collective: rows held / computed per layer per rank and the server's redundancy factor."""
        topo = self.ctx.topo
        rows = rows_accounting(topo, view)
        factors = topo.gather_object(redundancy(topo, computed_ids))
        if topo.rank != 0:
            return {}
        return {**rows, "redundancy": float(np.mean(factors))}


class CooperativeSplit:
    """cob: the server's ranks share one co-batch; each computes the rows its GPU owns and receives
    the others' rows over the intra-server transport."""

    def __init__(self, ctx, server_graph, exact: bool):
        self.ctx = ctx
        self.index = cobplan.ServerIndex(server_graph, ctx.cfg.conv_layers, exact)
        self.group = ctx.groups["server"]

    def targets(self, targets):
        return targets

    def plan(self, draw, timings) -> cobplan.HostPlan:
        return cobplan.cooperative_plan(self.index, draw, self.ctx.slice.gpu, timings)


class PerGpuSplit(CooperativeSplit):
    """mb: each rank takes the co-batch's targets its GPU owns and builds their whole dependency graph,
    with no exchange: what cob saves is the overlap between these per-GPU graphs.  Features come from
    the server's rows in host memory, as a per-GPU loader's would."""

    def __init__(self, ctx, server_graph, exact: bool):
        super().__init__(ctx, server_graph, exact)
        self.group = local_group()  # mb has no halo anywhere: nothing to send or receive

    def targets(self, targets):
        owner = owner_of(self.index.offsets, targets)
        return targets[owner == self.ctx.slice.gpu]

    def plan(self, draw, timings) -> cobplan.HostPlan:
        return cobplan.per_gpu_plan(self.index, draw, timings)


SPLITS = {"cooperative": CooperativeSplit, "per-gpu": PerGpuSplit}


def redundancy(topo, computed_ids) -> float:
    """Rows computed summed over the server's ranks / distinct (vertex, layer) pairs they needed.

    Collective on the server's ranks; every rank gets the server's factor."""
    gathered = topo.allgather_object([np.asarray(ids) for ids in computed_ids], group="server")
    distinct = 0
    for l in range(len(computed_ids)):
        ids = np.concatenate([g[l] for g in gathered])
        if ids.size:  # server-local ids: a mask counts the distinct ones in O(n) (np.unique sorts)
            seen = np.zeros(int(ids.max()) + 1, dtype=bool)
            seen[ids] = True
            distinct += int(np.count_nonzero(seen))
    total = sum(sum(ids.size for ids in g) for g in gathered)
    return float(total) / max(distinct, 1)

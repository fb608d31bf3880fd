"""Training modes as objects: one small class per mode, found by name in `MODES`.

A mode says what shard set it needs (and how to build one when the given set is wrong), whether its
result is exact (equal to single-process full-graph training), and yields the steps of an epoch.  The
training loop (engine/trainer.py) only calls these methods: adding a mode touches this file (or a
module of its own registered here) and nothing in the loop.  docs/extending.md has the recipe.

    fb    full-batch baseline: every layer on the world view (1-hop halo from every owner)
    flx   Flexible Preloading: the first k layers on the server's k-hop preload (intra-server
          exchange only), the remaining L-k layers on the world view; k = L exchanges no halo rows
          between servers, k = 0 would be fb
    eas   Expansion-aware Sampling: every layer on the server view of an EAS preload
    cob   Cooperative Batching: co-batches sampled inside the server's preload, split over its GPUs
    mb    per-GPU mini-batches: each GPU samples the whole dependency graph of its own targets
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, Iterator, Optional

import numpy as np

from granndis_hpc import memory_model, registry, shards
from granndis_hpc.options.train_groups import OVERLAP_HALOS
from granndis_hpc.cluster.errors import collective_errors
from granndis_hpc.cluster.linkcheck import both_ways_rate, link_check_text, measure_links
from granndis_hpc.cluster.roundcheck import measure_exchange_rounds
from granndis_hpc.cluster.topology import device_memory
from granndis_hpc.engine import cobatch, cobsetup, inductive, views
from granndis_hpc.memory_model import compute_rate
from granndis_hpc.engine.steps import RunContext, Step, TrainingError, rows_accounting
from granndis_hpc.graph.sampler import CoBatchSampler, SamplerError
from granndis_hpc.units import format_size

log = logging.getLogger(__name__)


class Mode:
    """Base class.  Subclasses set `name`/`help` and implement `check`, `setup` and `steps`."""

    name: str = ""
    help: str = ""
    sampler = None  # a stateful sampler (state_dict/load_state_dict) when the mode has one
    # Full-graph modes: the one plan every epoch runs over (set by setup)
    static_view: Optional[views.LayeredView] = None
    decision: Optional[Dict] = None  # what `auto` chose and rejected, when this mode was chosen by it

    def __init__(self, cfg):
        self.cfg = cfg

    @classmethod
    def check_options(cls, cfg) -> Optional[str]:
        """A problem with the other options this mode needs (TrainConfig refuses it at parse time): by
        default what its registry entry declares it `needs`."""
        return registry.mode_problem(cls.name, cfg)

    def resolve(self, topo, links: Optional[dict] = None, comm=None) -> "Mode":
        """The mode that will run (collective): itself, except for `auto`, which picks one (with the
        links measured at start-up, cluster/linkcheck.py, where the trainer measured them, and the
        rounds of the run's Communicator `comm`, cluster/roundcheck.py)."""
        return self

    def shard_layers(self) -> Optional[int]:
        """The layer count the shard set must have been built for (None: any)."""
        return self.cfg.conv_layers

    def check(self, manifest: dict) -> None:
        """Raise TrainingError, saying what to build instead, when the shard set cannot serve the mode."""

    def exact(self, manifest: dict) -> bool:
        raise NotImplementedError

    def setup(self, ctx: RunContext) -> None:
        raise NotImplementedError

    def steps(self, epoch: int) -> Iterator[Step]:
        raise NotImplementedError

    def close(self) -> None:
        """Release what set-up started (a batched mode's loader thread)."""

    # ---- what a checkpoint needs of the mode ------------------------------------------------
    def shape_dependence(self, manifest: dict) -> Optional[str]:
        """Why this mode's trajectory depends on S x G and the partition, or None when it does not (a
        checkpoint may then continue on another layout of the same dataset: rundir/checkpoint.py)."""
        if not self.exact(manifest):
            return f"mode {self.name} is not exact here (it samples within each server's preload)"
        return None

    @property
    def stateful(self) -> bool:
        """Whether the mode has state a checkpoint must keep (state_dict/load_state_dict)."""
        return False

    def state_dict(self) -> Optional[Dict]:
        return None

    def load_state_dict(self, state: Optional[Dict]) -> None:
        """Restore what state_dict returned (a stateless mode has nothing to restore)."""

    def describe(self, manifest: dict) -> Dict:
        """What the run records about the mode (summary.json)."""
        out = {"mode": self.name, "exact": self.exact(manifest)}
        if self.decision is not None:
            out["auto"] = self.decision
        return out


# name -> mode class: the dependency-free registry (granndis_hpc/registry.py declares the built-in
# modes by name with their capabilities: auto's rank, the memory model's estimate, what they need).
MODES: registry.Registry = registry.MODES


def register(cls):
    """Register a mode class under its `name`; capabilities it does not declare are read from the class
    (e.g. `rank`, `knob`, `estimate` to take part in --mode auto: docs/architecture.md)."""
    MODES.register(cls.name, cls)
    return cls


def make_mode(cfg) -> Mode:
    if cfg.mode not in MODES:
        raise TrainingError(f"unknown mode {cfg.mode!r}; choose one of {', '.join(MODES)}")
    return MODES[cfg.mode](cfg)


# ---- full-graph modes: one static plan, one step per epoch ---------------------------------------
class StaticMode(Mode):
    """One plan built at set-up; every epoch is one full-graph step over it."""

    def setup(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.static_view = views.LayeredView(self.plan_layers(ctx))

    def plan_layers(self, ctx: RunContext):
        """The view of every layer, in order."""
        raise NotImplementedError

    def steps(self, epoch: int) -> Iterator[Step]:
        rows, view = self.ctx.split_rows["train"], self.static_view
        assert view is not None  # (setup made it)
        yield Step(view=view, rows=rows, labels=self.ctx.labels[rows],
                   num_targets=int(self.ctx.split_totals["train"]),
                   accounting=lambda: rows_accounting(self.ctx.topo, view))


def server_view(ctx: RunContext, num_layers: int, exact: bool) -> views.View:
    """The rank's rows of its server's preload, planned for `num_layers` layers, intra-server exchange."""
    sl = ctx.slice
    if ctx.inductive:  # the rows and edges of the train-induced graph's own num_layers-hop preload
        rows = inductive.server_rows(sl, exact_degrees=exact, depth=num_layers)
        resolve = inductive.key_resolver_server(sl, depth=num_layers)
    else:
        rows, resolve = views.server_rows(sl, exact_degrees=exact), views.key_resolver_server(sl.global_id.shape[0])
    return views.build_view(rows, ctx.groups["server"], num_layers, all_active=False, resolve_keys=resolve,
                            device=ctx.device, exact=exact, static_features=ctx.static_features)


@register
class FullBatch(StaticMode):
    name = "fb"
    help = "full-batch baseline: 1-hop halo exchanged with every owner at every layer"

    def shard_layers(self):
        return None  # the world view serves any depth

    def exact(self, manifest):
        return True

    def plan_layers(self, ctx):
        return [ctx.world_view] * self.cfg.conv_layers


@register
class FlexiblePreload(StaticMode):
    name = "flx"
    help = ("Flexible Preloading: the first k layers (k = the shard set's --hops) on the server's "
            "preload, the rest with the world exchange")

    def check(self, manifest):
        pre = manifest["preload"]
        if pre["kind"] != "full" or int(pre["hops"]) < 1:
            raise TrainingError(
                f"mode flx needs a full preload of 1 to {self.cfg.conv_layers} hops, but the shards hold a "
                f"{pre['kind']} preload of {pre['hops']} hop(s); rebuild them with `granndis preprocess "
                f"build ... --preload full --hops K` (1 <= K <= {self.cfg.conv_layers}), or use --mode fb")
        k = self.cfg.preloaded_layers
        if k is not None and (k > int(pre["hops"]) or k > self.cfg.conv_layers):
            raise TrainingError(
                f"--preloaded-layers {k} needs a preload of {k} hops and a model of at least {k} layers; the "
                f"shards preload {pre['hops']} hop(s) and the model has {self.cfg.conv_layers} layers: use "
                f"--preloaded-layers {min(int(pre['hops']), self.cfg.conv_layers)} or fewer, or rebuild with "
                f"--hops {k}")
        inductive.check_train_hops(self.cfg.inductive, manifest, self.name, self.cfg.shards)

    def exact(self, manifest):
        return True

    def preloaded_layers(self, manifest) -> int:
        """k: the layers that run on the server's preload: --preloaded-layers, else the set's hops (at
        most L).  Rows deeper than k stay resident but are never active."""
        hops = int(manifest["preload"]["hops"])
        return min(hops if self.cfg.preloaded_layers is None else self.cfg.preloaded_layers, self.cfg.conv_layers)

    def plan_layers(self, ctx):
        k, L = self.preloaded_layers(ctx.manifest), self.cfg.conv_layers
        preloaded = server_view(ctx, k, exact=True)
        return [preloaded] * k + [ctx.world_view] * (L - k)

    def describe(self, manifest):
        return {**super().describe(manifest), "preloaded_layers": self.preloaded_layers(manifest)}


@register
class ExpansionAware(StaticMode):
    name = "eas"
    help = "Expansion-aware Sampling: every layer on the server's sampled (EAS) preload"

    def check(self, manifest):
        kind = manifest["preload"]["kind"]
        if kind != "eas":
            raise TrainingError(f"mode eas needs shards built with --preload eas, these hold a {kind} "
                                f"preload; rebuild with `granndis preprocess build ... --preload eas`")
        inductive.check_train_hops(self.cfg.inductive, manifest, self.name, self.cfg.shards)

    def exact(self, manifest):
        return False  # the boundary expansion is sampled; degrees are the kept neighbours'

    def plan_layers(self, ctx):
        return [server_view(ctx, self.cfg.conv_layers, exact=False)] * self.cfg.conv_layers


# ---- mini-batch modes: a sampler composed with a row split (engine/cobatch.py) -------------------
class BatchedMode(Mode):
    """Co-batches drawn by a CoBatchSampler inside the server's preload; `split` says which rows of a
    co-batch's dependency graph this rank computes and how it gets the others."""

    split_kind = ""
    # The server graph's structure (shards.read_server_graph, no features) where auto's co-batch set-up
    # check read it from the shard set this mode trains on (engine/cobsetup.py); set-up then reads only
    # the features
    server_structure: Optional[dict] = None

    def check(self, manifest):
        cfg, pre = self.cfg, manifest["preload"]  # fanout and sampler names: TrainConfig checks them
        if pre["kind"] == "full" and cfg.sampler != "saint" and int(pre["hops"]) < cfg.conv_layers:
            raise TrainingError(
                f"mode {self.name} samples {cfg.conv_layers}-hop dependency graphs inside the server's preload, "
                f"but the shards hold a {pre['hops']}-hop preload; rebuild them with --hops {cfg.conv_layers}")

    def exact(self, manifest):
        # Global degrees and complete neighbourhoods only when nothing is sampled away.
        return manifest["preload"]["kind"] == "full" and self.cfg.fanout == -1 and self.cfg.sampler == "sage"

    def setup(self, ctx):
        cfg, topo = self.cfg, ctx.topo
        # Every rank of a server draws the same co-batches (same seed): each reads its server's graph.
        with collective_errors(topo.world, "reading the server graph for co-batches",
                               catch=(shards.ShardError, SamplerError, OSError, KeyError)):
            held, self.server_structure = self.server_structure, None  # the loader keeps its own graph
            graph = (shards.read_server_graph(cfg.shards, ctx.manifest, topo.server, features=True) if held is None
                     else {**held, "features": shards.read_server_features(cfg.shards, ctx.manifest, topo.server)})
            if ctx.inductive:  # co-batches are sampled over the train-induced edges only
                graph = inductive.train_induced_graph(graph)
            train_ids = np.flatnonzero(graph["train"] & (graph["hop"] == 0))
            self.sampler = CoBatchSampler(graph["indptr"], graph["indices"], train_ids, cfg.batches_per_epoch,
                                          cfg.conv_layers, cfg.sampler, cfg.fanout, cfg.seed, topo.server)
        split = cobatch.SPLITS[self.split_kind](ctx, graph, self.exact(ctx.manifest))
        self.batches = cobatch.BatchedSteps(ctx, self.sampler, split, prefetch=not cfg.sequential_sampling)
        self.batches.start(0)  # the first co-batch is built while the trainer sets up the rest of the run

    def steps(self, epoch):
        return self.batches.steps(epoch)

    def shape_dependence(self, manifest):
        return super().shape_dependence(manifest) or (
            f"mode {self.name} samples its co-batches per server (each server shuffles its own training "
            f"vertices), so the batches follow the partition")

    @property
    def stateful(self):
        return True  # the sampler's position: co-batches continue where they stopped

    def state_dict(self):
        return self.sampler.state_dict()

    def load_state_dict(self, state):
        self.sampler.load_state_dict(state)

    def close(self):
        if getattr(self, "batches", None) is not None:
            self.batches.close()


@register
class CooperativeBatching(BatchedMode):
    name = "cob"
    help = "Cooperative Batching: one co-batch per server, its dependency graph split over the server's GPUs"
    split_kind = "cooperative"


@register
class PerGpuMiniBatch(BatchedMode):
    name = "mb"
    help = "per-GPU mini-batches: each GPU builds the whole dependency graph of its own targets"
    split_kind = "per-gpu"


# ---- GraNNDis' automatic choice (paper §5.1, Fig. 13b) -------------------------------------------
@register
class Automatic(Mode):
    """--mode auto --memory-per-gpu X --shards A[,B,...]: estimate every way the shard sets can be
    trained (granndis_hpc.memory_model) and run, among those that fit, the one of the shortest
    predicted epoch (--auto-rule time: the links and the compute rate measured here), or the first in
    GraNNDis' order (--auto-rule memory): full-batch FLX with the largest k, then FLX on an EAS set,
    then cooperative batching with the fewest co-batches.  --auto-modes exact leaves out the sampled
    modes.  Nothing fitting is refused with the budget that would be needed.  The time rule prices the
    co-batch set-up at zero first and times it (engine/cobsetup.py, collective) only where a co-batch
    option then wins, deciding again with its price."""

    name = "auto"
    help = "the fastest predicted option that fits --memory-per-gpu (--auto-rule memory: GraNNDis' order)"

    def resolve(self, topo, links: Optional[dict] = None, comm=None):
        cfg = self.cfg
        paths = [p for p in str(cfg.shards).split(",") if p]
        decision = measured = rates_for = rounds = setup = structure = None
        errors: Dict[str, Any] = dict(catch=(TrainingError, memory_model.MemoryModelError, shards.ShardError, OSError,
                                             KeyError,
                             ValueError))
        model_kw = dict(dropout=cfg.dropout, norm=cfg.norm, checkpoint_activations=cfg.checkpoint_activations,
                        linear_layers=cfg.linear_layers or 0,
                        options=tuple(registry.model_options(cfg.model, cfg.model_option).items()),
                        # the order the run computes in, whose peak is estimated (overlapped by default)
                        overlap=() if cfg.no_overlap else tuple(sorted(OVERLAP_HALOS[cfg.overlap_halos])),
                        precision=cfg.precision)
        if cfg.auto_rule == "time" and paths:
            if comm is None:
                raise TrainingError("--mode auto --auto-rule time times the run's exchange rounds: resolve it "
                                    "with the run's Communicator (Trainer does)")
            # collective; the trainer's, unless --no-link-check
            links = links or measure_links(topo, both_ways=True, piece_bytes=comm.piece_bytes)
            # collective: what an exchange round and a gradient round cost on the paths this run takes
            rounds = measure_exchange_rounds(comm, world_overlapped=not cfg.no_overlap,
                                             server_overlapped=not cfg.no_overlap
                                             and "server" in OVERLAP_HALOS[cfg.overlap_halos],
                                             gradient_overlapped=not cfg.no_overlap)

            def rates_for(m, degree):
                return memory_model.Rates(links["inter_Bps"], links["intra_Bps"], measured["row_s"], measured["edge_s"],
                                          compute_scale=measured["compute_scale"],
                                          overlap_scale=measured["overlap_scale"],
                                          overlap_step_s=measured["overlap_step_s"],
                                          step_s=measured["step_s"] + rounds["allreduce_s"],
                                          world_round_s=rounds["world_round_s"],
                                          server_round_s=rounds["server_round_s"],
                                          inter_both_Bps=both_ways_rate(links),
                                          cobatch_s=setup["cobatch_s"], cobatch_row_s=setup["cobatch_row_s"],
                                          # a co-batch step's all-reduce of its target count (one int over the
                                          # world) at the gradient round's price: of the rounds timed, the one
                                          # that is an all-reduce of a few bytes over every rank (the exchange
                                          # rounds are point-to-point); timed as the run reduces its gradient,
                                          # posted and polled where it overlaps, so it may price a blocking
                                          # all-reduce's wait a little low there
                                          targets_round_s=rounds["allreduce_s"])
        memory = device_memory(topo)  # collective: what the GPUs have free now (None on the CPU)
        # Rank 0 reads the shard sets and estimates; every rank gets the same decision or error.
        found = timing = None
        with collective_errors(topo.world, "--mode auto", **errors):
            if topo.rank == 0:
                found = memory_model.shard_set_options(
                    paths, cfg.model, cfg.hidden, cfg.conv_layers, cfg.memory_per_gpu_bytes, device=topo.device.type,
                    fanout=cfg.fanout, sampler=cfg.sampler, seed=cfg.seed,
                    job=(topo.servers, topo.ranks_per_server), inductive=cfg.inductive,
                    halo_route=cfg.halo_route, exact_only=cfg.auto_modes == "exact",
                    device_memory=memory, input_dropout=cfg.input_dropout, **model_kw)
        if rates_for is not None:
            # collective: at the widths of the model and the degree of the graph the run trains on (rank 0's
            # estimates: ShardSetOptions.degree)
            measured = self._compute_rate(topo, found)
            setup = {"cobatch_s": 0.0, "cobatch_row_s": 0.0, "method": ""}  # priced at zero until timed
        with collective_errors(topo.world, "--mode auto", **errors):
            if topo.rank == 0:
                assert found is not None  # (rank 0 estimated the options above)
                first = found.decide(rates_for)  # the time rule: the co-batch set-up at zero, a lower bound
                if first.choice is None:
                    raise TrainingError(first.reason)
                timing = rates_for is not None and memory_model.setup_matters(first)
                decision = first.to_dict()
                why = memory_model.setup_not_timed(first) if rates_for is not None and not timing else ""
                if why:  # said in the reason and summary.json (plan.auto.cobatch_setup)
                    setup = {"cobatch_s": 0.0, "cobatch_row_s": 0.0, "timed": False, "method": why}
        # Every rank learns whether cob's set-up can matter: timing it is collective (all ranks or none).
        timing, setup = topo.bcast_object((timing, setup))
        if timing:
            setup, structure = cobsetup.measure(cfg, paths[0], topo)  # collective; reads the server graphs
            with collective_errors(topo.world, "--mode auto", **errors):
                if topo.rank == 0:
                    assert found is not None  # (rank 0 estimated the options above)
                    decision = found.decide(rates_for).to_dict()  # the same options, cob's set-up priced
                    if decision["choice"] is None:  # (the budget is the same: something fits)
                        raise TrainingError(decision["reason"])
        decision = topo.bcast_object(decision)
        if measured is not None and links is not None:  # how the links and compute were measured, beside the rates
            decision["compute_rate"] = measured
            decision["link_check"] = {**links, "rounds": rounds}
            decision["reason"] += f"; {link_check_text(links, rounds)}; {measured['method']}"
            if setup and setup["method"]:
                decision["cobatch_setup"] = setup
                decision["reason"] += f"; {setup['method']}"
        choice = decision["choice"]
        # The chosen mode's own knob (flx: preloaded_layers = k; cob: batches_per_epoch), from its entry, and
        # fb's --halo-payload (rows unless the option sends partial aggregates).
        resolved = dataclasses.replace(cfg, mode=choice["mode"], shards=choice["source"],
                                       **{"preloaded_layers": None, "halo_payload": "rows", **choice["train_options"]})
        mode = make_mode(resolved)
        mode.decision = decision
        if isinstance(mode, BatchedMode) and choice["source"] == paths[0]:
            mode.server_structure = structure  # what the set-up check read: not read again
        if not cfg.quiet:
            log.info(f"[auto] {choice['label']} on {choice['source']}: estimated peak "
                     f"{format_size(choice['peak_bytes'])} per GPU within {format_size(decision['budget_bytes'])}")
            for line in memory_model.decision_table(decision):
                log.info(f"[auto]   {line}")
            log.info(f"[auto] {decision['reason']}")
        return mode

    def _compute_rate(self, topo, found) -> dict:
        """Collective: the compute rate measured on every rank (memory_model/compute_rate.measure_job) at
        the model's widths, the in-degree of the graph the run trains on and its overlapped path's shape,
        from rank 0's estimates of the options (`found`, memory_model.ShardSetOptions; None on the other
        ranks)."""
        graph = (found.m.widths(), found.degree, found.m, found.shape) if topo.rank == 0 else None
        widths, degree, m, shape = topo.bcast_object(graph)
        return compute_rate.measure_job(widths, degree, topo.device, topo.allgather_object, spec=m, shape=shape)

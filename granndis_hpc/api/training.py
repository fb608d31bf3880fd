"""train(): a training run from a graph held in Python or a shard set, with granndis-train's options; and
run_trainer, the one place a Trainer is made, run and closed (granndis-train runs through it too)."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, NamedTuple, Optional

from granndis_hpc.api.cache import DEFAULT_SUBDIR
from granndis_hpc.api.errors import OptionError, agreed, passed_on
from granndis_hpc.api.results import ShardSet, TrainResult
from granndis_hpc.api.world import start, world

# The set a mode trains on when train() builds it (registry.py's `build` hints): fb needs only the
# world view (1 hop), flx a full preload of k hops, eas and cob an EAS preload; a mode not listed
# gets a full preload as deep as the model.
_MODE_PRELOAD = {"fb": "full", "eas": "eas", "cob": "eas"}
_PLACEHOLDER = "<the set train() builds>"


class Finished(NamedTuple):
    summary: Optional[dict]   # None: stopped by a signal with a checkpoint written
    config: Any               # the TrainConfig the run used (--mode auto: the mode it chose)
    rank: int


def run_trainer(cfg, ignore_late_warnings: bool = False) -> Finished:
    """Collective: train with `cfg` (a TrainConfig) and write the run's outputs.

    ignore_late_warnings (the command-line process only): leave SIGUSR1 ignored after the run, for the
    rank's way out.  Not for in-process callers: children they start later would inherit SIG_IGN, and a
    shell cannot trap a signal ignored at its entry."""
    from granndis_hpc.engine.trainer import Trainer

    trainer = Trainer(cfg)
    try:
        summary = trainer.run()  # writes the resolved config (every option) to RUN_DIR/config.json
        if ignore_late_warnings:  # a late SIGUSR1 must not kill the ranks on their way out
            trainer.stop_signals.ignore_warnings_after()
    finally:
        trainer.close()
    return Finished(summary, trainer.cfg, trainer.topo.rank)


def default_build(cfg) -> dict:
    """The build options of the set `cfg` trains on, when train() builds it from a graph."""
    preload = _MODE_PRELOAD.get(cfg.mode, "full")
    hops = None  # the build's default: the layers for a full preload, 1 for EAS
    if cfg.mode == "fb":
        hops = 1
    elif cfg.mode == "flx" and cfg.preloaded_layers is not None:
        hops = min(cfg.preloaded_layers, cfg.conv_layers)
    return {"layers": cfg.conv_layers, "preload": preload, "hops": hops, "inductive": cfg.inductive}


def _device(config, options: Mapping) -> str:
    """The device asked for, read before MPI starts (mpistart sets the GPU first); the checked value
    comes with the config."""
    if "device" in options:
        device = options["device"]
    elif isinstance(config, Mapping):
        device = config.get("device")
    else:
        device = getattr(config, "device", None)
    return device if device in ("auto", "cpu", "cuda") else "auto"


def train(graph_or_shards: Any = None, *, out, config=None, cache_dir=None, build: Optional[Mapping] = None,
          **options) -> TrainResult:
    """Collective (every rank calls it): train a model and return its TrainResult.

    `graph_or_shards`: a graph held in Python (a PyG ``Data``, a DGL graph, a dict of save_bundle's
    keywords), a ShardSet, or a shard directory's path.  A graph is built into a shard set for this job's
    shape first, cached under `cache_dir` (default OUT/shard-cache) and reused by later calls of the same
    graph, shape and build options; `build` overrides the options of that build (build()'s names: preload,
    hops, partitioner, name, ...).  `out`: the run directory.  `options`: granndis-train's options by
    field name (TrainConfig: mode, model, layers, hidden, epochs, lr, ...), over those of `config` (a
    TrainConfig, a dict of its fields, or a --config TOML file's path).  Anything wrong raises the same
    GranndisError (OptionError for an option) on every rank."""
    from granndis_hpc.api.graphs import is_graph, shards_path
    from granndis_hpc.api.options import train_config

    start(_device(config, options))
    given = dict(options, out=os.fspath(out) if out is not None else None)
    from_graph = graph_or_shards is not None and is_graph(graph_or_shards)
    cfg = None
    with agreed("train()"):
        if build is not None and not from_graph:
            raise OptionError("train(build=...): build options apply when train() is given a graph, not a shard set")
        if build is not None and not isinstance(build, Mapping):
            raise OptionError(f"train(build=...): expected a dict of build options, got {type(build).__name__}")
        if from_graph:
            given["shards"] = _PLACEHOLDER
        elif graph_or_shards is not None:
            given["shards"] = shards_path(graph_or_shards, "train()")
        cfg = train_config(config, given)
        if not cfg.out:
            raise OptionError("train(): out= is required (the run directory: config, metrics, summary, best model)")
    shard_set = graph_or_shards if isinstance(graph_or_shards, ShardSet) else None
    if from_graph:
        from granndis_hpc.api.building import build_for_shape

        shape = world(cfg.ranks_per_server)
        cache_dir = os.path.join(cfg.out, DEFAULT_SUBDIR) if cache_dir is None else cache_dir
        shard_set = build_for_shape(graph_or_shards, shape.servers, shape.ranks_per_server, cache_dir=cache_dir,
                                    quiet=cfg.quiet, options={**default_build(cfg), **(build or {})}, what="train()")
        cfg = dataclasses.replace(cfg, shards=shard_set.path)
    _log_as_this_rank(cfg)
    try:
        finished = run_trainer(cfg)
    except Exception as exc:  # noqa: BLE001 -- the engine agrees on its errors; one rank's own ends the job
        raise passed_on(exc, "train()") from exc
    return TrainResult(run_dir=cfg.out, summary=finished.summary, config=finished.config, shards=shard_set,
                       rank=finished.rank)


def _log_as_this_rank(cfg) -> None:
    from granndis_hpc.cluster import as_group
    from granndis_hpc.progress import setup_logging

    setup_logging(as_group(None).rank, all_ranks=cfg.log_all_ranks, level=cfg.log_level)

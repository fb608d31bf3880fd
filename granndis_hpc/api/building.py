"""build(): a shard set from a graph held in Python, for the running job's shape unless told another.

The build is `granndis preprocess build`'s own pipeline (preprocess/build/pipeline.py run_build), run by
every rank of the job together, each holding the whole graph (as the command's whole-graph build does);
one process builds alone.  The options are BuildOptions' fields, checked by their declarations.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

from granndis_hpc.api import cache
from granndis_hpc.api.errors import OptionError, agreed, passed_on
from granndis_hpc.api.results import ShardSet
from granndis_hpc.api.world import start, world


def build(graph: Any, out=None, *, cache_dir=None, ranks_per_server: Optional[int] = None,
          servers: Optional[int] = None, gpus_per_server: Optional[int] = None, overwrite: bool = False,
          quiet: bool = False, **options) -> ShardSet:
    """Collective (every rank calls it): the shard set of `graph` -- a PyG ``Data``, a DGL graph, or a dict
    of save_bundle's keywords (edge_index, features, labels, train_mask, ...) -- for servers x
    gpus_per_server (default: this job's shape, servers of `ranks_per_server` ranks as training finds
    them; one process: 1 x 1).

    Written to `out`, or into `cache_dir` under a name keyed by the graph's content, the shape and the
    options, where a later call finds it and reuses it once verified (ShardSet.reused).  `options` are
    `granndis preprocess build`'s, by field name: layers (required), preload ("full" or "eas"), hops (an
    int, or "auto" with memory_per_gpu), partitioner, seed, eas_fanout, eas_select, row_block_rows,
    inductive, name, symmetrize, self_loops, normalize_features, and the estimate's model options for
    hops="auto".  Anything wrong raises the same GranndisError (OptionError for an option) on every rank."""
    start()
    with agreed("build()"):
        if (out is None) == (cache_dir is None):
            raise OptionError("build(): give out= (the set's directory) or cache_dir= (a cache of sets), one of them")
        if (servers is None) != (gpus_per_server is None):
            raise OptionError("build(): give servers= and gpus_per_server= together (or neither: this job's shape)")
    if servers is None:
        shape = world(ranks_per_server)
        servers, gpus_per_server = shape.servers, shape.ranks_per_server
    return build_for_shape(graph, servers, gpus_per_server, out=out, cache_dir=cache_dir, overwrite=overwrite,
                           quiet=quiet, options=options, what="build()")


def build_for_shape(graph: Any, servers: int, gpus_per_server: int, *, out=None, cache_dir=None,
                    overwrite: bool = False, quiet: bool = False, options: dict, what: str) -> ShardSet:
    """Collective: build() once the shape is known (train() and predict() call it for the job's shape)."""
    from granndis_hpc.api.graphs import CANONICAL_OPTIONS, agreed_graph, default_name
    from granndis_hpc.api.options import build_option_names, build_options
    from granndis_hpc.cluster import as_group

    group = as_group(None)
    opts = None
    with agreed(what):
        placeholder = os.fspath(out) if out is not None else os.path.join(os.fspath(cache_dir), "entry")
        options = {"name": default_name(graph), **options}
        opts = build_options(options, out=placeholder, servers=servers, gpus_per_server=gpus_per_server, what=what)
    recorded = {name: getattr(opts, name) for name in build_option_names() if name != "overwrite"}
    graph, digest = agreed_graph(graph, opts.name, **{k: getattr(opts, k) for k in CANONICAL_OPTIONS})
    key = cache.cache_key(digest, servers, gpus_per_server, recorded)
    cached = out is None
    if cached:
        target = os.path.join(os.fspath(cache_dir), cache.entry_name(opts.name, servers, gpus_per_server,
                                                                     opts.preload, key))
    else:
        target = os.fspath(out)
    opts = dataclasses.replace(opts, out=target, overwrite=bool(overwrite or cached))
    found, why = None, ""
    with agreed(what):
        if group.rank == 0:
            if cached:
                cache.make_cache_dir(os.fspath(cache_dir))
            found, why = cache.verified(target, key, digest, servers, gpus_per_server)
    found = group.bcast_object(found)
    if found is not None:
        return ShardSet.from_manifest(target, found, reused=True, build_options=recorded)
    printer = (lambda *a, **k: None) if quiet else print
    if group.rank == 0 and not quiet and why != "not built yet":
        print(f"[build] {target}: {why}; building it {'again' if cached else 'there (with overwrite=True)'}",
              flush=True)
    try:
        manifest = _run_build(group, graph, opts, key, digest, printer)
    except Exception as exc:  # noqa: BLE001 -- agreed by the pipeline on every rank, or one rank's own
        raise passed_on(exc, f"{what} building {target}") from exc
    return ShardSet.from_manifest(target, manifest, reused=False, build_options=recorded)


def _run_build(group, graph, opts, key: str, digest: str, printer) -> dict:
    """Collective: the pipeline of `granndis preprocess build` on the canonical graph."""
    from granndis_hpc.preprocess import sources
    from granndis_hpc.preprocess.build.pipeline import PhaseLog, run_build
    from granndis_hpc.preprocess.build.slices import spill_directory
    from granndis_hpc.preprocess.options import build_config
    from granndis_hpc.preprocess.plan.command import resolve_build_hops

    cfg = build_config(opts, command=f"granndis_hpc.build() on {group.size} rank(s)")
    cfg.extra.update(sources.features_record(opts.normalize_features))
    cfg.extra[cache.KEY_FIELD] = key
    log = PhaseLog(group, printer=printer)
    with spill_directory(opts.out):
        cfg.hops = resolve_build_hops(group, graph, opts, printer=printer, record=cfg.extra)
        manifest = run_build(group, graph, cfg, log, content_digest=digest)
    if group.rank == 0:
        printer(f"[build] wrote {opts.out} for {cfg.servers} x {cfg.gpus_per_server}", flush=True)
    return manifest

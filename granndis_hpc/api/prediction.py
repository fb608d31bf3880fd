"""predict(): a trained model's outputs for every vertex (or one split's), returned as arrays and, with
out=, also written as `granndis predict` writes them.

The forward is `granndis predict`'s (engine/predict.py WorldForward: exact full-graph inference over
the world view, on any shape and any shard set of the model's dataset); its rows are moved into
contiguous blocks of global ids (predict_io.to_blocks), and then handed to every rank ("all"), to
rank 0 only ("root"), or left in blocks ("block": rank r holds ids [N*r/P, N*(r+1)/P), the way to
keep a rank's memory bounded for a large graph).
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Dict, Mapping, Optional

import numpy as np

from granndis_hpc.api.cache import DEFAULT_SUBDIR
from granndis_hpc.api.errors import OptionError, agreed, passed_on
from granndis_hpc.api.results import Predictions, ShardSet, TrainResult
from granndis_hpc.api.world import start, world

GATHERS = ("all", "root", "block")
_IN_MEMORY = "<in memory>"
_PLACEHOLDER_SHARDS = "<the set predict() builds>"
# PredictOptions' fields that predict() takes as its own arguments.
_ARGUMENTS = ("model", "shards", "out")
# The set predict() builds from a graph when the model's own is not at hand: any preload serves the
# world view, so the smallest.
_PREDICT_BUILD = {"layers": 1, "preload": "full", "hops": 1}


def _run_dir_of(model) -> Optional[str]:
    """The run directory a model source belongs to (a run directory, its best-model.pt, one of its
    checkpoint directories RUN_DIR/checkpoints/epoch-E), or None."""
    if isinstance(model, TrainResult):
        return model.run_dir
    path = os.path.abspath(os.fspath(model))
    for candidate in (path, os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
        if os.path.isfile(os.path.join(candidate, "config.json")):
            return candidate
    return None


def predict(model: Any, graph_or_shards: Any, *, out=None, gather: str = "all", cache_dir=None,
            build: Optional[Mapping] = None, **options) -> Predictions:
    """Collective (every rank calls it): the outputs of `model` for the vertices of `graph_or_shards`.

    `model`: a TrainResult, a run directory (its best-model.pt, else its newest checkpoint), a
    best-model.pt or a checkpoint directory.  `graph_or_shards`: a graph held in Python (built for this
    job's shape first, cached under `cache_dir`, default the model's RUN_DIR/shard-cache: the set train()
    built is reused when the shape is the same), a ShardSet or a shard directory of the model's dataset.
    `options`: `granndis predict`'s by field name: probabilities, layer, split, format, overwrite,
    ranks_per_server, device, skip_checksums, verify_content, quiet, ...  `out`: also write them there
    (FILE.h5 or a directory of .npy files; refused when it exists, unless overwrite=True).  `gather`:
    which rank gets which rows (module docstring).  Anything wrong raises the same GranndisError
    (OptionError for an option) on every rank."""
    from granndis_hpc.api.graphs import is_graph, shards_path
    from granndis_hpc.api.options import check_names

    start(options.get("device") if options.get("device") in ("auto", "cpu", "cuda") else "auto")
    from_graph = is_graph(graph_or_shards)
    opts = run_dir = None
    with agreed("predict()"):
        from granndis_hpc.options.predict import PredictOptions

        names = [f.name for f in dataclasses.fields(PredictOptions) if f.name not in _ARGUMENTS]
        check_names(options, names, "predict()")
        if build is not None and not (from_graph and isinstance(build, Mapping)):
            raise OptionError("predict(build=...): a dict of build options, for the set predict() builds when it is "
                              "given a graph")
        if gather not in GATHERS:
            raise OptionError(f"predict(gather={gather!r}): choose one of {', '.join(map(repr, GATHERS))}")
        if not isinstance(model, TrainResult) and not os.path.exists(os.fspath(model)):
            raise OptionError(f"predict(): the model {os.fspath(model)!r} does not exist (give a TrainResult, a run "
                              f"directory, a best-model.pt or a checkpoint directory)")
        run_dir = _run_dir_of(model)
        if from_graph and cache_dir is None and run_dir is None:
            raise OptionError("predict(): the model is not in a run directory, so give cache_dir= for the shard set "
                              "built from the graph")
        source = model.run_dir if isinstance(model, TrainResult) else os.fspath(model)
        shards = _PLACEHOLDER_SHARDS if from_graph else shards_path(graph_or_shards, "predict()")
        opts = _options(PredictOptions, source, shards, out, options)
    if from_graph:
        shards_used = _build_for(model, graph_or_shards, opts, cache_dir or os.path.join(run_dir, DEFAULT_SUBDIR),
                                 build)
        opts = dataclasses.replace(opts, shards=shards_used.path)
    _log_as_this_rank(opts)
    try:
        return _predict(opts, out, gather)
    except Exception as exc:  # noqa: BLE001 -- agreed by the forward on every rank, or one rank's own
        raise passed_on(exc, "predict()") from exc



def _options(cls, source: str, shards: str, out, options: Mapping):
    from granndis_hpc.options import ConfigError

    try:
        return cls(model=source, shards=shards, out=_IN_MEMORY if out is None else os.fspath(out), **options)
    except (ConfigError, TypeError) as exc:
        raise OptionError(f"predict(): {' '.join(str(exc).split())}") from None


def _build_for(model, graph, opts, cache_dir, build: Optional[Mapping]) -> ShardSet:
    """Collective: the shard set of `graph` for this job's shape: with the model's own build options when
    it is a TrainResult (the same set when the shape is), else the smallest set."""
    from granndis_hpc.api.building import build_for_shape

    made = model.shards if isinstance(model, TrainResult) else None
    options = dict(made.build_options) if made is not None and made.build_options else dict(_PREDICT_BUILD)
    options.update(build or {})
    shape = world(opts.ranks_per_server)
    return build_for_shape(graph, shape.servers, shape.ranks_per_server, cache_dir=cache_dir, quiet=opts.quiet,
                           options=options, what="predict()")


def _predict(opts, out, gather: str) -> Predictions:
    """Collective: the forward, the rows in blocks of global ids, written when `out`, then gathered."""
    from granndis_hpc.cluster.errors import collective_errors
    from granndis_hpc.engine.predict import forward_of, output_rows, reads
    from granndis_hpc.engine.predict_io import OutputError, check_output, write_rows

    start_s = time.perf_counter()
    fw = forward_of(opts)
    try:
        topo = fw.topo
        with collective_errors(topo.world, "", catch=(OptionError, OutputError, OSError)):
            if opts.layer is not None and opts.layer >= fw.layers:
                raise OptionError(f"layer={opts.layer}: the model has {fw.layers} message-passing layers, so layer "
                                  f"must be 0 .. {fw.layers - 1}")
            if out is not None and topo.rank == 0:
                check_output(opts.out, opts.overwrite, reads(opts))  # before the forward: refuse early
        rows, first, total, provenance = output_rows(fw, opts)
        if out is not None:
            shapes = {name: (a.dtype.str, a.shape[1:]) for name, a in rows.items()}
            write_rows(topo, opts.out, opts.resolved_format(), first, total, rows, shapes, provenance, opts.overwrite,
                       reads(opts))
        arrays = _gathered(topo, rows, gather)
        if not opts.quiet and topo.rank == 0:
            print(f"[predict] {total} rows of {fw.source.path} (epoch {fw.source.epoch}) in "
                  f"{time.perf_counter() - start_s:.2f} s" + (f", written to {opts.out}" if out is not None else ""),
                  flush=True)
        return Predictions.from_arrays(arrays, provenance, rank=topo.rank,
                                       out=None if out is None else opts.out)
    finally:
        fw.close()


def _gathered(topo, rows: Dict[str, np.ndarray], gather: str) -> Dict[str, np.ndarray]:
    """Collective: the rows this rank returns -- every block ("all"), every block on rank 0 and none
    elsewhere ("root"), or its own block ("block").  Blocks are in rank order, so ids stay ascending."""
    if gather == "block":
        return rows
    blocks = topo.allgather_object(rows) if gather == "all" else topo.gather_object(rows)
    if blocks is None:  # "root", on a rank other than 0: no rows, the same arrays
        return {name: a[:0] for name, a in rows.items()}
    return {name: np.concatenate([b[name] for b in blocks]) for name in rows}


def _log_as_this_rank(opts) -> None:
    from granndis_hpc.cluster import as_group
    from granndis_hpc.progress import setup_logging

    setup_logging(as_group(None).rank, all_ranks=opts.log_all_ranks, level=opts.log_level)

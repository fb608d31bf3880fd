"""`granndis predict`: exact distributed inference of a trained model, written in global-id order.

Every rank reads its slice of the shard set, plans the exact world view (its inner vertices and all their
in-edges, the view training evaluates with) and runs the model in eval mode over it, so the logits are
the single-process full-graph forward's to float32 rounding on any cluster shape and any shard set of
the same dataset (the model's dataset content digest must match the shard set's).  The rows are then
moved into contiguous blocks of global ids and written (engine/predict_io.py): no rank holds more than
its own vertices' rows and one block of the output.
"""
from __future__ import annotations

import logging
import time
from typing import Dict, Optional

import numpy as np
import torch

from granndis_hpc import shards
from granndis_hpc.cluster.comm import Communicator
from granndis_hpc.cluster.errors import collective_errors
from granndis_hpc.cluster.ledger import Ledger
from granndis_hpc.cluster.topology import init_topology
from granndis_hpc.engine import targets, views
from granndis_hpc.engine.model_source import ModelSource, ModelSourceError, dataset_refusal, load_parameters, \
    read_model_source
from granndis_hpc.engine.predict_io import (PREDICT_TOOL, OutputError, block_bounds, check_output, to_blocks,
                                            write_rows)
from granndis_hpc.engine.preflight import DeterministicKernels, share_cpu_threads
from granndis_hpc.engine.source_ids import give_source_ids
from granndis_hpc.graph import planner
from granndis_hpc.graph.hetero import types_of
from granndis_hpc.nn.models import build_model
from granndis_hpc.model_code import rebuild_options
from granndis_hpc.options.startup import topology_args

log = logging.getLogger(__name__)

SPLIT_MASKS = {"train": "train_mask", "val": "val_mask", "test": "test_mask"}


class PredictError(ValueError):
    """The options cannot be served by this model and shard set."""


def build_from_source(source: ModelSource, manifest: Dict, device, model_option=None) -> torch.nn.Module:
    """The model the source's architecture describes, for this shard set's widths, with its parameters.
    `model_option`: the user's --model-option items; the code a model imports comes from them only
    (model_code.rebuild_options), never from the file."""
    arch, ds = source.architecture(), manifest["dataset"]
    try:
        options = rebuild_options(arch["model"], arch["model_option"], model_option, source.path)
    except ValueError as exc:
        raise ModelSourceError(str(exc)) from None
    torch.manual_seed(0)  # the parameters are replaced below; this keeps building deterministic
    model = build_model(arch["model"], int(ds["num_features"]), int(arch["hidden"]), int(ds["num_classes"]),
                        int(arch["layers"]), dropout=float(arch["dropout"] or 0.0), norm=bool(arch["norm"]),
                        linear_layers=int(arch["linear_layers"] or 0),  # absent before the option: none
                        types=types_of(ds), **options)
    load_parameters(model, source)
    return model.to(device)


class WorldForward:
    """Collective set-up of what exact full-graph inference needs on one rank: topology, shard slice,
    world view, the model with the source's parameters.  close() releases it."""

    def __init__(self, shards_dir: str, source_path: str, ranks_per_server: Optional[int], device: str,
                 intra_transport: str, skip_checksums: bool = False, verify_content: bool = False,
                 start: Optional[Dict] = None, host_staging: bool = False, model_option=None,
                 halo_route: str = "per-server"):
        # start: init_topology's start-up arguments (options.startup.topology_args of the options);
        # model_option: the user's --model-option items (build_from_source)
        self.topo = topo = init_topology(ranks_per_server, device, intra_transport, **(start or {}))
        try:
            share_cpu_threads(topo)
            self.comm = Communicator(topo, Ledger(), intra_transport, host_staging=host_staging)
            self.group = self.comm.group("world", None, route=halo_route)  # --halo-route
            world = topo.world
            with collective_errors(world, "", catch=(ModelSourceError, shards.ShardError, OSError, KeyError,
                                                     ValueError)):
                self.source = read_model_source(source_path)
                self.manifest = shards.read_manifest(shards_dir)
                shards.check_job(self.manifest, topo.servers, topo.ranks_per_server, None)  # any preload depth
                refusal = dataset_refusal(self.source, self.manifest, shards_dir)
                if refusal:
                    raise ModelSourceError(refusal)
                if topo.local_rank == 0 and not skip_checksums:
                    shards.verify_checksums(shards_dir, self.manifest, servers=[topo.server])
                self.slice = sl = shards.read_rank_slice(shards_dir, self.manifest, topo.server, topo.local_rank)
                self.model = build_from_source(self.source, self.manifest, topo.device, model_option).eval()
            if verify_content:
                with collective_errors(world, "", catch=(shards.ShardError,)):
                    shards.check_job_content(world, sl, self.manifest, shards_dir)
            self.layers = int(self.model.num_layers)
            with collective_errors(world, "", catch=(planner.PlanError,)):
                rows = views.world_rows(sl, topo.rank)
            with collective_errors(world, "", catch=(planner.PlanError,)):
                self.view = views.build_view(rows, self.group, self.layers, all_active=True,
                                             resolve_keys=views.key_resolver_world(sl.global_id[: sl.n_inner]),
                                             device=topo.device,
                                             static_features=not self.model.contract.input_projection)
            give_source_ids(self.model.contract, None, [self.view])  # collective: a typed model's vertex types
        except BaseException:
            self.close()
            raise

    @property
    def n_inner(self) -> int:
        return int(self.slice.n_inner)

    @torch.no_grad()
    def forward(self, layer: Optional[int] = None) -> tuple:
        """Collective: (logits of the inner rows, the rows layer `layer` reads or None).  Layer K's rows
        are what the model hands to gather(K, h): its own rows' input of conv K."""
        self.model.eval()
        exchange = self.view.gather_fn("evaluation")  # exact: evaluation halos travel in float32
        kept = {}

        def gather(l, h):
            if l == layer:
                kept["h"] = h[: self.n_inner].detach().clone()
            return exchange(l, h)

        logits = self.model(self.view.input_features, self.view.graphs, gather)
        return logits[: self.n_inner], kept.get("h")

    def close(self) -> None:
        for name in ("comm", "topo"):
            part = getattr(self, name, None)
            if part is not None:
                part.close()


def forward_of(opts) -> WorldForward:
    """Collective: the world forward of predict's options (PredictOptions: the set, the model, the job)."""
    return WorldForward(opts.shards, opts.model, opts.ranks_per_server, opts.device, opts.intra_transport,
                        opts.skip_checksums, opts.verify_content, topology_args(opts), opts.host_staging,
                        opts.model_option, opts.halo_route)


def reads(opts) -> tuple:
    """What the job reads, which --overwrite never replaces: (path, option)."""
    return (opts.model, "--model"), (opts.shards, "--shards")


def output_rows(fw: WorldForward, opts) -> tuple:
    """Collective: this rank's block of output rows ({name: array}, with global_id: the scores, the
    predicted classes and any --layer embeddings of the vertices of --split, by global id), its first row
    in the output, the total rows, and the provenance the output records (its "kind" is what recognises
    it as predict's: --overwrite replaces nothing else)."""
    topo, sl, n_inner = fw.topo, fw.slice, fw.n_inner
    logits, emb = fw.forward(opts.layer)
    out_name = "probabilities" if opts.probabilities else "logits"
    # multi-label: each task's sigmoid and the 0/1 predictions logit > 0 (engine/targets.py)
    multilabel = shards.is_multilabel(fw.manifest)
    scores = targets.probabilities(logits, multilabel) if opts.probabilities else logits
    arrays = {out_name: scores.float(), "prediction": targets.prediction(logits, multilabel)}
    if emb is not None:
        arrays["embeddings"] = emb.float()
    n = int(fw.manifest["dataset"]["num_vertices"])
    keep = (np.ones(n_inner, dtype=bool) if opts.split == "all"
            else np.asarray(getattr(sl, SPLIT_MASKS[opts.split])[:n_inner], dtype=bool))
    types = types_of(fw.manifest["dataset"])
    with collective_errors(topo.world, "", catch=(PredictError,)):
        vertex_type = vertex_type_of(fw.manifest, getattr(opts, "vertex_type", None))
    if types is not None and vertex_type is not None:  # one vertex type's rows (vertex_type_of: a type)
        lo_t, _ = types.id_range(vertex_type)
        keep &= types.vertex_type(sl.global_id[:n_inner]) == types.index(vertex_type)
    arrays["selected"] = torch.as_tensor(keep, device=topo.device)
    block_ids, block = to_blocks(fw.comm, topo, sl.global_id[:n_inner].astype(np.int64), arrays, n)
    lo, hi = block_bounds(n, topo.world_size)[topo.rank: topo.rank + 2]
    with collective_errors(topo.world, "", catch=(PredictError,)):
        if not np.array_equal(block_ids, np.arange(lo, hi)):  # every vertex has exactly one owner
            raise PredictError(f"{opts.shards}: the ranks' inner vertices do not cover global ids {lo}..{hi - 1} "
                               f"exactly once; run `granndis preprocess verify {opts.shards}`")
    sel = block.pop("selected").astype(bool)
    rows = {name: a[sel] for name, a in block.items()}
    rows["global_id"] = block_ids[sel]
    if types is not None:
        rows["type_id"] = rows["global_id"] - lo_t
    counts = np.asarray(topo.allgather_object(int(sel.sum())), dtype=np.int64)
    first, total = int(counts[: topo.rank].sum()), int(counts.sum())
    provenance = {"kind": PREDICT_TOOL, "output": out_name, "split": opts.split, "layer": opts.layer,
                  "rows": total, "shards": opts.shards, "dataset": fw.manifest["dataset"].get("name"),
                  **({"vertex_type": vertex_type} if types is not None else {}),
                  "dataset_sha256": fw.manifest["dataset"].get("content_sha256"),
                  "servers": topo.servers, "ranks_per_server": topo.ranks_per_server,
                  "model": fw.source.provenance(), "created_unix_s": time.time()}
    return rows, first, total, provenance


def vertex_type_of(manifest: dict, asked: Optional[str]) -> Optional[str]:
    """The vertex type predict writes: --vertex-type, else a heterogeneous set's target type (None: one type)."""
    types = types_of(manifest["dataset"])
    if types is None:
        if asked is not None:
            raise PredictError(f"--vertex-type {asked}: the set has one vertex type; leave the option out")
        return None
    if asked is not None and asked not in types.names:
        raise PredictError(f"--vertex-type {asked}: the set's vertex types are {', '.join(types.names)}")
    return asked or types.target


def run_predict(opts) -> Dict:
    """Collective: `granndis predict` (opts: PredictOptions).  Returns what was written (every rank)."""
    fmt = opts.resolved_format()
    start_s = time.perf_counter()
    kernels = DeterministicKernels(opts.deterministic)  # before any GPU work
    try:
        fw = forward_of(opts)
    except BaseException:
        kernels.close()
        raise
    try:
        topo = fw.topo
        with collective_errors(topo.world, "", catch=(PredictError, OutputError)):
            vertex_type_of(fw.manifest, opts.vertex_type)  # refused before the forward
            if opts.layer is not None and opts.layer >= fw.layers:
                raise PredictError(f"--layer {opts.layer}: the model has {fw.layers} message-passing layers, so "
                                   f"K must be 0 .. {fw.layers - 1} (the logits are written anyway)")
            if topo.rank == 0:
                check_output(opts.out, opts.overwrite, reads(opts))  # before the forward: refuse early
        rows, first, total, provenance = output_rows(fw, opts)
        shapes = {name: (a.dtype.str, a.shape[1:]) for name, a in rows.items()}
        write_rows(topo, opts.out, fmt, first, total, rows, shapes, provenance, opts.overwrite, reads(opts))
        result = {"out": opts.out, "format": fmt, "rows": total, "arrays": sorted(shapes),
                  "seconds": time.perf_counter() - start_s}
        if not opts.quiet:
            log.info(f"[predict] wrote {total} rows ({', '.join(sorted(shapes))}) of {fw.source.path} "
                     f"(epoch {fw.source.epoch}) to {opts.out} in {result['seconds']:.2f} s")
        return result
    finally:
        fw.close()
        kernels.close()

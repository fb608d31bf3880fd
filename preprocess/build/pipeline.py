"""The build pipeline: partition, preload halos, assign owners, write the shard set.

Work split over the P ranks of the communicator (P may be 1):
- every rank holds the whole canonical graph (loaded by the CLI);
- server partitioning is collective (ParMETIS) or done on rank 0 and broadcast (METIS);
- server s is handled by rank s % P: its GPU partition, halo, owners and file;
- the GPU of every inner vertex is all-reduced, because each server's world view names the global
  rank that owns each in-neighbour;
- rank 0 commits the set (renames, manifest last) once every rank has staged its files.
A failure on any rank is agreed on collectively (granndis_hpc.cluster's `collective_errors`, through
`Group.errors`), so every rank raises a clear error and none hangs; preprocess never calls MPI itself.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from granndis_hpc.cluster import as_group
from granndis_hpc.graph.csr import csr_from_edges, csr_rows, row_of_edges
from granndis_hpc.shards import (FORMAT_VERSION, commit_shard_set, discard_staged, lower_bound_set_bytes,
                                 prepare_output_dir, stage_server_file)
from granndis_hpc.shards import content, typed_rows

from granndis_hpc.preprocess.build import inductive
from granndis_hpc.preprocess.build.profile import _peak_rss, _reset_peak_rss
from granndis_hpc.preprocess.sources.canonical import DataError
from granndis_hpc.preprocess.build.halo import EAS_SELECT_RULES, eas, full_khop, induced_subgraph
from granndis_hpc.preprocess.partition.owners import assign_owners
from granndis_hpc.preprocess.partition.gpu_split import split_servers_over_gpus
from granndis_hpc.preprocess.partition.row_blocks import DEFAULT_BLOCK_ROWS, file_order, part_of, row_blocks
from granndis_hpc.preprocess.partition.twolevel import PARTITIONERS, WholeGraphAccess, balance, partition_digest, partition_servers

log = logging.getLogger(__name__)


@dataclass
class BuildConfig:
    out: str
    servers: int
    gpus_per_server: int
    layers: int
    preload: str = "full"  # full | eas
    hops: int | None = None  # default: layers (full), 1 (eas)
    fanout: int = 15
    select: str = "degree"
    partitioner: str = "parmetis"
    seed: int = 0
    overwrite: bool = False
    # Also write what training on the train-induced graph needs (preprocess/build/inductive.py).
    inductive: bool = False
    # Rows per locality block of each GPU's inner rows (preprocess/partition/row_blocks.py); 0: global-id order.
    row_block_rows: int = DEFAULT_BLOCK_ROWS
    command: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def effective_hops(self) -> int:
        if self.hops is not None:
            return int(self.hops)
        return int(self.layers) if self.preload == "full" else 1


def validate_config(cfg: BuildConfig, num_vertices: int) -> None:
    """Raise ValueError with the fix for every bad combination (called identically on every rank)."""
    problems = []
    if cfg.servers < 1:
        problems.append(f"--servers must be >= 1 (got {cfg.servers})")
    if cfg.gpus_per_server < 1:
        problems.append(f"--gpus-per-server must be >= 1 (got {cfg.gpus_per_server})")
    if cfg.layers < 1:
        problems.append(f"--layers must be >= 1 (got {cfg.layers})")
    if cfg.preload not in ("full", "eas"):
        problems.append(f"--preload must be full or eas (got {cfg.preload!r})")
    if cfg.hops is not None and cfg.hops < 1:
        problems.append(f"--hops must be >= 1 (got {cfg.hops}); use --hops 1 or more (default: --layers for full, 1 for eas)")
    if cfg.preload == "full" and isinstance(cfg.hops, int) and cfg.layers >= 1 and cfg.hops > cfg.layers:
        problems.append(f"--hops {cfg.hops} > --layers {cfg.layers}: a full preload deeper than the model only "
                        f"costs memory; use --hops {cfg.layers} (Flexible Preloading with k = L, exact "
                        f"full-graph training) or fewer (k < L: the last L-k layers use the world exchange)")
    if cfg.preload == "eas" and cfg.fanout < 1:
        problems.append(f"--eas-fanout must be >= 1 for --preload eas (got {cfg.fanout})")
    if cfg.select not in EAS_SELECT_RULES:
        problems.append(f"--eas-select must be one of {EAS_SELECT_RULES} (got {cfg.select!r})")
    if cfg.partitioner not in PARTITIONERS:
        problems.append(f"--partitioner must be one of {PARTITIONERS} (got {cfg.partitioner!r})")
    if cfg.servers >= 1 and cfg.gpus_per_server >= 1 and cfg.servers * cfg.gpus_per_server > num_vertices:
        problems.append(f"--servers {cfg.servers} x --gpus-per-server {cfg.gpus_per_server} = "
                        f"{cfg.servers * cfg.gpus_per_server} GPUs but the graph has only {num_vertices} vertices; "
                        f"every GPU needs at least one inner vertex: use fewer servers/GPUs or a larger graph")
    if problems:
        raise ValueError("invalid build configuration: " + "; ".join(problems))


def check_dataset(name: str, num_vertices: int, num_classes: int, num_train: int) -> None:
    """What no mode can train on, refused before anything is written (called identically on every
    rank): a class count above the vertex count (a source's or metadata.json's num_classes of 2**40
    made training allocate an output layer that wide), and an empty train split.
    verify and training refuse the same sets (preprocess/verify/command.py, engine/trainer.check_split_totals)."""
    if int(num_classes) > max(int(num_vertices), 1):
        raise DataError(f"{name}: num_classes={int(num_classes)} exceeds the {int(num_vertices)} vertices (a model's "
                        f"output layer would be that wide). Fix: give the dataset's true class count (the source's "
                        f"num_classes, e.g. in metadata.json or the bundle), or leave it out to count the labels")
    if int(num_train) == 0:
        raise DataError(f"{name}: the train split is empty (no vertex is marked for training), so no mode can "
                        f"train on the set. Fix: mark training vertices in the dataset's split (train_mask)")


def _permute_csr(indptr: np.ndarray, indices: np.ndarray, perm: np.ndarray):
    """Relabel a CSR so that new row i is old row perm[i]; sources sorted inside each row."""
    new_id = np.empty_like(perm)
    new_id[perm] = np.arange(perm.shape[0], dtype=perm.dtype)
    sub_indptr, src = csr_rows(indptr, indices, perm)
    src = new_id[src]  # rebinding frees the old ids: the edge arrays dominate the build's memory
    # csr_from_edges sorts one int64 key per edge (several times faster than a two-key lexsort); its
    # indptr equals sub_indptr (same rows, same lengths).
    return csr_from_edges(src, row_of_edges(sub_indptr), perm.shape[0])


def build_server(graph, server: int, server_of: np.ndarray, gpu_of: np.ndarray, block: np.ndarray | None,
                 cfg: BuildConfig):
    """All datasets of one server file (docs/design.md §5) and its statistics.

    server_of / gpu_of / block: server, GPU and locality block (row_blocks; None: rows in global-id
    order) of every global vertex as an INNER vertex.
    """
    G = cfg.gpus_per_server
    inner = np.flatnonzero(server_of == server).astype(np.int64)
    if cfg.preload == "full":
        verts, hop = full_khop(graph.indptr, graph.indices, inner, cfg.effective_hops)
    else:
        verts, hop = eas(graph.indptr, graph.indices, inner, cfg.effective_hops, cfg.fanout, cfg.select, cfg.seed)
    sub_indptr, sub_indices = induced_subgraph(graph.indptr, graph.indices, verts)
    owner = assign_owners(sub_indptr, sub_indices, hop, gpu_of[verts].astype(np.int32), G)
    perm = file_order(verts, hop, owner, server_of, gpu_of, block)
    verts, hop, owner = verts[perm], hop[perm], owner[perm]
    indptr, indices = _permute_csr(sub_indptr, sub_indices, perm)
    # The unpermuted CSR is as large as the permuted one: free it before the datasets are gathered
    # (with the copies below it set the build's peak: 4.5 GiB per rank at 2.45M vertices).
    del sub_indptr, sub_indices, perm

    in_degree = graph.in_degree()
    offsets = np.zeros(G + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=G), out=offsets[1:])
    inner_counts = np.bincount(owner[hop == 0], minlength=G).astype(np.int64)
    inner_rows = np.flatnonzero(hop == 0)  # in row order: GPU 0's inner rows, then GPU 1's, ...
    w_offsets = np.zeros(G + 1, dtype=np.int64)
    np.cumsum(inner_counts, out=w_offsets[1:])
    w_indptr, w_src = csr_rows(graph.indptr, graph.indices, verts[inner_rows])
    # Global rank of every world-view source, in int32 (ranks fit) without int64 temporaries.
    src_rank = server_of[w_src].astype(np.int32)
    src_rank *= G
    src_rank += gpu_of[w_src]
    # copy=False: most arrays already have the stored dtype, and a copy of the edge arrays costs
    # hundreds of MiB at products size.
    arrays = {
        "vertices/global_id": verts.astype(np.int64, copy=False),
        "vertices/owner": owner.astype(np.int32, copy=False),
        "vertices/hop": hop.astype(np.int32, copy=False),
        "vertices/offsets": offsets,
        "vertices/inner_counts": inner_counts,
        "graph/indptr": indptr.astype(np.int64, copy=False),
        "graph/indices": indices.astype(np.int64, copy=False),
        "graph/in_degree": in_degree[verts],
        "features": _stored_features(graph, verts),
        # int64 class ids, or a multi-label set's uint8 [rows, C] (shards/schema.py)
        "labels": graph.labels[verts].astype(np.uint8 if graph.labels.ndim == 2 else np.int64, copy=False),
        "split/train": graph.train_mask[verts].astype(bool, copy=False),
        "split/val": graph.val_mask[verts].astype(bool, copy=False),
        "split/test": graph.test_mask[verts].astype(bool, copy=False),
        "world/offsets": w_offsets,
        "world/indptr": w_indptr.astype(np.int64, copy=False),
        "world/src_global_id": w_src.astype(np.int64, copy=False),
        "world/src_rank": src_rank,
        "world/src_in_degree": in_degree[w_src],
    }
    if cfg.inductive:
        arrays["graph/train_in_degree"] = inductive.train_in_degree(graph.indptr, graph.indices, graph.train_mask)[verts]
        arrays["world/src_split"] = inductive.vertex_split_codes(
            graph.train_mask, graph.val_mask, graph.test_mask)[w_src]
        arrays["graph/train_hop"] = inductive.train_hops(indptr, indices, hop, arrays["split/train"],
                                                        cfg.effective_hops)
    stats = server_stats(server, inner.shape[0], hop, owner, graph.train_mask[verts], indices.shape[0],
                         w_src.shape[0], G, cfg.effective_hops)
    return arrays, stats


def _stored_features(graph, verts: np.ndarray) -> np.ndarray:
    """The rows' features as the server file stores them: [rows, F], or flat at each row's type width
    where the types' widths differ (granndis_hpc/shards/typed_rows.py)."""
    rows = np.ascontiguousarray(graph.features[verts], dtype=np.float32)
    types = getattr(graph, "types", None)
    if types is None or not types.typed_widths:
        return rows
    return typed_rows.pack(rows, typed_rows.row_widths(types, verts))


def server_stats(server: int, inner: int, hop: np.ndarray, owner: np.ndarray, train: np.ndarray, edges: int,
                 world_edges: int, G: int, hops: int) -> dict:
    """The manifest's statistics of one server file (rows in file order: their hop, owner GPU and
    training flag); build_server and the distributed build (dist_server) record the same."""
    train_inner = train & (hop == 0)
    m = hop.shape[0]
    return {
        "server": server,
        "inner": int(inner),
        "preloaded": int(np.count_nonzero(hop > 0)),
        "preloaded_share": float(np.count_nonzero(hop > 0) / max(m, 1)),
        "rows": int(m),
        "train": int(np.count_nonzero(train_inner)),
        "edges": int(edges),
        "world_edges": int(world_edges),
        "rows_per_gpu": np.bincount(owner, minlength=G).tolist(),
        "inner_per_gpu": np.bincount(owner[hop == 0], minlength=G).tolist(),
        "train_per_gpu": np.bincount(owner[train_inner], minlength=G).tolist(),
        "gpu_row_balance": balance(owner, G),
        "gpu_inner_balance": balance(owner[hop == 0], G),
        "gpu_train_balance": balance(owner[train_inner], G) if train_inner.any() else 1.0,
        "hop_counts": np.bincount(hop, minlength=hops + 1).tolist(),
    }


def build_and_stage(graph, s: int, server_of, gpu_of, block, cfg: BuildConfig, gpu_constraints, staged: list,
                    stats: list, release=None):
    """Build server s's arrays and stage its file (appending to `staged` and `stats`); returns the
    seconds spent (building, writing).  `release()`, when given, runs between the two: the distributed
    build frees the rows it fetched for this server there, before the file is written."""
    t = time.perf_counter()
    arrays, st = build_server(graph, s, server_of, gpu_of, block, cfg)
    st["gpu_constraints"] = gpu_constraints
    t_build = time.perf_counter() - t
    del graph  # the last reference when the caller passed a temporary view
    if release is not None:
        release()
    t = time.perf_counter()
    staged.append(stage_server_file(cfg.out, s, cfg.servers, cfg.gpus_per_server, arrays))
    stats.append(st)
    return t_build, time.perf_counter() - t


PHASES = ("load", "partition", "halos+write", "commit")


class PhaseLog:
    """Rank 0 prints one line per phase with its elapsed time, and advances a progress bar over the
    phases when one is given (granndis_hpc.progress: rank 0, on a terminal or forced, never --quiet)."""

    def __init__(self, comm, printer=print, bar=None):
        self.group = as_group(comm)
        self.rank = self.group.rank
        self.printer, self.t0, self.last = printer, time.perf_counter(), time.perf_counter()
        self.times = {}
        self.bar = bar
        # Every rank's CPU seconds and peak RSS per phase (`profile`, gathered by bench scripts through
        # $GRANNDIS_BUILD_PROFILE): the peak is reset at every phase end, so it is that phase's own.
        self.profile, self.cpu_last = {}, time.process_time()
        _reset_peak_rss()

    def done(self, phase: str, detail: str = "") -> None:
        now = time.perf_counter()
        cpu = time.process_time()
        self.profile[phase] = {"wall_s": now - self.last, "cpu_s": cpu - self.cpu_last, "peak_rss": _peak_rss()}
        self.cpu_last = cpu
        _reset_peak_rss()
        self.times[phase] = now - self.last
        if self.rank == 0:
            line = (f"[preprocess] {phase:<9} {now - self.last:8.2f} s  (total {now - self.t0:8.2f} s)"
                    + (f"  {detail}" if detail else ""))
            if self.bar is not None and not self.bar.disable:
                self.bar.write(line)
            else:
                self.printer(line, flush=True)
        if self.bar is not None:
            self.bar.set_description(f"preprocess: {phase} done")
            self.bar.update(1)
        self.last = now


def dataset_digest(graph) -> str:
    """sha256 of the canonical dataset in global-id order: the in-edge CSR, the features, the labels,
    the class count and the three split masks (granndis_hpc/shards/content.py defines it, so that a
    training job with --verify-content recomputes the same bytes from its ranks' rows).  It does not
    depend on the partition, the layout or the preload, so two shard sets of one dataset built for
    different S x G (or with another partitioner, seed or --hops) share it, and a checkpoint can
    continue on either (rundir/checkpoint.py); a change to any edge, feature value, label or split flag
    changes it.  One pass over the arrays (no copies when they already have the digest's dtypes)."""
    return content.dataset_digest(graph)


def _dataset_entry(graph, content_digest: str | None = None) -> dict:
    return {"name": graph.name, "num_vertices": graph.num_vertices, "num_edges": graph.num_edges,
            "num_features": graph.num_features, "num_classes": int(graph.num_classes),
            "num_train": int(graph.train_mask.sum()), "num_val": int(graph.val_mask.sum()),
            "num_test": int(graph.test_mask.sum()),
            "content_sha256": content_digest or dataset_digest(graph),
            # only in a multi-label set, so a single-label manifest is what it always was
            **({"multilabel": True} if graph.labels.ndim == 2 else {}),
            # only in a heterogeneous set (granndis_hpc/graph/hetero.py)
            **({"types": graph.types.to_record()} if getattr(graph, "types", None) is not None else {})}


def prepare_build_output(group, cfg: BuildConfig, n: int, e: int, f: int, label_bytes: int = 8) -> None:
    """Collective: rank 0 prepares cfg.out and, before hours of partitioning, refuses a disk that cannot
    hold even the inner rows (each server file is checked against its own size again before it is
    written); a refused build has created nothing."""
    with group.errors("preparing the output directory"):
        if group.rank == 0:
            stale = prepare_output_dir(cfg.out, cfg.overwrite, lower_bound_set_bytes(n, e, f, label_bytes),
                                       "the shard set (at least)")
            if stale:
                shown = ", ".join(stale[:4]) + (", ..." if len(stale) > 4 else "")
                log.info(f"[preprocess] removed {len(stale)} temporary file(s) and spill director(ies) of an "
                         f"interrupted build in {cfg.out} ({shown})")


def run_build(comm, graph, cfg: BuildConfig, log: PhaseLog | None = None, content_digest: str | None = None) -> dict:
    """Collective over `comm` (an MPI communicator or a cluster.Group; None = MPI.COMM_WORLD): build
    the shard set cfg.out from `graph`; returns the manifest (all ranks).  `content_digest`: the
    dataset digest when already computed from the slices (sliced.slice_digest, equal to
    dataset_digest(graph))."""
    group = as_group(comm)
    log = log or PhaseLog(group, printer=lambda *a, **k: None)
    with group.errors("checking the build configuration"):
        validate_config(cfg, graph.num_vertices)
        check_dataset(graph.name, graph.num_vertices, graph.num_classes, int(np.count_nonzero(graph.train_mask)))
    S, G, P, rank = cfg.servers, cfg.gpus_per_server, group.size, group.rank
    prepare_build_output(group, cfg, graph.num_vertices, graph.num_edges, graph.num_features,
                         graph.num_classes if graph.labels.ndim == 2 else 8)  # multi-label: C uint8 a row

    sp = partition_servers(group, graph, S, cfg.partitioner, cfg.seed)
    server_of = sp.parts
    mine = list(range(rank, S, P))
    # The distributed build's GPU split (one function; ParMETIS over all ranks for parmetis).
    access = WholeGraphAccess(group, graph)
    gpu_of, gpu_constraints = split_servers_over_gpus(group, access, server_of, graph.train_mask, G, cfg.partitioner,
                                                      cfg.seed)
    t_blocks = time.perf_counter()
    block = row_blocks(group, access, part_of(server_of, gpu_of, G), S * G, cfg.row_block_rows)
    t_blocks = time.perf_counter() - t_blocks
    log.done("partition", sp.log_line(cfg.row_block_rows, t_blocks))

    staged, stats = [], []
    t_halo = t_write = 0.0
    try:
        with group.errors("building server files"):
            for s in mine:
                dh, dw = build_and_stage(graph, s, server_of, gpu_of, block, cfg, gpu_constraints[s], staged, stats)
                t_halo, t_write = t_halo + dh, t_write + dw
    except BaseException:
        discard_staged(staged)
        raise
    log.done("halos+write", f"halo/owners {t_halo:.2f} s, hdf5 write {t_write:.2f} s (rank 0)")

    manifest = commit_build(group, cfg, _dataset_entry(graph, content_digest), sp, server_of, gpu_of, staged, stats)
    log.done("commit", f"{cfg.out}: {S} server files + manifest.json")
    return manifest


def commit_build(group, cfg: BuildConfig, dataset_entry: dict, sp, server_of, gpu_of, staged, stats) -> dict:
    """Collective: gather every rank's staged server files and statistics; rank 0 writes the manifest and
    commits the set (or discards every staged file on failure); returns the manifest on every rank."""
    S, G = cfg.servers, cfg.gpus_per_server
    all_staged = group.gather_object(staged)
    all_stats = group.gather_object(stats)
    manifest = None
    with group.errors("committing the shard set"):
        if group.rank == 0:
            staged_flat = [x for part in all_staged for x in part]
            try:
                stats_flat = sorted((x for part in all_stats for x in part), key=lambda x: x["server"])
                manifest = {
                    "format_version": FORMAT_VERSION,
                    "dataset": dataset_entry,
                    "servers": S, "gpus_per_server": G, "layers": int(cfg.layers),
                    "preload": {"kind": cfg.preload, "hops": cfg.effective_hops,
                                "fanout": int(cfg.fanout) if cfg.preload == "eas" else None,
                                "select": cfg.select if cfg.preload == "eas" else None},
                    "partitioner": sp.manifest_entry(),
                    "partition_digest": partition_digest(server_of, gpu_of, S, G),
                    "seed": int(cfg.seed),
                    "command": cfg.command,
                    "files": {},
                    "stats": _summary_stats(stats_flat, S, G),
                }
                if cfg.row_block_rows > 0:  # rows inside a (GPU, hop) class by locality block (shards.row_block_rows)
                    manifest["row_block_rows"] = int(cfg.row_block_rows)
                manifest.update(cfg.extra)
                if cfg.inductive:  # the protocol the set serves (shards.is_inductive)
                    manifest["inductive"] = True
                    manifest["train_hop"] = True  # graph/train_hop stored (shards.has_train_hop)
                manifest = commit_shard_set(cfg.out, manifest, staged_flat)
            except BaseException:
                discard_staged(staged_flat)
                raise
    return group.bcast_object(manifest)


def _summary_stats(per_server: list, S: int, G: int) -> dict:
    inner = np.array([s["inner"] for s in per_server], dtype=np.float64)
    rows = np.array([s["rows"] for s in per_server], dtype=np.float64)
    train = np.array([s["train"] for s in per_server], dtype=np.float64)
    return {
        "servers": per_server,
        "server_inner_balance": float(inner.max() / inner.mean()) if inner.mean() > 0 else 1.0,
        "server_rows_balance": float(rows.max() / rows.mean()) if rows.mean() > 0 else 1.0,
        "server_train_balance": float(train.max() / train.mean()) if train.mean() > 0 else 1.0,
        "gpu_row_balance_max": float(max(s["gpu_row_balance"] for s in per_server)),
        "gpu_train_balance_max": float(max(s["gpu_train_balance"] for s in per_server)),
        "replication_factor": float(rows.sum() / max(inner.sum(), 1.0)),
    }


def build_shards(graph, out, *, servers: int, gpus_per_server: int, layers: int, preload: str = "full",
                 hops: int | None = None, fanout: int = 15, select: str = "degree", partitioner: str = "parmetis",
                 seed: int = 0, overwrite: bool = False, comm=None, command: str = "", verbose: bool = False,
                 inductive: bool = False, row_block_rows: int = DEFAULT_BLOCK_ROWS) -> dict:
    """Programmatic build (tests, benchmarks): same pipeline as the CLI.  `comm` defaults to COMM_WORLD;
    pass MPI.COMM_SELF (or a one-rank cluster.Group) to build on one rank.  Returns the manifest."""
    cfg = BuildConfig(out=str(out), servers=servers, gpus_per_server=gpus_per_server, layers=layers, preload=preload,
                      hops=hops, fanout=fanout, select=select, partitioner=partitioner, seed=seed,
                      overwrite=overwrite, inductive=inductive, row_block_rows=row_block_rows,
                      command=command or f"build_shards(servers={servers}, gpus_per_server={gpus_per_server}, "
                      f"layers={layers}, preload={preload!r})")
    log = PhaseLog(comm) if verbose else None
    return run_build(comm, graph, cfg, log)

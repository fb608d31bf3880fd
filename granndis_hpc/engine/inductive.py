"""Inductive training (--inductive, docs/inductive.md): train on the subgraph induced by the training
vertices, validate on the graph induced by the training and validation vertices, test on the full graph
(the protocol of the GraNNDis artifact, PipeGCN and BNS-GCN).

An inductive shard set holds the full graph's partition, preloads and world view, plus every row's
in-degree within the train-induced graph and the split code of every world-view source
(preprocess/build/inductive.py).  Each induced graph is derived here by filtering a view's rows and edges: a
vertex outside the graph is no row, an edge from one is no edge, and degrees are counted within the
graph.  Vertices keep their global ids, so dropout masks are those a single process draws on the
induced graph with the original ids.

- `InducedViews`: the train-induced and train+validation-induced world views (fb training and the
  world layers of flx; exact evaluation on the two induced graphs);
- `server_rows`: the rows of the train-induced graph's own preload within the server's preload (flx, eas),
  selected and scheduled by their stored hop within the train-induced graph (graph/train_hop);
- `train_induced_graph`: a server graph whose edges are the train-induced ones (cob, mb sample it);
- `evaluate`: the accuracies of the three graphs.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import numpy as np
import torch

from granndis_hpc import shards
from granndis_hpc.engine import views
from granndis_hpc.graph.csr import csr_row_positions, row_of_edges
from granndis_hpc.graph.typed_features import TypedRows
from granndis_hpc.engine.steps import RunContext, TrainingError

TRAIN = shards.SPLIT_BITS["train"]
TRAIN_VAL = shards.SPLIT_BITS["train"] | shards.SPLIT_BITS["val"]
PROTOCOLS = {False: "transductive", True: "inductive"}


def check_shards(inductive: bool, manifest: dict, path: str) -> None:
    """TrainingError when --inductive meets a set built without it.  (A transductive run on an inductive
    set is fine: the set holds the full graph, and the extra datasets are not read.)"""
    if inductive and not shards.is_inductive(manifest):
        raise TrainingError(
            f"--inductive needs a shard set built with --inductive, but {path} was built without it (it holds no "
            f"train-induced degrees or source splits); rebuild it with `granndis preprocess build ... --inductive`, "
            f"or train without --inductive")


def check_train_hops(inductive: bool, manifest: dict, mode: str, path: str) -> None:
    """TrainingError when --inductive flx or eas meets an inductive set built before graph/train_hop existed
    (they train on the rows it selects; fb, cob and mb do not read it)."""
    if inductive and not shards.has_train_hop(manifest):
        raise TrainingError(
            f"--inductive --mode {mode} needs the train-induced hops (graph/train_hop) that `granndis preprocess "
            f"build --inductive` now stores, and {path} was built without them; rebuild it with `granndis preprocess "
            f"build ... --inductive --out {path} --overwrite` (it was built by: {manifest.get('command', 'unknown')}), "
            f"or use --mode fb")


def check_content(sl, manifest: dict, path: str) -> None:
    """--verify-content: the stored train-induced degrees of this rank's rows against the edges it holds
    (no communication).  An inner row's world view holds every in-edge, so its degree is the number of
    them from training vertices (world/src_split); a row of a full preload above its deepest hop holds
    every in-edge in the file too.  ShardError naming the set when one differs.  (`preprocess verify`
    also checks every source's split against its home row.)"""
    n = int(sl.n_inner)
    world = np.add.reduceat(np.append((sl.w_src_split & TRAIN) != 0, False).astype(np.int64),
                            sl.w_indptr[:-1]) if n else np.zeros(0, dtype=np.int64)
    world[np.diff(sl.w_indptr) == 0] = 0  # reduceat reads the next row's first edge for an empty row
    bad = not np.array_equal(world, sl.train_in_degree[:n])
    pre = manifest["preload"]
    if not bad and pre["kind"] == "full":
        complete = np.flatnonzero(sl.hop < int(pre["hops"]))
        edge_row = np.repeat(np.arange(sl.hop.shape[0]), np.diff(sl.indptr))
        stored = np.bincount(edge_row, weights=sl.server_train[sl.indices], minlength=sl.hop.shape[0])
        bad = not np.array_equal(stored[complete].astype(np.int64), sl.train_in_degree[complete])
    if bad:
        raise shards.ShardError(
            f"{path}: graph/train_in_degree of server {sl.server} GPU {sl.gpu} disagrees with the edges the file "
            f"holds (edited after the build?); run `granndis preprocess verify {path}` and rebuild the set")
    if sl.server_train_hop is not None and not _train_hops_consistent(sl, int(pre["hops"])):
        raise shards.ShardError(
            f"{path}: graph/train_hop of server {sl.server} GPU {sl.gpu} is no BFS distance over the edges the file "
            f"holds (edited after the build?); run `granndis preprocess verify {path}` and rebuild the set")


def _train_hops_consistent(sl, depth: int) -> bool:
    """What this rank can check of the stored train-induced hops without communication: its inner training
    rows at hop 0, its other training rows at hops 1..depth or unreached, the rest unreached, and no edge
    between training rows skips a hop (a source lies at most one hop beyond the row it feeds, for the rows
    that hold their in-edges).  `preprocess verify` recomputes the BFS itself."""
    own = sl.server_train_hop[sl.row_offset:sl.row_offset + sl.num_rows].astype(np.int64)
    train, n = np.asarray(sl.train_mask, dtype=bool), int(sl.n_inner)
    inner = np.arange(own.shape[0]) < n
    ok = np.all(own[inner & train] == 0) and np.all(own[~train] == shards.TRAIN_HOP_UNREACHED)
    ok = ok and np.all((own[~inner & train] >= 1) & ((own[~inner & train] <= depth)
                                                    | (own[~inner & train] == shards.TRAIN_HOP_UNREACHED)))
    edge_row = np.repeat(np.arange(own.shape[0]), np.diff(sl.indptr))
    src_hop = sl.server_train_hop[sl.indices].astype(np.int64)
    feeds = (own[edge_row] < depth) & sl.server_train[sl.indices]
    return bool(ok and np.all(src_hop[feeds] <= own[edge_row][feeds] + 1))


def subset_rows(rows: views.RowSource, keep_row: np.ndarray, keep_edge: np.ndarray,
                degree: Optional[np.ndarray] = None) -> views.RowSource:
    """The rows `keep_row` (a mask, order kept) of a RowSource with their in-edges `keep_edge`: take_rows."""
    return take_rows(rows, np.flatnonzero(np.asarray(keep_row, dtype=bool)), keep_edge, degree)


def take_rows(rows: views.RowSource, take: np.ndarray, keep_edge: np.ndarray, degree: Optional[np.ndarray] = None,
              hop: Optional[np.ndarray] = None, src_hop: Optional[np.ndarray] = None) -> views.RowSource:
    """The rows `take` (indices, in their new order) of a RowSource with their in-edges `keep_edge` (a mask
    over all edges).  Own-edge positions are renumbered to the taken rows (a kept edge's own source must
    be taken); keys stay what the sources' owners resolve (their resolver maps them onto their taken rows).
    degree: of the taken rows (default: their kept in-edges, the in-degree within the induced graph when the
    rows hold all their in-edges).  hop (of the taken rows) and src_hop (per edge of `rows`): the hops the
    planner schedules by, in place of the rows' own (hop must be non-decreasing in `take` order)."""
    take = np.asarray(take, dtype=np.int64)
    sub_indptr, pos = csr_row_positions(rows.indptr, take)  # the taken rows' edges, in their new order
    kept = np.asarray(keep_edge, dtype=bool)[pos]
    pos = pos[kept]
    lens = np.bincount(row_of_edges(sub_indptr)[kept], minlength=take.shape[0])
    indptr = np.zeros(take.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens, out=indptr[1:])
    new_index = np.full(rows.hop.shape[0], -1, dtype=np.int64)
    new_index[take] = np.arange(take.shape[0], dtype=np.int64)
    is_own = rows.is_own[pos]
    own_pos = np.where(is_own, new_index[np.where(is_own, rows.own_pos[pos], 0)], 0)
    return views.RowSource(
        hop=(rows.hop[take] if hop is None else np.asarray(hop, dtype=np.int64)), indptr=indptr, is_own=is_own,
        own_pos=own_pos, peer=rows.peer[pos], key=rows.key[pos],
        src_hop=(rows.src_hop if src_hop is None else np.asarray(src_hop, dtype=np.int64))[pos],
        degree=(lens if degree is None else np.asarray(degree)).astype(np.float32),
        features=rows.features.take(take) if isinstance(rows.features, TypedRows) else rows.features[take],
        global_id=None if rows.global_id is None else np.asarray(rows.global_id)[take])


def world_rows(sl, my_rank: int, split_bits: int) -> views.RowSource:
    """This rank's rows of the world view of the graph induced by the vertices whose split has one of
    `split_bits`: its inner rows in that graph and their in-edges from it (complete: the world view holds
    every in-edge, so their count is the induced in-degree)."""
    n = int(sl.n_inner)
    own = shards.split_code(sl.train_mask[:n], sl.val_mask[:n], sl.test_mask[:n])
    return subset_rows(views.world_rows(sl, my_rank), (own & split_bits) != 0, (sl.w_src_split & split_bits) != 0)


def server_rows(sl, exact_degrees: bool, depth: int) -> views.RowSource:
    """The rows of the train-induced graph's own `depth`-hop preload within the server's preload: this GPU's
    rows whose hop within the train-induced graph (graph/train_hop) is at most `depth`, ordered and
    scheduled by that hop, and their edges from such rows.  A training row the full graph's hops preload
    but the train-induced graph reaches only farther, or never, is not held.  Degrees: the stored
    train-induced in-degrees (exact: a row at a train-induced hop below `depth` holds all its in-edges,
    and the deepest rows, which may lack theirs, are sources only), or the kept edges (EAS, whose graphs
    are closed)."""
    rows = views.server_rows(sl, exact_degrees=exact_degrees)
    own_hop, take = _taken(sl, depth)
    src_hop = sl.server_train_hop[sl.indices].astype(np.int64)  # TRAIN_HOP_UNREACHED > depth: not a row
    return take_rows(rows, take, src_hop <= depth,
                     degree=sl.train_in_degree[take] if exact_degrees else None, hop=own_hop[take], src_hop=src_hop)


def _taken(sl, depth: int):
    """(this GPU's rows' train-induced hops, the rows within `depth` of them, ordered by that hop)."""
    lo = sl.row_offset
    own_hop = sl.server_train_hop[lo:lo + sl.num_rows].astype(np.int64)
    kept = np.flatnonzero(own_hop <= depth)
    return own_hop, kept[np.argsort(own_hop[kept], kind="stable")]


def key_resolver_server(sl, depth: int):
    """A server view's keys (positions in this GPU's rows of the file) -> positions among the rows
    server_rows(sl, ..., depth) holds (-1 for other rows: no peer asks for them, as every edge it keeps
    comes from a row within `depth`)."""
    take = _taken(sl, depth)[1]
    new_index = np.full(sl.num_rows, -1, dtype=np.int64)
    new_index[take] = np.arange(take.shape[0], dtype=np.int64)

    def resolve(keys):
        keys = np.asarray(keys, dtype=np.int64)
        inside = (keys >= 0) & (keys < new_index.shape[0])
        return np.where(inside, new_index[np.where(inside, keys, 0)], -1)
    return resolve


def train_induced_graph(graph: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """A server graph (shards.read_server_graph of an inductive set) whose edges are the train-induced
    ones; the rows stay (server-local ids keep their meaning), and in_degree becomes the train-induced
    in-degree.  A sampler that starts at training vertices then only reaches training vertices."""
    indptr = np.asarray(graph["indptr"], dtype=np.int64)
    n = indptr.shape[0] - 1
    train = np.asarray(graph["train"], dtype=bool)
    edge_row = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    keep = train[edge_row] & train[graph["indices"]]
    new_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(edge_row[keep], minlength=n), out=new_indptr[1:])
    return {**graph, "indptr": new_indptr, "indices": np.asarray(graph["indices"])[keep],
            "in_degree": np.asarray(graph["train_in_degree"], dtype=np.int64)}


class InducedViews:
    """The world views of the two induced graphs on this rank (built collectively at set-up), and the
    training context the mode plans over: the train-induced world view, its rows' labels, every row a
    target (the rows of the train-induced graph are the training vertices)."""

    def __init__(self, ctx: RunContext):
        cfg, sl, topo = ctx.cfg, ctx.slice, ctx.topo
        n = int(sl.n_inner)
        code = shards.split_code(sl.train_mask[:n], sl.val_mask[:n], sl.test_mask[:n])
        self.ctx = ctx
        self.views, self.rows, self.labels = {}, {}, {}
        for name, bits, measured in (("train", TRAIN, sl.train_mask[:n]), ("val", TRAIN_VAL, sl.val_mask[:n])):
            kept = (code & bits) != 0
            self.views[name] = views.build_view(
                world_rows(sl, topo.rank, bits), ctx.groups["world"], cfg.conv_layers, all_active=True,
                resolve_keys=views.key_resolver_world(sl.global_id[:n][kept]), device=ctx.device,
                static_features=ctx.static_features)
            # Positions, among the induced graph's rows, of the vertices its accuracy is measured on.
            self.rows[name] = torch.as_tensor(np.flatnonzero(measured[kept]), device=ctx.device)
            self.labels[name] = torch.as_tensor(sl.labels[:n][kept], device=ctx.device)

    def training_context(self) -> RunContext:
        """The RunContext a mode trains on: the train-induced world view, and its rows as the targets."""
        ctx, rows = self.ctx, self.rows["train"]
        return dataclasses.replace(ctx, world_view=self.views["train"], labels=self.labels["train"],
                                   split_rows={"train": rows, "val": rows[:0], "test": rows[:0]},
                                   inductive=True)

    @torch.no_grad()
    def split_outputs(self, forward) -> dict:
        """split -> (logits, labels) of this rank's vertices of the split: training vertices on the
        train-induced graph, validation vertices on the train+validation-induced graph, test vertices on
        the full graph (what the metric is measured on: engine/targets.py).  forward(view) -> logits of
        the view's rows (eval mode)."""
        out = {}
        for name, view in (("train", self.views["train"]), ("val", self.views["val"])):
            r = self.rows[name]
            out[name] = (forward(view)[r], self.labels[name][r])
        r = self.ctx.split_rows["test"]
        out["test"] = (forward(self.ctx.world_view)[r], self.ctx.labels[r])
        return out

"""Inductive training (--inductive, docs/inductive.md): train on the subgraph induced by the training
vertices, validate on the graph induced by the training and validation vertices, test on the full graph
(the protocol of the GraNNDis artifact, PipeGCN and BNS-GCN).

An inductive shard set holds the full graph's partition, preloads and world view, plus every row's
in-degree within the train-induced graph and the split code of every world-view source
(preprocess/inductive.py).  Each induced graph is derived here by filtering a view's rows and edges: a
vertex outside the graph is no row, an edge from one is no edge, and degrees are counted within the
graph.  Vertices keep their global ids, so dropout masks are those a single process draws on the
induced graph with the original ids.

- `InducedViews`: the train-induced and train+validation-induced world views (fb training and the
  world layers of flx; exact evaluation on the two induced graphs);
- `server_rows`: the train-induced rows of the preloaded server view (flx, eas);
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
            f"train-induced degrees or source splits); rebuild it with `python -m preprocess build ... --inductive`, "
            f"or train without --inductive")


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
            f"holds (edited after the build?); run `python -m preprocess verify {path}` and rebuild the set")


def subset_rows(rows: views.RowSource, keep_row: np.ndarray, keep_edge: np.ndarray,
                degree: Optional[np.ndarray] = None) -> views.RowSource:
    """The rows `keep_row` of a RowSource with their in-edges `keep_edge` (edges of dropped rows are
    dropped too).  Own-edge positions are renumbered to the kept rows; keys stay what the sources' owners
    resolve (their resolver maps them onto their kept rows).  degree: of the kept rows (default: their
    kept in-edges, the in-degree within the induced graph when the rows hold all their in-edges)."""
    n = rows.hop.shape[0]
    keep_row = np.asarray(keep_row, dtype=bool)
    edge_row = np.repeat(np.arange(n, dtype=np.int64), np.diff(rows.indptr))
    keep_edge = np.asarray(keep_edge, dtype=bool) & keep_row[edge_row]
    new_index = np.cumsum(keep_row) - 1
    lens = np.bincount(edge_row[keep_edge], minlength=n)[keep_row]
    indptr = np.zeros(lens.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens, out=indptr[1:])
    is_own = rows.is_own[keep_edge]
    own_pos = np.where(is_own, new_index[np.where(is_own, rows.own_pos[keep_edge], 0)], 0)
    return views.RowSource(
        hop=rows.hop[keep_row], indptr=indptr, is_own=is_own, own_pos=own_pos, peer=rows.peer[keep_edge],
        key=rows.key[keep_edge], src_hop=rows.src_hop[keep_edge],
        degree=(lens if degree is None else np.asarray(degree)).astype(np.float32),
        features=rows.features[keep_row],
        global_id=None if rows.global_id is None else np.asarray(rows.global_id)[keep_row])


def world_rows(sl, my_rank: int, split_bits: int) -> views.RowSource:
    """This rank's rows of the world view of the graph induced by the vertices whose split has one of
    `split_bits`: its inner rows in that graph and their in-edges from it (complete: the world view holds
    every in-edge, so their count is the induced in-degree)."""
    n = int(sl.n_inner)
    own = shards.split_code(sl.train_mask[:n], sl.val_mask[:n], sl.test_mask[:n])
    return subset_rows(views.world_rows(sl, my_rank), (own & split_bits) != 0, (sl.w_src_split & split_bits) != 0)


def server_rows(sl, exact_degrees: bool) -> views.RowSource:
    """The train-induced rows of the preloaded server view: this GPU's training rows and their edges from
    training rows.  Degrees: the stored train-induced in-degrees (exact: the rows a layer computes hold
    all their in-edges, and the deepest rows, which lack theirs, are sources only), or the kept edges (EAS,
    whose graphs are closed)."""
    rows = views.server_rows(sl, exact_degrees=exact_degrees)
    keep = np.asarray(sl.train_mask, dtype=bool)
    src = sl.indices.astype(np.int64)
    return subset_rows(rows, keep, sl.server_train[src],
                       degree=sl.train_in_degree[keep] if exact_degrees else None)


def key_resolver_server(sl):
    """A server view's keys (positions in this GPU's rows of the file) -> positions among its training
    rows (-1 for other rows, which no peer asks for)."""
    keep = np.asarray(sl.train_mask, dtype=bool)
    new_index = np.where(keep, np.cumsum(keep) - 1, -1)

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
                resolve_keys=views.key_resolver_world(sl.global_id[:n][kept]), device=ctx.device)
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

"""A plain-torch reference of the relational models (nn/hetero_models.py rgcn, rgat) over a whole graph in
global-id order, written from the formulas and the models' parameter names only (no granndis layer), in
float64, plus the small random typed graphs the tests build.  Distributed tests compare their logits with
``reference_logits``."""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from granndis_hpc.graph.hetero import GraphTypes, Relation


def random_typed_graph(seed: int, counts=(14, 11, 9), pairs=((0, 0), (0, 1), (1, 0), (1, 2), (2, 1), (2, 2)),
                       edges_per_relation: int = 30) -> Tuple[GraphTypes, np.ndarray, np.ndarray]:
    """(types, indptr, indices): vertex types with type-major ids, one relation per ordered type pair
    in `pairs`, random edges of each (duplicates dropped), as in-edge CSR sorted by source."""
    rng = np.random.default_rng(seed)
    names = tuple("abcdefgh"[: len(counts)])
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    relations = tuple(Relation(names[s], f"r{s}{d}", names[d]) for s, d in pairs)
    types = GraphTypes(names, tuple(int(o) for o in offsets), relations, names[0])
    src, dst = [], []
    for s, d in pairs:
        src.append(rng.integers(offsets[s], offsets[s + 1], edges_per_relation))
        dst.append(rng.integers(offsets[d], offsets[d + 1], edges_per_relation))
    n = int(offsets[-1])
    key = np.unique(np.concatenate(dst) * n + np.concatenate(src))
    dst_all, src_all = key // n, key % n
    indptr = np.concatenate([[0], np.cumsum(np.bincount(dst_all, minlength=n))]).astype(np.int64)
    return types, indptr, src_all.astype(np.int64)


def edge_relations(types: GraphTypes, indptr, indices) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(destination, source, relation) of every edge, int64."""
    dst = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    rel = types.edge_type(indices, dst)
    return torch.from_numpy(dst), torch.from_numpy(np.asarray(indices, dtype=np.int64)), torch.from_numpy(rel)


def _rgcn(p: Dict[str, torch.Tensor], h, dst, src, rel, R: int):
    weight = p["weight"]
    if "comp" in p:  # bases: W_r = sum_b comp[r, b] V_b
        weight = torch.einsum("rb,bio->rio", p["comp"], weight)
    out = h @ p["root"] + p["bias"]
    for r in range(R):
        e = rel == r
        deg = torch.zeros(h.shape[0], dtype=h.dtype).index_add_(0, dst[e], torch.ones(int(e.sum()), dtype=h.dtype))
        mean = torch.zeros_like(h).index_add_(0, dst[e], h[src[e]]) / deg.clamp(min=1).unsqueeze(1)
        out = out + mean @ weight[r]
    return out


def _gat(p: Dict[str, torch.Tensor], h, dst, src, concat: bool):
    """One GAT without self loops over the edges src -> dst; every row, 0 + bias where it has no edge."""
    heads, c = p["att_src"].shape
    x = (h @ p["lin.weight"].T).view(-1, heads, c)
    logits = F.leaky_relu((x * p["att_src"]).sum(-1)[src] + (x * p["att_dst"]).sum(-1)[dst], 0.2)
    out = torch.zeros(h.shape[0], heads, c, dtype=h.dtype)
    for v in torch.unique(dst).tolist():  # a softmax per destination: plain, not fast
        e = dst == v
        alpha = torch.softmax(logits[e], dim=0)
        out[v] = (alpha.unsqueeze(2) * x[src[e]]).sum(0)
    out = out.reshape(h.shape[0], -1) if concat else out.mean(1)
    return out + p["bias"]


def _rgat(p, h, dst, src, rel, types: GraphTypes, concat: bool):
    vertex_type = torch.from_numpy(types.vertex_type(np.arange(types.num_vertices)))
    out = 0
    for r, relation in enumerate(types.relations):
        e = rel == r
        sub = {k[len(f"rel.{r}."):]: v for k, v in p.items() if k.startswith(f"rel.{r}.")}
        # a relation's output only goes to its destination type
        into = (vertex_type == types.index(relation.dst)).to(h.dtype).unsqueeze(1)
        out = out + into * _gat(sub, h, dst[e], src[e], concat)
    return out


def reference_logits(model_state, types: GraphTypes, indptr, indices, features, layers: int, model: str = "rgcn",
                     linear_layers: int = 0, norm: bool = False) -> torch.Tensor:
    """Eval-mode logits [n, classes] of an `model` ("rgcn" or "rgat") with `layers` layers, the last
    `linear_layers` of them per-vertex Linear ones, from its state_dict, over the whole graph."""
    p = {k: v.detach().double() for k, v in model_state.items()}
    return reference_forward(p, types, indptr, indices, features, layers, model, linear_layers, norm)


def reference_forward(p: Dict[str, torch.Tensor], types: GraphTypes, indptr, indices, features, layers: int,
                      model: str = "rgcn", linear_layers: int = 0, norm: bool = False, drop=None) -> torch.Tensor:
    """The logits from the parameters `p` (by the model's names; differentiable), with `drop(l, h)`
    applied to the rows entering layer l >= 1 after the activation (the models' feature dropout)."""
    dst, src, rel = edge_relations(types, indptr, indices)
    act = F.relu if model == "rgcn" else (lambda t: F.leaky_relu(t, 0.01))
    h, convs = torch.as_tensor(features).to(next(iter(p.values())).dtype), layers - linear_layers
    for name in types.names:  # option embed: the type's input rows are its embedding table
        if f"embeddings.{name}" in p:
            lo, hi = types.id_range(name)
            h = torch.cat([h[:lo], p[f"embeddings.{name}"], h[hi:]])
    for l in range(layers):
        if l:
            if norm:
                h = F.layer_norm(h, h.shape[1:], p[f"norms.{l - 1}.weight"], p[f"norms.{l - 1}.bias"])
            h = act(h)
            if drop is not None:
                h = drop(l, h)
        if l >= convs:
            j = l - convs
            h = h @ p[f"linears.{j}.weight"].T + p[f"linears.{j}.bias"]
            continue
        conv = {k[len(f"convs.{l}."):]: v for k, v in p.items() if k.startswith(f"convs.{l}.")}
        if model == "rgcn":
            h = _rgcn(conv, h, dst, src, rel, types.num_relations)
        else:  # the last conv of a model without linear layers averages its heads into the classes
            h = _rgat(conv, h, dst, src, rel, types, concat=not (l == layers - 1))
    return h


def train_reference(model, graph, layers: int, epochs: int, lr: float, dropout: float, seed: int,
                    linear_layers: int = 0, norm: bool = False, features=None) -> Dict[str, torch.Tensor]:
    """Single-process full-graph training of `model`'s parameters in float64 with reference_forward:
    Adam on CE(sum)/n_train over the target type's training vertices, feature dropout with the masks of
    vertices 0..N-1 (nn/dropout.keep_mask).  features(p): the layer-0 rows from the parameters being
    trained (an input projection's); None: graph.features.  Returns the trained parameters by name."""
    from granndis_hpc.nn.dropout import keep_mask

    p = {k: v.detach().double().clone().requires_grad_(True) for k, v in model.named_parameters()}
    opt = torch.optim.Adam(list(p.values()), lr=lr)
    y = torch.from_numpy(graph.labels)
    train = torch.from_numpy(np.flatnonzero(graph.train_mask))
    ids = torch.arange(graph.num_vertices)
    for epoch in range(epochs):
        def drop(layer, h, epoch=epoch):
            return h * keep_mask(seed, epoch, layer, ids, h.shape[1], dropout).to(h.dtype) / (1 - dropout)
        opt.zero_grad()
        x = graph.features if features is None else features(p)
        logits = reference_forward(p, graph.types, graph.indptr, graph.indices, x, layers, model.name,
                                   linear_layers, norm, drop if dropout > 0 else None)
        loss = F.cross_entropy(logits[train], y[train], reduction="sum") / len(train)
        loss.backward()
        opt.step()
    return {k: v.detach() for k, v in p.items()}

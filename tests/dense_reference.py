"""Independent single-process reference for the GNN models: dense matrices on the whole graph.

Written from the formulas in granndis_hpc/nn (module docstrings), NOT by calling its layers, so that a
bug in the sparse layers, the gather bookkeeping or the residual slicing shows up as a mismatch.
Everything is computed in float64 (by default) so that the reference's own rounding is negligible.

    from tests.dense_reference import dense_logits
    logits = dense_logits("sage", model, indptr, indices, features)          # [N, classes]

Parameters are read by name (see granndis_hpc/nn/models.py).  Given the module itself, they are its
live parameters, so ``dense_logits(...).sum().backward()`` produces reference gradients in ``.grad``.
Dropout is 0 (eval semantics) whatever the module's mode, unless ``dropout(layer, h)`` is given: it is
applied where the models drop (before conv l >= 1 and before the per-vertex Linear layer l of a model
with linears.{j} parameters; ResSAGE+ also before the head, layer L = all layers), e.g. with
the masks of granndis_hpc.nn.dropout.keep_mask over the global ids 0..N-1.  Input dropout is
``dropout(0, x)`` on the raw features when ``input_dropout=True`` (before conv 0; ResSAGE+: before the
encoder): a single process holds every vertex, so there is no halo to think about.
"""
from __future__ import annotations

import re
from typing import Mapping, Optional, Union

import numpy as np
import torch

LAYERNORM_EPS = 1e-5  # torch.nn.LayerNorm's default; read from the module when one is given


def _t(a, dtype=None) -> torch.Tensor:
    t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.asarray(a))
    return t if dtype is None else t.to(dtype)


def dense_adjacency(indptr, indices, num_cols: Optional[int] = None, dtype=torch.float64) -> torch.Tensor:
    """Dense A[v, u] = number of edges u -> v, from in-edge CSR; shape [rows, num_cols (default rows)]."""
    indptr, indices = _t(indptr, torch.int64), _t(indices, torch.int64)
    n_rows = indptr.shape[0] - 1
    rows = torch.repeat_interleave(torch.arange(n_rows), indptr[1:] - indptr[:-1])
    a = torch.zeros(n_rows, n_rows if num_cols is None else num_cols, dtype=dtype)
    a.index_put_((rows, indices), torch.ones(rows.shape[0], dtype=dtype), accumulate=True)
    return a


def _layer_norm(h, weight, bias, eps):
    mean = h.mean(dim=1, keepdim=True)
    var = ((h - mean) ** 2).mean(dim=1, keepdim=True)  # biased variance, as LayerNorm uses
    return (h - mean) / torch.sqrt(var + eps) * weight + bias


class _Params:
    def __init__(self, source, dtype):
        if isinstance(source, torch.nn.Module):
            named = dict(source.named_parameters())
            self.eps = {name: mod.eps for name, mod in source.named_modules() if isinstance(mod, torch.nn.LayerNorm)}
        elif isinstance(source, Mapping):
            named, self.eps = dict(source), {}
        else:
            raise TypeError(f"dense_logits: model must be a torch.nn.Module or a state_dict, got {type(source)}")
        self.p = {k: v.to(dtype) for k, v in named.items()}

    def __getitem__(self, name):
        if name not in self.p:
            raise KeyError(f"dense_logits: parameter {name!r} not found; have {sorted(self.p)}")
        return self.p[name]

    def has(self, name):
        return name in self.p

    def num_convs(self):
        return 1 + max(int(m.group(1)) for k in self.p if (m := re.match(r"convs\.(\d+)\.", k)))

    def num_linears(self):
        """The per-vertex Linear layers after the convs (linears.{j}; --linear-layers)."""
        return len({m.group(1) for k in self.p if (m := re.match(r"linears\.(\d+)\.", k))})

    def linear(self, prefix, h, bias=True):
        out = h @ self[prefix + ".weight"].T
        return out + self[prefix + ".bias"] if bias and self.has(prefix + ".bias") else out

    def layer_norm(self, prefix, h):
        return _layer_norm(h, self[prefix + ".weight"], self[prefix + ".bias"], self.eps.get(prefix, LAYERNORM_EPS))


def dense_logits(model_name: str, model: Union[torch.nn.Module, Mapping[str, torch.Tensor]], indptr, indices,
                 features, degrees: Optional[Union[np.ndarray, torch.Tensor]] = None,
                 dtype: torch.dtype = torch.float64, dropout=None, input_dropout: bool = False,
                 attention_dropout=None) -> torch.Tensor:
    """Whole-graph logits [N, classes] of model ``model_name`` ("sage" | "gcn" | "ressage" | EDGE_MODELS), dropout 0.

    indptr/indices: in-edge CSR of the whole graph (numpy or torch); features [N, F];
    degrees [N]: the degree to normalise with (default: the in-degree, i.e. row counts of the CSR).
    dropout(layer, h) -> h: the training-time dropout of the rows of h (all N vertices); None: none.
    input_dropout: also drop the input features, as dropout(0, x).
    attention_dropout(layer, dst, src, alpha) -> alpha: GAT's dropout of the attention weights alpha [E, heads]
    of the edges src -> dst (self loops included); None: none.
    Returns ``dtype`` (float64 by default); differentiable wrt the module's parameters.
    """
    x = _t(features, dtype)
    n = x.shape[0]
    a = dense_adjacency(indptr, indices, n, dtype)
    if a.shape[0] != n:
        raise ValueError(f"dense_logits: indptr has {a.shape[0]} rows but features have {n}")
    deg = a.sum(dim=1) if degrees is None else _t(degrees, dtype)
    p = _Params(model, dtype)
    L, J = p.num_convs(), p.num_linears()
    drop = dropout if dropout is not None else (lambda layer, h: h)
    if input_dropout:
        x = drop(0, x)

    # Normalised dense operators, straight from the formulas; only the model's own one is built (each is
    # a few [N, N] passes, the reference's main cost once its products run at the output width).
    if model_name == "gcn":
        # GCN as PyG's add_remaining_self_loops: a stored loop (diagonal of A) is replaced by one of weight 1.
        loops = torch.diagonal(a).clone()
        s = 1.0 / torch.sqrt(deg - loops + 1.0)
        gcn_op = s[:, None] * (a - torch.diag(loops) + torch.eye(n, dtype=dtype)) * s[None, :]
    else:
        mean_op = a / torch.clamp(deg, min=1.0)[:, None]

    def sage(l, h):
        c = f"convs.{l}"
        # mean_op @ (h W^T) = (mean_op @ h) W^T; projecting first keeps the dense [N, N] product at the
        # output width (Cora: 16 columns instead of 1433, 90x fewer flops; float64 rounding either way).
        return h @ p[c + ".lin_self.weight"].T + (p[c + ".lin_self.bias"] if p.has(c + ".lin_self.bias") else 0) \
            + mean_op @ (h @ p[c + ".lin_neigh.weight"].T)

    def gcn(l, h):
        c = f"convs.{l}"
        out = gcn_op @ (h @ p[c + ".lin.weight"].T)
        return out + p[c + ".bias"] if p.has(c + ".bias") else out

    if model_name in ("sage", "gcn"):
        conv = sage if model_name == "sage" else gcn
        h = x
        for l in range(L):
            if l > 0:
                if p.has(f"norms.{l - 1}.weight"):
                    h = p.layer_norm(f"norms.{l - 1}", h)
                h = drop(l, torch.relu(h))
            h = conv(l, h)
        for j in range(J):  # the per-vertex head: Linear layers L + j, no aggregation
            if p.has(f"norms.{L + j - 1}.weight"):
                h = p.layer_norm(f"norms.{L + j - 1}", h)
            h = p.linear(f"linears.{j}", drop(L + j, torch.relu(h)))
        return h
    if model_name == "ressage":
        h = sage(0, p.linear("encoder", x))
        for l in range(1, L):
            h = h + sage(l, drop(l, torch.relu(p.layer_norm(f"norms.{l - 1}", h))))
        for j in range(J):  # residual per-vertex blocks
            h = h + p.linear(f"linears.{j}", drop(L + j, torch.relu(p.layer_norm(f"norms.{L + j - 1}", h))))
        return p.linear("head", drop(L + J, torch.relu(p.layer_norm("out_norm", h))))
    if model_name in EDGE_MODELS:
        return _edge_model_logits(model_name, p, a, _t(indptr, torch.int64), _t(indices, torch.int64), x, L, drop,
                                  attention_dropout, _negative_slopes(model, L), J)
    raise ValueError(f"dense_logits: unknown model {model_name!r}")


# ---- GAT, GIN, SAGE-sum, SAGE-max (granndis_hpc/nn/zoo.py) ------------------------------------------
EDGE_MODELS = ("gat", "gin", "sage-sum", "sage-max")


def _negative_slopes(model, layers):
    """GAT's LeakyReLU slope per conv: the module's, else 0.2 (PyG's default)."""
    convs = getattr(model, "convs", None) if isinstance(model, torch.nn.Module) else None
    return [getattr(convs[l], "negative_slope", 0.2) if convs is not None else 0.2 for l in range(layers)]


def _segment_softmax(e, dst, n):
    """softmax of e [E, H] over the edges of each destination dst[i] (shifted by the destination's max)."""
    top = torch.full((n, e.shape[1]), -torch.inf, dtype=e.dtype).scatter_reduce(
        0, dst.unsqueeze(1).expand_as(e), e, "amax", include_self=True).detach()
    w = torch.exp(e - top[dst])
    return w / torch.zeros(n, e.shape[1], dtype=e.dtype).index_add(0, dst, w)[dst]


def _edge_model_logits(name, p, a, indptr, indices, x, L, drop, attention_dropout, slopes, J=0):
    n = x.shape[0]
    dst = torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])
    src = indices

    def gat(l, h):
        c = f"convs.{l}"
        att_src, att_dst, bias = p[c + ".att_src"], p[c + ".att_dst"], p[c + ".bias"]
        heads, width = att_src.shape
        z = (h @ p[c + ".lin.weight"].T).view(n, heads, width)
        # N(v) without stored loops, plus one self loop per vertex (PyG GATConv's add_self_loops).
        off = src != dst
        d = torch.cat([dst[off], torch.arange(n)])
        s = torch.cat([src[off], torch.arange(n)])
        logit = torch.nn.functional.leaky_relu((z * att_src).sum(-1)[s] + (z * att_dst).sum(-1)[d], slopes[l])
        alpha = _segment_softmax(logit, d, n)
        if attention_dropout is not None:
            alpha = attention_dropout(l, d, s, alpha)
        out = torch.zeros(n, heads, width, dtype=h.dtype).index_add(0, d, alpha.unsqueeze(2) * z[s])
        out = out.reshape(n, heads * width) if bias.shape[0] == heads * width else out.mean(dim=1)
        return out + bias

    def gin(l, h):
        c = f"convs.{l}"
        # W((1+eps) h + A h) + b, projected first (A's product at the output width; linear, so the same).
        hw = h @ p[c + ".lin1.weight"].T
        z = (1.0 + p[c + ".eps"]) * hw + a @ hw + p[c + ".lin1.bias"]
        return p.linear(c + ".lin2", torch.relu(z))

    def sage_sum(l, h):
        c = f"convs.{l}"
        return p.linear(c + ".lin_self", h) + a @ (h @ p[c + ".lin_neigh.weight"].T)

    def sage_max(l, h):
        c = f"convs.{l}"
        top = torch.full(h.shape, -torch.inf, dtype=h.dtype).scatter_reduce(
            0, dst.unsqueeze(1).expand(-1, h.shape[1]), h[src], "amax", include_self=True)
        top = torch.where(torch.isinf(top), torch.zeros((), dtype=h.dtype), top)  # no in-edge: 0
        return p.linear(c + ".lin_self", h) + top @ p[c + ".lin_neigh.weight"].T

    conv = {"gat": gat, "gin": gin, "sage-sum": sage_sum, "sage-max": sage_max}[name]
    act = torch.nn.functional.elu if name == "gat" else torch.relu
    h = x
    for l in range(L):
        if l > 0:
            if p.has(f"norms.{l - 1}.weight"):
                h = p.layer_norm(f"norms.{l - 1}", h)
            h = drop(l, act(h))
        h = conv(l, h)
    for j in range(J):  # the per-vertex head: Linear layers L + j, no aggregation
        if p.has(f"norms.{L + j - 1}.weight"):
            h = p.layer_norm(f"norms.{L + j - 1}", h)
        h = p.linear(f"linears.{j}", drop(L + j, act(h)))
    return h


def random_in_csr(num_vertices: int, num_edges: int, rng: np.random.Generator, isolated: int = 0):
    """A random directed graph as in-edge CSR (indptr, indices): no self loops, possible multi-edges
    removed, and the last ``isolated`` vertices without any edge (to exercise degree 0)."""
    active = num_vertices - isolated
    src = rng.integers(0, active, num_edges)
    dst = rng.integers(0, active, num_edges)
    keep = src != dst
    pairs = np.unique(np.stack([dst[keep], src[keep]], axis=1), axis=0)  # sorted by (dst, src)
    indptr = np.zeros(num_vertices + 1, dtype=np.int64)
    np.cumsum(np.bincount(pairs[:, 0], minlength=num_vertices), out=indptr[1:])
    return indptr, pairs[:, 1].astype(np.int64)


def train_dense(graph, model, epochs: int, lr: float, dropout: float = 0.0, input_dropout: float = 0.0,
                seed: int = 0, weight_decay: float = 0.0, first_layer_decay_only: bool = False,
                dtype: Optional[torch.dtype] = None, attention_dropout: float = 0.0):
    """Single-process full-graph training with the dense reference: Adam on CE(sum)/n_train.
    Returns a trained copy of `model` (converted to `dtype` when given); `graph` is a preprocess Graph
    (indptr, indices, features, ...).

    dropout / input_dropout: probabilities, with the counter-based masks of vertices 0..N-1
    (nn/dropout.keep_mask(seed, epoch, layer, ids, width, p); input dropout is layer 0).
    weight_decay: Adam's (coupled L2); first_layer_decay_only: only on the layer that reads the features
    (parameters convs.0.* for sage/gcn, encoder.* for ressage; models.py names them), as PyG's
    examples/gcn.py decays conv1 only.
    attention_dropout: GAT's, with the masks of the edges' (destination, source) ids
    (keep_mask(seed, epoch, attention_key(layer), edge_ids(dst, src), heads, p))."""
    import copy

    from granndis_hpc.nn.dropout import keep_mask
    from granndis_hpc.nn.edge_layers import attention_key, edge_ids

    model = copy.deepcopy(model)
    if dtype is not None:
        model = model.to(dtype)
    first = "encoder." if model.name == "ressage" else "convs.0."
    named = list(model.named_parameters())
    if first_layer_decay_only:
        groups = [{"params": [p for n, p in named if n.startswith(first)], "weight_decay": weight_decay},
                  {"params": [p for n, p in named if not n.startswith(first)], "weight_decay": 0.0}]
    else:
        groups = [{"params": [p for _, p in named], "weight_decay": weight_decay}]
    opt = torch.optim.Adam(groups, lr=lr)
    x, y = torch.from_numpy(graph.features), torch.from_numpy(graph.labels)
    train = torch.from_numpy(np.flatnonzero(graph.train_mask))
    deg = torch.from_numpy(graph.in_degree())
    ids = torch.arange(x.shape[0])
    for epoch in range(epochs):
        def drop(layer, h, epoch=epoch):
            p = input_dropout if layer == 0 else dropout
            if p == 0.0:
                return h
            return h * keep_mask(seed, epoch, layer, ids, h.shape[1], p).to(h.dtype) / (1 - p)
        def attention(layer, dst, src, alpha, epoch=epoch):
            keep = keep_mask(seed, epoch, attention_key(layer), edge_ids(dst, src), alpha.shape[1], attention_dropout)
            return alpha * keep.to(alpha.dtype) / (1 - attention_dropout)
        opt.zero_grad()
        logits = dense_logits(model.name, model, graph.indptr, graph.indices, x, degrees=deg, dropout=drop,
                              input_dropout=input_dropout > 0,
                              attention_dropout=attention if attention_dropout > 0 else None)
        loss = torch.nn.functional.cross_entropy(logits[train], y[train], reduction="sum") / len(train)
        loss.backward()
        opt.step()
    return model


def assert_parameters_close(model, reference, rel_tol: float = 1e-4, label: str = ""):
    """Every parameter of `model` within rel_tol x max(|reference|, 1) of the reference's, by name."""
    for (name, got), (_, want) in zip(model.named_parameters(), reference.named_parameters()):
        err = (got.detach().double() - want.detach().double()).abs().max().item()
        scale = want.detach().abs().max().item()
        assert err <= rel_tol * max(scale, 1.0), f"{label}{name}: max abs error {err:.3e}"

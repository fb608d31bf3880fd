"""Per-GPU memory model of a training plan, and the choice GraNNDis makes with it (paper §5.1):
the largest preloaded depth k that fits, then EAS, then cooperative batches.

Pure: no MPI, nothing from the engine, so `preprocess` can use it offline.  Two entry points:
- `estimate(plan, model, ...)` from row counts per layer (a `RankRows`, built by hand or by
  `rank_rows(...)` from shard arrays);
- `estimate_shard_set(path, ...)` from a shard set on disk (reads each rank's slice, plans nothing,
  trains nothing).

What a rank holds (on its device; the host copies are not counted), for an L-layer model trained
with k preloaded hops (docs/memory-model.md has the formulas and the measurements):
- features: the static input rows of every view the run builds (own rows and the halo rows exchanged
  once at set-up): the server view (k >= 1) and the world view (always: exact evaluation uses it);
- graph: per LayerGraph indptr/indices/degrees, the cached normalised CSR adjacency (built by the
  first forward) and its cached transpose (built by the first backward, only where the aggregation's
  input needs a gradient), and the exchange's index tensors;
- parameters, their gradients and Adam's two moments;
- activations: what autograd keeps for the backward pass, per layer, derived from what each aten op
  saves and equal byte for byte to `SavedBytes` (tests/unit/test_memory_model.py);
- halo buffers and step transient: the step's peak above its activations (the exchange's send and
  receive rows, conv outputs, the current layer's gradients in the backward; after it, the flat
  all-reduce bucket and Adam's temporaries), the exchange's share reported as halo_buffers.
The estimate of a rank is the sum of these; an option's is the largest rank's.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

F32 = 4  # every float tensor of the engine is float32
I64 = 8  # every index tensor is int64
MODELS = ("sage", "gcn", "ressage")


class MemoryModelError(ValueError):
    """Inputs the model cannot estimate (unknown model, k outside 0..L, inconsistent counts)."""


# ---------------------------------------------------------------------------------------------------
# Row counts
@dataclass(frozen=True)
class LayerRows:
    """One LayerGraph of a view: its source rows (own prefix + halo), computed rows and edges."""

    n_own_in: int  # own source rows (a prefix of the own rows)
    n_halo: int  # halo source rows received from peers at this layer
    n_dst: int  # rows computed
    nnz: int  # in-edges of the computed rows
    n_send: int = 0  # own rows sent to peers at this layer
    inter_halo: int = 0  # of n_halo: rows received from other servers (world view only)

    @property
    def n_src(self) -> int:
        return self.n_own_in + self.n_halo


@dataclass(frozen=True)
class ViewRows:
    """A view: all its own rows, its full halo (static features exchanged once) and its L graphs."""

    name: str  # "server" | "world" | "cobatch"
    n_own: int
    n_halo: int  # distinct halo rows of the full plan
    n_send: int  # rows of the full send list (the static exchange)
    layers: Tuple[LayerRows, ...]
    inter_halo: int = 0  # of n_halo: rows owned by other servers


@dataclass(frozen=True)
class RankRows:
    """What one rank (server s, GPU g) trains on, as row counts.

    k: preloaded layers.  Layers 0..k-1 of the training plan are server.layers[0..k-1], layers k..L-1
    are world.layers[k..L-1]; k = 0 is fb (server is None), k = L is flx."""

    rank: int
    features: int
    num_classes: int
    n_inner: int
    n_train: int  # inner training rows of this rank (the loss)
    layers: int
    k: int
    world: ViewRows
    server: Optional[ViewRows] = None

    def training_layers(self) -> List[Tuple[str, LayerRows]]:
        out = []
        for l in range(self.layers):
            if l < self.k:
                out.append(("server", self.server.layers[l]))
            else:
                out.append(("world", self.world.layers[l]))
        return out

    def views(self) -> List[ViewRows]:
        return [v for v in (self.server, self.world) if v is not None]


def check_rank_rows(r: RankRows) -> None:
    if not 0 <= r.k <= r.layers:
        raise MemoryModelError(f"k = {r.k} preloaded layers is outside 0..L = 0..{r.layers}")
    if r.k > 0 and (r.server is None or len(r.server.layers) < r.k):
        raise MemoryModelError(f"k = {r.k} needs a server view with at least {r.k} layers")
    if len(r.world.layers) != r.layers:
        raise MemoryModelError(f"the world view has {len(r.world.layers)} layers, the model {r.layers}")
    tl = r.training_layers()
    for l in range(1, len(tl)):
        if tl[l][1].n_own_in != tl[l - 1][1].n_dst:
            raise MemoryModelError(
                f"layer {l}: {tl[l][1].n_own_in} own source rows but layer {l - 1} computes {tl[l - 1][1].n_dst}; "
                "a layer's computed rows are the next layer's own rows")
    if tl and tl[-1][1].n_dst != r.n_inner:
        raise MemoryModelError(f"the last layer computes {tl[-1][1].n_dst} rows, not the {r.n_inner} inner rows")


# ---------------------------------------------------------------------------------------------------
# Models: widths and parameters (mirrors granndis_hpc/nn/models.py; test_memory_model checks both)
@dataclass(frozen=True)
class ModelSpec:
    name: str
    features: int
    hidden: int
    num_classes: int
    layers: int
    dropout: float = 0.5
    norm: bool = False  # sage/gcn only; ressage always has LayerNorm
    checkpoint_activations: bool = False  # ressage only (nn/models.py recomputes its residual blocks)

    def __post_init__(self):
        if self.name not in MODELS:
            raise MemoryModelError(f"unknown model {self.name!r}; choose one of {', '.join(MODELS)}")
        for k in ("features", "hidden", "num_classes", "layers"):
            if int(getattr(self, k)) < 1:
                raise MemoryModelError(f"{k} must be >= 1, got {getattr(self, k)}")

    def widths(self) -> List[Tuple[int, int]]:
        """(in, out) width of every conv."""
        L, H = self.layers, self.hidden
        if self.name == "ressage":
            return [(H, H)] * L
        w = [self.features] + [H] * (L - 1) + [self.num_classes]
        return [(w[i], w[i + 1]) for i in range(L)]

    def parameters(self) -> int:
        """Number of parameters (floats)."""
        L, H, F, C = self.layers, self.hidden, self.features, self.num_classes
        if self.name == "ressage":
            conv = 2 * H * H + H
            return (F * H + H) + L * conv + (L - 1) * 2 * H + 2 * H + (H * C + C)
        n = 0
        for i, o in self.widths():
            n += (2 * i * o + o) if self.name == "sage" else (i * o + o)
        if self.norm:
            n += (L - 1) * 2 * H
        return n


# ---------------------------------------------------------------------------------------------------
# What autograd saves
def _conv_saved(kind: str, lr: LayerRows, win: int, wout: int, input_grad: bool,
                with_exchange: bool) -> Tuple[int, int]:
    """Bytes a SAGE/GCN conv saves at one layer, gather included (views.View.gather_fn + nn/layers.py).

    gather: the halo exchange saves its send index when h needs a gradient; cat makes a new [n_src, win]
    storage, which lin_self (SAGE) / the projection (when out < in) save.  Aggregating first (out >= in)
    saves the [n_dst, win] aggregate instead.  A Linear saves its weight only when its input needs a
    gradient.  Slices (h_src[:n_dst]) share the cat's storage and count once.
    Returns (saved, of which already allocated before the step: the weights and the send index)."""
    s, d = lr.n_src, lr.n_dst
    b = pre = 0
    if input_grad and with_exchange:
        b += lr.n_send * I64
        pre += lr.n_send * I64
    h_src = s * win * F32
    weight = win * wout * F32 if input_grad else 0
    if kind == "sage":
        b += h_src + weight  # lin_self(h_src[:d])
        b += weight if wout < win else d * win * F32 + weight  # lin_neigh on h_src, or on the aggregate
    else:  # gcn: one Linear, before or after the aggregation
        b += (h_src + weight) if wout < win else (d * win * F32 + weight)
    pre += weight * (2 if kind == "sage" else 1)
    return b, pre


def _pre_saved(rows: int, width: int, norm: bool, dropout: float, mask_bytes: int) -> Tuple[int, int]:
    """[LayerNorm] -> ReLU -> dropout between convs: LN saves input, mean, rstd, weight, bias; ReLU its
    result; dropout its mask (a float mask on CPU (input * bernoulli noise), a bool mask on CUDA)."""
    b = pre = 0
    if norm:
        b += rows * width * F32 + 2 * rows * F32 + 2 * width * F32
        pre += 2 * width * F32  # LN weight and bias
    b += rows * width * F32
    if dropout > 0:
        b += rows * width * mask_bytes
    return b, pre


def _loss_saved(n_train: int, classes: int) -> Tuple[int, int]:
    """logits[rows]: the row index (the trainer's, allocated at set-up); cross entropy: log-softmax
    result, the target, total_weight."""
    return n_train * I64 + n_train * classes * F32 + n_train * I64 + F32, n_train * I64


def activation_layers(r: RankRows, m: ModelSpec, device: str = "cpu") -> Dict[str, object]:
    """Bytes autograd keeps for the backward pass, per layer (as SavedBytes counts: each storage once).

    Returns {"per_layer": [...], "head": bytes, "loss": bytes, "saved": the total SavedBytes counts,
    "fresh"/"fresh_per_layer": the part the step allocates (not the weights, the input features or
    index tensors that exist before it),
    "recompute": with checkpointing, the largest block's activations, held again while the backward
    recomputes it (0 without)}."""
    mask_bytes = 1 if device == "cuda" else F32
    tl = r.training_layers()
    widths = m.widths()
    per_layer, fresh, recompute = [], [], 0

    def add(*parts):
        return sum(p[0] for p in parts), sum(p[1] for p in parts)

    if m.name == "ressage":
        H = m.hidden
        own0 = r.server.n_own if r.k > 0 else r.world.n_own
        # encoder(x) saves x, a slice of the view's whole feature tensor, which is what its storage
        # holds (allocated at set-up).
        enc = own0 * r.features * F32
        for l, (_, lr) in enumerate(tl):
            b, pre = _conv_saved("sage", lr, H, H, input_grad=True, with_exchange=True)
            if l >= 1:
                b, pre = add((b, pre), _pre_saved(lr.n_own_in, H, True, m.dropout, mask_bytes))
            if l >= 1 and m.checkpoint_activations:
                # A recomputed block saves only its input (the outer hooks see it; measured), and
                # the backward re-runs the block, holding its activations again one block at a time.
                recompute = max(recompute, b - pre)
                b, pre = lr.n_own_in * H * F32, 0
            per_layer.append(b)
            fresh.append(b - pre)
        per_layer[0] += enc
        head, pre = _pre_saved(r.n_inner, H, True, m.dropout, mask_bytes)
        # head saves its input (the dropout output, a new storage when p > 0; else ReLU's result,
        # counted above) and its weight.
        head += (r.n_inner * H * F32 if m.dropout > 0 else 0) + H * m.num_classes * F32
        head_fresh = head - pre - H * m.num_classes * F32
    else:
        for l, (_, lr) in enumerate(tl):
            win, wout = widths[l]
            b, pre = _conv_saved(m.name, lr, win, wout, input_grad=l > 0, with_exchange=l > 0)
            if l >= 1:
                b, pre = add((b, pre), _pre_saved(lr.n_own_in, win, m.norm, m.dropout, mask_bytes))
            per_layer.append(b)
            fresh.append(b - pre)
        head = head_fresh = 0
    loss, loss_pre = _loss_saved(r.n_train, m.num_classes)
    saved = sum(per_layer) + head + loss
    return {"per_layer": per_layer, "fresh_per_layer": fresh, "head": head, "loss": loss, "saved": saved,
            "fresh": sum(fresh) + head_fresh + loss - loss_pre, "recompute": recompute}


# ---------------------------------------------------------------------------------------------------
# Static memory
def _graph_bytes(lr: LayerRows, kind: str, forward_cache: bool, transpose_cache: bool) -> int:
    """A LayerGraph: indptr, indices, degrees, its exchange indices (send, halo rows) and the cached CSR
    adjacency (crow, col, values; GCN adds the n_dst self-loop entries) and its transpose."""
    b = (lr.n_dst + 1) * I64 + lr.nnz * I64 + lr.n_dst * F32 + lr.n_src * F32
    b += lr.n_send * I64 + lr.n_halo * I64
    entries = lr.nnz + (lr.n_dst if kind == "gcn" else 0)
    if forward_cache:
        b += (lr.n_dst + 1) * I64 + entries * (I64 + F32)
    if transpose_cache:
        b += (lr.n_src + 1) * I64 + entries * (I64 + F32)
    return b


def step_peak(r: RankRows, m: ModelSpec, act: Dict[str, object]) -> Dict[str, object]:
    """Peak bytes a training step allocates above what it starts with (activations and transients).

    Forward at layer l: the activations saved so far (layers <= l) plus the larger of the exchange's
    buffers (send + receive rows at the input width) and the conv's two output terms.  Backward at
    layer l: the activations of layers <= l (later ones are freed as the backward passes them) plus
    the gradient of the output and, where the input needs a gradient, the gradients of the source
    rows (SAGE: two paths, self and aggregation; GCN: one), of the rows sent back to their owners and of the own
    rows they add into; a checkpointed block also holds its recomputed activations.  The end of the
    forward holds every activation plus the logits and the loss terms."""
    tl = r.training_layers()
    widths = m.widths()
    # Only what the step allocates: saved inputs, weights and index tensors exist before it.
    prefix = np.cumsum(act["fresh_per_layer"]).tolist()
    best, where = int(act["fresh"]) + r.n_inner * m.num_classes * F32, "loss"
    halo_max = 0
    for l, (_, lr) in enumerate(tl):
        win, wout = widths[l]
        exchanged = l > 0 or m.name == "ressage"  # plain layer 0 reads the static halo features
        input_grad = exchanged
        halo = (lr.n_send + lr.n_halo) * win * F32 if exchanged else 0
        halo_max = max(halo_max, halo)
        fwd = prefix[l] + max(halo, 2 * lr.n_dst * wout * F32)
        if input_grad:
            # SAGE's source rows get two gradients (lin_self's slice and the aggregation), GCN's one.
            # The autograd engine adds the second into the first and frees it before the exchange's
            # backward allocates the rows sent back and the own rows they add into.
            paths = 1 if m.name == "gcn" else 2
            grads = lr.n_dst * wout + max(paths * lr.n_src * win,
                                          lr.n_src * win + lr.n_send * win + lr.n_own_in * win)
        else:
            grads = lr.n_dst * wout + (lr.n_src * wout if wout < win else 0)
        # + the weight gradient, computed then added into .grad (one weight at a time).
        grads += win * wout
        bwd = prefix[l] + grads * F32 + (act["recompute"] if m.checkpoint_activations and l >= 1 else 0)
        for value, name in ((fwd, f"forward layer {l}"), (bwd, f"backward layer {l}")):
            if value > best:
                best, where = int(value), name
    return {"peak": int(best), "where": where, "halo": int(halo_max)}


def estimate(r: RankRows, m: ModelSpec, device: str = "cpu", adam: bool = True) -> Dict[str, object]:
    """Memory of one rank: {"breakdown": {component: bytes}, "total": peak bytes, ...}."""
    check_rank_rows(r)
    if m.layers != r.layers:
        raise MemoryModelError(f"the model has {m.layers} layers, the row counts {r.layers}")
    kind = "gcn" if m.name == "gcn" else "mean"
    tl = r.training_layers()
    widths = m.widths()
    # Does layer l's aggregation input need a gradient (then the backward builds the transpose)?
    def agg_input_grad(l):
        if m.name == "ressage" or l > 0:
            return True
        win, wout = widths[0]
        return wout < win  # projected first: the aggregate's input is lin(h_src), which has a gradient

    features = 0
    for v in r.views():
        features += (v.n_own + v.n_halo) * r.features * F32 + (v.n_own + v.n_halo) * F32  # + degrees
        features += v.n_send * I64  # the full send list
    graph = 0
    for v in r.views():
        for l, lr in enumerate(v.layers):
            trained = (v.name != "world" and l < r.k) or (v.name == "world" and l >= r.k)
            used_forward = trained or v.name == "world"  # evaluation runs every world layer
            graph += _graph_bytes(lr, kind, used_forward, trained and agg_input_grad(l))
    act = activation_layers(r, m, device)
    step = step_peak(r, m, act)
    P = m.parameters()
    # After the backward the activations are gone; the step then holds the flat all-reduce bucket
    # and Adam's temporaries (one parameter-sized tensor each, at most).
    after = 2 * P * F32 if adam else P * F32
    breakdown = {
        "features": features,
        "graph": graph,
        "parameters": P * F32,
        "gradients": P * F32,
        "optimizer": (2 * P * F32) if adam else 0,
        "activations": int(act["fresh"]),
    }
    # The step's transient above its activations, of which halo buffers: at most the largest
    # layer's exchange (send + receive rows at its input width).
    transient = int(max(step["peak"], after) - act["fresh"])
    breakdown["halo_buffers"] = min(transient, int(step["halo"]))
    breakdown["step_transient"] = transient - breakdown["halo_buffers"]
    total = sum(breakdown.values())
    return {"rank": r.rank, "k": r.k, "breakdown": breakdown, "total": int(total),
            "activation_saved": int(act["saved"]), "activation_per_layer": act["per_layer"],
            "step_peak": int(step["peak"]), "step_peak_layer": step["where"],
            "rows_per_layer": [lr.n_src for _, lr in tl], "computed_per_layer": [lr.n_dst for _, lr in tl]}


def inter_server_bytes(ranks: Sequence[RankRows], m: ModelSpec, servers: int, steps: int = 1) -> Dict[str, int]:
    """Inter-server bytes per epoch, summed over ranks, as the ledger counts them.

    Halo: every world-exchange layer l >= k sends, forward, the inter-server halo rows at the layer's
    input width and returns their gradients backward (x2); layer 0 of plain models reads the static
    features exchanged at set-up, so in fb it costs nothing per epoch.  Gradients: the leaders' ring
    all-reduce moves 2 (S-1) x params x 4 bytes in all (cluster/accounting.py), once per optimizer
    step (`steps` per epoch: the co-batches of cob)."""
    widths = m.widths()
    halo = 0
    for r in ranks:
        for l in range(r.k, r.layers):
            if l == 0 and m.name != "ressage":
                continue
            halo += 2 * r.world.layers[l].inter_halo * widths[l][0] * F32
    grad = 2 * (int(servers) - 1) * m.parameters() * F32 * int(steps)
    return {"halo": int(halo), "gradient": int(grad), "total": int(halo + grad)}


# ---------------------------------------------------------------------------------------------------
# Row counts from shard arrays (the same rules as engine/views.py and graph/planner.py)
@dataclass
class GpuArrays:
    """What the model reads of one rank's shard slice (shards.RankSlice has all of it)."""

    rank: int  # global rank = server * G + gpu
    gpu: int
    indptr: np.ndarray  # in-edge CSR of this GPU's rows, rebased to 0
    indices: np.ndarray  # sources as server-local ids
    w_indptr: np.ndarray  # world view of its inner rows
    w_src_rank: np.ndarray
    w_src_global_id: np.ndarray
    n_train: int  # inner training rows


@dataclass
class ServerArrays:
    server: int
    hop: np.ndarray  # hop of every server-local id
    offsets: np.ndarray  # [G+1] row offsets of the GPUs
    gpus: List[GpuArrays]
    # The server's whole graph as shards.read_server_graph returns it (what the co-batch sampler
    # draws from); kept by server_arrays_from_build only.
    graph: Optional[Dict[str, np.ndarray]] = None


def server_arrays_from_build(arrays: Dict[str, np.ndarray], server: int) -> ServerArrays:
    """From the datasets of one server file (preprocess.build.build_server names) without features."""
    offsets = np.asarray(arrays["vertices/offsets"], dtype=np.int64)
    w_off = np.asarray(arrays["world/offsets"], dtype=np.int64)
    ip, ix = np.asarray(arrays["graph/indptr"], np.int64), arrays["graph/indices"]
    wip = np.asarray(arrays["world/indptr"], np.int64)
    hop = np.asarray(arrays["vertices/hop"], np.int64)
    train = np.asarray(arrays["split/train"], bool) & (hop == 0)
    G = offsets.shape[0] - 1
    gpus = []
    for g in range(G):  # loop over the server's GPUs
        lo, hi, wlo, whi = offsets[g], offsets[g + 1], w_off[g], w_off[g + 1]
        gpus.append(GpuArrays(
            rank=server * G + g, gpu=g, indptr=ip[lo:hi + 1] - ip[lo], indices=ix[ip[lo]:ip[hi]],
            w_indptr=wip[wlo:whi + 1] - wip[wlo], w_src_rank=arrays["world/src_rank"][wip[wlo]:wip[whi]],
            w_src_global_id=arrays["world/src_global_id"][wip[wlo]:wip[whi]],
            n_train=int(np.count_nonzero(train[lo:hi]))))
    graph = {"indptr": ip, "indices": np.asarray(ix, np.int64), "in_degree": arrays.get("graph/in_degree"),
             "hop": hop, "train": np.asarray(arrays["split/train"], bool), "offsets": offsets}
    return ServerArrays(server=server, hop=hop, offsets=offsets, gpus=gpus, graph=graph)


def gpu_arrays_from_slice(sl) -> GpuArrays:
    """From a shards.RankSlice."""
    n = int(sl.n_inner)
    return GpuArrays(rank=int(sl.server) * int(sl.gpus_per_server) + int(sl.gpu), gpu=int(sl.gpu),
                     indptr=sl.indptr, indices=sl.indices, w_indptr=sl.w_indptr, w_src_rank=sl.w_src_rank,
                     w_src_global_id=sl.w_src_global_id, n_train=int(np.count_nonzero(sl.train_mask[:n])))


def _world_halo_pairs(g: GpuArrays) -> np.ndarray:
    """Distinct (owner rank, global id) of this rank's world halo rows, sorted."""
    wr = np.asarray(g.w_src_rank, dtype=np.int64)
    wg = np.asarray(g.w_src_global_id, dtype=np.int64)
    other = wr != g.rank
    if not other.any():
        return np.zeros((0, 2), dtype=np.int64)
    return np.unique(np.stack([wr[other], wg[other]], axis=1), axis=0)


def world_reads(servers: Sequence[ServerArrays], world_size: int) -> np.ndarray:
    """For every rank, how many of its inner rows the given servers' ranks read: summed over all
    servers (an all-reduce under MPI), it is every rank's world send-list length."""
    out = np.zeros(int(world_size), dtype=np.int64)
    for s in servers:
        for g in s.gpus:  # loop over ranks, not vertices
            out += np.bincount(_world_halo_pairs(g)[:, 0], minlength=int(world_size))
    return out


def server_view_rows(s: ServerArrays, gpu: int, depth: int) -> ViewRows:
    """GPU `gpu`'s server view planned for `depth` layers (planner.build_plan, all_active=False):
    layer l reads own and other-GPU rows of hop <= depth-l and computes own rows of hop <= depth-1-l."""
    offsets, hop = s.offsets, s.hop
    own_hop = hop[offsets[gpu]:offsets[gpu + 1]]
    ip = np.asarray(s.gpus[gpu].indptr, dtype=np.int64)
    src = np.asarray(s.gpus[gpu].indices, dtype=np.int64)
    owner = np.searchsorted(offsets, src, side="right") - 1
    halo = np.unique(src[owner != gpu])
    halo_hop = hop[halo]
    # What the other GPUs read from this one: the distinct own rows among each peer's halo sources.
    sent = []
    for g in s.gpus:  # loop over the server's GPUs, not over vertices
        if g.gpu == gpu:
            continue
        src_g = np.asarray(g.indices, dtype=np.int64)
        o = np.searchsorted(offsets, src_g, side="right") - 1
        sent.append(np.unique(src_g[o == gpu]))
    sent = np.concatenate(sent) if sent else np.zeros(0, np.int64)
    sent_hop = hop[sent]
    layers = []
    for l in range(int(depth)):
        lim_in, lim_out = depth - l, depth - 1 - l
        n_own_in = int(np.searchsorted(own_hop, lim_in, side="right"))
        n_dst = int(np.searchsorted(own_hop, lim_out, side="right"))
        layers.append(LayerRows(n_own_in=n_own_in, n_halo=int(np.count_nonzero(halo_hop <= lim_in)),
                                n_dst=n_dst, nnz=int(ip[n_dst]),
                                n_send=int(np.count_nonzero(sent_hop <= lim_in))))
    return ViewRows("server", int(own_hop.shape[0]), int(halo.shape[0]), int(sent.shape[0]), tuple(layers))


def shard_rows(servers: Sequence[ServerArrays], layers: int, k: int, features: int, num_classes: int,
               world_sent: Optional[np.ndarray] = None) -> List[RankRows]:
    """RankRows of every rank of the given servers for an L-layer model with k preloaded layers.

    The server arrays must hold a preload of at least k hops (k = 0 reads only the world view).
    world_sent: every rank's world send-list length (`world_reads` summed over all servers); computed
    from `servers` when they are all the servers."""
    if not 0 <= int(k) <= int(layers):
        raise MemoryModelError(f"k = {k} preloaded layers is outside 0..L = 0..{layers}")
    if world_sent is None:
        world_sent = world_reads(servers, sum(len(s.gpus) for s in servers))
    out = []
    for s in servers:
        G = len(s.gpus)
        for g in s.gpus:
            n_inner = int(np.asarray(g.w_indptr).shape[0] - 1)
            pairs = _world_halo_pairs(g)
            w_inter = int(np.count_nonzero(pairs[:, 0] // G != s.server))
            wl = LayerRows(n_own_in=n_inner, n_halo=int(pairs.shape[0]), n_dst=n_inner,
                           nnz=int(np.asarray(g.w_indptr)[-1]), n_send=int(world_sent[g.rank]), inter_halo=w_inter)
            world = ViewRows("world", n_inner, int(pairs.shape[0]), int(world_sent[g.rank]),
                             tuple([wl] * int(layers)), inter_halo=w_inter)
            server = server_view_rows(s, g.gpu, int(k)) if k > 0 else None
            out.append(RankRows(rank=g.rank, features=int(features), num_classes=int(num_classes),
                                n_inner=n_inner, n_train=g.n_train, layers=int(layers), k=int(k),
                                world=world, server=server))
    return out


def cobatch_server_arrays(graph: Dict[str, np.ndarray], server: int, layers: int, batches: int,
                          fanout: int = -1, sampler: str = "sage", seed: int = 0, epoch: int = 0,
                          iteration: int = 0) -> ServerArrays:
    """The rows of one co-batch (engine/cobatch.py `cob`): the sampler's dependency graph of the
    iteration's targets, split over the server's GPUs by the shard's owners, as ServerArrays whose
    rows are the sample's (sorted by (GPU, hop)).  This is the exact sample the run draws at that
    (epoch, iteration) -- same seed, same sampler -- so its counts are a measurement, not a bound.

    graph: shards.read_server_graph's dict (indptr, indices, hop, train, offsets)."""
    from granndis_hpc.graph.csr import csr_rows
    from granndis_hpc.graph.sampler import CoBatchSampler

    offsets = np.asarray(graph["offsets"], dtype=np.int64)
    G = offsets.shape[0] - 1
    train_ids = np.flatnonzero(np.asarray(graph["train"], bool) & (np.asarray(graph["hop"]) == 0))
    smp = CoBatchSampler(graph["indptr"], graph["indices"], train_ids, batches, layers, sampler, fanout, seed, server)
    sg = smp.sample(smp.epoch_targets(epoch)[iteration], epoch, iteration)
    owner = np.searchsorted(offsets, sg.vertices, side="right") - 1
    perm = np.lexsort((np.arange(sg.vertices.shape[0]), sg.hop, owner))  # (GPU, hop), stable
    new_pos = np.empty_like(perm)
    new_pos[perm] = np.arange(perm.shape[0], dtype=perm.dtype)
    row_off = np.zeros(G + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=G), out=row_off[1:])
    sample_src = new_pos[sg.position_of(sg.indices)]
    gpus = []
    for g in range(G):  # loop over the server's GPUs
        ip, src = csr_rows(sg.indptr, sample_src, perm[row_off[g]:row_off[g + 1]])
        n_t = int(np.count_nonzero(sg.hop[perm[row_off[g]:row_off[g + 1]]] == 0))
        gpus.append(GpuArrays(rank=server * G + g, gpu=g, indptr=ip, indices=src, w_indptr=np.zeros(1, np.int64),
                              w_src_rank=np.zeros(0, np.int64), w_src_global_id=np.zeros(0, np.int64), n_train=n_t))
    return ServerArrays(server=server, hop=sg.hop[perm].astype(np.int64), offsets=row_off, gpus=gpus)


def with_cobatch(world_rows: Sequence[RankRows], cob: Sequence[ServerArrays]) -> List[RankRows]:
    """RankRows of cooperative batching: each rank's co-batch view (all L layers) plus its world view
    (exact evaluation keeps it resident)."""
    by_rank = {g.rank: (s, g) for s in cob for g in s.gpus}
    out = []
    for r in world_rows:
        s, g = by_rank[r.rank]
        view = server_view_rows(s, g.gpu, r.layers)
        # The step's last layer computes the co-batch's targets on this GPU: they are its "inner" rows.
        out.append(replace(r, k=r.layers, server=replace(view, name="cobatch"), n_train=g.n_train,
                           n_inner=g.n_train))
    return out


def measure_step_peak(fn) -> int:
    """Peak bytes torch allocates on CPU while fn() runs, above the level it starts at: every CPU
    allocation and free the profiler records, summed in time order.  (Resident memory is no measure:
    the C heap keeps freed blocks.)  On CUDA use torch.cuda.max_memory_allocated instead."""
    import itertools

    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events()
                     if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU),
                    key=lambda e: e.start_ns())
    return int(max(itertools.accumulate((e.nbytes() for e in events), initial=0)))


# ---------------------------------------------------------------------------------------------------
# Options and the choice
def rows_held(r: RankRows) -> int:
    """Rows the views a GPU trains on hold: the server view's own and halo rows (k >= 1), plus the
    world view's halo rows when a layer runs on it (its own rows are the inner rows, already counted).
    The two views keep separate tensors, so a row in both halos counts twice, as its memory does."""
    n = (r.server.n_own + r.server.n_halo) if r.k > 0 else r.world.n_own
    return int(n + (r.world.n_halo if r.k < r.layers else 0))


@dataclass
class Option:
    """One way to train: `mode` fb|flx|eas|cob, `k` preloaded layers (flx), `batches` (cob)."""

    mode: str
    k: int = 0
    batches: int = 1
    peak: int = 0  # estimated peak bytes, max over ranks
    peak_rank: int = 0
    breakdown: Dict[str, int] = field(default_factory=dict)  # of the peak rank
    rows_per_gpu: int = 0  # max over ranks of the rows a GPU holds (own + halo, training views)
    inter_server_bytes: Dict[str, int] = field(default_factory=dict)
    source: str = ""  # the shard set (or build) it reads

    @property
    def label(self) -> str:
        # The knob that tells options of one mode apart: k for flx, the co-batch count for cob.
        knob = {"flx": f" k={self.k}", "cob": f" batches={self.batches}"}
        return self.mode + knob.get(self.mode, "")

    def to_dict(self) -> dict:
        return {"mode": self.mode, "k": self.k, "batches": self.batches, "label": self.label, "peak_bytes": self.peak,
                "peak_rank": self.peak_rank, "breakdown": dict(self.breakdown), "rows_per_gpu": self.rows_per_gpu,
                "inter_server_bytes": dict(self.inter_server_bytes), "source": self.source}


def make_option(mode: str, rows: Sequence[RankRows], m: ModelSpec, servers: int, device: str = "cpu",
                batches: int = 1, source: str = "") -> Option:
    ests = [estimate(r, m, device) for r in rows]
    worst = max(range(len(ests)), key=lambda i: ests[i]["total"])
    held = max(rows_held(r) for r in rows)
    return Option(mode=mode, k=int(rows[0].k) if mode in ("flx", "fb") else int(rows[0].layers), batches=batches,
                  peak=int(ests[worst]["total"]), peak_rank=int(rows[worst].rank), breakdown=ests[worst]["breakdown"],
                  rows_per_gpu=int(held), source=source,
                  # one optimizer step per co-batch (batches is 1 for the full-graph modes)
                  inter_server_bytes=inter_server_bytes(rows, m, servers, steps=batches))


@dataclass
class Decision:
    """What `choose` picked (None when nothing fits), its estimate, and what it rejected and why."""

    choice: Optional[Option]
    budget: int
    rejected: List[Option]
    reason: str

    def to_dict(self) -> dict:
        return {"choice": None if self.choice is None else self.choice.to_dict(), "budget_bytes": self.budget,
                "reason": self.reason, "rejected": [o.to_dict() for o in self.rejected]}


def preference(o: Option) -> tuple:
    """GraNNDis' order (paper §5.1, Fig. 13b): full-batch FLX with the largest k, then FLX on EAS, then
    cooperative batching with the fewest (largest) co-batches.  fb (k = 0) comes last: it replicates
    nothing but sends every layer's halo over the slow links, which is what GraNNDis avoids; it is
    chosen only when nothing of GraNNDis' fits (it is also the lightest full-batch option)."""
    return {"flx": (0, -o.k), "eas": (1, 0), "cob": (2, o.batches), "fb": (3, 0)}[o.mode]


def _inter_total(o: Option) -> int:
    return int(sum(o.inter_server_bytes.values()))


def drop_dominated(options: Sequence[Option]) -> Tuple[List[Option], List[str]]:
    """The exact full-graph options (fb, flx) without those another one of the same shard set beats on
    both counts: no more memory and no more inter-server bytes, less of one (issue 21, item 13: flx
    k = 1 of a 2-layer model holds more rows than fb for the same inter-server bytes, since fb caches its
    layer-0 halo).  Returns (kept, one line per dropped option saying why)."""
    exact = [o for o in options if o.mode in ("fb", "flx")]
    kept, why = [], []
    for o in options:
        better = next((b for b in exact if o.mode in ("fb", "flx") and b is not o and b.source == o.source
                       and o.inter_server_bytes and b.inter_server_bytes  # known for both
                       and b.peak <= o.peak and _inter_total(b) <= _inter_total(o)
                       and (b.peak < o.peak or _inter_total(b) < _inter_total(o))), None)
        if better is None:
            kept.append(o)
        else:
            why.append(f"{o.label} (dominated by {better.label}: {format_size_(better.peak)} <= "
                       f"{format_size_(o.peak)} per GPU, {_inter_total(better):,} <= {_inter_total(o):,} "
                       f"inter-server bytes per epoch)")
    return kept, why


def format_size_(n):
    from granndis_hpc.units import format_size
    return format_size(n)


def choose(options: Sequence[Option], budget_bytes: int) -> Decision:
    """The first option in GraNNDis' preference order whose estimated peak fits the budget."""
    from granndis_hpc.units import format_size

    options, dominated = drop_dominated(options)
    dropped = ("; not considered: " + ", ".join(dominated)) if dominated else ""
    ordered = sorted(options, key=preference)
    for i, o in enumerate(ordered):
        if o.peak <= budget_bytes:
            rejected = ordered[:i]
            # The order as preference() applies it (one ranking, the same in `plan` and --mode auto).
            why = (f"{o.label} is the first of GraNNDis' order (flx with the largest k, then EAS, then cob with "
                   f"the fewest co-batches, then fb) whose "
                   f"estimated peak {format_size(o.peak)} per GPU fits {format_size(budget_bytes)}")
            if rejected:
                why += "; rejected: " + ", ".join(f"{r.label} ({format_size(r.peak)})" for r in rejected)
            return Decision(o, int(budget_bytes), rejected, why + dropped)
    if not ordered:
        return Decision(None, int(budget_bytes), [], "no option was estimated for this job, so none can be chosen")
    need = min(o.peak for o in ordered)
    # A budget the user can paste: whole MiB, rounded up (format_size rounds to 3 digits).
    paste = f"{-(-need // (1 << 20))}MiB"
    return Decision(None, int(budget_bytes), list(ordered),
                    f"nothing fits {format_size(budget_bytes)} per GPU: the smallest estimate is "
                    f"{format_size(need)} ({min(ordered, key=lambda o: o.peak).label if ordered else 'none'}); "
                    f"use --memory-per-gpu {paste} or more, more servers/GPUs, or more co-batches" + dropped)


# ---------------------------------------------------------------------------------------------------
# From shard sets on disk
def read_shard_set(path: str) -> Tuple[dict, List[ServerArrays]]:
    """The manifest and every server's ServerArrays of a shard set (reads each rank's slice)."""
    from granndis_hpc import shards

    manifest = shards.read_manifest(path)
    out = []
    for s in range(int(manifest["servers"])):
        gpus, sl = [], None
        for g in range(int(manifest["gpus_per_server"])):
            sl = shards.read_rank_slice(path, manifest, s, g)
            gpus.append(gpu_arrays_from_slice(sl))
        out.append(ServerArrays(s, sl.server_hop.astype(np.int64), sl.server_offsets.astype(np.int64), gpus))
    return manifest, out


def model_for(manifest: dict, name: str, hidden: int, layers: int, **kw) -> ModelSpec:
    ds = manifest["dataset"]
    return ModelSpec(name, int(ds["num_features"]), int(hidden), int(ds["num_classes"]), int(layers), **kw)


def options_from_arrays(servers: Sequence[ServerArrays], kind: str, hops: int, layers: int, m: ModelSpec,
                        n_servers: int, device: str = "cpu", source: str = "",
                        world_sent: Optional[np.ndarray] = None, ks: Optional[Sequence[int]] = None) -> List[Option]:
    """The options one set of server arrays offers: a full preload of h hops serves fb and flx with any
    k <= min(h, L) (rows deeper than k stay resident but inactive); an EAS set serves eas."""
    F, C = m.features, m.num_classes
    if kind == "eas":
        return [make_option("eas", shard_rows(servers, layers, layers, F, C, world_sent), m, n_servers, device,
                            source=source)]
    ks = range(0, min(int(hops), int(layers)) + 1) if ks is None else ks
    return [make_option("fb" if k == 0 else "flx", shard_rows(servers, layers, k, F, C, world_sent), m, n_servers,
                        device, source=source) for k in ks]


def estimate_shard_set(path: str, model: str, hidden: int, layers: Optional[int] = None, k: Optional[int] = None,
                       device: str = "cpu", **model_kw) -> List[dict]:
    """Per-rank estimates (`estimate`'s dicts) for a shard set on disk.  k defaults to the set's
    preload (min(hops, L)) for a full set, L (all layers on the EAS server view) for an EAS set."""
    manifest, servers = read_shard_set(path)
    L = int(layers or manifest["layers"])
    pre = manifest["preload"]
    if k is None:
        k = L if pre["kind"] == "eas" else min(int(pre["hops"]), L)
    if pre["kind"] == "full" and k > int(pre["hops"]):
        raise MemoryModelError(f"{path} preloads {pre['hops']} hop(s), which cannot run k = {k} preloaded layers")
    m = model_for(manifest, model, hidden, L, **model_kw)
    rows = shard_rows(servers, L, k, m.features, m.num_classes)
    return [estimate(r, m, device) for r in rows]


def choose_shard_sets(paths: Sequence[str], model: str, hidden: int, layers: int, budget_bytes: int,
                      device: str = "cpu", batches: Sequence[int] = (2, 4, 8, 16, 32, 64), fanout: int = -1,
                      sampler: str = "sage", seed: int = 0, job: Optional[Tuple[int, int]] = None,
                      **model_kw) -> Decision:
    """`--mode auto`: the options the shard sets offer (full sets: fb and flx k <= hops; EAS sets: eas,
    and cob with each co-batch count in `batches`), estimated, and the choice for the budget.

    Reads every rank's slice of every set (features included) and samples the first co-batch on
    the calling process: call it on one rank and broadcast the Decision.  device="cuda" for a GPU
    run (bool dropout masks)."""
    from granndis_hpc import shards

    manifests = {path: shards.read_manifest(path) for path in paths}
    usable, skipped = fitting_sets(manifests, layers, job)
    if not usable:
        raise MemoryModelError("--mode auto: none of the shard sets can run this job: " + "; ".join(skipped))
    options = []
    for path in usable:
        manifest, servers = read_shard_set(path)
        m = model_for(manifest, model, hidden, layers, **model_kw)
        pre = manifest["preload"]
        S = int(manifest["servers"])
        found = options_from_arrays(servers, pre["kind"], int(pre["hops"]), layers, m, S, device, source=path)
        if int(manifest["layers"]) != layers:  # only fb serves a set built for another depth
            options += [o for o in found if o.mode == "fb"]
            continue
        options += found
        if pre["kind"] == "eas" or int(pre["hops"]) >= layers:
            base = shard_rows(servers, layers, 0, m.features, m.num_classes)
            graphs = [shards.read_server_graph(path, manifest, s) for s in range(S)]
            for b in batches:
                n_train = min(int(np.count_nonzero(g["train"] & (g["hop"] == 0))) for g in graphs)
                if b > n_train:
                    continue
                cob = [cobatch_server_arrays(g, s, layers, b, fanout, sampler, seed) for s, g in enumerate(graphs)]
                options.append(make_option("cob", with_cobatch(base, cob), m, S, device, batches=b, source=path))
    decision = choose(options, budget_bytes)
    if skipped:
        import dataclasses
        decision = dataclasses.replace(decision, reason=decision.reason + "; sets not considered: " + "; ".join(skipped))
    return decision


def fitting_sets(manifests: Dict[str, dict], layers: int, job: Optional[Tuple[int, int]]) -> Tuple[list, list]:
    """(the shard sets --mode auto may choose among, why each other one is left out).  Every set must
    hold the same dataset (one content digest; issue 21, item 14: a list of a CiteSeer and a Cora set
    trained Cora), else MemoryModelError; a set built for another S x G than the job's is left out (it
    would be picked and then refused)."""
    def dataset(m):
        ds = m["dataset"]
        return ds.get("content_sha256") or f"name {ds.get('name')!r}"
    kinds = {}
    for path, m in manifests.items():
        kinds.setdefault(dataset(m), []).append(f"{path} ({m['dataset'].get('name')})")
    if len(kinds) > 1:
        raise MemoryModelError("--mode auto: --shards lists sets of different datasets (content digests differ: "
                               + " vs ".join(", ".join(v) for v in kinds.values())
                               + "); give sets built from one dataset")
    usable, skipped = [], []
    for path, m in manifests.items():
        S, G = int(m["servers"]), int(m["gpus_per_server"])
        if job is not None and (S, G) != tuple(job):
            skipped.append(f"{path} is built for {S} servers x {G} GPUs, this job runs {job[0]} x {job[1]}")
        else:
            usable.append(path)
    return usable, skipped

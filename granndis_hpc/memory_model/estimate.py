"""The pure estimate: per-GPU memory of a training plan from row counts, with no I/O.

No HDF5, no sampling, no torch: `estimate(rows, model, device)` from a `RankRows` (row counts per
layer, built by hand or by memory_model/arrays.py from shard arrays).  What is model-specific (conv
widths, parameters, what autograd saves per layer, which layers read the static halo) is the model's
own estimate, found through its registry entry (granndis_hpc/registry.py `estimator`; memory_model/stacks.py
ModelEstimate): this module names no model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from granndis_hpc.registry import MODELS, linear_head_problem, model_options
from granndis_hpc.units import FLOAT32_BYTES as F32
from granndis_hpc.units import INT64_BYTES as I64

from .graph_bytes import _graph_bytes, _split_graph_bytes
from .host import host_parts
from .induced import inductive_parts
from .stacks import send_rows
from .typed_widths import view_width


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
    n_send_once: Optional[int] = None  # of those, on the per-server route (once per other server)
    inter_halo: int = 0  # of n_halo: rows received from other servers (world view only)
    inter_once: Optional[int] = None  # of inter_halo: those it relays on --halo-route per-server (None: all)

    @property
    def n_src(self) -> int:
        return self.n_own_in + self.n_halo


@dataclass(frozen=True)
class PeerCounts:
    """One rank's world view per sending rank, each of world-size length (memory_model/payload.py, which
    counts fb's partial payloads from them): rows_from[a] the distinct rows of rank a it reads;
    partials_from[a] its inner rows with an in-edge from a row of a; once_from[a] of rows_from[a] those it
    relays on the per-server route (a's own server's: 0); edges_from[a] its rows' in-edges from a's rows."""

    rows_from: Tuple[int, ...]
    partials_from: Tuple[int, ...]
    once_from: Tuple[int, ...]
    edges_from: Tuple[int, ...]


@dataclass(frozen=True)
class ViewRows:
    """A view: all its own rows, its full halo (static features exchanged once) and its L graphs."""

    name: str  # "server" | "world" | "cobatch"
    n_own: int
    n_halo: int  # distinct halo rows of the full plan
    n_send: int  # rows of the full send list (the static exchange)
    layers: Tuple[LayerRows, ...]
    inter_halo: int = 0  # of n_halo: rows owned by other servers
    inter_once: Optional[int] = None  # of inter_halo: those it relays on the per-server route (None: all)
    # The world view per sending rank (memory_model/payload.py), which fb's partial payloads are counted
    # from; None where they were not counted (fb then offers rows only).
    peers: Optional[PeerCounts] = None


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
    # --inductive, counted on the induced graphs (memory_model/induced.py): world and server are the
    # train-induced graph's views; evaluation also holds these (the full and the train+validation-induced
    # world views), and on a CPU device the shard slice (host_bytes) shares the memory.
    evaluation: Tuple[ViewRows, ...] = ()
    host_bytes: int = 0
    server_file: Tuple[int, int] = (0, 0)  # rows and edges of the server's file (what co-batches sample)

    def training_layers(self) -> List[Tuple[str, LayerRows]]:
        out: List[Tuple[str, LayerRows]] = []
        for l in range(self.layers):
            if l < self.k:
                assert self.server is not None  # k > 0: the server view (the class docstring)
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


# Bytes of an activation number under each --precision.
ACTIVATION_BYTES = {"fp32": F32, "bf16": 2}
# The models whose layers save under bf16 what they save in float32 at half width (measured:
# tests/unit/test_precision.py).  Others keep float32 parts under autocast (GAT's softmax and GIN's eps
# read float32 parameters; SAGE-max's maximum): their activations are estimated at float32 width, an
# upper bound (measured 1.3-1.9x what bf16 saves).
HALF_WIDTH_MODELS = ("sage", "gcn", "ressage", "sage-sum")


# ---------------------------------------------------------------------------------------------------
# Models: the estimate registered with each (memory_model/stacks.py; test_memory_model checks it against the models)
@dataclass(frozen=True)
class ModelSpec:
    name: str
    features: int
    hidden: int
    num_classes: int
    layers: int  # message-passing layers (the row counts' depth)
    dropout: float = 0.5
    norm: bool = False  # LayerNorm between convs, for the models that take it
    checkpoint_activations: bool = False  # recompute blocks (the models whose entry is checkpointable)
    options: Tuple[Tuple[str, Any], ...] = ()  # the model's extra constructor options (registry.model_options)
    linear_layers: int = 0  # per-vertex Linear layers after the `layers` convs (--linear-layers)
    # --inductive (engine/inductive.py): evaluation also holds the world views of the full and the
    # train+validation-induced graphs (memory_model/induced.py).
    inductive: bool = False
    multilabel: bool = False  # multi-label targets: binary cross-entropy (its saved tensors differ)
    # The exchange groups whose halos a layer computes behind (--overlap-halos: ("world",) by default,
    # ("server", "world") for all; () is --no-overlap): the order whose memory is estimated.
    overlap: Tuple[str, ...] = ("world",)
    # --precision (engine/precision.py): bf16 computes and saves activations at 2 bytes a number.
    precision: str = "fp32"
    halo_route: str = "per-server"  # --halo-route (engine/halo_route.py): how world halo rows cross servers
    # The graph's relations, for the models of heterogeneous graphs (registry ``typed``: their per-relation
    # tensors); None: memory_model/hetero_stacks.py assumes DEFAULT_RELATIONS.
    relations: Optional[int] = None
    relation_rows: Optional[float] = None  # relations into a destination row's type, averaged (None: all)
    # Each vertex type's feature width (a heterogeneous set's; None: unknown or one type): the relational
    # models' per-type input projection (memory_model/hetero_stacks.py ProjectedInput) reads them.
    type_widths: Optional[Tuple[int, ...]] = None
    # Each vertex type's vertex count, beside type_widths: rows held at their own widths are counted at
    # the mean width (memory_model/typed_widths.py); None: at the widest.
    type_counts: Optional[Tuple[int, ...]] = None
    # Each conv's partial width where fb and flx may send partial aggregates (--halo-payload partial | smaller:
    # memory_model/payload.py with_payloads applies the engine's conditions); (): estimated with rows only.
    message_widths: Tuple[int, ...] = ()
    payload_refusal: str = ""  # why they are not offered where the model or the run refuses them ("": none)
    # On a CPU device, estimate the rank's resident memory (what `preprocess plan --device cpu` compares with
    # a CPU run's peak RSS): the process, its shard slice and the heap's holes too (memory_model/host.py).
    # --mode auto leaves it off: its --memory-per-gpu is what the (emulated) GPU's tensors may take.
    resident: bool = False

    def __post_init__(self):
        if self.precision not in ACTIVATION_BYTES:
            raise MemoryModelError(f"unknown precision {self.precision!r}; choose one of {', '.join(ACTIVATION_BYTES)}")
        if self.name not in MODELS:
            raise MemoryModelError(f"unknown model {self.name!r}; choose one of {', '.join(MODELS)}")
        if MODELS.entry(self.name).get("estimator") is None:
            raise MemoryModelError(
                f"model {self.name!r} has no memory estimate, which --mode auto and `preprocess plan` need: "
                f"register it with register_model({self.name!r}, estimator=...) (a memory_model.stacks.ModelEstimate), "
                f"or choose a mode")
        for k in ("features", "hidden", "num_classes", "layers"):
            if int(getattr(self, k)) < 1:
                raise MemoryModelError(f"{k} must be >= 1, got {getattr(self, k)}")
        problem = linear_head_problem(self.name, self.layers + self.linear_layers, self.linear_layers)
        if problem:
            raise MemoryModelError(problem)
        try:
            declared = model_options(self.name)
            declared.update(dict(self.options))
            unknown = sorted(set(dict(self.options)) - set(model_options(self.name)))
        except ValueError as exc:
            raise MemoryModelError(str(exc)) from None
        if unknown:
            raise MemoryModelError(f"model {self.name!r} has no option {unknown[0]!r}")
        object.__setattr__(self, "options", tuple(sorted(declared.items())))

    @property
    def activation_bytes(self) -> int:
        """Bytes of one activation number (rows, their halo, their gradients): 4, or 2 under bf16."""
        return ACTIVATION_BYTES[self.precision]

    @property
    def estimator(self):
        """The model's ModelEstimate (its registry entry's `estimator`)."""
        return MODELS.entry(self.name).resolve("estimator")

    def option(self, name: str):
        """One of the model's extra constructor options (its declared default when not given)."""
        return dict(self.options)[name]

    def widths(self) -> List[Tuple[int, int]]:
        """(in, out) width of every conv."""
        return self.estimator.widths(self)

    @property
    def total_layers(self) -> int:
        """Every layer: the convs and the per-vertex Linear head."""
        return self.layers + self.linear_layers

    def parameters(self) -> int:
        """Number of parameters (floats)."""
        return int(self.estimator.parameters(self))


# ---------------------------------------------------------------------------------------------------
# What autograd saves
def _loss_saved(n_train: int, classes: int, multilabel: bool = False) -> Tuple[int, int]:
    """logits[rows]: the row index (the trainer's, allocated at set-up); cross entropy: log-softmax
    result, the target, total_weight; multi-label (binary cross-entropy with logits): the logits' rows
    and the float32 0/1 target."""
    if multilabel:
        return n_train * I64 + 2 * n_train * classes * F32, n_train * I64
    return n_train * I64 + n_train * classes * F32 + n_train * I64 + F32, n_train * I64


def overlapped_layers(r: RankRows, m: ModelSpec) -> Tuple[List[bool], List[bool]]:
    """(pending, split) per training layer in the order m.overlap describes.  pending[l]: layer l's
    halo is in flight while its conv aggregates the own rows' edges (its view's group overlaps and the
    layer exchanges; nn/graph.PendingRows).  split[l]: layer l computes the rows layer l + 1 sends
    first (boundary-first pipelining, nn/graph.RowSplit), which it does when layer l + 1 is pending."""
    pending = [name in m.overlap and m.estimator.exchanged(l, m) for l, (name, _) in enumerate(r.training_layers())]
    return pending, [l + 1 < len(pending) and pending[l + 1] for l in range(len(pending))]


def activation_layers(r: RankRows, m: ModelSpec, device: str = "cpu") -> Dict[str, Any]:
    """Bytes autograd keeps for the backward pass, per layer (as SavedBytes counts: each storage once).

    Returns {"per_layer": [...], "head": bytes, "loss": bytes, "saved": the total SavedBytes counts,
    "fresh"/"fresh_per_layer": the part the step allocates (not the weights, the input features or
    index tensors that exist before it),
    "recompute": with checkpointing, the largest block's activations, held again while the backward
    recomputes it (0 without)}.  The model's layers are its estimator's; the loss is the trainer's."""
    mask_bytes = 1 if device == "cuda" else F32  # dropout masks: bool on CUDA, float on CPU
    if m.activation_bytes != F32 and m.name in HALF_WIDTH_MODELS:  # a float mask is in the rows' dtype,
        mask_bytes *= 2 if device == "cuda" else 1  # halved below with them
    a = m.estimator.activations(r, m, mask_bytes)
    if m.activation_bytes != F32 and m.name in HALF_WIDTH_MODELS:
        a = _half_width(a, r, m)
    # Boundary-first layers save what their split adds (SAGE: lin_self's copies of the own rows it reads
    # by RowSplit, instead of a slice of the gathered rows); a model that declares nothing adds nothing.
    # Overlapped layers save what their conv declares for split sources (SAGE at equal widths: no aggregate).
    split_saved = getattr(m.estimator, "split_saved", None)
    pending_saved = getattr(m.estimator, "pending_saved", None)
    if split_saved is not None:
        widths, width_ratio = m.widths(), (m.activation_bytes / F32 if m.name in HALF_WIDTH_MODELS else 1)
        for l, ((_, lr), pending, split) in enumerate(zip(r.training_layers(), *overlapped_layers(r, m))):
            extra = split_saved(lr, *widths[l]) if split else 0
            if pending and pending_saved is not None and not (m.checkpoint_activations and l >= 1):
                extra += pending_saved(lr, *widths[l])
            extra = int(extra * width_ratio)
            a["per_layer"][l] += extra
            a["fresh_per_layer"][l] += extra
    loss, loss_pre = _loss_saved(r.n_train, m.num_classes, m.multilabel)
    saved = sum(a["per_layer"]) + a["head"] + loss
    return {"per_layer": list(a["per_layer"]), "fresh_per_layer": list(a["fresh_per_layer"]), "head": a["head"],
            "loss": loss, "saved": saved, "fresh": sum(a["fresh_per_layer"]) + a["head_fresh"] + loss - loss_pre,
            "recompute": a["recompute"]}


def _half_width(a: Dict[str, Any], r: RankRows, m: ModelSpec) -> Dict[str, Any]:
    """The model's float32 activation bytes as --precision bf16 saves them (engine/precision.py): every
    float tensor a layer saves at half width -- its rows, dropout masks, and the bfloat16 copies of the
    weights autocast makes (allocated by the step, not before it) -- and the exchanges' send indices
    (int64) as they are.  The loss is float32 (activation_layers adds it unchanged).  Exact for models
    without LayerNorm; a LayerNorm keeps its statistics (two float32 numbers a row) and parameters in
    float32, which this counts at half width (tests/unit/test_precision_memory.py measures the gap)."""
    est, seen, out, fresh = m.estimator, set(), [], []
    for l, (b, (_, lr)) in enumerate(zip(a["per_layer"], r.training_layers())):
        recomputed = m.checkpoint_activations and l >= 1  # a recomputed block saves only its input rows
        # The exchange saves its send index (int64) once per rows object (the world view's layers share one).
        index = 0
        if not recomputed and est.exchanged(l, m) and id(lr) not in seen:
            seen.add(id(lr))
            index = send_rows(lr, m.halo_route) * I64
        out.append((b - index) // 2 + index)
        fresh.append(out[-1] - index)
    return {"per_layer": out, "fresh_per_layer": fresh, "head": a["head"] // 2, "head_fresh": a["head"] // 2,
            "recompute": a["recompute"] // 2}


# ---------------------------------------------------------------------------------------------------
# Static memory
def step_peak(r: RankRows, m: ModelSpec, act: Dict[str, Any]) -> Dict[str, Any]:
    """Peak bytes a training step allocates above what it starts with (activations and transients).

    Forward at layer l: the activations saved so far (layers <= l) plus the larger of the exchange's
    buffers (send + receive rows at the input width) and the conv's two output terms (a layer reading
    the static halo features: their gather's two copies, the halo rows and the cat).  Backward at
    layer l: the activations of layers <= l (later ones are freed as the backward passes them) plus
    the gradient of the output and, where the input needs a gradient, the gradients of the source
    rows (SAGE: two paths, self and aggregation; GCN: one), of the rows sent back to their owners and of the own
    rows they add into; a checkpointed block also holds its recomputed activations.  The end of the
    forward holds every activation plus the logits and the loss terms."""
    tl = r.training_layers()
    widths = m.widths()
    est = m.estimator
    A = m.activation_bytes  # rows, halo buffers and row gradients; weight gradients are float32
    # Only what the step allocates: saved inputs, weights and index tensors exist before it.
    prefix = np.cumsum(act["fresh_per_layer"]).tolist()
    best, where = int(act["fresh"]) + r.n_inner * m.num_classes * F32, "loss"
    # The per-vertex head's backward (--linear-layers) runs while every activation is still held.
    for j, (win, wout) in enumerate(est.linear_widths(m)):
        # the gradients of its output, input and weight
        n = est.linear_rows(r)
        value = int(act["fresh"]) + n * (win + wout) * A + win * wout * F32 \
            + (act["recompute"] if m.checkpoint_activations else 0)
        if value > best:
            best, where = value, f"backward layer {m.layers + j}"
    halo_max = 0
    pending = overlapped_layers(r, m)[0]
    for l, (_, lr) in enumerate(tl):
        win, wout = widths[l]
        exchanged = est.exchanged(l, m)  # else the layer reads the static halo features
        input_grad = exchanged
        halo = (lr.n_send + lr.n_halo) * win * A if exchanged else 0
        halo_max = max(halo_max, halo)
        # Per-edge tensors a conv allocates at once (GAT's messages [E, heads, C]; memory_model/zoo_stacks.py),
        # in the forward and again as their gradient in the backward.
        edge = est.edge_transient(lr, m, l, win, wout) if hasattr(est, "edge_transient") else 0
        # Overlapped, the exchange's buffers are alive while the conv computes its own and halo partial
        # products and their sum; without overlap the exchange is done before the conv starts.
        conv = max(2 * lr.n_dst * wout, 3 * lr.n_dst * min(win, wout)) * A + edge
        fwd = prefix[l] + (halo + conv if pending[l] else max(halo, 2 * lr.n_dst * wout * A + edge))
        if not exchanged:
            # The static halo's gather (engine/views.py): the halo rows selected from the view's feature
            # tensor and their cat with the own rows, float32, alive together (on Cora's 1433-wide input
            # the forward's peak: measured).
            fwd = max(fwd, prefix[l] - act["fresh_per_layer"][l] + (lr.n_src + lr.n_halo) * win * F32)
        if input_grad:
            # SAGE's source rows get two gradients (lin_self's slice and the aggregation), GCN's one:
            # the estimator's grad_paths.  The autograd engine adds the second into the first and frees it
            # before the exchange's backward allocates the rows sent back and the own rows they add into.
            paths = est.grad_paths
            grads = lr.n_dst * wout + max(paths * lr.n_src * win,
                                          lr.n_src * win + lr.n_send * win + lr.n_own_in * win)
        else:
            grads = lr.n_dst * wout + (lr.n_src * wout if wout < win else 0)
        # + the weight gradient, computed then added into .grad (one weight at a time).
        recompute = act["recompute"] if m.checkpoint_activations and l >= 1 else 0
        bwd = prefix[l] + grads * A + win * wout * F32 + edge + recompute
        for value, name in ((fwd, f"forward layer {l}"), (bwd, f"backward layer {l}")):
            if value > best:
                best, where = int(value), name
    return {"peak": int(best), "where": where, "halo": int(halo_max)}


def estimate(r: RankRows, m: ModelSpec, device: str = "cpu", adam: bool = True) -> Dict[str, Any]:
    """Memory of one rank: {"breakdown": {component: bytes}, "total": peak bytes, ...}."""
    check_rank_rows(r)
    if m.layers != r.layers:
        raise MemoryModelError(f"the model has {m.layers} layers, the row counts {r.layers}")
    est = m.estimator
    tl = r.training_layers()

    features = 0
    # A model that projects its input first (memory_model/hetero_stacks.py projection) holds no halo
    # feature rows (engine/views.py static_features).
    halo_features = 0 if getattr(est, "projects", lambda _: False)(m) else 1
    # Own rows at their own types' widths where the model projects a set of several widths.
    own_width = view_width(m)
    for v in r.views():
        features += int((v.n_own * own_width + v.n_halo * halo_features * r.features) * F32)
        features += (v.n_own + v.n_halo) * F32
        features += v.n_send * I64  # the full send list
    graph = 0
    for v in r.views():
        # The world view's layers share one graph and one set of matrices (engine/views.py): counted
        # once, with every cache any of its layers uses.
        shared: Dict[Any, Tuple[LayerRows, bool, bool]] = {}
        for l, lr in enumerate(v.layers):
            trained = (v.name != "world" and l < r.k) or (v.name == "world" and l >= r.k)
            used_forward = trained or v.name == "world"  # evaluation runs every world layer
            key = "world" if v.name == "world" else l
            fwd, transpose = shared.get(key, (lr, False, False))[1:]
            shared[key] = (lr, fwd or used_forward, transpose or (trained and est.aggregation_input_grad(m, l)))
        graph += sum(_graph_bytes(lr, est.self_loops, fwd, transpose) for lr, fwd, transpose in shared.values())
    # Overlapped layers also hold their split matrices: training's (with transposes) and evaluation's
    # (the world view's layers, forward only, when its exchanges overlap).  A graph caches each split
    # once, so layers sharing one graph (the world view's) count each (rows object, row split) once,
    # with its transposes when any of them trains through it.
    pending, split = overlapped_layers(r, m)
    splits: Dict[Tuple[int, bool], Any] = {}

    def count(lr, row_split: bool, transposed: bool):
        key = (id(lr), row_split)
        splits[key] = (lr, row_split, transposed or (key in splits and splits[key][2]))
    for l, (_, lr) in enumerate(tl):
        if pending[l]:
            count(lr, split[l], est.aggregation_input_grad(m, l))
    if "world" in m.overlap:
        for l, lr in enumerate(r.world.layers):
            trained_here = l >= r.k and pending[l]
            if est.exchanged(l, m) and not trained_here:
                count(lr, l + 1 < r.layers, False)
    graph += sum(_split_graph_bytes(lr, est.self_loops, s, t) for lr, s, t in splits.values())
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
    if m.inductive:  # evaluation's views, its forward and the shard slice (memory_model/induced.py)
        if not r.evaluation:
            raise MemoryModelError(f"rank {r.rank}: an inductive estimate needs the evaluation views' rows "
                                   "(RankRows.evaluation: memory_model/induced_sets.py, "
                                   "preprocess/plan/induced_counts.py)")
        breakdown.update(inductive_parts(r, m, device, int(act["fresh"]) + transient))
    elif device == "cpu" and m.resident:  # the process, its slice and the heap's holes (memory_model/host.py)
        breakdown.update(host_parts(r, m, int(act["fresh"]) + transient, est.heap_holes))
    total = sum(breakdown.values())
    return {"rank": r.rank, "k": r.k, "breakdown": breakdown, "total": int(total),
            "activation_saved": int(act["saved"]), "activation_per_layer": act["per_layer"],
            "step_peak": int(step["peak"]), "step_peak_layer": step["where"],
            "rows_per_layer": [lr.n_src for _, lr in tl], "computed_per_layer": [lr.n_dst for _, lr in tl]}


def inter_server_bytes(ranks: Sequence[RankRows], m: ModelSpec, servers: int, steps: int = 1,
                       halo_bytes: Optional[np.ndarray] = None) -> Dict[str, int]:
    """Inter-server bytes per epoch, summed over ranks, as the ledger counts them.

    Halo: every world-exchange layer l >= k sends, forward, the inter-server halo rows at the layer's
    input width (m.activation_bytes a number) and returns their gradients backward (x2); layer 0 of plain
    models reads the static features exchanged at set-up (the estimator's `exchanged`), so in fb it costs
    nothing per epoch.  Gradients: the leaders' ring all-reduce moves 2 (S-1) x params x 4 bytes in all
    (cluster/accounting.py), once per optimizer step (`steps` per epoch: the co-batches of cob).
    halo_bytes: [rank, (inter, intra)] where the halo is not rank_halo_bytes' (fb's partial payloads)."""
    halo = (sum(rank_halo_bytes(r, m)[0] for r in ranks) if halo_bytes is None
            else int(np.asarray(halo_bytes)[:, 0].sum()))
    grad = 2 * (int(servers) - 1) * m.parameters() * F32 * int(steps)
    return {"halo": int(halo), "gradient": int(grad), "total": int(halo + grad)}


def rank_halo_bytes(r: RankRows, m: ModelSpec) -> Tuple[int, int]:
    """(inter-server, intra-server) halo bytes of one rank per step: each exchanging layer's halo rows at
    its input width, received forward and their gradients returned backward (x2).  Server-side layers
    (l < k) exchange inside the server only; world layers split by their inter_halo rows, or on the
    per-server route by the rows this rank relays (inter_once; the others arrive from a relay of its server)."""
    widths = m.widths()
    inter = intra = 0
    once = m.halo_route == "per-server"
    for l, (view, lr) in enumerate(r.training_layers()):
        if m.estimator.exchanged(l, m):
            crossing = 0 if view != "world" else lr.inter_once if once and lr.inter_once is not None else lr.inter_halo
            inter += 2 * crossing * widths[l][0] * m.activation_bytes
            intra += 2 * (lr.n_halo - crossing) * widths[l][0] * m.activation_bytes
    return int(inter), int(intra)

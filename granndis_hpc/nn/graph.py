"""The one-hop graph of one layer (``LayerGraph``) and neighbourhood aggregation over it.

A rank orders its rows so that the rows later layers need form a prefix.  At layer l the engine hands
the model a ``LayerGraph``: ``n_dst`` destination rows (the first ``n_dst`` source rows, so destination
row i and source row i are the same vertex), ``n_src`` source rows (own active rows followed by halo
rows from peers) and the in-edges of the destination rows as CSR over source indices.

Degrees are *given*, never recomputed from the block: exact modes pass global in-degrees (a truncated
frontier block would otherwise change the normalisation), sampled modes pass kept-neighbour counts.
Degrees count a stored self loop (an edge v -> v) like any in-edge; ``src_loops`` says how many each
source row has, so that GCN can treat them as PyG's ``add_remaining_self_loops`` does.

No MPI and no files here: this module is pure torch and device-agnostic (CPU and CUDA).
"""
from __future__ import annotations

from dataclasses import dataclass, field
import weakref
from typing import Callable, Dict, Optional

import numpy as np
import torch

from .cpu_kernels import csr_matmul
from .sparse import coo_to_csr as _coo_to_csr

KINDS = ("mean", "gcn", "sum")

# Aggregation backends, measured by bench/bench_aggregate.py (results in docs/performance/aggregate.md):
#   "spmm"      - cached CSR adjacency A and its transpose; forward A @ h, backward A^T @ grad.
#                 Memory O(nnz) for the matrices, no [nnz, d] message tensor; deterministic on CUDA.
#   "index_add" - gather h[src] * w into an [nnz, d] message tensor and index_add_ it into rows.
# "spmm" is the default: it was faster for forward+backward and needed a fraction of the peak memory
# of "index_add" on the 200k-vertex, degree-25, width-64 benchmark (see docs/performance/aggregate.md).
BACKENDS = ("spmm", "index_add")
DEFAULT_BACKEND = "spmm"


def _as_tensor(a, dtype: torch.dtype, name: str) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        return a.to(dtype)
    if isinstance(a, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(a)).to(dtype)
    raise TypeError(f"LayerGraph: {name} must be a numpy array or torch tensor, got {type(a).__name__}")


@dataclass(eq=False)
class LayerGraph:
    """In-edges of ``n_dst`` destination rows over ``n_src`` source rows, plus the degrees to normalise with."""

    n_dst: int
    n_src: int
    indptr: torch.Tensor  # int64 [n_dst+1]
    indices: torch.Tensor  # int64 [nnz], source index in [0, n_src)
    dst_degree: torch.Tensor  # float32 [n_dst]
    src_degree: torch.Tensor  # float32 [n_src]
    # float32 [n_src]: stored self loops of each source row (counted in its degree).  None: counted from
    # the block for the destination rows (their loop is the edge i -> i), 0 for the other rows; pass
    # them when rows beyond n_dst have stored loops.  Given ones must match the block's destination rows.
    src_loops: Optional[torch.Tensor] = None
    # Source rows the rank holds itself (the rest are halo rows), where the builder knows it: prepare()
    # then builds this graph's own/halo split matrices (overlapped aggregation) from another graph's keys.
    n_own: Optional[int] = None
    # (kind, dtype, transposed, part) -> sparse CSR matrix, ("coo", kind, dtype) -> COO triple; built lazily
    # on the graph's device.
    _cache: Dict[tuple, torch.Tensor] = field(default_factory=dict, repr=False)
    # Called with the key of every matrix this graph builds (coo or CSR), right after building it: a
    # co-batch loader learns from the first step's graphs, while that step runs, which matrices the
    # model needs, and prepares them for the next co-batch at once (engine/cobatch.py).
    on_build: Optional[Callable[[tuple], None]] = field(default=None, repr=False, compare=False)
    # (kind, dtype, transposed, part, which, split) -> CSR of the rows split.first / split.rest
    # (boundary-first pipelining); apart from _cache, whose keys a co-batch loader replays on other graphs.
    _rows_cache: Dict[tuple, torch.Tensor] = field(default_factory=dict, repr=False)
    # int64 [n_src]: the source rows' global ids, given by the engine to the graphs of a model whose
    # contract asks for them (nn/contract.py ModelContract.source_ids); None: source row i is vertex i.
    source_ids: Optional[torch.Tensor] = field(default=None, repr=False)
    # The graph whose in-edges this graph's are a subset of (same rows), where in-edges were left out
    # because their sums arrive otherwise (partial aggregates, engine/partial.py): its degrees are that
    # graph's, and so are the per-relation degrees a relation-wise layer counts (nn/hetero_layers.py).
    degrees_from: Optional["LayerGraph"] = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        self.n_dst, self.n_src = int(self.n_dst), int(self.n_src)
        self.indptr = _as_tensor(self.indptr, torch.int64, "indptr")
        self.indices = _as_tensor(self.indices, torch.int64, "indices")
        self.dst_degree = _as_tensor(self.dst_degree, torch.float32, "dst_degree")
        self.src_degree = _as_tensor(self.src_degree, torch.float32, "src_degree")
        given_loops = self.src_loops is not None
        if given_loops:
            self.src_loops = _as_tensor(self.src_loops, torch.float32, "src_loops")
        self._validate()
        rows = self.edge_rows()
        on_diag = rows[self.indices == rows]
        block_loops = torch.bincount(on_diag, minlength=self.n_dst).to(torch.float32) if self.n_dst else \
            torch.zeros(0, device=self.device)
        if not given_loops:
            self.src_loops = torch.cat([block_loops, torch.zeros(self.n_src - self.n_dst, device=self.device)])
        elif self.src_loops.shape != (self.n_src,):
            raise ValueError(f"LayerGraph: src_loops must have shape ({self.n_src},), "
                             f"got {tuple(self.src_loops.shape)}")
        elif not torch.equal(self.src_loops[: self.n_dst], block_loops):
            raise ValueError("LayerGraph: src_loops of the destination rows must equal their self-loop edges "
                             "(i -> i) in the block")
        self.has_loops = bool(on_diag.numel())

    def _validate(self):
        def bad(msg):
            raise ValueError(f"LayerGraph: {msg}")

        if self.n_dst < 0 or self.n_src < self.n_dst:
            bad(f"need 0 <= n_dst <= n_src (destination rows are a prefix of the source rows), "
                f"got n_dst={self.n_dst}, n_src={self.n_src}")
        if self.indptr.dim() != 1 or self.indptr.shape[0] != self.n_dst + 1:
            bad(f"indptr must have n_dst+1 = {self.n_dst + 1} entries, got shape {tuple(self.indptr.shape)}")
        nnz = self.indices.shape[0]
        if self.indices.dim() != 1:
            bad(f"indices must be 1-D, got shape {tuple(self.indices.shape)}")
        if int(self.indptr[0]) != 0 or int(self.indptr[-1]) != nnz:
            bad(f"indptr must start at 0 and end at len(indices)={nnz}, "
                f"got {int(self.indptr[0])}..{int(self.indptr[-1])}")
        if self.n_dst > 0 and bool((self.indptr[1:] < self.indptr[:-1]).any()):
            bad("indptr must be non-decreasing")
        if nnz and (int(self.indices.min()) < 0 or int(self.indices.max()) >= self.n_src):
            bad(f"indices must lie in [0, n_src={self.n_src}), got range "
                f"[{int(self.indices.min())}, {int(self.indices.max())}]")
        for name, deg, n in (("dst_degree", self.dst_degree, self.n_dst), ("src_degree", self.src_degree, self.n_src)):
            if deg.shape != (n,):
                bad(f"{name} must have shape ({n},), got {tuple(deg.shape)}")
            if n and not bool(torch.isfinite(deg).all() & (deg >= 0).all()):
                bad(f"{name} must be finite and >= 0")

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[0])

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    @staticmethod
    def from_csr(indptr, indices, n_src: int, dst_degree=None, src_degree=None, src_loops=None) -> "LayerGraph":
        """Build from in-edge CSR (numpy or torch).  Degrees default to the block's own row counts.

        The default is right for a whole graph and for sampled blocks; exact truncated blocks must pass
        global degrees.  Source rows beyond n_dst have no row in the block, so their degree must be given.
        """
        indptr = _as_tensor(indptr, torch.int64, "indptr")
        n_dst = int(indptr.shape[0]) - 1
        row_counts = (indptr[1:] - indptr[:-1]).to(torch.float32)
        if dst_degree is None:
            dst_degree = row_counts
        if src_degree is None:
            if int(n_src) != n_dst:
                raise ValueError(
                    f"LayerGraph.from_csr: src_degree is required when n_src ({n_src}) > n_dst ({n_dst}): "
                    "the block has no in-edges for the halo rows, so their degree cannot be derived; "
                    "pass the global in-degree (exact modes) or the kept-neighbour count (sampled modes)")
            src_degree = _as_tensor(dst_degree, torch.float32, "dst_degree")
        return LayerGraph(n_dst, int(n_src), indptr, indices, dst_degree, src_degree, src_loops)

    def to(self, device) -> "LayerGraph":
        """A copy on ``device`` (the adjacency cache is rebuilt there lazily)."""
        device = torch.device(device)
        return LayerGraph(self.n_dst, self.n_src, self.indptr.to(device), self.indices.to(device),
                          self.dst_degree.to(device), self.src_degree.to(device),
                          None if self.src_loops is None else self.src_loops.to(device), n_own=self.n_own)

    def edge_rows(self) -> torch.Tensor:
        """Destination row of every edge (COO row array), device-agnostic."""
        counts = self.indptr[1:] - self.indptr[:-1]
        return torch.repeat_interleave(torch.arange(self.n_dst, device=self.device), counts)

    def coo(self, kind: str, dtype: torch.dtype = torch.float32):
        """(rows, cols, values) of the normalised adjacency; for "gcn" with the self-loop entries appended.

        Cached like the CSR matrices (the index_add backend reads it on every call)."""
        _check_kind(kind)
        key = ("coo", kind, dtype)
        if key not in self._cache:
            self._cache[key] = self._coo(kind, dtype)
            self._built(key)
        return self._cache[key]

    def _coo(self, kind: str, dtype: torch.dtype):
        rows, cols = self.edge_rows(), self.indices
        d_dst = self.dst_degree.to(dtype)
        if kind == "mean":
            # Divide by max(degree, 1): an isolated vertex (or one with no kept neighbour) aggregates 0.
            vals = (1.0 / d_dst.clamp(min=1.0))[rows]
            return rows, cols, vals
        if kind == "sum":  # GIN, SAGE-sum: every in-edge with weight 1 (a multi-edge counts as often as it occurs)
            return rows, cols, torch.ones(rows.shape[0], dtype=dtype, device=self.device)
        # Kipf & Welling: A_hat = (D+I)^-1/2 (A+I) (D+I)^-1/2 with A and d without self loops.  A stored
        # loop is replaced by the one of weight 1 (PyG's add_remaining_self_loops), not added to it: its
        # edge is dropped and it leaves the degree (d = degree - loops), else it would count twice.
        assert self.src_loops is not None  # (__post_init__ sets it)
        loops = self.src_loops.to(dtype)
        # The clamp only guards a degree given below the row's loops (inconsistent input): d' >= 1.
        d_hat_dst = (d_dst - loops[: self.n_dst]).clamp(min=0.0) + 1.0
        inv_sqrt_dst = torch.rsqrt(d_hat_dst)
        inv_sqrt_src = torch.rsqrt((self.src_degree.to(dtype) - loops).clamp(min=0.0) + 1.0)
        if self.has_loops:
            off_diag = cols != rows
            rows, cols = rows[off_diag], cols[off_diag]
        vals = inv_sqrt_dst[rows] * inv_sqrt_src[cols]
        diag = torch.arange(self.n_dst, device=self.device)
        return (torch.cat([rows, diag]), torch.cat([cols, diag]), torch.cat([vals, 1.0 / d_hat_dst]))

    def _built(self, key) -> None:
        if self.on_build is not None:
            self.on_build(key)

    def cache_keys(self):
        """The aggregation matrices this graph has built so far (keys for `prepare`)."""
        return list(self._cache)

    def prepare(self, keys) -> None:
        """Build the matrices named by `keys` (another graph's cache_keys) now: a loader thread prepares the
        next co-batch's graphs this way while the current step computes."""
        for key in keys:
            if key[0] == "coo":
                self.coo(key[1], key[2])
                continue
            kind, dtype, transposed, part = key
            if part is not None:  # the split point is this graph's own, not the other graph's
                if self.n_own is None:
                    continue  # built on first use
                part = (part[0], self.n_own)
            self._matrix(kind, dtype, transposed, part)

    def adjacency(self, kind: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Cached sparse CSR matrix [n_dst, n_src] of the normalised adjacency ("mean" or "gcn")."""
        return self._matrix(kind, dtype, transposed=False)

    def _matrix(self, kind: str, dtype: torch.dtype, transposed: bool, part=None, rows=None) -> torch.Tensor:
        """part None: the whole adjacency; ("own", n_own): its columns < n_own (sources the rank holds);
        ("halo", n_own): the other columns, renumbered from 0 (the halo rows).  rows None: every
        destination row; ("first" | "rest", split): only those rows of the RowSplit, renumbered from 0.
        Built once per graph -- the engine keeps a plan's graphs for every step -- by masks over the
        COO entries."""
        if rows is not None:
            split_key = (kind, dtype, transposed, part, rows[0], rows[1])
            if split_key not in self._rows_cache:
                self._rows_cache[split_key] = self._build_matrix(kind, dtype, transposed, part, rows)
            return self._rows_cache[split_key]
        key = (kind, dtype, transposed, part)
        if key not in self._cache:
            self._cache[key] = self._build_matrix(kind, dtype, transposed, part, None)
            self._built(key)
        return self._cache[key]

    def _build_matrix(self, kind, dtype, transposed, part, rows) -> torch.Tensor:
        rows_, cols, vals = self._coo(kind, dtype)
        shape = (self.n_dst, self.n_src)
        if part is not None:
            which, n_own = part
            if n_own < self.n_src:  # (no halo rows: "own" is every entry, "halo" none -- no mask)
                keep = cols < n_own if which == "own" else cols >= n_own
                rows_, cols, vals = rows_[keep], cols[keep], vals[keep]
            elif which == "halo":
                rows_, cols, vals = rows_[:0], cols[:0], vals[:0]
            if which == "own":
                shape = (self.n_dst, n_own)
            else:
                cols, shape = cols - n_own, (self.n_dst, self.n_src - n_own)
        if rows is not None:
            which, split = rows
            if split.n != self.n_dst:
                raise ValueError(f"LayerGraph: a RowSplit of {split.n} rows for a graph of n_dst={self.n_dst}")
            index = split.first if which == "first" else split.rest
            position = torch.full((self.n_dst,), -1, dtype=torch.int64, device=self.device)
            position[index] = torch.arange(index.numel(), device=self.device)
            new_rows = position[rows_]
            keep = new_rows >= 0
            rows_, cols, vals, shape = new_rows[keep], cols[keep], vals[keep], (index.numel(), shape[1])
        if transposed:
            rows_, cols, shape = cols, rows_, (shape[1], shape[0])
        return _coo_to_csr(rows_, cols, vals, shape)


def _spmm(matrix, h: torch.Tensor) -> torch.Tensor:
    """matrix(dtype) @ h, outside autocast (--precision bf16), which would cast it to bfloat16: the CPU
    has no bfloat16 sparse matmul (MKL's CSR kernel is float/double only).  Half-width rows are
    multiplied in float32 and the result rounded back to their dtype: a vertex's neighbours are summed
    in float32, rounding once instead of once per addition.  On the CPU the product is cpu_kernels's."""
    with torch.autocast(h.device.type, enabled=False):
        if h.dtype in (torch.float32, torch.float64):
            return csr_matmul(matrix(h.dtype), h)
        return csr_matmul(matrix(torch.float32), h.float()).to(h.dtype)


class _SparseMatmul(torch.autograd.Function):
    """y = A @ h with backward grad_h = A^T @ grad_y, both from the graph's cached CSR matrices.

    torch's own autograd through a CSR matmul would transpose A on every backward; caching A^T once per
    graph (the engine reuses a layer's graph every epoch) avoids that.
    """

    @staticmethod
    def forward(ctx, h, graph: LayerGraph, kind: str, part=None, rows=None):
        ctx.graph, ctx.kind, ctx.part, ctx.rows = graph, kind, part, rows
        return _spmm(lambda dtype: graph._matrix(kind, dtype, transposed=False, part=part, rows=rows), h)

    @staticmethod
    def backward(ctx, grad_out):
        grad_h = None
        if ctx.needs_input_grad[0]:
            grad_h = _spmm(lambda dtype: ctx.graph._matrix(ctx.kind, dtype, transposed=True, part=ctx.part,
                                                           rows=ctx.rows), grad_out.contiguous())
        return grad_h, None, None, None, None


def _aggregate_index_add(graph: LayerGraph, h_src: torch.Tensor, kind: str) -> torch.Tensor:
    if h_src.dtype not in (torch.float32, torch.float64):
        # Half-width rows (--precision bf16): summed in float32 like _spmm (a bfloat16 index_add would
        # round after every addition), then rounded once.
        with torch.autocast(h_src.device.type, enabled=False):
            return _aggregate_index_add(graph, h_src.float(), kind).to(h_src.dtype)
    rows, cols, vals = graph.coo(kind, h_src.dtype)
    messages = h_src[cols] * vals.unsqueeze(1)
    out = torch.zeros(graph.n_dst, h_src.shape[1], dtype=h_src.dtype, device=h_src.device)
    return out.index_add(0, rows, messages)


def _check_kind(kind: str):
    if kind not in KINDS:
        raise ValueError(f"unknown aggregation kind {kind!r}; choose one of {KINDS}")


def aggregate(graph, h_src: torch.Tensor, kind: str, backend: Optional[str] = None) -> torch.Tensor:
    """Normalised neighbourhood aggregation [n_dst, d] of source rows h_src [n_src, d]; autograd-aware.

    graph: a LayerGraph, or a GraphPart of one (then h_src holds the part's source rows and the result
    its destination rows; parts always use the cached part matrices, whatever the backend).

    kind "mean": sum_{u in N(v)} h_u / max(d_v, 1).
    kind "gcn":  h_v / d'_v + sum_{u in N(v), u != v} h_u / sqrt(d'_u d'_v), d' = degree - stored loops + 1
                 (PyG's GCNConv with add_remaining_self_loops: one loop of weight 1 per vertex).
    kind "sum":  sum_{u in N(v)} h_u (no degree).
    """
    _check_kind(kind)
    if isinstance(graph, GraphPart):
        graph.check_sources(h_src)
        return _SparseMatmul.apply(h_src.contiguous(), graph.graph, kind, graph.source_key, graph.rows)
    _check_sources(graph, h_src)
    backend = backend or DEFAULT_BACKEND
    if backend == "spmm":
        return _SparseMatmul.apply(h_src.contiguous(), graph, kind)
    if backend == "index_add":
        return _aggregate_index_add(graph, h_src, kind)
    raise ValueError(f"unknown aggregation backend {backend!r}; choose one of {BACKENDS}")


def _check_sources(graph: LayerGraph, h_src) -> None:
    """h_src fits the graph: [n_src, d] rows on its device."""
    if h_src.dim() != 2 or h_src.shape[0] != graph.n_src:
        raise ValueError(f"aggregate: h_src must have shape [n_src={graph.n_src}, d], got {tuple(h_src.shape)}")
    if h_src.device != graph.device:
        raise ValueError(f"aggregate: h_src is on {h_src.device} but the graph is on {graph.device}; "
                         "move the graph with graph.to(device)")


# Per graph: its edges split into own and halo parts (cached: the engine reuses a layer's graph every
# epoch).  Weak keys: the cache goes with the graph.
_EDGES: "weakref.WeakKeyDictionary[LayerGraph, dict]" = weakref.WeakKeyDictionary()


def split_edges(graph: LayerGraph, n_own: int, self_loops: bool):
    """((rows, cols) of the edges from own source rows (cols < n_own), (rows, cols - n_own) of the halo
    edges).  self_loops: drop stored loops v -> v and give every destination row one loop, in the own
    part (a destination row is an own row), as PyG's GATConv does (add_self_loops)."""
    cache = _EDGES.setdefault(graph, {})
    key = (int(n_own), bool(self_loops))
    if key not in cache:
        rows, cols = graph.edge_rows(), graph.indices
        if self_loops:
            off = cols != rows
            rows, cols = rows[off], cols[off]
        own = cols < n_own
        own_rows, own_cols = rows[own], cols[own]
        if self_loops:
            diag = torch.arange(graph.n_dst, device=graph.device)
            own_rows, own_cols = torch.cat([own_rows, diag]), torch.cat([own_cols, diag])
        cache[key] = ((own_rows, own_cols), (rows[~own], cols[~own] - n_own))
    return cache[key]


class GraphPart:
    """A subset of a layer graph's edges that a layer aggregates on its own (nn/contract.py).

    sources: None (every source row), "own" (the first n_own source rows: the rows the rank holds) or
    "halo" (the others, renumbered from 0).  rows: None (every destination row) or ("first" | "rest",
    split) with split a row split (``first``/``rest`` sorted row indices, ``n``): only those
    destination rows, renumbered from 0.  The layer runner makes the parts; a layer reads them
    through ``aggregate(part, ...)`` (sparse products from the graph's cached part matrices) or
    ``edges(self_loops)`` (the part's edge list).
    """

    __slots__ = ("graph", "sources", "n_own", "rows")

    def __init__(self, graph: LayerGraph, sources: Optional[str] = None, n_own: Optional[int] = None, rows=None):
        if sources not in (None, "own", "halo"):
            raise ValueError(f"GraphPart: sources must be None, 'own' or 'halo', got {sources!r}")
        self.graph, self.sources, self.rows = graph, sources, rows
        self.n_own = graph.n_src if n_own is None else int(n_own)

    @property
    def source_key(self):
        """The part key of LayerGraph._matrix."""
        return None if self.sources is None else (self.sources, self.n_own)

    @property
    def n_dst(self) -> int:
        if self.rows is None:
            return self.graph.n_dst
        which, split = self.rows
        return int((split.first if which == "first" else split.rest).numel())

    @property
    def n_src(self) -> int:
        if self.sources is None:
            return self.graph.n_src
        return self.n_own if self.sources == "own" else self.graph.n_src - self.n_own

    def check_sources(self, h_src: torch.Tensor) -> None:
        if h_src.dim() != 2 or h_src.shape[0] != self.n_src:
            raise ValueError(f"aggregate: a {self.sources or 'whole'} part's source rows must have shape "
                             f"[{self.n_src}, d], got {tuple(h_src.shape)}")

    def edges(self, self_loops: bool = False):
        """(destination rows, source rows) of the part's edges, as indices into its own rows and sources.
        self_loops: stored loops dropped, one loop per destination row added (in the own part)."""
        if self.rows is not None:
            raise ValueError("GraphPart.edges: edge lists are given for whole destination rows only")
        own, halo = split_edges(self.graph, self.n_own, self_loops)
        return halo if self.sources == "halo" else own

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

import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import scipy.sparse  # (imported here, not on first use: ~0.5 s that would land in a training step)
import torch

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


def _csr(crow: torch.Tensor, col: torch.Tensor, val: torch.Tensor, shape: Tuple[int, int]) -> torch.Tensor:
    """A sparse CSR tensor without torch's 'beta' and 'invariant checks' warnings on every call."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            return torch.sparse_csr_tensor(crow, col, val, size=shape, check_invariants=False)
        except TypeError:  # torch < 2.0 has no check_invariants argument
            return torch.sparse_csr_tensor(crow, col, val, size=shape)


class PendingRows:
    """A layer's source rows while its halo is still in flight: the own rows now, the halo on demand.

    ``own`` [n_own, d] are the first source rows; ``halo()`` waits for the other ``n_halo`` rows (once,
    then cached) and returns them, autograd-connected.  ``aggregate`` multiplies the edges whose sources
    are own rows first and waits only before the halo edges, so the transfer overlaps that work.  The
    model contract's cat(own, halo) is ``materialize()``.  No MPI here: the waiting is the caller's.
    """

    __slots__ = ("own", "_wait", "n_halo", "_halo")

    def __init__(self, own: torch.Tensor, wait_halo, n_halo: int):
        self.own, self._wait, self.n_halo, self._halo = own, wait_halo, int(n_halo), None

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.own.shape[0] + self.n_halo,) + tuple(self.own.shape[1:]))

    def halo(self) -> torch.Tensor:
        if self._wait is not None:
            wait, self._wait = self._wait, None
            self._halo = wait()
        return self._halo

    def map(self, fn) -> "PendingRows":
        """A row-wise ``fn`` (a Linear) applied to the own rows now and to the halo rows on arrival."""
        return PendingRows(fn(self.own), lambda: fn(self.halo()), self.n_halo)

    def materialize(self) -> torch.Tensor:
        return torch.cat([self.own, self.halo()], dim=0)


def materialize(h_src) -> torch.Tensor:
    """``h_src`` as one tensor (waiting for a pending halo)."""
    return h_src.materialize() if isinstance(h_src, PendingRows) else h_src


class RowSplit:
    """A layer's ``n`` destination rows in two groups: ``first`` (sorted row indices: the rows the peers
    read in the next layer's exchange) and ``rest`` (the others, sorted).

    Boundary-first pipelining (as G3 does): a layer computes its first rows, the next layer's
    exchange is posted with them, and the rest is computed while they travel.  ``merge`` puts the two
    back in row order (autograd-connected)."""

    __slots__ = ("first", "rest", "n", "__weakref__")

    def __init__(self, first: torch.Tensor, n: int):
        first = first.to(torch.int64)
        if first.dim() != 1 or (first.numel() and (int(first.min()) < 0 or int(first.max()) >= n)):
            raise ValueError(f"RowSplit: first rows must be a 1-D index into {n} rows")
        if first.numel() > 1 and not bool((first[1:] > first[:-1]).all()):
            raise ValueError("RowSplit: first rows must be sorted and unique")
        others = torch.ones(n, dtype=torch.bool, device=first.device)
        others[first] = False
        self.first, self.rest, self.n = first, torch.nonzero(others).squeeze(1), int(n)

    def merge(self, first: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
        out = first.new_empty((self.n,) + tuple(first.shape[1:]))
        out.index_copy_(0, self.first, first)
        return out.index_copy_(0, self.rest, rest)


class SplitRows:
    """A layer's output over a RowSplit: the first rows now, the rest on demand (computed once)."""

    __slots__ = ("split", "first", "_rest")

    def __init__(self, split: RowSplit, first: torch.Tensor, rest):
        self.split, self.first, self._rest = split, first, rest

    def rest(self) -> torch.Tensor:
        if callable(self._rest):
            self._rest = self._rest()
        return self._rest

    def map(self, fn) -> "SplitRows":
        """A row-wise ``fn`` applied to the first rows now and to the rest when they are asked for."""
        return SplitRows(self.split, fn(self.first), lambda: fn(self.rest()))

    def merge(self) -> torch.Tensor:
        return self.split.merge(self.first, self.rest())


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
            raise ValueError(f"LayerGraph: src_loops must have shape ({self.n_src},), got {tuple(self.src_loops.shape)}")
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
                          self.dst_degree.to(device), self.src_degree.to(device), self.src_loops.to(device),
                          n_own=self.n_own)

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
            key = (kind, dtype, transposed, part, rows[0], rows[1])
            if key not in self._rows_cache:
                self._rows_cache[key] = self._build_matrix(kind, dtype, transposed, part, rows)
            return self._rows_cache[key]
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


def _coo_to_csr(rows, cols, vals, shape) -> torch.Tensor:
    """CSR from COO entries, duplicates summed (a multi-edge counts as often as it occurs)."""
    if rows.device.type == "cpu" and vals.dtype in _SCIPY_DTYPES:
        return _coo_to_csr_scipy(rows, cols, vals, shape)
    return _coo_to_csr_torch(rows, cols, vals, shape)


def _coo_to_csr_torch(rows, cols, vals, shape) -> torch.Tensor:
    n_rows, n_cols = shape
    # Sort by (row, col) with one key; int64 does not overflow for any realistic graph.
    key = rows * max(n_cols, 1) + cols
    # Canonical CSR input (sorted, no multi-edges) is already in order: skip the O(nnz log nnz) sort.
    if key.numel() > 1 and not bool((key[1:] > key[:-1]).all()):
        key, order = torch.sort(key)
        vals = vals[order]
    if key.numel():
        unique, inverse = torch.unique_consecutive(key, return_inverse=True)
        if unique.numel() != key.numel():
            vals = torch.zeros(unique.numel(), dtype=vals.dtype, device=vals.device).index_add_(0, inverse, vals)
            key = unique
    r, c = key // max(n_cols, 1), key % max(n_cols, 1)
    crow = torch.zeros(n_rows + 1, dtype=torch.int64, device=rows.device)
    crow[1:] = torch.cumsum(torch.bincount(r, minlength=n_rows), 0)
    return _csr(crow, c, vals, shape)


# On the CPU scipy's COO -> CSR conversion (a counting pass by row, then a sort inside each row) gives
# the same matrix as the torch path above (columns sorted in every row, duplicates summed: a normalised
# adjacency's duplicate entries hold equal values, so the order of their sum does not matter) about 5x
# faster than its global torch.sort (200k graph, 0.7M entries: 0.011 s against 0.064 s): a co-batch
# loader builds ~10 of these per co-batch (engine/cobatch.py).  scipy has no bfloat16.
_SCIPY_DTYPES = (torch.float32, torch.float64)


def _coo_to_csr_scipy(rows, cols, vals, shape) -> torch.Tensor:
    m = scipy.sparse.csr_matrix((vals.detach().numpy(), (rows.numpy(), cols.numpy())), shape=shape)
    m.sum_duplicates()  # (sorts the columns of every row too)
    crow = torch.from_numpy(m.indptr.astype(np.int64, copy=False))
    col = torch.from_numpy(m.indices.astype(np.int64, copy=False))
    return _csr(crow, col, torch.from_numpy(m.data), shape)


def _spmm(matrix, h: torch.Tensor) -> torch.Tensor:
    """matrix(dtype) @ h, outside autocast (--precision bf16), which would cast it to bfloat16: the CPU
    has no bfloat16 sparse matmul (MKL's CSR kernel is float/double only).  Half-width rows are
    multiplied in float32 and the result rounded back to their dtype: a vertex's neighbours are summed
    in float32, rounding once instead of once per addition."""
    with torch.autocast(h.device.type, enabled=False):
        if h.dtype in (torch.float32, torch.float64):
            return matrix(h.dtype) @ h
        return (matrix(torch.float32) @ h.float()).to(h.dtype)


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


def aggregate(graph: LayerGraph, h_src: torch.Tensor, kind: str, backend: Optional[str] = None,
              split: Optional[RowSplit] = None):
    """Normalised neighbourhood aggregation [n_dst, d] of source rows h_src [n_src, d]; autograd-aware.

    split: return SplitRows over it instead (see aggregate_split).

    kind "mean": sum_{u in N(v)} h_u / max(d_v, 1).
    kind "gcn":  h_v / d'_v + sum_{u in N(v), u != v} h_u / sqrt(d'_u d'_v), d' = degree - stored loops + 1
                 (PyG's GCNConv with add_remaining_self_loops: one loop of weight 1 per vertex).
    kind "sum":  sum_{u in N(v)} h_u (no degree).
    """
    _check_kind(kind)
    if split is not None:
        return aggregate_split(graph, h_src, kind, split, backend)
    _check_sources(graph, h_src)
    if isinstance(h_src, PendingRows):
        return _aggregate_pending(graph, h_src, kind, backend)
    backend = backend or DEFAULT_BACKEND
    if backend == "spmm":
        return _SparseMatmul.apply(h_src.contiguous(), graph, kind)
    if backend == "index_add":
        return _aggregate_index_add(graph, h_src, kind)
    raise ValueError(f"unknown aggregation backend {backend!r}; choose one of {BACKENDS}")


def _check_sources(graph: LayerGraph, h_src) -> None:
    """h_src fits the graph: [n_src, d] rows on its device, or PendingRows of at least n_dst own rows."""
    if isinstance(h_src, PendingRows):
        own = h_src.own
        n_own = own.shape[0]
        if own.dim() != 2 or n_own + h_src.n_halo != graph.n_src or n_own < graph.n_dst:
            raise ValueError(f"aggregate: pending rows of shape {tuple(h_src.shape)} (own {n_own}) do not fit "
                             f"the graph's n_src={graph.n_src}, n_dst={graph.n_dst}")
        return
    if h_src.dim() != 2 or h_src.shape[0] != graph.n_src:
        raise ValueError(f"aggregate: h_src must have shape [n_src={graph.n_src}, d], got {tuple(h_src.shape)}")
    if h_src.device != graph.device:
        raise ValueError(f"aggregate: h_src is on {h_src.device} but the graph is on {graph.device}; "
                         "move the graph with graph.to(device)")


def _aggregate_pending(graph: LayerGraph, h_src: PendingRows, kind: str, backend: Optional[str]) -> torch.Tensor:
    """aggregate over own rows now + halo rows on arrival: A[:, own] @ own + A[:, halo] @ halo.

    The same entries as aggregate(graph, cat(own, halo)); only the order of the sums differs.  The
    index_add backend has no split form: it waits first."""
    if (backend or DEFAULT_BACKEND) != "spmm":
        return aggregate(graph, h_src.materialize(), kind, backend)
    return _pending_product(graph, h_src, kind, None)


def _pending_product(graph: LayerGraph, h_src: PendingRows, kind: str, rows) -> torch.Tensor:
    """A[rows, own] @ own, then (after waiting for the halo) + A[rows, halo] @ halo; rows as _matrix's."""
    n_own = h_src.own.shape[0]
    out = _SparseMatmul.apply(h_src.own.contiguous(), graph, kind, ("own", n_own), rows)
    halo = h_src.halo()  # the wait (once per PendingRows): everything above overlapped the transfer
    # Even without halo rows the halo product stays in the graph: its backward posts the reverse
    # exchange, which the peers wait for (every rank must run the same collectives).
    return out + _SparseMatmul.apply(halo.contiguous(), graph, kind, ("halo", n_own), rows)


def aggregate_split(graph: LayerGraph, h_src, kind: str, split: RowSplit, backend: Optional[str] = None) -> SplitRows:
    """aggregate(graph, h_src, kind) as SplitRows: the first rows' edges now, the rest's on demand.

    The first rows are what the next exchange sends, so they are computed first (waiting for a pending
    halo only for their halo edges); everything of the other rows is left to ``rest()``, which the
    model calls after posting that exchange, so it runs while the first rows travel (boundary-first
    pipelining).  Each row sums the same entries as in ``aggregate``; only the order of sums can differ
    (own columns, then halo columns).  The index_add backend has no row form: it aggregates every row
    at once and splits the result."""
    _check_kind(kind)
    if split.n != graph.n_dst:
        raise ValueError(f"aggregate: a RowSplit of {split.n} rows for a graph of n_dst={graph.n_dst}")
    if (backend or DEFAULT_BACKEND) != "spmm":
        out = aggregate(graph, h_src, kind, backend)
        return SplitRows(split, out.index_select(0, split.first), lambda: out.index_select(0, split.rest))
    _check_sources(graph, h_src)

    def product(which: str) -> torch.Tensor:
        # Pending sources: the first rows wait for the halo only for their halo edges.
        if isinstance(h_src, PendingRows):
            return _pending_product(graph, h_src, kind, (which, split))
        return _SparseMatmul.apply(h_src.contiguous(), graph, kind, None, (which, split))

    return SplitRows(split, product("first"), lambda: product("rest"))

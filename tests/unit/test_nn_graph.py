"""LayerGraph and aggregate(): normalisation formulas, both backends, autograd, bad input."""
import re

import numpy as np
import pytest
import torch

from granndis_hpc.nn import BACKENDS, LayerGraph, aggregate
from tests.dense_reference import dense_adjacency, random_in_csr




def _block(rng, n_dst=37, n_src=53, nnz=300):
    """A rectangular block with uneven sizes, halo rows, a duplicate edge and rows without edges."""
    dst = np.sort(rng.integers(0, n_dst - 5, nnz))  # the last 5 destination rows have no in-edge
    src = rng.integers(0, n_src, nnz)
    src[1], dst[1] = src[0], dst[0]  # one multi-edge: counts twice
    # No edge i -> i: GCN replaces a stored self loop (tests/unit/test_gcn_self_loops.py); here the
    # formula is that of a graph without loops.
    on_diag = src == dst
    src[on_diag] = (src[on_diag] + 1) % n_src
    indptr = np.zeros(n_dst + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n_dst), out=indptr[1:])
    # "Global" degrees larger than the block's row counts, as for a truncated frontier block; some 0.
    src_degree = rng.integers(0, 9, n_src).astype(np.float32)
    dst_degree = np.diff(indptr).astype(np.float32) + rng.integers(0, 4, n_dst)
    dst_degree[-2:] = 0
    src_degree[:n_dst] = dst_degree  # a destination row is the same vertex as that source row
    return LayerGraph.from_csr(indptr, src, n_src, dst_degree, src_degree), indptr, src


def _expected(kind, graph, indptr, indices, h):
    """Dense [n_dst, n_src] operator written from the formulas, applied to h (float64)."""
    n_dst, n_src = graph.n_dst, graph.n_src
    a = dense_adjacency(indptr, indices, n_src)
    d_dst, d_src = graph.dst_degree.double(), graph.src_degree.double()
    if kind == "mean":
        op = a / d_dst.clamp(min=1)[:, None]
    else:
        op = a / torch.sqrt((d_dst[:, None] + 1) * (d_src[None, :] + 1))
        op[torch.arange(n_dst), torch.arange(n_dst)] += 1 / (d_dst + 1)
    return op @ h.double()


# CUDA runs only where torch sees a GPU (not on the development machine or CI).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["mean", "gcn"])
def test_aggregate_matches_formula_and_gradients(kind, backend, device):
    rng = np.random.default_rng(1)
    graph, indptr, indices = _block(rng)
    h = torch.randn(graph.n_src, 6, generator=torch.Generator().manual_seed(2), requires_grad=True)
    h_dev = h.detach().to(device).requires_grad_()
    out = aggregate(graph.to(device), h_dev, kind, backend=backend).cpu()
    want = _expected(kind, graph, indptr, indices, h)
    torch.testing.assert_close(out.double(), want, atol=1e-6, rtol=1e-6)
    # Gradient wrt the source rows (the custom backward uses the cached transpose).
    weights = torch.randn(graph.n_dst, 6, dtype=torch.float64)
    (g_out,) = torch.autograd.grad((out.double() * weights).sum(), h_dev)
    (g_want,) = torch.autograd.grad((want * weights).sum(), h)
    g_out = g_out.cpu()
    torch.testing.assert_close(g_out.double(), g_want.double(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["mean", "gcn"])
def test_aggregate_gradcheck_float64(kind, backend):
    rng = np.random.default_rng(3)
    graph, _, _ = _block(rng, n_dst=9, n_src=14, nnz=30)
    h = torch.randn(graph.n_src, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: aggregate(graph, t, kind, backend=backend), (h,))


def test_adjacency_is_cached_and_matches_coo():
    rng = np.random.default_rng(4)
    graph, indptr, indices = _block(rng)
    a = graph.adjacency("gcn")
    assert a is graph.adjacency("gcn") and a.layout == torch.sparse_csr and a.shape == (graph.n_dst, graph.n_src)
    eye = torch.eye(graph.n_src, dtype=torch.float64)
    torch.testing.assert_close(a.to_dense().double(), _expected("gcn", graph, indptr, indices, eye), atol=1e-7,
                               rtol=1e-6)
    # A float64 request gets its own matrix; moving the graph drops the cache.
    assert graph.adjacency("gcn", torch.float64).dtype == torch.float64
    assert not graph.to("cpu")._cache


@pytest.mark.parametrize("halo_rows", [3, 0])
def test_own_and_halo_parts_and_the_build_hook(halo_rows):
    """The own/halo split matrices are the adjacency's columns before / after n_own (all and none of
    them when the graph has no halo rows), and on_build names every matrix as it is built, once."""
    rng = np.random.default_rng(5)
    graph, indptr, indices = _block(rng)
    n_own = graph.n_src - halo_rows
    built = []
    graph.on_build = built.append
    whole = _expected("mean", graph, indptr, indices, torch.eye(graph.n_src, dtype=torch.float64))
    for transposed in (False, True):
        own = graph._matrix("mean", torch.float32, transposed, ("own", n_own)).to_dense().double()
        halo = graph._matrix("mean", torch.float32, transposed, ("halo", n_own)).to_dense().double()
        want_own, want_halo = whole[:, :n_own], whole[:, n_own:]
        if transposed:
            want_own, want_halo = want_own.T, want_halo.T
        torch.testing.assert_close(own, want_own, atol=1e-7, rtol=1e-6)
        assert halo.shape == want_halo.shape
        torch.testing.assert_close(halo, want_halo, atol=1e-7, rtol=1e-6)
    graph._matrix("mean", torch.float32, False, ("own", n_own))  # cached: not built again
    assert built == [("mean", torch.float32, t, (w, n_own)) for t in (False, True) for w in ("own", "halo")]


@pytest.mark.parametrize("n_rows,n_cols,nnz", [(50, 70, 400), (3, 4, 0), (0, 5, 0)])
def test_cpu_csr_conversion_matches_the_torch_path(n_rows, n_cols, nnz):
    """The CPU (scipy) COO -> CSR conversion builds the torch path's matrix exactly: sorted columns,
    multi-edges summed (with the equal values a normalised adjacency gives them)."""
    from granndis_hpc.nn.sparse import _coo_to_csr_torch
    from granndis_hpc.nn.sparse import coo_to_csr as _coo_to_csr

    g = torch.Generator().manual_seed(nnz)
    rows = torch.randint(0, max(n_rows, 1), (nnz,), generator=g)
    cols = torch.randint(0, max(n_cols, 1), (nnz,), generator=g)
    rows, cols = torch.cat([rows, rows[: nnz // 4]]), torch.cat([cols, cols[: nnz // 4]])  # duplicates
    vals = 1.0 / (1.0 + rows.to(torch.float32))  # a function of the entry, as in every adjacency
    fast, ref = _coo_to_csr(rows, cols, vals, (n_rows, n_cols)), _coo_to_csr_torch(rows, cols, vals, (n_rows, n_cols))
    for part in ("crow_indices", "col_indices", "values"):
        a, b = getattr(fast, part)(), getattr(ref, part)()
        assert a.dtype == b.dtype and torch.equal(a, b), part
    assert fast.shape == ref.shape


def test_whole_graph_defaults_and_empty_graphs():
    rng = np.random.default_rng(5)
    indptr, indices = random_in_csr(40, 120, rng, isolated=4)
    g = LayerGraph.from_csr(indptr, indices, 40)
    torch.testing.assert_close(g.dst_degree, torch.from_numpy(np.diff(indptr)).float())
    torch.testing.assert_close(g.src_degree, g.dst_degree)
    h = torch.randn(40, 5)
    assert aggregate(g, h, "mean")[-4:].abs().max() == 0  # isolated: mean over nothing is 0
    # A rank may own no rows at some layer, and a block may have no edges.
    for n_dst, n_src in ((0, 0), (0, 3), (4, 4)):
        e = LayerGraph(n_dst, n_src, torch.zeros(n_dst + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
                       torch.zeros(n_dst), torch.zeros(n_src))
        for backend in BACKENDS:
            x = torch.randn(n_src, 2, requires_grad=True)
            out = aggregate(e, x, "gcn", backend=backend)
            assert out.shape == (n_dst, 2)
            out.sum().backward()
            torch.testing.assert_close(out, x[:n_dst])  # gcn with degree 0: only the self term, weight 1


@pytest.mark.parametrize("change, message", [
    (dict(n_src=3), "n_dst <= n_src"),
    (dict(indptr=torch.tensor([0, 2, 1, 3, 3, 3])), "non-decreasing"),
    (dict(indptr=torch.tensor([0, 1, 2, 3])), "n_dst+1"),
    (dict(indices=torch.tensor([0, 1, 9])), "indices must lie in [0, n_src=6)"),
    (dict(indices=torch.tensor([0, 1])), "end at len(indices)=2"),
    (dict(dst_degree=torch.ones(3)), "dst_degree must have shape (5,)"),
    (dict(src_degree=-torch.ones(6)), "src_degree must be finite and >= 0"),
])
def test_layer_graph_rejects_bad_input(change, message):
    args = dict(n_dst=5, n_src=6, indptr=torch.tensor([0, 1, 2, 3, 3, 3]), indices=torch.tensor([1, 5, 0]),
                dst_degree=torch.ones(5), src_degree=torch.ones(6))
    args.update(change)
    with pytest.raises(ValueError, match=re.escape(message)):
        LayerGraph(**args)


def test_from_csr_needs_halo_degrees_and_aggregate_checks_shapes():
    with pytest.raises(ValueError, match="src_degree is required"):
        LayerGraph.from_csr(np.array([0, 1]), np.array([1]), n_src=2)
    g = LayerGraph.from_csr(np.array([0, 1, 1]), np.array([1]), n_src=2)
    with pytest.raises(ValueError, match=r"shape \[n_src=2, d\]"):
        aggregate(g, torch.randn(3, 4), "mean")
    with pytest.raises(ValueError, match="unknown aggregation kind"):
        aggregate(g, torch.randn(2, 4), "max")
    with pytest.raises(ValueError, match="unknown aggregation backend"):
        aggregate(g, torch.randn(2, 4), "mean", backend="dgl")

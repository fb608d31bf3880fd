"""GCN on graphs with stored self loops (`--self-loops keep|add`) equals PyG's GCNConv semantics:
gcn_norm with add_remaining_self_loops, i.e. a vertex with a stored loop keeps one loop of weight 1,
every other vertex gets one, and the degree is d' = (in-edges without the loop) + 1.  The reference
below is that formula in dense float64, written here (no PyG needed); before the fix the stored loop
was counted twice (once as an edge, once as the added self term) and the degree was one too high."""
import numpy as np
import pytest
import torch

from granndis_hpc.nn import BACKENDS, LayerGraph, aggregate, build_model
from tests.dense_reference import random_in_csr


def _graph_with_loops(rng, n=90, edges=400, isolated=5):
    """In-edge CSR with a stored loop on a third of the vertices (some of them isolated otherwise)."""
    indptr, indices = random_in_csr(n, edges, rng, isolated=isolated)
    dst = np.repeat(np.arange(n), np.diff(indptr))
    looped = np.flatnonzero(rng.random(n) < 1 / 3)
    looped = np.union1d(looped, [n - 1])  # an isolated vertex whose only in-edge is its loop
    dst, src = np.concatenate([dst, looped]), np.concatenate([indices, looped])
    order = np.lexsort((src, dst))
    dst, src = dst[order], src[order]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, src.astype(np.int64), looped


def _pyg_gcn_operator(indptr, indices, n):
    """D'^-1/2 (A without loops + I) D'^-1/2 over in-edges, d' = in-degree without loops + 1."""
    rows = np.repeat(np.arange(n), np.diff(indptr))
    a = torch.zeros(n, n, dtype=torch.float64)
    keep = rows != indices  # add_remaining_self_loops: stored loops are replaced, not added to
    a.index_put_((torch.from_numpy(rows[keep]), torch.from_numpy(indices[keep])),
                 torch.ones(int(keep.sum()), dtype=torch.float64), accumulate=True)
    a += torch.eye(n, dtype=torch.float64)
    s = 1.0 / torch.sqrt(a.sum(dim=1))
    return s[:, None] * a * s[None, :]


@pytest.mark.parametrize("backend", BACKENDS)
def test_gcn_aggregation_with_stored_loops_equals_pyg_semantics(backend):
    rng = np.random.default_rng(0)
    indptr, indices, looped = _graph_with_loops(rng)
    n = indptr.shape[0] - 1
    graph = LayerGraph.from_csr(indptr, indices, n)  # degrees: in-degree counting the loop (as shards)
    assert torch.equal(graph.src_loops.nonzero().squeeze(1), torch.from_numpy(looped))
    h = torch.randn(n, 7, dtype=torch.float64)
    want = _pyg_gcn_operator(indptr, indices, n) @ h
    got = aggregate(graph, h.float(), "gcn", backend).double()
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    # Mean aggregation (SAGE) keeps the loop as a neighbour, as PyG's SAGEConv does.
    mean = aggregate(graph, h.float(), "mean", backend).double()
    rows = np.repeat(np.arange(n), np.diff(indptr))
    a = torch.zeros(n, n, dtype=torch.float64)
    a.index_put_((torch.from_numpy(rows), torch.from_numpy(indices)), torch.ones(rows.size, dtype=torch.float64),
                 accumulate=True)
    torch.testing.assert_close(mean, (a / a.sum(1, keepdim=True).clamp(min=1)) @ h, atol=1e-6, rtol=1e-5)


def test_block_with_halo_rows_uses_given_source_loops():
    """A prefix block (destination rows 0..m-1, every vertex a source row) with global degrees and the
    source rows' loops given, as the engine builds them, equals the whole graph's rows 0..m-1."""
    rng = np.random.default_rng(1)
    indptr, indices, _ = _graph_with_loops(rng)
    n, m = indptr.shape[0] - 1, 40
    whole = LayerGraph.from_csr(indptr, indices, n)
    block = LayerGraph.from_csr(indptr[: m + 1], indices[: indptr[m]], n, dst_degree=whole.dst_degree[:m],
                                src_degree=whole.src_degree, src_loops=whole.src_loops)
    h = torch.randn(n, 5)
    torch.testing.assert_close(aggregate(block, h, "gcn"), aggregate(whole, h, "gcn")[:m])
    # The engine's equivalent form for halo rows: degree without the loop and 0 loops.
    halo_form = LayerGraph.from_csr(
        indptr[: m + 1], indices[: indptr[m]], n, dst_degree=whole.dst_degree[:m],
        src_degree=torch.cat([whole.src_degree[:m], (whole.src_degree - whole.src_loops)[m:]]),
        src_loops=torch.cat([whole.src_loops[:m], torch.zeros(n - m)]))
    torch.testing.assert_close(aggregate(halo_form, h, "gcn"), aggregate(whole, h, "gcn")[:m])
    # Loops that contradict the block's own i -> i edges are refused.
    bad = whole.src_loops.clone()
    bad[:m] = 1 - bad[:m]
    with pytest.raises(ValueError, match="src_loops"):
        LayerGraph.from_csr(indptr, indices, n, src_loops=bad)


def test_gcn_model_with_stored_loops_equals_pyg_semantics():
    rng = np.random.default_rng(2)
    indptr, indices, _ = _graph_with_loops(rng)
    n = indptr.shape[0] - 1
    torch.manual_seed(0)
    model = build_model("gcn", 6, 8, 3, 2, dropout=0.0).eval()
    x = torch.randn(n, 6)
    got = model(x, [LayerGraph.from_csr(indptr, indices, n)] * 2).double()
    op = _pyg_gcn_operator(indptr, indices, n)
    p = {k: v.detach().double() for k, v in model.named_parameters()}
    h = op @ (x.double() @ p["convs.0.lin.weight"].T) + p["convs.0.bias"]
    want = op @ (torch.relu(h) @ p["convs.1.lin.weight"].T) + p["convs.1.bias"]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)

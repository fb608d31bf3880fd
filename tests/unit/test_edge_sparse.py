"""nn/edge_sparse.py's weighted_sum and GATConv.attend's segment path (the edges as an EdgeCSR) against
plain torch gathers and index_adds written here: values and gradients, over several gradient chunks,
with rows without edges and with an empty part."""
import math

import pytest
import torch
import torch.nn.functional as F

from granndis_hpc.nn import edge_sparse
from granndis_hpc.nn.edge_layers import GATConv
from granndis_hpc.nn.edge_sparse import EdgeCSR, weighted_sum


def _edges(seed, n_dst, n_src, n_edges):
    """Random edges in CSR order (rows sorted), with duplicates; the last rows get none."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.sort(torch.randint(0, n_dst - 2, (n_edges,), generator=g)).values
    return rows, torch.randint(0, n_src, (n_edges,), generator=g)


@pytest.mark.parametrize("n_edges", [0, 1, 300])
def test_weighted_sum_and_its_gradients_equal_the_gathers(monkeypatch, n_edges):
    monkeypatch.setattr(edge_sparse, "_CHUNK", 64)  # several chunks of the weights' gradient
    n_dst, n_src, H, C = 20, 15 if n_edges else 0, 3, 5
    rows, cols = _edges(1, n_dst, max(n_src, 1), n_edges)
    g = torch.Generator().manual_seed(2)
    w = torch.rand(n_edges, H, dtype=torch.float64, generator=g).requires_grad_()
    x = torch.randn(n_src, H, C, dtype=torch.float64, generator=g).requires_grad_()
    weight = torch.randn(n_dst, H, C, dtype=torch.float64, generator=g)
    got = weighted_sum(w, x, EdgeCSR(rows, cols, n_dst, n_src))
    (got * weight).sum().backward()
    got_w, got_x = w.grad.clone(), x.grad.clone()
    w.grad = x.grad = None
    want = torch.zeros(n_dst, H, C, dtype=torch.float64).index_add(0, rows, w.unsqueeze(2) * x[cols])
    (want * weight).sum().backward()
    assert torch.allclose(got, want) and torch.allclose(got_w, w.grad) and torch.allclose(got_x, x.grad)


def test_attend_with_the_edges_as_csr_equals_the_scatter_path():
    """The segment maximum and sum (rows sorted) give what the scatter path gives, rows without edges
    included (-inf and 0), and the same gradients."""
    n_dst, n_src, H, C = 12, 9, 2, 4
    rows, cols = _edges(3, n_dst, n_src, 60)
    conv = GATConv(6, C, heads=H, add_self_loops=False).double()
    outs, grads = [], []
    for csr in (None, EdgeCSR(rows, cols, n_dst, n_src)):
        x = torch.randn(n_src, H, C, dtype=torch.float64, generator=torch.Generator().manual_seed(5)).requires_grad_()
        a_src = (x * conv.att_src).sum(-1)
        a_dst = torch.randn(n_dst, H, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
        mx, s, n = conv.attend(x, a_src, a_dst, rows, cols, n_dst, csr=csr)
        outs.append((mx, s, n))
        (n.sum() + s.sum() * 0.5).backward()
        grads.append(x.grad)
    (m1, s1, n1), (m2, s2, n2) = outs
    assert torch.equal(m1, m2) and bool(torch.isinf(m1[-2:]).all())
    assert torch.allclose(s1, s2) and torch.allclose(n1, n2) and torch.allclose(grads[0], grads[1])
    # and the weights are the softmax numerators: a row's own maximum subtracted
    e = F.leaky_relu(a_src[cols] + a_dst[rows], conv.negative_slope)
    assert math.isclose(float(s2.sum()), float(torch.exp(e - m2[rows]).sum()), rel_tol=1e-12)

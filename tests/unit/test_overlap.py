"""Overlapped halo exchange without MPI: a fake transport (one process, the "peers" are blocks of rows)
drives engine/exchange.halo_exchange_start; the split aggregation (own edges now, halo edges on arrival)
must equal the blocking cat(own, halo) aggregation forward and backward, the halo's wire dtype must round
exactly as a cast does, and the backward must post the halo gradients before the own rows' branch runs
and wait for them only after it (the overlap)."""
import numpy as np
import pytest
import torch

from granndis_hpc.engine.exchange import halo_exchange, halo_exchange_post, halo_exchange_start
from granndis_hpc.nn.rows import PendingRows, RowSplit, SplitRows
from granndis_hpc.nn.runner import call_layer
from granndis_hpc.nn.contract import Layer
from granndis_hpc.nn.graph import LayerGraph, aggregate
from granndis_hpc.nn.layers import GCNConv, SAGEConv
from tests.dense_reference import random_in_csr


class FakeTransport:
    """Rows sent are received reversed (a deterministic 'peer'); records the order of posts and waits."""

    def __init__(self, events):
        self.events = events

    def __call__(self, send, send_counts, recv_counts):  # the blocking form
        assert send.shape[0] == sum(send_counts) and sum(recv_counts) == sum(send_counts)
        return send.flip(0).clone()

    def start(self, send, send_counts, recv_counts):
        direction = "fwd" if len([e for e in self.events if e.startswith("post")]) % 2 == 0 else "bwd"
        self.events.append(f"post-{direction}")
        rows = self(send, send_counts, recv_counts)
        events = self.events

        class Pending:
            def wait(self):
                events.append(f"wait-{direction}")
                return rows
        return Pending()


def _problem(seed, n_own=40, n_halo=15, width=6):
    rng = np.random.default_rng(seed)
    n_src = n_own + n_halo
    n_dst = 30
    indptr, indices = random_in_csr(n_dst, 200, rng)
    indices = rng.integers(0, n_src, indices.size)  # sources anywhere among own and halo rows
    indices[: min(n_dst, indices.size)] = np.arange(min(n_dst, indices.size))  # some self loops
    degree = torch.as_tensor(np.diff(indptr) + rng.integers(0, 3, n_dst), dtype=torch.float32)
    src_degree = torch.cat([degree, torch.as_tensor(rng.integers(1, 9, n_src - n_dst), dtype=torch.float32)])
    graph = LayerGraph.from_csr(indptr, indices, n_src, dst_degree=degree, src_degree=src_degree)
    h = torch.randn(n_own, width, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    send_index = torch.as_tensor(rng.integers(0, n_own, n_halo))
    return graph, h, send_index


@pytest.mark.parametrize("conv_cls,width_out", [(SAGEConv, 4), (SAGEConv, 9), (GCNConv, 4), (GCNConv, 9)])
def test_pending_rows_equal_blocking_exchange_forward_and_backward(conv_cls, width_out):
    graph, h0, send_index = _problem(1)
    torch.manual_seed(0)
    conv = conv_cls(h0.shape[1], width_out).double()
    grads = {}
    for overlap in (False, True):
        h = h0.clone().requires_grad_(True)
        transport = FakeTransport([])
        counts = [send_index.numel()]
        if overlap:
            h_src = halo_exchange_start(h, send_index, counts, counts, transport.start)
            assert isinstance(h_src, PendingRows) and h_src.shape[0] == graph.n_src
        else:
            h_src = torch.cat([h, halo_exchange(h, send_index, counts, counts, transport)])
        out = call_layer(conv, h_src, graph)
        weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
        (out * weight).sum().backward()
        grads[overlap] = (out.detach(), h.grad.clone(), [p.grad.clone() for p in conv.parameters()])
        conv.zero_grad()
    (o0, g0, p0), (o1, g1, p1) = grads[False], grads[True]
    torch.testing.assert_close(o1, o0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g1, g0, rtol=1e-12, atol=1e-12)
    for a, b in zip(p1, p0):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_backward_posts_the_halo_gradients_before_the_own_branch_and_waits_after():
    graph, h0, send_index = _problem(2)
    events = []
    transport = FakeTransport(events)
    h = h0.clone().requires_grad_(True)
    counts = [send_index.numel()]
    lin = torch.nn.Linear(h.shape[1], 3).double()

    class MeanOfProjection(Layer):
        def message(self, rows, call):
            m = lin(rows)
            if call.own_messages is None:  # the own rows' messages: their part runs before the wait
                m.register_hook(lambda g: events.append("own-branch-backward"))
                events.append("own-aggregation")
            return m

        def aggregate_part(self, part, m, call):
            return aggregate(part, m, "mean")

        def update(self, h_dst, aggregated, call):
            return aggregated
    out = call_layer(MeanOfProjection(), halo_exchange_start(h, send_index, counts, counts, transport.start), graph)
    assert events == ["post-fwd", "own-aggregation", "wait-fwd"]
    out.sum().backward()
    assert events[3:] == ["post-bwd", "own-branch-backward", "wait-bwd"], events


def test_halo_wire_dtype_rounds_like_a_cast_both_ways():
    graph, h0, send_index = _problem(3)
    h0 = h0.float()
    counts = [send_index.numel()]
    for dtype in (torch.bfloat16, torch.float16):
        h = h0.clone().requires_grad_(True)
        sent = []

        def start(send, sc, rc):
            sent.append(send.dtype)
            rows = send.flip(0).clone()
            return type("P", (), {"wait": lambda self: rows})()
        pending = halo_exchange_start(h, send_index, counts, counts, start, wire_dtype=dtype)
        halo = pending.halo()
        assert halo.dtype == torch.float32
        torch.testing.assert_close(halo, h0[send_index].to(dtype).float().flip(0), rtol=0, atol=0)
        g = torch.randn(halo.shape, generator=torch.Generator().manual_seed(4))
        halo.backward(g)
        want = torch.zeros_like(h0).index_add_(0, send_index, g.to(dtype).float().flip(0))
        torch.testing.assert_close(h.grad, want, rtol=0, atol=0)
        assert sent == [dtype, dtype]


# ---------------------------------------------------------------- boundary-first pipelining

def _split_of(send_index, n):
    first, position = torch.unique(send_index, sorted=True, return_inverse=True)
    return RowSplit(first, n), position


@pytest.mark.parametrize("conv_cls,width_out", [(SAGEConv, 4), (SAGEConv, 9), (GCNConv, 4), (GCNConv, 9)])
@pytest.mark.parametrize("pending", [True, False])
def test_split_rows_equal_the_whole_conv_forward_and_backward(conv_cls, width_out, pending):
    """The runner's row-split call of a conv row for row equals its whole call, gradients included; the first
    rows are computed before rest() is asked for."""
    graph, h0, send_index = _problem(5)
    torch.manual_seed(0)
    conv = conv_cls(h0.shape[1], width_out).double()
    rng = np.random.default_rng(6)
    split = RowSplit(torch.as_tensor(np.sort(rng.choice(graph.n_dst, 11, replace=False))), graph.n_dst)
    results = []
    for use_split in (False, True):
        h = h0.clone().requires_grad_(True)
        counts = [send_index.numel()]
        if pending:
            h_src = halo_exchange_start(h, send_index, counts, counts, FakeTransport([]).start)
        else:
            h_src = torch.cat([h, halo_exchange(h, send_index, counts, counts, FakeTransport([]))])
        if use_split:
            parts = call_layer(conv, h_src, graph, split=split)
            assert isinstance(parts, SplitRows) and parts.first.shape[0] == 11 and callable(parts._rest)
            out = parts.merge()
        else:
            out = call_layer(conv, h_src, graph)
        weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
        (out * weight).sum().backward()
        results.append((out.detach(), h.grad.clone(), [p.grad.clone() for p in conv.parameters()]))
        conv.zero_grad()
    (o0, g0, p0), (o1, g1, p1) = results
    torch.testing.assert_close(o1, o0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g1, g0, rtol=1e-12, atol=1e-12)
    for a, b in zip(p1, p0):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("conv_cls", [SAGEConv, GCNConv])
def test_split_rows_copy_the_destination_rows_only_for_a_layer_that_reads_them(conv_cls, monkeypatch):
    """SAGE's update reads each group's destination rows (copies of them, row for row); GCN's reads
    none (reads_dst False) and gets None: no [rows, in] copy of its input (at layer 0 of Cora 1433 wide)."""
    graph, h0, _ = _problem(5)
    conv = conv_cls(h0.shape[1], 4).double()
    split = RowSplit(torch.arange(0, graph.n_dst, 3), graph.n_dst)
    seen, update = [], conv.update
    monkeypatch.setattr(conv, "update", lambda h_dst, agg, call: seen.append(h_dst) or update(h_dst, agg, call))
    h_src = torch.cat([h0, h0[: graph.n_src - h0.shape[0]]])
    call_layer(conv, h_src, graph, split=split).merge()
    if conv_cls is GCNConv:
        assert not conv.reads_dst and seen == [None, None]
    else:
        assert torch.equal(seen[0], h_src[split.first]) and torch.equal(seen[1], h_src[split.rest])


def test_merge_puts_rows_in_order_and_saves_no_tensor_for_the_backward():
    """RowSplit.merge: row order and each group's gradient rows, with nothing kept for the backward
    (index_copy_ would keep both groups: a second copy of every merged row)."""
    split = RowSplit(torch.tensor([1, 4, 5]), 7)
    first = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    rest = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = split.merge(first, rest)
    assert saved == []
    torch.testing.assert_close(out[split.first], first, rtol=0, atol=0)
    torch.testing.assert_close(out[split.rest], rest, rtol=0, atol=0)
    weight = torch.arange(14, dtype=torch.float64).view(7, 2)
    (out * weight).sum().backward()
    torch.testing.assert_close(first.grad, weight[split.first], rtol=0, atol=0)
    torch.testing.assert_close(rest.grad, weight[split.rest], rtol=0, atol=0)


class _LoopbackGather:
    """A one-process gather over L layers of N own rows: layer l's halo is the rows send[l] of its own
    rows, reversed (a deterministic 'peer'); layer 0's halo is static.  boundary=True adds the
    boundary-first hooks of engine/views.View.gather_fn.  Records posts, waits and rest() calls."""

    def __init__(self, x_halo, send, n, events, boundary):
        self.x_halo, self.send, self.n, self.events, self.posted = x_halo, send, n, events, {}
        if boundary:
            self.boundary = lambda l: _split_of(send[l], n)[0]
            self.post = self._post

    def start(self, rows, sc, rc):
        self.events.append("post")
        out = rows.flip(0).clone()
        events = self.events

        class Pending:
            def wait(self):
                events.append("wait")
                return out
        return Pending()

    def _post(self, l, rows):
        _, position = _split_of(self.send[l], self.n)
        counts = [self.send[l].numel()]
        self.posted[l] = halo_exchange_post(rows, position, counts, counts, self.start)

    def __call__(self, l, h):
        if l in self.posted:
            return self.posted.pop(l).rows(h)
        if l == 0:
            return torch.cat([h, self.x_halo])
        counts = [self.send[l].numel()]
        return halo_exchange_start(h, self.send[l], counts, counts, self.start)


@pytest.mark.parametrize("name,norm", [("sage", False), ("sage", True), ("gcn", False)])
def test_model_posts_each_exchange_from_the_boundary_rows_before_the_rest(name, norm, monkeypatch):
    """PlainGNN with gather.boundary: logits and every gradient equal the unsplit overlapped pass (and
    the blocking one), dropout included; each layer's exchange is posted before the rest of the layer
    below is computed, and waited for only after it; in the backward the rest rows' gradient is computed
    between posting the halo gradients and waiting for them."""
    from granndis_hpc.nn.dropout import RowDropout
    from granndis_hpc.nn.models import build_model
    rng = np.random.default_rng(7)
    n, n_halo, layers, width = 40, 12, 3, 6
    graphs, send = [], []
    for _ in range(layers):
        indptr, indices = random_in_csr(n, 240, rng)
        indices = rng.integers(0, n + n_halo, indices.size)
        degree = torch.as_tensor(np.diff(indptr) + rng.integers(0, 3, n), dtype=torch.float32)
        src_degree = torch.cat([degree, torch.as_tensor(rng.integers(1, 9, n_halo), dtype=torch.float32)])
        graphs.append(LayerGraph.from_csr(indptr, indices, n + n_halo, dst_degree=degree, src_degree=src_degree))
        send.append(torch.as_tensor(rng.integers(0, n, n_halo)))  # duplicates: a row sent to two 'peers'
    x = torch.randn(n, width, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    x_halo = torch.randn(n_halo, width, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    row_ids = torch.as_tensor(rng.permutation(1000)[:n])
    real_rest, real_merge = SplitRows.rest, RowSplit.merge
    results = {}
    for how in ("blocking", "overlap", "boundary"):
        torch.manual_seed(0)
        model = build_model(name, width, 5, 3, layers, dropout=0.3, norm=norm).double()
        events = []
        monkeypatch.setattr(SplitRows, "rest", lambda self: (events.append("rest"), real_rest(self))[1])

        def merge(split, first, rest, events=events):  # records when the rest rows get their gradient
            if rest.requires_grad:
                rest.register_hook(lambda g: events.append("rest-grad"))
            return real_merge(split, first, rest)
        monkeypatch.setattr(RowSplit, "merge", merge)
        if how == "blocking":
            def gather(l, h):
                if l == 0:
                    return torch.cat([h, x_halo])
                counts = [send[l].numel()]
                return torch.cat([h, halo_exchange(h, send[l], counts, counts, lambda s, sc, rc: s.flip(0).clone())])
        else:
            gather = _LoopbackGather(x_halo, send, n, events, boundary=how == "boundary")
        out = model(x, graphs, gather, dropout=RowDropout(3, 1, row_ids))
        # (a conv's rest() calls its aggregation's: count consecutive ones once)
        forward = [e for i, e in enumerate(events) if i == 0 or e != events[i - 1]]
        if how == "boundary":
            assert forward == ["post", "rest", "wait", "post", "rest", "wait"], forward
        elif how == "overlap":
            assert forward == ["post", "wait", "post", "wait"], forward
        n_forward = len(events)
        out.pow(2).sum().backward()
        if how == "boundary":  # the backward mirror: the rest rows' gradient while the halo's travels
            assert events[n_forward:] == ["post", "rest-grad", "wait"] * 2, events[n_forward:]
        results[how] = (out.detach(), [p.grad.clone() for p in model.parameters()])
    for how in ("overlap", "boundary"):
        torch.testing.assert_close(results[how][0], results["blocking"][0], rtol=1e-12, atol=1e-12)
        for a, b in zip(results[how][1], results["blocking"][1]):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)

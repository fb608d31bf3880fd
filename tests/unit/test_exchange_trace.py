"""GRANNDIS_EXCHANGE_TRACE (granndis_hpc/cluster/trace.py): an overlapped exchange records post, wait
start and wait end forward and backward under one id, a blocking one its start and end; off, nothing is
recorded."""
import torch

from granndis_hpc.cluster import trace
from granndis_hpc.cluster.exchange_group import immediate_start
from granndis_hpc.engine.exchange import halo_exchange, halo_exchange_start


def _mirror(send, send_counts, recv_counts, phase="halo"):
    return send.flip(0).clone()


def test_an_overlapped_and_a_blocking_exchange_are_traced(monkeypatch):
    monkeypatch.setattr(trace, "EVENTS", [])
    h = torch.randn(4, 3, requires_grad=True)
    send = torch.tensor([0, 2])
    pending = halo_exchange_start(h, send, [2], [2], immediate_start(_mirror))
    pending.halo().sum().backward()
    names = [e for e, _, _ in trace.EVENTS]
    assert names == ["post_fwd", "wait_start_fwd", "wait_end_fwd", "post_bwd", "wait_start_bwd", "wait_end_bwd"]
    assert len({i for _, _, i in trace.EVENTS}) == 1 and trace.EVENTS[0][2] > 0
    times = [t for _, t, _ in trace.EVENTS]
    assert times == sorted(times)
    del trace.EVENTS[:]
    halo_exchange(h, send, [2], [2], _mirror).sum().backward()
    assert [e for e, _, _ in trace.EVENTS] == ["block_fwd_start", "block_fwd_end", "block_bwd_start", "block_bwd_end"]


def test_off_records_nothing(monkeypatch):
    monkeypatch.setattr(trace, "EVENTS", None)
    trace.mark("post_fwd", 3)
    assert trace.new_id() == -1 and trace.EVENTS is None
    trace.dump("/nonexistent/never-written.json")  # off: no file

"""GRANNDIS_EXCHANGE_TRACE (granndis_hpc/cluster/trace.py) and its reader bench/exchange_trace.py: an
overlapped exchange records post, wait start and wait end forward and backward under one id, a blocking
one its start and end; off, nothing is recorded.  The reader's windows and waits are checked on events
with hand-set times."""
import pytest
import torch

from exchange_trace import step_figures, steps_of
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


def test_the_reader_gives_each_exchanges_window_and_wait():
    ev = [("step_start", 0.0, -1), ("post_fwd", 0.1, 1), ("wait_start_fwd", 0.3, 1), ("wait_end_fwd", 0.45, 1),
          ("block_fwd_start", 0.5, -1), ("block_fwd_end", 0.6, -1), ("backward", 0.7, -1),
          ("post_bwd", 0.8, 1), ("wait_start_bwd", 1.0, 1), ("wait_end_bwd", 1.05, 1), ("backward_end", 1.2, -1),
          ("step_end", 1.5, -1), ("post_fwd", 2.0, 2)]  # outside a step: ignored
    (step,) = steps_of(ev)
    f = step_figures(step)
    assert (f["forward_s"], f["backward_s"], f["rest_s"]) == pytest.approx((0.7, 0.5, 0.3))
    got = [(e["dir"], round(e["window_s"], 9), round(e["wait_s"], 9)) for e in f["exchanges"]]
    assert got == [("fwd", 0.2, 0.15), ("fwd (blocking)", 0.0, 0.1), ("bwd", 0.2, 0.05)]

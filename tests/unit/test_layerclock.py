"""engine/layerclock.py: each layer is charged the compute between its marks, forward (gather calls) and
backward (the gradient of the next layer's input rows), less the halo exchange's ledger seconds."""
import time

import pytest
import torch

from granndis_hpc.cluster import hostsync
from granndis_hpc.cluster.ledger import Ledger
from granndis_hpc.nn.rows import HaloGather
from granndis_hpc.engine.layerclock import LayerClock
from tests.conftest import FakeCudaEvent


class _Slow(torch.autograd.Function):
    """Identity that sleeps `fwd` seconds forward and `bwd` seconds backward (a layer's compute)."""

    @staticmethod
    def forward(ctx, h, fwd, bwd):
        ctx.bwd = bwd
        time.sleep(fwd)
        return h.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.bwd)
        return grad, None, None


@pytest.mark.parametrize("cuda", [False, True])
def test_layer_clock_charges_each_layer_its_compute_less_the_halo_exchange(cuda, monkeypatch):
    # cuda=True: the GPU's marks (events and the ledger's event spans, read at the end) with stand-in
    # events that hold the host time they were recorded at.
    monkeypatch.setattr(hostsync, "_event", FakeCudaEvent)
    ledger = Ledger()
    clock = LayerClock(ledger, 2, cuda=cuda)

    def gather(l, h):
        with (ledger.timed_events if cuda else ledger.timed)("inter", "halo"):  # the exchange: not compute
            time.sleep(0.2)
        return h
    post = object()
    g = clock.wrap(HaloGather(gather, post=post))  # the boundary-first hooks are kept
    assert g.post is post and g.boundary is None
    w = torch.ones(3, requires_grad=True)
    for _ in range(2):  # two steps of one epoch add up
        clock.start_forward()
        h = _Slow.apply(g(0, torch.ones(3)) * w, 0.08, 0.12)  # layer 0: 80 ms forward, 120 ms backward
        h = _Slow.apply(g(1, h), 0.16, 0.04)                   # layer 1: 160 ms forward, 40 ms backward
        clock.end_forward()
        time.sleep(0.12)  # the loss: neither layer's
        clock.start_backward()
        h.sum().backward()
        clock.end_backward()
    expected = [[0.16, 0.32], [0.24, 0.08]]
    for got_row, want_row in zip(clock.seconds, expected):
        for got, want in zip(got_row, want_row):
            # A loaded host only lengthens the sleeps; the margin stays below the 0.24 s of loss and 0.4 s of
            # exchange per layer that a wrong attribution would add.
            assert want - 1e-3 <= got < want + 0.1
    clock.reset()
    assert clock.seconds.tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_a_recomputed_forward_inside_the_backward_is_not_charged_to_the_forward():
    ledger = Ledger()
    clock = LayerClock(ledger, 2)
    g = clock.wrap(lambda l, h: h)
    clock.start_backward()
    g(1, torch.ones(2, requires_grad=True))  # --checkpoint-activations: gather again in the backward
    clock.end_backward()
    assert clock.seconds[0].tolist() == [0.0, 0.0]  # all of it is the last layer's backward
    assert clock.seconds[1, 0] == 0.0 and clock.seconds[1, 1] >= 0.0

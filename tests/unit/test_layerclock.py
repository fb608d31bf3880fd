"""engine/layerclock.py: each layer is charged the compute between its marks, forward (gather calls) and
backward (the gradient of the next layer's input rows), less the halo exchange's ledger seconds."""
import time

import torch

from granndis_hpc.cluster.ledger import Ledger
from granndis_hpc.engine.layerclock import LayerClock


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


def test_layer_clock_charges_each_layer_its_compute_less_the_halo_exchange():
    ledger = Ledger()
    clock = LayerClock(ledger, 2)

    def gather(l, h):
        with ledger.timed("inter", "halo"):  # the exchange: not compute
            time.sleep(0.05)
        return h
    gather.post = "kept"
    g = clock.wrap(gather)
    assert g.post == "kept" and not hasattr(g, "boundary")
    w = torch.ones(3, requires_grad=True)
    for _ in range(2):  # two steps of one epoch add up
        clock.start_forward()
        h = _Slow.apply(g(0, torch.ones(3)) * w, 0.02, 0.03)  # layer 0: 20 ms forward, 30 ms backward
        h = _Slow.apply(g(1, h), 0.04, 0.01)                   # layer 1: 40 ms forward, 10 ms backward
        clock.end_forward()
        time.sleep(0.03)  # the loss: neither layer's
        clock.start_backward()
        h.sum().backward()
        clock.end_backward()
    expected = [[0.04, 0.08], [0.06, 0.02]]
    for got_row, want_row in zip(clock.seconds, expected):
        for got, want in zip(got_row, want_row):
            assert want - 1e-3 <= got < want + 0.03
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

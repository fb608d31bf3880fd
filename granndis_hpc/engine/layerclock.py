"""Per-layer compute seconds of one rank's training steps, forward and backward.

A bulk-synchronous halo exchange waits for the slowest rank of its group at every layer, so the compute
an epoch cannot avoid is not one rank's total but the critical path through every rank's per-layer
compute (granndis_hpc/report/linkmodel.py's per-rank timeline).  This clock measures those pieces:

- forward, layer l: from the model's gather(l, .) call to gather(l + 1, .) (the last layer: to the
  model's return).  Boundary-first pipelining computes layer l + 1's send rows inside layer l: they
  count to layer l, where they run;
- backward, layer l: from the gradient of layer l + 1's input rows being complete (a tensor hook on the
  rows handed to gather(l + 1, .)) to that of layer l's (the last layer: from the start of the backward;
  layer 0: to its end);
- each less the halo exchanges' ledger seconds inside (phases halo and setup), so that, as in the epoch
  record, compute is what is not spent in the halo exchange.  What the layers do not hold (input
  dropout before layer 0, the loss, the optimizer step, the gradient hooks' posts) is the rest of the
  epoch's compute: `epoch_record` writes every rank's compute beside these.

Costs two perf_counter readings and one ledger sum per layer and direction; a recomputed block
(--checkpoint-activations) calls gather again inside the backward, which the clock ignores.  On a GPU
(`cuda=True`) a mark is a CUDA event on the current stream and the ledger's event-span count, and the
seconds are read when `seconds` is first read after the marks (at the epoch's end): the clock never
synchronises the device inside a step (cluster/hostsync.py).
"""
from __future__ import annotations

import time
from typing import Callable, List, Optional

import numpy as np
import torch

from granndis_hpc.cluster.ledger import Ledger
from granndis_hpc.nn.rows import HaloGather


class LayerClock:
    def __init__(self, ledger: Ledger, layers: int, cuda: bool = False):
        self.ledger, self.layers, self.cuda = ledger, int(layers), bool(cuda)
        self.reset()

    def reset(self) -> None:
        """Start an epoch: [2, layers] seconds (row 0 forward, row 1 backward) summed over its steps."""
        self._seconds = np.zeros((2, self.layers))
        self._spans: List[tuple] = []  # GPU: (row, layer, start mark, end mark), read by `seconds`
        self._phase: Optional[str] = None
        self._layer: Optional[int] = None
        self._t = 0.0

    @property
    def seconds(self) -> np.ndarray:
        """[2, layers] seconds so far (on a GPU: waits for the marks' events)."""
        spans, self._spans = self._spans, []
        for row, layer, (ev0, c0), (ev1, c1) in spans:
            ev1.synchronize()
            self._seconds[row, layer] += ev0.elapsed_time(ev1) / 1e3 - self.ledger.span_seconds(c0, c1)
        return self._seconds

    def _now(self):
        if self.cuda:
            from granndis_hpc.cluster.hostsync import _event
            return _event(), self.ledger.span_cursor()
        comm = self.ledger.total_seconds(phase="halo") + self.ledger.total_seconds(phase="setup")
        return time.perf_counter() - comm

    def _close(self, row: int, layer):
        now = self._now()
        if layer is not None and 0 <= layer < self.layers:
            if self.cuda:
                self._spans.append((row, layer, self._t, now))
            else:
                self._seconds[row, layer] += now - self._t
        self._t = now
        return now

    def wrap(self, gather: Callable) -> HaloGather:
        """The model's gather(l, h) with the forward's layer marks and the backward's hooks; keeps the
        boundary-first hooks (gather.boundary / gather.post) of the gather it wraps."""
        def timed(l: int, h: torch.Tensor):
            if self._phase == "forward":
                self._close(0, self._layer)
                self._layer = l
                if l > 0 and h.requires_grad:  # its gradient complete: layer l's backward is done
                    h.register_hook(lambda grad, l=l: self._backward_mark(l))
            return gather(l, h)

        # (a plain gather function has no hooks)
        return HaloGather(timed, getattr(gather, "boundary", None), getattr(gather, "post", None))

    def start_forward(self) -> None:
        self._phase, self._layer = "forward", None
        self._t = self._now()

    def end_forward(self) -> None:
        self._close(0, self._layer)
        self._phase, self._layer = None, None

    def start_backward(self) -> None:
        self._phase, self._layer = "backward", self.layers - 1
        self._t = self._now()

    def _backward_mark(self, l: int) -> None:
        if self._phase == "backward":
            self._close(1, l)
            self._layer = l - 1

    def end_backward(self) -> None:
        self._close(1, self._layer)
        self._phase, self._layer = None, None

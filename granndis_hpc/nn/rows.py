"""A layer's rows while the layer runner overlaps communication with computation.

``PendingRows``: a layer's source rows while its halo is in flight (the exchange posted); the runner
hands the own rows to the layer's own-edge part now and the halo rows to its halo-edge part on arrival
(nn/runner.py).  ``RowSplit`` / ``SplitRows``: a layer's destination rows in two groups, the rows
the next exchange sends first (boundary-first pipelining).  ``HaloGather``: the engine's ``gather(l, h)``
with, where its exchanges are posted early, ``boundary(l)`` and ``post(l, rows)``.  ``PartialSources``: a
layer's source rows where some peers send partial aggregates instead of rows (engine/partial.py).
No MPI here: the waiting is the caller's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch


class PendingRows:
    """A layer's source rows while its halo is still in flight: the own rows now, the halo on demand.

    ``own`` [n_own, d] are the first source rows; ``halo()`` waits for the other ``n_halo`` rows (once,
    then cached) and returns them, autograd-connected.  ``materialize()`` is cat(own, halo).
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
        return _Merge.apply(first, rest, self)


class _Merge(torch.autograd.Function):
    """RowSplit.merge: the two groups' rows in row order; the gradient is each group's rows of the
    output's.  Its own function because autograd's index_copy_ saves its source rows (measured: both
    groups, a second copy of every merged row kept to the backward); this keeps only the split."""

    @staticmethod
    def forward(ctx, first, rest, split):
        ctx.split = split
        out = first.new_empty((split.n,) + tuple(first.shape[1:]))
        out.index_copy_(0, split.first, first)
        return out.index_copy_(0, split.rest, rest)

    @staticmethod
    def backward(ctx, grad):
        split = ctx.split
        return grad.index_select(0, split.first), grad.index_select(0, split.rest), None


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


@dataclass
class HaloGather:
    """The engine's ``gather(l, h)`` (engine/views.py), and where a view overlaps its exchanges the
    boundary-first hooks: ``boundary(l)``, the RowSplit of layer l's own rows into the rows its exchange
    sends and the others (None: not this layer), and ``post(l, rows)``, the exchange posted from those
    rows.  The runner calls any ``gather(l, h)``; it pipelines only where ``boundary`` is given."""

    fn: Callable[[int, torch.Tensor], Any]
    boundary: Optional[Callable[[int], Optional[RowSplit]]] = None
    post: Optional[Callable[[int, torch.Tensor], None]] = None

    def __call__(self, l: int, h: torch.Tensor):
        return self.fn(l, h)


class PartialSources:
    """A layer's source rows where some peers send partial aggregates instead of their rows.

    ``rows`` [n_own + n_halo, d]: the own rows and the halo rows that came as rows, a tensor or, the
    exchange overlapped, ``PendingRows``; ``graph``: the layer's LayerGraph over them (the in-edges from
    the other peers' rows left out, degrees unchanged: ``graph.degrees_from``); ``partials(m_own,
    layer)``: given the messages of the own rows and the layer (its Layer.weighted_sum kind), sends this
    rank's own partials to the peers and returns ``wait()``, which gives the summed partial aggregates the
    other peers sent for the destination rows [n_dst, w] (autograd-connected both ways; overlapped, the
    exchange travels until ``wait()``).  The layer runner adds them to the aggregate of ``graph``, or to
    the layer's output where they are projected rows (nn/runner.py)."""

    __slots__ = ("rows", "graph", "partials")

    def __init__(self, rows: "torch.Tensor | PendingRows", graph,
                 partials: Callable[[torch.Tensor, Any], Callable[[], torch.Tensor]]):
        self.rows, self.graph, self.partials = rows, graph, partials

    @property
    def shape(self) -> torch.Size:
        return self.rows.shape

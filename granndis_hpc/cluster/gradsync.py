"""Gradients reduced during the backward pass, in flat buckets, like DDP's reducer.

Each parameter's post-accumulate-grad hook marks it final; a bucket whose parameters are all final is
posted at once (Communicator.reduce_flat_start: reduce to the server's leader, then the leaders'
sum -- a pairwise exchange on 2 servers, a ring in a helper thread on more -- which travels while the
backward computes the earlier layers' gradients: every later hook polls the posted buckets, and that
MPI_Testall is what moves them, with no polling thread), and
`finish()` after the backward waits for the buckets, broadcasts inside the servers and writes the sums
back into `.grad`.  Buckets hold the parameters in reverse order (the backward produces the last
layers' gradients first) and are posted strictly in bucket order, so every rank issues the same
collectives in the same order whatever the timing.  Ledger bytes: the same model per bucket as
`Communicator.allreduce_` (linear in the bucket's size for intra traffic and, on two servers, for the
leaders' ring), so the epoch's gradient bytes do not change on 2 servers (tests/mpi/test_overlap.py).

Knows nothing about graphs; only about parameters and the Communicator.
"""
from __future__ import annotations

from typing import Iterable, List

import torch

from .comm import Communicator, plan_buckets
from .errors import ClusterError

# DDP's first-bucket size: small enough that the first bucket is posted early in the backward (our
# models are small: a 3-layer width-64 SAGE on Cora holds 0.8 MB of parameters), large enough that a
# bucket's latency is small against its transfer.
OVERLAP_BUCKET_BYTES = 1 << 20


class GradientSync:
    """Reduce `params`' gradients (sum over all ranks) while the backward runs; call finish() after it."""

    def __init__(self, comm: Communicator, params: Iterable[torch.nn.Parameter], phase: str = "gradient",
                 bucket_bytes: int = OVERLAP_BUCKET_BYTES):
        self.comm, self.phase = comm, phase
        order = [p for p in params if p.requires_grad][::-1]
        layout = plan_buckets([p.numel() * p.element_size() for p in order], [p.dtype for p in order],
                              bucket_bytes)
        self.buckets: List[List[torch.nn.Parameter]] = [[order[i] for i in b] for b in layout]
        self._bucket_of = {id(p): k for k, b in enumerate(self.buckets) for p in b}
        self._handles = []
        # torch < 2.1 has no post-accumulate hook: every bucket is then posted in finish(), after the
        # backward, which is today's order (still bucketed, still hierarchical).
        self.overlaps = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
        if self.overlaps:
            self._handles = [p.register_post_accumulate_grad_hook(self._on_final) for p in order]
        self._reset()

    def _reset(self) -> None:
        self._missing = [len(b) for b in self.buckets]
        self._posted: list = []

    def _on_final(self, param: torch.Tensor) -> None:
        k = self._bucket_of[id(param)]
        self._missing[k] -= 1
        if self._missing[k] < 0:
            raise ClusterError("a parameter's gradient was accumulated twice in one backward pass, after its "
                               "bucket had been reduced; run with --no-overlap")
        while len(self._posted) < len(self.buckets) and self._missing[len(self._posted)] == 0:
            self._post(len(self._posted))
        for _, _, pending in self._posted:
            pending.poll()  # start the leaders' stage of buckets whose intra reduce has completed

    def _post(self, k: int) -> None:
        grads = []
        for p in self.buckets[k]:
            if p.grad is None:  # unused this step: reduce zeros, as allreduce_ over zero_grad'ed grads
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        aliased = len(grads) == 1 and grads[0].is_contiguous()
        with torch.no_grad():
            flat = grads[0].view(-1) if aliased else torch.cat([g.reshape(-1) for g in grads])
        after = self._posted[-1][2] if self._posted else None
        self._posted.append((k, None if aliased else grads, self.comm.reduce_flat_start(flat, self.phase, after)))

    def finish(self) -> None:
        """After backward: post what is left (in order), wait for every bucket, write the sums back."""
        while len(self._posted) < len(self.buckets):
            self._post(len(self._posted))
        with torch.no_grad():
            for _, grads, pending in self._posted:
                flat = pending.wait()
                if grads is not None:
                    for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
                        g.copy_(piece.view_as(g))
        self._reset()

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

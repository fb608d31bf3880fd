"""Gradients reduced during the backward pass, in flat buckets, like DDP's reducer.

Each parameter's post-accumulate-grad hook marks it final; a bucket whose parameters are all final is
posted at once (Communicator.reduce_flat_start: reduce to the server's leader, then the leaders'
sum -- a pairwise exchange on 2 servers, a ring in a helper thread on more -- which travels while the
backward computes the earlier layers' gradients: every later hook polls the posted buckets, and that
MPI_Testall is what moves them, with no polling thread), and
`finish()` after the backward waits for the buckets, broadcasts inside the servers and writes the sums
back into `.grad`.  Buckets hold the parameters in reverse order (the backward produces the last
layers' gradients first), cut at layer boundaries into about OVERLAP_BUCKETS buckets (plan_layer_buckets),
so the first is final after the last layer's backward and travels while the earlier layers'
backward computes; they are posted strictly in bucket order, so every rank issues the same
collectives in the same order whatever the timing.  Ledger bytes: the same model per bucket as
`Communicator.allreduce_`, which is linear in the bucket's size for the intra traffic and, on two
servers, for the leaders' pair (each leader sends its whole bucket), so on 2 servers the epoch's
gradient bytes are those of one bucket, per rank and in total (tests/mpi/test_overlap.py,
test_gradsync.py).  On more servers the job's total is too (the ring sends 2 (S-1) B in all), but a
leader's own share moves by the rounding of each bucket's ring chunks (a few elements per bucket).
The ledger has no per-message term; the time model (report/linkmodel.py) none either: each bucket's few
messages' latency is not modelled.

Knows nothing about graphs; only about parameters and the Communicator.
"""
from __future__ import annotations

from typing import Iterable, List, Optional, Tuple, Union

import torch

from .comm import Communicator
from .errors import ClusterError
from .layout import OVERLAP_BUCKETS, plan_layer_buckets



def layer_of(name: str) -> str:
    """The layer a parameter belongs to, from its name: the module path up to the first index
    ("convs.2.lin_self.weight" -> "convs.2"), else its module ("norm.weight" -> "norm")."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[:i + 1])
    return ".".join(parts[:-1])


class GradientSync:
    """Reduce the parameters' gradients (sum over all ranks) while the backward runs; call finish() after it.

    params: a model's named_parameters() (buckets cut at its layers, layer_of) or plain parameters
    (each its own unit).  The first backward runs on buckets in reverse registration order; its
    finish() then re-plans them in the order that backward made the gradients final (rank 0's order,
    broadcast: every rank must hold the same layout), as DDP rebuilds its buckets after the first
    iteration.  Registration order is not the backward's: ressage registers every LayerNorm after every
    conv, so norms.0 -- final only at the end of the backward -- would sit in the first bucket and hold
    every bucket back (they are posted strictly in order)."""

    def __init__(self, comm: Communicator,
                 params: Iterable[Union[torch.nn.Parameter, Tuple[str, torch.nn.Parameter]]],
                 phase: str = "gradient", buckets: Optional[int] = None):
        buckets = OVERLAP_BUCKETS if buckets is None else buckets
        if buckets < 1:
            raise ClusterError(f"buckets must be at least 1, got {buckets}")
        self.comm, self.phase, self._count = comm, phase, buckets
        named = [item if isinstance(item, tuple) else (str(i), item) for i, item in enumerate(params)]
        self._named = [(n, p) for n, p in named if p.requires_grad]
        self._index = {id(p): i for i, (_, p) in enumerate(self._named)}
        self._plan(list(range(len(self._named)))[::-1])
        self._handles = []
        # Per bucket: how many of the backward's gradient hooks had fired when it was posted (its
        # parameters' own included; -1: posted by finish(), after the backward).  Tests read it.
        self.posted_at: List[int] = []
        self._seen: List[int] = []     # this backward's hooks, in firing order (indices into _named)
        self._learned = False          # buckets re-planned from the first backward's order
        # torch < 2.1 has no post-accumulate hook: every bucket is then posted in finish(), after the
        # backward, which is today's order (still bucketed, still hierarchical).
        # One rank: the world's sum is this rank's own gradient, so there is nothing to post, hook,
        # flatten or copy back; finish() only gives unused parameters their zero gradient, as a bucket would.
        self.alone = comm.topo.world_size == 1
        self.overlaps = not self.alone and hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
        if self.overlaps:
            self._handles = [p.register_post_accumulate_grad_hook(self._on_final) for _, p in self._named]
        self._reset()

    def _plan(self, order: List[int]) -> None:
        """Buckets over the parameters in `order` (indices into _named, the first final first)."""
        params = [self._named[i][1] for i in order]
        nbytes = [p.numel() * p.element_size() for p in params]
        target = max(1, -(-sum(nbytes) // self._count))
        layout = plan_layer_buckets(nbytes, [p.dtype for p in params], [layer_of(self._named[i][0]) for i in order],
                                    target)
        self.buckets: List[List[torch.nn.Parameter]] = [[params[i] for i in b] for b in layout]
        self.bucket_names: List[List[str]] = [[self._named[order[i]][0] for i in b] for b in layout]
        self._bucket_of = {id(p): k for k, b in enumerate(self.buckets) for p in b}

    def bucket_bytes(self) -> List[int]:
        """Each bucket's bytes, in posting order."""
        return [sum(p.numel() * p.element_size() for p in b) for b in self.buckets]

    def _learn_order(self) -> None:
        """Once, after the first backward (collective): rank 0's hook order, its unused parameters last."""
        order = self.comm.topo.world.bcast(self._seen if self.comm.topo.rank == 0 else None, root=0)
        seen = set(order)
        if len(seen) != len(order) or not seen <= set(range(len(self._named))):
            raise ClusterError(f"GradientSync: rank 0's gradient order {order} is not a set of parameter indices")
        self._plan(order + [i for i in range(len(self._named))[::-1] if i not in seen])
        self._learned = True

    def _reset(self) -> None:
        self._missing = [len(b) for b in self.buckets]
        self._posted: list = []
        self._seen = []

    def _on_final(self, param: torch.Tensor) -> None:
        k = self._bucket_of[id(param)]
        self._seen.append(self._index[id(param)])
        self._missing[k] -= 1
        if self._missing[k] < 0:
            raise ClusterError("a parameter's gradient was accumulated twice in one backward pass, after its "
                               "bucket had been reduced; run with --no-overlap")
        while len(self._posted) < len(self.buckets) and self._missing[len(self._posted)] == 0:
            self._post(len(self._posted))
        for _, _, pending in self._posted:
            pending.poll()  # start the leaders' stage of buckets whose intra reduce has completed

    def _post(self, k: int, after_backward: bool = False) -> None:
        if k == 0:
            self.posted_at = []
        self.posted_at.append(-1 if after_backward else len(self._seen))
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
        if self.alone:
            for _, p in self._named:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            return
        while len(self._posted) < len(self.buckets):
            self._post(len(self._posted), after_backward=True)
        with torch.no_grad():
            for _, grads, pending in self._posted:
                flat = pending.wait()
                if grads is not None:
                    for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
                        g.copy_(piece.view_as(g))
        if self.overlaps and not self._learned:
            self._learn_order()
        self._reset()

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

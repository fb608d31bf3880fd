"""The GPU-only branches of training run through the CUDA test double (tests/cuda_double.py), 2 servers x
2 ranks on real Cora, with the intra-server transport over gloo (NCCL's code path) and over MPI:

- fb: the halo rows of every world exchange and every gradient bucket's MPI stages staged on the side
  stream (cluster/staging.py), their sends deferred until the copy's event has completed
  (cluster/pending.MPIProgress, cluster/allreduce.PendingReduce), the received rows copied back with
  the step's stream waiting for them;
- fb with --no-overlap: the blocking order's staged copies, each waited for before its MPI call;
- cob: the same as fb, and every co-batch made on the loader's stream (engine/cobstream.py) and waited for.

Every copy is delayed and poisons its destination first, and every torch operation of the main thread
that touches rows a copy is still writing raises, so a missing wait fails the run.  The runs must give
the very bits of the plain CPU run (staging only copies), and the copies must be those the exchanges
and buckets counted here call for: 2 per world exchange over gloo (the inter blocks out, then back),
4 over MPI (the intra blocks too), per bucket 2 on a leader over gloo (out for the leaders' sum, then
back), 4 on a leader and 3 elsewhere over MPI (out to the leader, the leader's sum back; the leaders'
sum back; out for the broadcast, and back where it is received) -- a branch bypassed changes them."""
import math

import pytest
import torch

from granndis_hpc.cluster.comm import Communicator
from tests.cuda_double import CudaDouble
from tests.mpi.conftest import make_trainer, on_every_rank

pytestmark = pytest.mark.mpi(min_size=4)
EPOCHS = 2


class _Calls:
    """The exchanges and buckets a rank starts, counted at the Communicator's entry points."""

    def __init__(self, monkeypatch):
        self.world = self.intra = self.buckets = self.blocking = 0
        spy = self

        def counted(name, attr):
            original = getattr(Communicator, name)

            def call(self, send, *args, **kwargs):
                if math.prod(send.shape[1:]) > 0:  # rows of some width (none: nothing is moved)
                    setattr(spy, attr, getattr(spy, attr) + 1)
                return original(self, send, *args, **kwargs)
            monkeypatch.setattr(Communicator, name, call)
        counted("world_exchange_start", "world")
        counted("intra_exchange_start", "intra")
        original = Communicator.reduce_flat_start

        def bucket(self, flat, *args, **kwargs):
            spy.buckets += 1
            return original(self, flat, *args, **kwargs)
        monkeypatch.setattr(Communicator, "reduce_flat_start", bucket)
        blocking = Communicator._reduce_flat

        def flat(self, *args, **kwargs):
            spy.blocking += 1
            return blocking(self, *args, **kwargs)
        monkeypatch.setattr(Communicator, "_reduce_flat", flat)


def _train(shards, mode, transport, device=None, calls=None, **extra):
    trainer = make_trainer(shards, mode, epochs=EPOCHS, intra_transport=transport, dropout=0.0, **extra)
    try:
        losses = [trainer.train_epoch()["loss"] for _ in range(EPOCHS)]
        params = [p.detach().clone() for p in trainer.model.parameters()]
        facts = dict(leader=trainer.topo.is_leader, staged=trainer.comm._staging.cuda)
        batches = getattr(trainer.mode, "batches", None)
        if batches is not None:
            loader = batches.loader
            facts.update(puts=loader.puts, waits=loader.waits, loader_streams=loader.cuda)
    finally:
        trainer.close()
    return losses, params, facts


def _expected_copies(calls, transport, leader):
    if transport == "gloo":  # a blocking bucket: out for the leaders' sum and back, on leaders
        return 2 * calls.world + (2 * (calls.buckets + calls.blocking) if leader else 0)
    # A blocking bucket over MPI: the reduce's out (and back on the leader), the leaders' sum out and back,
    # the broadcast's out (and back where it is received).
    return 4 * calls.world + 2 * calls.intra + (4 if leader else 3) * calls.buckets + \
        (5 if leader else 3) * calls.blocking


@pytest.mark.parametrize("mode,transport,extra", [
    ("fb", "gloo", {}),
    ("fb", "mpi", {}),
    ("fb", "mpi", {"no_overlap": True}),  # the blocking order: Alltoallv and the blocking all-reduce, staged
    ("cob", "gloo", {"batches_per_epoch": 2, "fanout": 5, "overlap_halos": "all"}),
    ("cob", "mpi", {"batches_per_epoch": 2, "fanout": 5, "overlap_halos": "all"}),
])
def test_gpu_branches_through_the_double_give_the_plain_bits(cora_shards, monkeypatch, transport, mode, extra):
    shards = cora_shards[("full", 3)]
    plain_losses, plain_params, plain = _train(shards, mode, transport, **extra)
    calls, device = _Calls(monkeypatch), CudaDouble(delay=0.002)
    with device.installed():
        losses, params, facts = _train(shards, mode, transport, device, calls, **extra)
    counts = device.counts

    def check():
        assert not plain["staged"] and facts["staged"]
        assert losses == plain_losses
        assert all(torch.equal(a, b) for a, b in zip(params, plain_params))
        assert calls.world + calls.intra > 0 and calls.buckets + calls.blocking > 0
        staged = _expected_copies(calls, transport, facts["leader"])
        uploads = facts.get("puts", 0)
        assert counts["copies"] == staged + uploads, (sorted(counts.items()), vars(calls), staged, uploads)
        assert counts["uploads"] == uploads
        # Every staging copy waits on the side stream for the rows it reads, and records its tensor there.
        assert counts["record_stream"] == staged and counts["side_wait_event"] == staged
        # Some send found its copy still running and was deferred (the copies take `delay`); blocking
        # calls wait for their copies instead.
        assert counts["query_pending"] > 0 or extra.get("no_overlap")
        if mode == "cob":
            steps = EPOCHS * extra["batches_per_epoch"]
            assert facts["loader_streams"] and uploads > 0 and facts["waits"] == steps
            assert counts["use_stream"] >= steps and counts["use_device"] >= steps
    on_every_rank(check)

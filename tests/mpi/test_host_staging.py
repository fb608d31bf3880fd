"""Host staging of MPI messages (cluster/staging.py), run on the CPU with the GPU's staging logic
(--host-staging: pooled host buffers, copies out before the sends are posted, copies back
after the receives), 2 servers x 2 ranks on real Cora with the MPI transport.

Staging only copies, so training must give the same bits as without it -- losses, parameters and every
ledger byte -- with the halo exchange and the gradient buckets overlapped (sends deferred until their
copy is complete, cluster/pending.MPIProgress) and blocking (--no-overlap: Alltoallv, the blocking
all-reduce).  The pool lends every buffer back by the end of a step and reuses them: the second epoch
allocates no new host memory."""

import pytest
import torch
from mpi4py import MPI

from tests.mpi.conftest import make_trainer, on_every_rank

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD


def _train(shards, staged, **extra):
    trainer = make_trainer(shards, "fb", epochs=2, intra_transport="mpi", host_staging=staged, **extra)
    try:
        pool = trainer.comm._staging.pool
        assert trainer.comm._staging.copies == staged
        records, allocated = [], []
        for _ in range(2):
            records.append(trainer.train_epoch())
            allocated.append((pool.allocated_bytes, pool.lent))
        params = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    finally:
        trainer.close()
    return records, params, allocated


@pytest.mark.parametrize("no_overlap", [False, True])
def test_staged_training_gives_the_same_bits(cora_shards, no_overlap):
    shards = cora_shards[("full", 3)]
    plain, staged = (_train(shards, s, no_overlap=no_overlap) for s in (False, True))

    def check():
        (rec_a, par_a, _), (rec_b, par_b, allocated) = plain, staged
        for a, b in zip(rec_a, rec_b):
            assert a["loss"] == b["loss"] and a["bytes"] == b["bytes"]
        for name in par_a:
            assert torch.equal(par_a[name], par_b[name]), name
        (first, lent1), (second, lent2) = allocated
        assert first > 0 and second == first and lent1 == lent2 == 0, allocated
    on_every_rank(check)

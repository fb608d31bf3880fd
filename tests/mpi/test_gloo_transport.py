"""The training engine with its intra-server transport over gloo, 2 servers x 2 ranks on real Cora.

On a GPU server the intra-server transport is NCCL, and NCCL runs the code gloo runs here on the CPU:
the server subgroups made by `torch.distributed.new_group`, `all_to_all_single(async_op=True)` for the
halo exchange (posted, then waited after the own-row work: overlap is on), `reduce(async_op=True)` and
`broadcast` for the gradient buckets during the backward, and `destroy_process_group` when a trainer
closes (each test below builds and tears down its own groups in the same process).  The CPU default is
the MPI transport, so without these tests that path would run in no training test.

The reference is the dense single-process model of tests/dense_reference.py: the same logits, and after
training the same parameters, in fb (world view: the intra blocks of every world exchange over gloo)
and flx (full preload, server view, every exchange over gloo, overlapped with `--overlap-halos all`)
and flx with world layers after a preloaded one."""
import copy

import numpy as np
import pytest
import torch
import torch.distributed as dist
from mpi4py import MPI

from tests.dense_reference import assert_parameters_close, dense_logits, train_dense
from tests.mpi.conftest import gather_by_global_id, make_trainer, on_every_rank

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
EPOCHS = 3


@pytest.mark.parametrize("mode,extra", [
    ("fb", {}),
    ("flx", {"overlap_halos": "all"}),
    ("flx", {"preloaded_layers": 1}),
])
def test_gloo_transport_equals_the_dense_reference(cora, cora_shards, mode, extra):
    trainer = make_trainer(cora_shards[("full", 3)], mode, epochs=EPOCHS, intra_transport="gloo", **extra)
    try:
        on_every_rank(lambda: _check_groups(trainer))
        initial = copy.deepcopy(trainer.model)
        trainer.model.eval()
        with torch.no_grad():
            before = gather_by_global_id(trainer, trainer.inner_logits())
        records = [trainer.train_epoch() for _ in range(EPOCHS)]
    finally:
        trainer.close()
    on_every_rank(lambda: _check_torn_down())
    for rec in records:  # both stages went over gloo: halo rows and gradient buckets inside each server
        assert int(np.sum(rec["bytes"]["intra_halo"])) > 0 and int(np.sum(rec["bytes"]["intra_grad"])) > 0
    if WORLD.rank == 0:
        want = dense_logits("sage", initial, cora.indptr, cora.indices, torch.from_numpy(cora.features),
                            degrees=torch.from_numpy(cora.in_degree())).detach().numpy()
        err = np.abs(before - want).max() / np.abs(want).max()
        assert err < 1e-4, f"{mode}: logits differ from the dense reference by {err:.2e} relative"
        assert_parameters_close(trainer.model, train_dense(cora, initial, EPOCHS, 0.01), 1e-4, label=f"{mode}: ")


def _check_groups(trainer):
    assert trainer.comm.intra_transport == "gloo"
    group = trainer.topo.intra_group
    assert group is not None and dist.get_backend(group) == "gloo"
    assert dist.get_world_size(group) == trainer.topo.ranks_per_server


def _check_torn_down():
    assert not dist.is_initialized(), "the trainer left torch.distributed initialised after close()"

"""Host synchronisations on the training step's path, counted on the CPU (cluster/hostsync.SyncCounter).

Each call the counter records would make the host wait for the GPU on a CUDA run (`.item()`, `float(t)`,
`.tolist()`, `.cpu()`, `.numpy()` of a device tensor, a blocking copy between devices,
`torch.cuda.synchronize`).  A step has one: the loss it returns (`float(loss)`).  A change that adds one
to the step -- a timer that synchronises, a count read back from a device tensor -- fails here with the
file and line of the new call.  2 servers x 2 ranks on real Cora, overlap on (the default): the posted
halo exchanges, the gradient buckets reduced during the backward, in fb, flx and co-batched cob.  The
second epoch is counted: the first builds each graph's sparse matrices once (nn/graph.py checks its
arrays and converts them there, outside the steady state).  cob builds the matrices of each co-batch's
graphs inside its step (their checks read device values): those calls, in nn/graph.py, are not counted
against it; everything else in its step is held to the same rule."""
from collections import Counter

import pytest
from mpi4py import MPI

from tests.mpi.conftest import counted_steps, make_trainer, on_every_rank

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD


@pytest.mark.parametrize("mode,extra", [
    ("fb", {}),
    ("flx", {"preloaded_layers": 1, "dropout": 0.5}),
    ("cob", {"batches_per_epoch": 2, "fanout": 5}),
])
def test_a_training_step_syncs_the_host_once_for_its_loss(cora_shards, mode, extra):
    trainer = make_trainer(cora_shards[("full", 3)], mode, epochs=2, **extra)
    try:
        trainer.train_epoch()
        per_step = [counter.calls for counter in counted_steps(trainer)]
    finally:
        trainer.close()

    def check():
        assert per_step, "the epoch ran no step"
        for calls in per_step:
            if mode == "cob":  # a co-batch's graphs are new each step: their matrices are built in it
                calls = [c for c in calls if not c[1].startswith("granndis_hpc/nn/graph.py:")]
            assert [name for name, _ in calls] == ["__float__"], \
                f"{mode}: host syncs in a step (call, where: times): {dict(Counter(calls))}"
    on_every_rank(check)

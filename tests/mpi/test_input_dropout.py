"""Input dropout (--input-dropout) keeps the exact modes exact, on real Cora (mpirun -n 4).

Layer 0's halo is the static features exchanged once at set-up.  Input dropout is drawn after gather,
for own and halo rows alike, from each row's global id (nn/dropout.py RowDropout.sources), so every
rank draws the owner's mask itself: fb and flx (k = L and k < L) on 2x2 and 4x1 follow the
single-process trajectory (tests/dense_reference.train_dense with the same masks over vertex ids
0..N-1), with hidden dropout and first-layer weight decay as in Kipf & Welling's GCN recipe, and the
halo traffic per epoch is the same as without input dropout."""
import copy

import pytest
import torch
from mpi4py import MPI

from tests.dense_reference import train_dense
from tests.mpi.conftest import make_trainer

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
P_IN, P, EPOCHS, LR, WD, SEED, LAYERS = 0.5, 0.5, 8, 0.01, 5e-4, 7, 3
RECIPE = dict(epochs=EPOCHS, lr=LR, dropout=P, input_dropout=P_IN, seed=SEED, weight_decay=WD,
              weight_decay_on="first")


@pytest.fixture(scope="module")
def shard_sets(cora_shapes):
    """Full 3-hop shard sets for 2x2 and 4x1 (the session's, tests/mpi/conftest.py), keyed by ranks per server."""
    assert LAYERS == 3  # the layers cora_shapes is built for
    return {2: cora_shapes[2], 1: cora_shapes[1]}


def _train(shards, mode, ranks_per_server, **extra):
    trainer = make_trainer(shards, mode, "gcn", LAYERS, ranks_per_server=ranks_per_server, **{**RECIPE, **extra})
    try:
        initial = copy.deepcopy(trainer.model)
        summary = trainer.run()
        return initial, trainer.model, summary
    finally:
        trainer.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode,k", [("fb", None), ("flx", 3), ("flx", 1)])
def test_input_dropout_training_equals_reference(cora, shard_sets, mode, k):
    extra = {"preloaded_layers": k} if mode == "flx" else {}
    results = {rps: _train(shard_sets[rps], mode, rps, **extra) for rps in (2, 1)}
    if WORLD.rank != 0:
        return
    initial = results[2][0]
    want = train_dense(cora, initial, EPOCHS, LR, dropout=P, input_dropout=P_IN, seed=SEED, weight_decay=WD,
                       first_layer_decay_only=True, dtype=torch.float64)
    # The reference without input dropout is far from it: the masks of the input matter.
    plain = train_dense(cora, initial, EPOCHS, LR, dropout=P, seed=SEED, weight_decay=WD,
                        first_layer_decay_only=True, dtype=torch.float64)
    gap = max((a.detach() - b.detach()).abs().max().item()
              for a, b in zip(want.parameters(), plain.parameters()))
    assert gap > 1e-3
    for rps, shape in ((2, "2x2"), (1, "4x1")):
        model = results[rps][1]
        for (name, got), (_, ref) in zip(model.named_parameters(), want.named_parameters()):
            err = (got.detach().double() - ref.detach()).abs().max().item()
            assert err <= 1e-5, f"{mode} k={k} on {shape}: {name} max error {err:.3e} against the reference"


@pytest.mark.timeout(120)
def test_input_dropout_costs_no_halo_exchange(shard_sets):
    """The cached layer-0 halo stays valid: the same bytes per epoch with and without input dropout."""
    with_drop = _train(shard_sets[2], "fb", 2, epochs=2)[2]
    without = _train(shard_sets[2], "fb", 2, epochs=2, input_dropout=0.0)[2]
    assert with_drop["bytes_per_epoch"] == without["bytes_per_epoch"]
    assert with_drop["bytes_per_epoch"]["inter_halo"] > 0  # fb exchanges hidden layers' halos


def test_input_dropout_refused_for_a_model_that_ignores_it(shard_sets):
    from granndis_hpc.cluster.errors import ClusterError
    from granndis_hpc.nn import models

    class Plain(models.PlainGNN):
        contract = models.ModelContract()  # input_dropout_rows None

    models.MODELS["plain-no-input-dropout"] = lambda f, h, c, l, d, n: Plain("sage", f, h, c, l, d, n)
    try:
        with pytest.raises(ClusterError, match="does not apply input dropout"):
            make_trainer(shard_sets[2], "fb", "plain-no-input-dropout", LAYERS, input_dropout=0.5)
    finally:
        del models.MODELS["plain-no-input-dropout"]

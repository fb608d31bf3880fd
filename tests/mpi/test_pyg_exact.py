"""The `pyg` model family on real Cora (mpirun -n 4, fb on 2x2): a stack of torch_geometric convolutions
gives, distributed, the logits of the same stack run by plain PyG on the whole graph in one process, and
after training the parameters of plain PyG training (Adam on the mean cross-entropy of the training
vertices); a convolution that cannot run partitioned is refused with the reason on every rank."""
import copy

import numpy as np
import pytest
import torch

from tests.mpi.conftest import gather_by_global_id, make_trainer

pytest.importorskip("torch_geometric")
pytestmark = pytest.mark.mpi(min_size=4)
from mpi4py import MPI  # noqa: E402

from granndis_hpc.cluster.errors import ClusterError  # noqa: E402

from tests.mpi.test_zoo_exact import _assert_trained_close  # noqa: E402
from tests.pyg_factories import plain_pyg_logits  # noqa: E402

WORLD = MPI.COMM_WORLD
EPOCHS, LR = 3, 0.01


def _edge_index(cora):
    dst = np.repeat(np.arange(cora.num_vertices), np.diff(cora.indptr))
    return torch.from_numpy(np.stack([cora.indices, dst]).astype(np.int64))


def _train_plain(cora, model, edge_index):
    model = copy.deepcopy(model).double()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    x, y = torch.from_numpy(cora.features).double(), torch.from_numpy(cora.labels)
    train = torch.from_numpy(np.flatnonzero(cora.train_mask))
    for _ in range(EPOCHS):
        opt.zero_grad()
        logits = plain_pyg_logits(model, x, edge_index)
        (torch.nn.functional.cross_entropy(logits[train], y[train], reduction="sum") / len(train)).backward()
        opt.step()
    return model


def _without(model, names):
    """A copy of `model` whose parameters `names` are set to 0 (left out of the comparison)."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in names:
                p.zero_()
    return model


@pytest.mark.parametrize("factory", ["attention", "sums"])
def test_pyg_stack_equals_plain_pyg_on_the_whole_graph(cora, cora_shards, factory):
    options = ["module=tests.pyg_factories", f"factory={factory}"]
    trainer = make_trainer(cora_shards[("full", 3)], "fb", "pyg", 3, hidden=8, epochs=EPOCHS, lr=LR,
                           model_option=options)
    try:
        edge_index = _edge_index(cora)
        trainer.model.eval()
        with torch.no_grad():
            got = gather_by_global_id(trainer, trainer.logits(trainer.train_view, "halo"))
        initial = copy.deepcopy(trainer.model)
        trainer.model.train()
        trainer.run()
        if WORLD.rank == 0:
            with torch.no_grad():
                want = plain_pyg_logits(initial, torch.from_numpy(cora.features), edge_index).numpy()
            err = np.abs(got - want).max() / np.abs(want).max()
            assert err < 1e-4, f"{factory}: logits' max relative error {err:.3e}"
            ref = _train_plain(cora, initial, edge_index)
            moved = max((a.detach().double() - b.detach()).abs().max().item()
                        for a, b in zip(initial.parameters(), ref.parameters()))
            assert moved > 1e-3  # training moved the parameters
            # TransformerConv's key bias adds the same q.b to every logit of a destination's softmax: its
            # exact gradient is 0, and Adam scales the float32 rounding residue (which differs from the
            # float64 reference's) into steps of up to lr; it is checked to Adam's bound, the rest tightly.
            invariant = [n for n, _ in ref.named_parameters() if n.endswith("lin_key.bias")]
            for name in invariant:
                got, want = dict(trainer.model.named_parameters())[name], dict(ref.named_parameters())[name]
                assert (got.detach().double() - want.detach()).abs().max().item() <= EPOCHS * LR * 1.01, name
            _assert_trained_close(_without(trainer.model, invariant), _without(ref, invariant), f"{factory}: ")
    finally:
        trainer.close()


def test_a_conv_that_cannot_run_partitioned_is_refused_with_the_reason(cora_shards):
    """On every rank together: the one-line error main_guard prints once."""
    with pytest.raises(ClusterError, match=r"GCNConv\(normalize=True\) computes the degrees.*normalize=False") as info:
        make_trainer(cora_shards[("full", 3)], "fb", "pyg", 3, hidden=8,
                     model_option=["module=tests.pyg_factories", "factory=normalized_gcn"])
    assert info.value.collective


def test_pyg_stack_runs_in_flx_exactly_and_learns_in_the_sampled_modes(cora, cora_shards):
    """flx with one preloaded layer gives the plain PyG logits; eas, cob and mb sample (not compared with
    the reference): the stack trains there and the loss falls."""
    options = ["module=tests.pyg_factories", "factory=sums"]
    trainer = make_trainer(cora_shards[("full", 3)], "flx", "pyg", 3, hidden=8, model_option=options,
                           preloaded_layers=1)
    try:
        trainer.model.eval()
        with torch.no_grad():
            got = gather_by_global_id(trainer, trainer.logits(trainer.train_view, "halo"))
        if WORLD.rank == 0:
            with torch.no_grad():
                want = plain_pyg_logits(trainer.model, torch.from_numpy(cora.features), _edge_index(cora)).numpy()
            assert np.abs(got - want).max() / np.abs(want).max() < 1e-4
    finally:
        trainer.close()
    for mode, shards, extra in (("eas", cora_shards[("eas", 3)], {}),
                                ("cob", cora_shards[("full", 3)], {"batches_per_epoch": 2, "fanout": 5}),
                                ("mb", cora_shards[("full", 3)], {"batches_per_epoch": 2, "fanout": 5})):
        trainer = make_trainer(shards, mode, "pyg", 3, hidden=8, lr=0.01, model_option=options, **extra)
        try:
            losses = [trainer.train_epoch()["loss"] for _ in range(8)]
        finally:
            trainer.close()
        assert all(np.isfinite(losses)) and np.mean(losses[-2:]) < 0.9 * np.mean(losses[:2]), (mode, losses)

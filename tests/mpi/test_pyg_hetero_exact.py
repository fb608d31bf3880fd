"""`--model pyg-hetero` on a heterogeneous graph (tests/hetero_graphs.py: papers, authors, fields; five
relations), mpirun -n 4 on 2x2: in fb and flx (k = L and k < L) the logits, gathered by global id, equal
PyG's own HeteroConv of the model's per-relation convs run on rank 0 over the whole graph
(tests/pyg_factories.py heteroconv_logits); a conv that cannot serve a relation is refused on every rank; cob trains."""
import copy

import numpy as np
import pytest
import torch

from tests.hetero_graphs import typed_graph
from tests.mpi.conftest import assert_views_close, build_sets_on_rank0, make_trainer, view_logits

pytest.importorskip("torch_geometric")
pytestmark = pytest.mark.mpi(min_size=4)
from mpi4py import MPI  # noqa: E402

from granndis_hpc.cluster.errors import ClusterError  # noqa: E402

from tests.pyg_factories import heteroconv_logits  # noqa: E402

WORLD = MPI.COMM_WORLD
LAYERS = 3


@pytest.fixture(scope="module")
def typed():
    return typed_graph()


@pytest.fixture(scope="module")
def typed_set(typed):
    spec = {"typed-2": {"servers": WORLD.size // 2, "gpus_per_server": 2, "layers": LAYERS, "preload": "full"}}
    return build_sets_on_rank0(typed, spec, prefix="granndis-pyg-hetero-")["typed-2"]


@pytest.mark.parametrize("factory,mode,k", [("hetero_mixed", "fb", None), ("hetero_mixed", "flx", 3),
                                            ("hetero_gat", "flx", 1), ("hetero_sage", "fb", None)])
def test_logits_equal_pyg_heteroconv(typed, typed_set, factory, mode, k):
    extra = {"preloaded_layers": k} if k is not None else {}
    trainer = make_trainer(typed_set, mode, "pyg-hetero", LAYERS, hidden=8, ranks_per_server=2,
                           model_option=["module=tests.pyg_factories", f"factory={factory}"], **extra)
    try:
        views = view_logits(trainer)
        if WORLD.rank == 0:
            model = copy.deepcopy(trainer.model).double()
            with torch.no_grad():
                want = heteroconv_logits(model, typed.types, typed.indptr, typed.indices,
                                         torch.from_numpy(typed.features).double()).numpy()
            assert_views_close(views, want, f"{factory} {mode} k={k}")
    finally:
        trainer.close()


def test_a_conv_that_cannot_serve_a_relation_is_refused_on_every_rank(typed_set):
    with pytest.raises(ClusterError, match=r"--model pyg-hetero: GATv2Conv\(add_self_loops=True\) would join") as info:
        make_trainer(typed_set, "fb", "pyg-hetero", LAYERS, hidden=8, ranks_per_server=2,
                     model_option=["module=tests.pyg_factories", "factory=gatv2"])
    assert info.value.collective


@pytest.mark.parametrize("mode", ["cob"])
def test_sampled_modes_train(typed_set, mode):
    """cob samples, so they are not compared with the reference: the model trains and the loss falls."""
    trainer = make_trainer(typed_set, mode, "pyg-hetero", LAYERS, hidden=8, lr=0.02, ranks_per_server=2,
                           batches_per_epoch=2, fanout=4, dropout=0.3, norm=True,
                           model_option=["module=tests.pyg_factories", "factory=hetero_mixed"])
    try:
        losses = [trainer.train_epoch()["loss"] for _ in range(10)]
    finally:
        trainer.close()
    assert all(np.isfinite(losses)) and np.mean(losses[-3:]) < 0.9 * np.mean(losses[:3]), losses

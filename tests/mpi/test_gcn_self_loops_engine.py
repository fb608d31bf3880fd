"""GCN through the engine on Cora built with `--self-loops add` (every vertex has a stored loop) equals
PyG's GCNConv semantics (add_remaining_self_loops), in fb and flx (mpirun -n 4, 2 servers x 2 ranks).

The views exchange a halo row's degree without its stored loop (engine/views.py) and count own rows'
loops; before the fix the loop was counted twice and the logits were off by ~0.2 (relative)."""

import numpy as np
import pytest
import torch
from mpi4py import MPI

from tests.conftest import require_planetoid
from tests.mpi.conftest import build_sets_on_rank0, gather_by_global_id, make_trainer
from tests.unit.test_gcn_self_loops import _pyg_gcn_operator

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
LAYERS = 3


@pytest.fixture(scope="module")
def looped():
    from granndis_hpc.preprocess.sources import load

    graph = load("planetoid", name="cora", root=str(require_planetoid()), self_loops="add")
    out = build_sets_on_rank0(graph, {"cora-loops": {"layers": LAYERS, "preload": "full"}},
                              prefix="granndis-loops-")["cora-loops"]
    return graph, out


@pytest.mark.parametrize("mode", ["fb", "flx"])
def test_gcn_with_stored_loops_equals_pyg_semantics(looped, mode):
    graph, shards = looped
    n = graph.indptr.shape[0] - 1
    rows = np.repeat(np.arange(n), np.diff(graph.indptr))
    assert np.array_equal(np.unique(rows[rows == graph.indices]), np.arange(n))  # every vertex stores a loop
    trainer = make_trainer(shards, mode, "gcn", LAYERS)
    try:
        trainer.model.eval()
        with torch.no_grad():
            got = [gather_by_global_id(trainer, trainer.logits(trainer.train_view, "halo")),
                   gather_by_global_id(trainer, trainer.inner_logits())]
        if WORLD.rank == 0:
            op = _pyg_gcn_operator(graph.indptr, graph.indices, n)
            p = {k: v.detach().double() for k, v in trainer.model.named_parameters()}
            h = torch.from_numpy(graph.features).double()
            for l in range(LAYERS):
                if l > 0:
                    h = torch.relu(h)
                h = op @ (h @ p[f"convs.{l}.lin.weight"].T) + p[f"convs.{l}.bias"]
            want = h.numpy()
            for g in got:
                err = np.abs(g - want).max() / np.abs(want).max()
                assert err < 1e-5, f"{mode}: max relative error {err:.3e} against PyG's GCN semantics"
    finally:
        trainer.close()

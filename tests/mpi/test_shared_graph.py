"""One graph for the layers whose rows do not change: the world view (fb's training plan and every
mode's evaluation) computes every row at every layer, so its layers share one LayerGraph -- one copy of
indptr/indices/degrees and one set of cached sparse matrices and row splits -- instead of L copies.
The server view of a preload (flx) changes its rows by layer and keeps one graph per layer.  The memory
model counts the shared graph once.  2 servers x 2 ranks on real Cora; fb's results equal the dense
reference in test_engine_exact.py with the shared graph."""
import pytest
import torch
from mpi4py import MPI

from granndis_hpc import memory_model as mm
from tests.mpi.conftest import make_trainer, on_every_rank

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD


def test_world_view_layers_share_one_graph_and_the_model_counts_it_once(cora_shards):
    path = cora_shards[("full", 3)]
    trainer = make_trainer(path, "fb", layers=3)
    try:
        trainer.train_epoch()
        with torch.no_grad():
            trainer.inner_logits()
        world = trainer.world_view
        flx_view = None
    finally:
        trainer.close()
    trainer = make_trainer(path, "flx", layers=3)
    try:
        flx_view = trainer.train_view
    finally:
        trainer.close()

    def check():
        graphs = world.graphs
        assert len(graphs) == 3 and all(g is graphs[0] for g in graphs)
        assert graphs[0]._cache, "the epoch built no matrix"
        assert all(s is world._send[0] for s in world._send) and len(world.__dict__.get("_row_splits", {})) <= 1
        assert len({id(g) for g in flx_view.graphs}) == 3  # rows change by layer: one graph each
    on_every_rank(check)

    if WORLD.rank == 0:
        _, servers = mm.read_shard_set(path)
        manifest = trainer.manifest
        graph = {}
        # From 3 layers on the split matrices of the overlapped order are fixed too (one boundary-first
        # split, one last layer's), so the estimate does not grow with depth.
        for layers in (3, 4):
            rows = mm.shard_rows(servers, layers, 0, int(manifest["dataset"]["num_features"]),
                                 int(manifest["dataset"]["num_classes"]))
            spec = mm.model_for(manifest, "sage", 16, layers)
            graph[layers] = [mm.estimate(r, spec)["breakdown"]["graph"] for r in rows]
        assert graph[3] == graph[4]  # fb: one world graph whatever the depth

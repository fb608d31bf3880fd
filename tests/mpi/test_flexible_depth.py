"""Flexible Preloading with k < L on real Cora, 2 servers x 2 ranks (mpirun -n 4).

A 4-layer model on shard sets preloaded with k = 1..4 hops: the first k layers run on the server's
preloaded graph (intra-server exchange only), the remaining 4-k with the world exchange.  Every k must
equal the dense single-process reference (tests/dense_reference.py) in logits and, after EPOCHS,
in parameters; the ledger shows the trade: inter-server halo bytes fall linearly in k to 0 at k = L,
while the rows computed per epoch grow."""
import copy

import numpy as np
import pytest
import torch
from mpi4py import MPI

from tests.dense_reference import assert_parameters_close, dense_logits, train_dense
from tests.mpi.conftest import build_sets_on_rank0, gather_by_global_id, make_trainer

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
LAYERS = 4
EPOCHS = 8  # each a full Adam step: a wrong backward shows at the first
DEPTHS = list(range(1, LAYERS + 1))


@pytest.fixture(scope="module")
def depth_shards(cora):
    """Full preloads of k = 1..L hops for an L-layer model, keyed by k."""
    built = build_sets_on_rank0(cora, {f"cora-full-L{LAYERS}-k{k}": {"layers": LAYERS, "preload": "full", "hops": k}
                                       for k in DEPTHS}, prefix="granndis-depth-")
    return {k: built[f"cora-full-L{LAYERS}-k{k}"] for k in DEPTHS}


def _relative_error(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("model", ["sage", "gcn"])
@pytest.mark.parametrize("k", DEPTHS)
def test_logits_equal_dense_reference(cora, depth_shards, model, k):
    trainer = make_trainer(depth_shards[k], "flx", model, LAYERS)
    try:
        assert trainer.train_view.groups == ["server"] * k + ["world"] * (LAYERS - k)
        trainer.model.eval()
        with torch.no_grad():
            got = gather_by_global_id(trainer, trainer.logits(trainer.train_view, "halo"))
        if WORLD.rank == 0:
            want = dense_logits(model, trainer.model, cora.indptr, cora.indices, torch.from_numpy(cora.features),
                                degrees=torch.from_numpy(cora.in_degree())).detach().numpy()
            err = _relative_error(got, want)
            assert err < 1e-4, f"k={k}: max relative error {err:.3e}"
    finally:
        trainer.close()


# The backward at each k < L, the two models taking turns (the forward of both at every k is the logits
# test's; k = L is tests/mpi/test_engine_exact.py's flx).
@pytest.mark.parametrize("k,model", [(1, "sage"), (2, "gcn"), (3, "sage")])
def test_parameters_after_training_equal_reference(cora, depth_shards, model, k):
    trainer = make_trainer(depth_shards[k], "flx", model, LAYERS, epochs=EPOCHS)
    try:
        initial = copy.deepcopy(trainer.model)
        trainer.run()
        if WORLD.rank == 0:
            ref = train_dense(cora, initial, EPOCHS, 0.01)
            assert_parameters_close(trainer.model, ref, 1e-4, f"k={k} ")
    finally:
        trainer.close()


def test_ledger_shows_the_trade(depth_shards):
    """Per epoch, inter-server halo bytes = (L-k) world layers x (forward + backward) x the world halo:
    fb's (which caches its layer-0 input) equals k = 1's, and k = L sends none.  Rows computed grow
    with k (the preloaded rows of hop >= 1 are computed redundantly on every server that holds them)."""
    inter, computed = {}, {}
    for name, shard_dir, mode in [("fb", depth_shards[LAYERS], "fb")] + [(k, depth_shards[k], "flx") for k in DEPTHS]:
        trainer = make_trainer(shard_dir, mode, "sage", LAYERS)
        try:
            rec = trainer.train_epoch()
            inter[name] = rec["bytes"]["inter_halo"]
            computed[name] = int(trainer.comm.allreduce_scalar(
                sum(int(g.n_dst) for g in trainer.train_view.graphs), "sum"))
            if name == "fb":
                # Bytes of one world layer's halo at the hidden width, forward and backward, summed
                # over the ranks: rows this rank receives from other servers, counted by the sender
                # (on the default per-server route, those its route's plan receives across servers).
                wv = trainer.world_view
                other = np.flatnonzero(trainer.topo._server_of != trainer.topo.server)
                plan = wv.plan.layers[1] if wv._routes is None else wv._routes[1].plan
                rows_in = int(plan.recv_counts[other].sum())
                per_layer = int(trainer.comm.allreduce_scalar(rows_in, "sum")) * 16 * 4 * 2
        finally:
            trainer.close()
    assert inter["fb"] == (LAYERS - 1) * per_layer > 0
    for k in DEPTHS:
        assert inter[k] == (LAYERS - k) * per_layer, (k, inter)
    assert inter[LAYERS] == 0
    assert computed["fb"] == computed[1] < computed[2] < computed[3] < computed[4], computed

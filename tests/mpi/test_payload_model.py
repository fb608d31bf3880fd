"""The byte model of fb's partial payloads (memory_model/payload.py) against the ledger of a real run on
Cora (mpirun -n 4, 2 servers x 2 ranks): the inter- and intra-server halo bytes of one epoch of fb with
--halo-payload partial and smaller, on both routes, equal what `preprocess plan` (the build's arrays,
never written) and --mode auto's model of the shard set (its arrays on disk) predict."""
import os
import shutil

import pytest
from mpi4py import MPI

from tests.mpi.conftest import RANKS_PER_SERVER, TEST_ROW_BLOCK_ROWS, make_trainer, on_rank0

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
HIDDEN = 16


def _predicted(cora, shards, route):
    """Rank 0: label -> (inter-server halo bytes, intra-server halo bytes) of one epoch, from the plan and
    from the shard set, which must agree."""
    from granndis_hpc import memory_model as mm
    from granndis_hpc.preprocess.plan import command as plan

    cfg = plan.PlanConfig(servers=WORLD.size // RANKS_PER_SERVER, gpus_per_server=RANKS_PER_SERVER, layers=3,
                          hidden=HIDDEN, dropout=0.0, partitioner="metis", seed=0, row_block_rows=TEST_ROW_BLOCK_ROWS,
                          eas=False, device="cpu", ks=[0], halo_route=route)
    planned = {o.label: o for o in plan.plan_options(MPI.COMM_SELF, cora, cfg)["options"]}
    manifest, servers = mm.read_shard_set(shards)
    m = mm.with_payloads(mm.model_for(manifest, "sage", HIDDEN, 3, dropout=0.0, halo_route=route))
    s = mm.set_arrays(shards, manifest, servers)
    s.ks, s.sample_cobatches = [0], False  # fb's options only, as the plan's ks=[0]
    model = {o.label: o for o in mm.options(mm.row_groups(s, 3, m, mm.Sampling()), m, cfg.servers)}
    assert set(planned) == set(model) == {"fb", "fb payload=partial", "fb payload=smaller"}
    out = {}
    for label, o in planned.items():
        assert o.inter_server_bytes == model[label].inter_server_bytes, label
        assert (o.work.intra_bytes == model[label].work.intra_bytes).all(), label
        out[label] = (o.inter_server_bytes["halo"], int(o.work.intra_bytes.sum()), o.peak)
    return out


@pytest.mark.parametrize("route", ["direct", "per-server"])
def test_predicted_bytes_equal_the_ledgers(cora, cora_shapes, route):
    """Bytes exactly; memory: the torch allocations of set-up and an epoch (on the CPU: features read
    through NumPy are not among them) stay under the estimated peak, which adds the payload's structures."""
    from granndis_hpc.memory_model.profile import measure_step_peak

    predicted = on_rank0(lambda: _predicted(cora, cora_shapes[2], route))
    for payload in ("rows", "partial", "smaller"):
        got = {}

        def train():
            trainer = make_trainer(cora_shapes[2], "fb", "sage", 3, hidden=HIDDEN, halo_payload=payload,
                                   no_overlap=True, halo_route=route)
            try:
                trainer.train_epoch()
                got["bytes"] = (trainer.ledger.bytes("inter", "halo"), trainer.ledger.bytes("intra", "halo"))
            finally:
                trainer.close()
        peak = max(WORLD.allgather(measure_step_peak(train)))
        every = WORLD.allgather(got["bytes"])
        label = "fb" if payload == "rows" else f"fb payload={payload}"
        measured = tuple(sum(g[i] for g in every) for i in (0, 1))
        assert measured == predicted[label][:2], (route, payload, measured, predicted[label])
        assert peak <= predicted[label][2], (route, payload, peak, predicted[label][2])


def test_auto_runs_the_payload_it_chooses(monkeypatch):
    """--mode auto on a 1-hop set (fb with each payload; flx k=1) priced with an inter-server link so slow
    that its bytes decide: fb payload=smaller, the fewest, is chosen; the run trains fb with
    --halo-payload smaller, its summary entry says so, and its ledger's halo bytes are the predicted ones.
    The graph's features are narrow, so that the halo, not the gradient (Cora's 1433-wide first layer),
    makes most of the bytes."""
    from granndis_hpc import memory_model as mm
    from granndis_hpc.preprocess.sources import load
    from tests.mpi.conftest import build_sets_on_rank0

    def graph():
        return load("synthetic", vertices=1500, avg_degree=8.0, features=8, classes=4, seed=1)

    shards = build_sets_on_rank0(graph, {"h1": {"layers": 3, "preload": "full", "hops": 1}},
                                 prefix="granndis-payload-auto-")["h1"]
    decide = mm.ShardSetOptions.decide
    slow = mm.Rates(inter_Bps=1e3, intra_Bps=1e9, row_s=1e-12, edge_s=1e-12)
    monkeypatch.setattr(mm.ShardSetOptions, "decide", lambda self, rates_for=None: decide(self, lambda m, degree: slow))
    trainer = make_trainer(shards, "auto", "sage", 3, hidden=HIDDEN, memory_per_gpu="64GiB", no_overlap=True,
                           auto_modes="exact")
    try:
        decision, cfg = trainer.mode.decision, trainer.cfg
        assert {"fb", "fb payload=partial", "fb payload=smaller"} <= {o["label"] for o in decision["options"]}
        choice = decision["choice"]
        assert choice["label"] == "fb payload=smaller" and choice["train_options"] == {"halo_payload": "smaller"}
        assert (cfg.mode, cfg.halo_payload) == ("fb", "smaller") and trainer.world_view.payload is not None
        assert trainer.mode.describe(trainer.manifest)["auto"]["choice"]["payload"] == "smaller"
        trainer.train_epoch()
        got = sum(WORLD.allgather(trainer.ledger.bytes("inter", "halo")))
    finally:
        trainer.close()
        WORLD.barrier()
        if WORLD.rank == 0:  # the set this test built
            shutil.rmtree(os.path.dirname(shards), ignore_errors=True)
    assert got == choice["inter_server_bytes"]["halo"]

"""Per-rank and per-server bytes of the epoch record (2 servers x 2 ranks, real Cora): every rank's own
ledger, gathered as plain objects, must sum to the record's totals, its largest entry must be the
record's max_rank_bytes, and the sums over each server's ranks its inter_bytes_per_server."""
import pytest
from mpi4py import MPI

from tests.mpi.conftest import make_trainer

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD


def _own_classes(ledger):
    """This rank's epoch bytes by class, read from its ledger one counter at a time."""
    return {"intra_halo": ledger.bytes("intra", "halo") + ledger.bytes("intra", "setup"),
            "inter_halo": ledger.bytes("inter", "halo") + ledger.bytes("inter", "setup"),
            "intra_grad": ledger.bytes("intra", "gradient"), "inter_grad": ledger.bytes("inter", "gradient")}


@pytest.mark.parametrize("mode,extra", [("fb", {}), ("flx", {}), ("cob", {"batches_per_epoch": 2, "fanout": 5})])
def test_per_rank_bytes_sum_to_the_totals(cora_shards, mode, extra):
    trainer = make_trainer(cora_shards[("full", 3)], mode, **extra)
    try:
        rec = trainer.train_epoch()  # the ledger still holds this epoch's counts (reset at the next one)
        own = WORLD.allgather(_own_classes(trainer.ledger))
        server_of = [trainer.topo.server_of(r) for r in range(WORLD.size)]
        servers = trainer.topo.servers
    finally:
        trainer.close()
    keys = ("intra_halo", "inter_halo", "intra_grad", "inter_grad")
    assert rec["bytes"] == {k: sum(o[k] for o in own) for k in keys}
    assert rec["max_rank_bytes"] == {k: max(o[k] for o in own) for k in keys}
    per_server = [sum(o["inter_halo"] + o["inter_grad"] for o, s in zip(own, server_of) if s == srv)
                  for srv in range(servers)]
    assert rec["inter_bytes_per_server"] == per_server
    assert sum(per_server) == rec["bytes"]["inter_halo"] + rec["bytes"]["inter_grad"]
    # Gradients cross servers in every mode; only fb exchanges halo rows between servers.
    assert all(b > 0 for b in per_server)
    assert (rec["bytes"]["inter_halo"] > 0) == (mode == "fb")
    # The time breakdown is the slowest rank's own (maxima of each part over ranks
    # would come from different ranks and could add up to more than the epoch): its parts add up to the epoch.
    parts = sum(rec[k] for k in ("intra_comm_s", "inter_comm_s", "grad_sync_s", "compute_s", "sampling_s"))
    assert parts == pytest.approx(rec["time_s"], rel=1e-9, abs=1e-12)
    assert 0 <= rec["slowest_rank"] < WORLD.size

"""eas, mb and cob with the intra-server transport over gloo (the code NCCL runs on a GPU server), 2
servers x 2 ranks on real Cora.  tests/mpi/test_gloo_transport.py holds fb and flx over gloo to the
dense reference; here:

- cob with one co-batch of every neighbour computes what flx computes (as tests/mpi/test_cobatch.py
  holds over MPI), so cob over gloo must give flx's losses and parameters;
- eas, mb and cob (sampled) must give, over gloo, the run of the MPI transport: the same ledger bytes,
  the same losses and the same parameters up to the order of the gradient sums (gloo sums a server's
  buckets in its own order), with the server-view halo exchanges overlapped (`--overlap-halos all`:
  gloo's `all_to_all_single(async_op=True)` posted, then waited after the own-row work)."""
import numpy as np
import pytest

from tests.mpi.conftest import make_trainer, on_every_rank

pytestmark = pytest.mark.mpi(min_size=4)
EPOCHS = 2


def _train(shards, mode, epochs=EPOCHS, **extra):
    trainer = make_trainer(shards, mode, epochs=epochs, **extra)
    try:
        transport = trainer.comm.intra_transport
        records = [trainer.train_epoch() for _ in range(epochs)]
        params = [p.detach().clone() for p in trainer.model.parameters()]
    finally:
        trainer.close()
    return transport, records, params


def _assert_params_close(got, want, tol=1e-4):
    for a, b in zip(got, want):
        err = (a.double() - b.double()).abs().max().item()
        assert err <= tol * max(b.abs().max().item(), 1.0), err


def test_cob_over_gloo_without_sampling_equals_flx(cora_shards):
    shards = cora_shards[("full", 3)]
    _, flx, flx_params = _train(shards, "flx", epochs=5)
    transport, cob, cob_params = _train(shards, "cob", epochs=5, intra_transport="gloo", batches_per_epoch=1,
                                        fanout=-1)
    assert transport == "gloo"
    np.testing.assert_allclose([r["loss"] for r in cob], [r["loss"] for r in flx], rtol=1e-4)
    on_every_rank(lambda: _assert_params_close(cob_params, flx_params))
    assert all(int(np.sum(r["bytes"]["intra_halo"])) > 0 and r["bytes"]["inter_halo"] == 0 for r in cob)


@pytest.mark.parametrize("mode,shards,extra", [
    ("eas", ("eas", 3), {}),
    ("mb", ("full", 3), {"batches_per_epoch": 2, "fanout": 5}),
    ("cob", ("full", 3), {"batches_per_epoch": 2, "fanout": 5}),
])
def test_gloo_equals_the_mpi_transport(cora_shards, mode, shards, extra):
    runs = {t: _train(cora_shards[shards], mode, intra_transport=t, overlap_halos="all", **extra)
            for t in ("gloo", "mpi")}
    assert [runs[t][0] for t in ("gloo", "mpi")] == ["gloo", "mpi"]
    (_, rec_gloo, par_gloo), (_, rec_mpi, par_mpi) = runs["gloo"], runs["mpi"]
    for a, b in zip(rec_gloo, rec_mpi):
        assert a["bytes"] == b["bytes"] and a["max_rank_bytes"] == b["max_rank_bytes"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    # Both stages of each transport ran: halo rows and gradient buckets inside each server.
    assert all(int(np.sum(r["bytes"]["intra_grad"])) > 0 for r in rec_gloo)
    if mode != "mb":  # mb's per-GPU mini-batches exchange no rows
        assert all(int(np.sum(r["bytes"]["intra_halo"])) > 0 for r in rec_gloo)
    on_every_rank(lambda: _assert_params_close(par_gloo, par_mpi))

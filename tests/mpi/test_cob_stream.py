"""The co-batch loader's device path (engine/cobstream.py) run on the CPU with --host-staging, 2 servers
x 2 ranks on real Cora: every co-batch's tensors are made in the loader thread through `put`, each step
waits for its co-batch's ready event first, and a co-batch is retired (kept until the main stream's work
on it has run) when the next one takes its place -- with the same losses and parameters, bit for bit,
as the plain CPU run."""
import pytest
import torch

from tests.mpi.conftest import make_trainer, on_every_rank

pytestmark = pytest.mark.mpi(min_size=4)
EPOCHS, BATCHES = 2, 2


def _train(shards, mode, staged):
    trainer = make_trainer(shards, mode, batches_per_epoch=BATCHES, fanout=5, dropout=0.0, epochs=EPOCHS,
                           host_staging=staged)
    try:
        losses = [trainer.train_epoch()["loss"] for _ in range(EPOCHS)]
        params = [p.detach().clone() for p in trainer.model.parameters()]
        loader = trainer.mode.batches.loader
        facts = dict(active=loader.active, puts=loader.puts, threads=set(loader.put_threads), waits=loader.waits,
                     retired=loader.retired, held=loader.collect())
    finally:
        trainer.close()
    return losses, params, facts


@pytest.mark.parametrize("mode", ["cob"])  # mb builds its co-batches by the same loader
def test_the_loader_stream_logic_gives_the_same_bits(cora_shards, mode):
    shards = cora_shards[("full", 3)]
    plain_losses, plain_params, plain = _train(shards, mode, False)
    losses, params, facts = _train(shards, mode, True)

    def check():
        assert not plain["active"] and plain["puts"] == plain["waits"] == 0
        assert losses == plain_losses
        assert all(torch.equal(a, b) for a, b in zip(params, plain_params))
        steps = EPOCHS * BATCHES
        assert facts["active"] and facts["puts"] > 0
        assert all(name.startswith("cobatch-loader") for name in facts["threads"]), facts["threads"]
        assert facts["waits"] == steps and facts["retired"] == steps - 1 and facts["held"] == 0, facts
    on_every_rank(check)

"""The recipes of docs/extending.md, proven on real Cora with 2 servers x 2 ranks (mpirun -n 4).

- Add a mode: subclass StaticMode, say which view runs each layer, register it; the training loop is
  untouched.  Here: half the layers on the server's preload, the rest with the world exchange.
- Add a model: register one builder (with its memory estimate and its constructor options) in
  granndis_hpc.nn.models; every mode can train it, --mode auto included.  Here: tests/recipe_model.py's
  mean-aggregation MLP with its own option `widen`, checked against a dense reference written in this file.
Both must equal the dense single-process computation (logits within 1e-4)."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from granndis_hpc.engine import modes
from granndis_hpc.engine.steps import TrainingError
from tests import recipe_model
from tests.dense_reference import dense_adjacency, dense_logits
from tests.mpi.conftest import gather_by_global_id, make_trainer

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD


# ---- recipe: add a mode --------------------------------------------------------------------------
class HalfPreload(modes.StaticMode):
    name = "recipe-half"
    help = "the first L//2 layers on the server's preload, the rest with the world exchange"

    def check(self, manifest):
        if manifest["preload"]["kind"] != "full" or int(manifest["preload"]["hops"]) < self.cfg.layers // 2:
            raise TrainingError(f"{self.name} needs a full preload of at least {self.cfg.layers // 2} hops")

    def exact(self, manifest):
        return True

    def plan_layers(self, ctx):
        k = self.cfg.layers // 2
        return [modes.server_view(ctx, k, exact=True)] * k + [ctx.world_view] * (self.cfg.layers - k)


# ---- recipe: add a model (tests/recipe_model.py) ------------------------------------------------
def mean_mlp_dense(model, cora):
    """The same formula with dense float64 matrices over the whole graph."""
    a = dense_adjacency(cora.indptr, cora.indices)
    a_mean = a / torch.clamp(torch.from_numpy(cora.in_degree()).double(), min=1).unsqueeze(1)
    h = torch.from_numpy(cora.features).double()
    for layer, lin in enumerate(conv.lin for conv in model.convs):
        h = (h + a_mean @ h) @ lin.weight.detach().double().T + lin.bias.detach().double()
        if layer < len(model.convs) - 1:
            h = torch.relu(h)
    return h.numpy()


@pytest.fixture
def registered():
    modes.register(HalfPreload)
    recipe_model.register()
    yield
    modes.MODES.pop(HalfPreload.name)
    recipe_model.unregister()


def _logits_by_global_id(trainer):
    trainer.model.eval()
    with torch.no_grad():
        return gather_by_global_id(trainer, trainer.logits(trainer.train_view, "halo"))


def _check(got, want):
    if WORLD.rank == 0:
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 1e-4, f"max relative error {err:.3e}"


def test_added_mode_trains_exactly(registered, cora, cora_shards):
    trainer = make_trainer(cora_shards[("full", 3)], "recipe-half", "sage", 3)
    try:
        assert trainer.train_view.groups == ["server", "world", "world"]
        got = _logits_by_global_id(trainer)
        if WORLD.rank == 0:
            want = dense_logits("sage", trainer.model, cora.indptr, cora.indices, torch.from_numpy(cora.features),
                                degrees=torch.from_numpy(cora.in_degree())).detach().numpy()
            _check(got, want)
        rec = trainer.train_epoch()  # and it trains through the unchanged loop
        assert np.isfinite(rec["loss"])
    finally:
        trainer.close()


@pytest.mark.parametrize("mode", ["fb", "flx", "recipe-half", "auto"])
def test_added_model_runs_in_every_mode(registered, cora, cora_shards, mode):
    full = cora_shards[("full", 3)]
    # auto: its registered estimate sizes it (1 TiB: the largest k of the full set, flx k = 3).
    auto = dict(memory_per_gpu="1TiB", auto_rule="memory")
    shards, extra = (f"{full},{cora_shards[('eas', 3)]}", auto) if mode == "auto" else (full, {})
    trainer = make_trainer(shards, mode, recipe_model.NAME, 3, model_option=["widen=2"], **extra)
    try:
        assert trainer.model.convs[0].lin.out_features == 32  # its own constructor option reached it
        if mode == "auto":
            assert trainer.mode.name == "flx" and trainer.mode.decision["choice"]["label"] == "flx k=3"
        got = _logits_by_global_id(trainer)
        if WORLD.rank == 0:
            _check(got, mean_mlp_dense(trainer.model, cora))
    finally:
        trainer.close()

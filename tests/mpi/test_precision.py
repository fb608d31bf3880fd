"""--precision bf16 on real Cora, 2 servers x 2 ranks (mpirun -n 4), sage and gcn in fb.

- The logits of a bf16 run (after training, evaluated as the engine evaluates: under autocast) are
  those of a single-process whole-graph reference written here from the formulas in float64, rounded
  to bfloat16 where the precision policy rounds (engine/precision.py), in most entries bit for bit and
  within a few bfloat16 ulps in all; and nearer to it than to the float32 reference (so bf16 did run).
- Parameters, their gradients and Adam's state stay float32.
- The epoch's halo bytes are exactly half of the same float32 run's (rows and their gradients travel
  in bfloat16), the gradient all-reduce bytes unchanged.
- The plan entry says precision bf16, not exact, and the checkpoints are shape-dependent."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from tests.dense_reference import dense_adjacency, dense_logits
from tests.mpi.conftest import gather_by_global_id, make_trainer

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
EPOCHS = 2


def _bf(t):
    """Rounded to bfloat16 (round to nearest even), held in float64."""
    return t.to(torch.bfloat16).to(torch.float64)


def _bf16_reference(cora, model):
    """Whole-graph logits from the formulas, rounding where --precision bf16 says it rounds
    (engine/precision.py): a Linear multiplies bfloat16 rows by its bfloat16 weight and rounds its
    output (its bias added in bfloat16, as autocast's addmm does); the aggregation sums bfloat16 rows
    exactly (float64 here, float32 there) and rounds once; each conv's output is rounded; ReLU is exact.
    A conv projects first when it narrows or keeps the width (the engine's choice with the halo in flight)."""
    p = {k: v.detach().double() for k, v in model.named_parameters()}
    a = dense_adjacency(cora.indptr, cora.indices, cora.num_vertices)
    deg = torch.from_numpy(cora.in_degree()).double()
    if model.name == "gcn":
        loops = torch.diagonal(a).clone()
        s = 1.0 / torch.sqrt(deg - loops + 1.0)
        op = s[:, None] * (a - torch.diag(loops) + torch.eye(a.shape[0], dtype=a.dtype)) * s[None, :]
    else:
        op = a / torch.clamp(deg, min=1.0)[:, None]

    def linear(h, name, bias=True):
        out = _bf(h) @ _bf(p[name + ".weight"]).T
        return _bf(out + _bf(p[name + ".bias"]) if bias else out)

    h = torch.from_numpy(cora.features).double()
    for layer in range(model.num_layers):
        c = f"convs.{layer}"
        if layer:
            h = torch.relu(h)
        if model.name == "gcn":
            h = _bf(_bf(op @ linear(h, c + ".lin", bias=False)) + p[c + ".bias"])
        else:
            h = _bf(linear(h, c + ".lin_self") + _bf(op @ linear(h, c + ".lin_neigh", bias=False)))
    return h.numpy()


def _fp32_reference(cora, model):
    return dense_logits(model.name, model, cora.indptr, cora.indices, torch.from_numpy(cora.features),
                        degrees=torch.from_numpy(cora.in_degree())).detach().numpy()


def _relative(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_bf16_run_is_close_to_an_autocast_reference_with_half_the_halo_bytes(cora, cora_shards, model):
    shards = cora_shards[("full", 3)]
    recs = {}
    for precision in ("fp32", "bf16"):
        trainer = make_trainer(shards, "fb", model=model, precision=precision, epochs=EPOCHS, lr=0.01)
        try:
            recs[precision] = [trainer.train_epoch() for _ in range(EPOCHS)]
            if precision == "fp32":
                continue
            logits = trainer.inner_logits()
            got = gather_by_global_id(trainer, logits)
            assert logits.dtype == torch.bfloat16  # the head computed under autocast
            params = list(trainer.model.parameters())
            assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in params)
            state = [t for s in trainer.optimizer.torch.state.values() for t in s.values()
                     if torch.is_tensor(t) and t.is_floating_point() and t.dim() > 0]
            assert len(state) == 2 * len(params) and all(t.dtype == torch.float32 for t in state)
            entry, shape_dependent = trainer.communication_entry(), trainer.shape_dependence()
            assert entry["precision"] == "bf16" and entry["exact"] is False
            assert "--precision bf16" in entry["inexact_because"] and "--precision bf16" in shape_dependent
            if WORLD.rank == 0:
                bf16_ref, fp32_ref = _bf16_reference(cora, trainer.model), _fp32_reference(cora, trainer.model)
                # The reference rounds where the engine does, so most logits are the same bfloat16
                # number (measured: 84 % gcn, 92 % sage); the others differ where float32 and float64
                # sums, or a sum split into own and halo columns, land on the two sides of a rounding
                # boundary, by an ulp or two (2^-8 relative), which the next layers carry on.  float32
                # training differs from the float32 reference by 1e-5 (test_engine_exact.py); a bf16
                # run that did not round where the policy says would differ from the bf16 reference
                # as much as from the float32 one, whose every logit it rounds.
                assert (got == bf16_ref).mean() > 0.75, (got == bf16_ref).mean()
                assert np.abs(got - bf16_ref).mean() < 0.5 * np.abs(got - fp32_ref).mean()
                assert _relative(got, bf16_ref) < 2e-2, _relative(got, bf16_ref)
        finally:
            trainer.close()
    for full, half in zip(recs["fp32"], recs["bf16"]):
        for link in ("intra", "inter"):
            assert full["bytes"][f"{link}_halo"] > 0
            assert half["bytes"][f"{link}_halo"] * 2 == full["bytes"][f"{link}_halo"]
            assert half["bytes"][f"{link}_grad"] == full["bytes"][f"{link}_grad"]
        assert half["loss"] == pytest.approx(full["loss"], rel=2e-2)

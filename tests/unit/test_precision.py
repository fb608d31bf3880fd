"""--precision bf16 in one process: the sparse aggregation under autocast, the memory model's half-width
activations against what autograd saves, and the option's refusals (a bad combination, a change on
resume).  The distributed run is tests/mpi/test_precision.py."""
import json
import os
from dataclasses import asdict

import numpy as np
import pytest
import torch

from granndis_hpc import memory_model as mm
from granndis_hpc.options.train import TrainConfig
from granndis_hpc.options import ConfigError
from granndis_hpc.engine.exchange import halo_exchange
from granndis_hpc.engine.epoch import SavedBytes
from granndis_hpc.engine.precision import Precision
from granndis_hpc.memory_model.estimate import HALF_WIDTH_MODELS
from granndis_hpc.nn.contract import PassSettings
from granndis_hpc.nn.graph import GraphPart, LayerGraph, aggregate
from granndis_hpc.nn.models import build_model
from tests.unit.test_memory_model import _loopback, _random_plan

CPU = torch.device("cpu")
BF16 = Precision("bf16", CPU)


def _graph(rng, n_dst=30, n_src=50, edges=200):
    dst = np.sort(rng.integers(0, n_dst, edges))
    indptr = np.searchsorted(dst, np.arange(n_dst + 1)).astype(np.int64)
    return LayerGraph.from_csr(indptr, rng.integers(0, n_src, edges).astype(np.int64), n_src,
                               src_degree=np.ones(n_src, dtype=np.float32))


@pytest.mark.parametrize("backend", ["spmm", "index_add"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_aggregation_under_autocast_sums_in_float32(backend, dtype):
    # The CPU has no bfloat16 sparse matmul, and autocast would cast a float32 one to bfloat16: both
    # are computed in float32 (rounded once to the rows' dtype), forward and backward.
    rng = np.random.default_rng(0)
    g = _graph(rng)
    h = torch.as_tensor(rng.standard_normal((g.n_src, 6)), dtype=dtype).requires_grad_()
    a = torch.zeros(g.n_dst, g.n_src, dtype=torch.float64)
    rows, cols = torch.repeat_interleave(torch.arange(g.n_dst), torch.diff(torch.as_tensor(g.indptr))), \
        torch.as_tensor(g.indices)
    a.index_put_((rows, cols), torch.ones(rows.numel(), dtype=torch.float64), accumulate=True)
    mean = a / a.sum(1, keepdim=True).clamp(min=1)
    with BF16.autocast():
        out = aggregate(g, h, "mean", backend=backend)
        # The halo in flight: the own and the halo sources' parts, as the layer runner sums them.
        pending = (aggregate(GraphPart(g, "own", 40), h[:40], "mean", backend=backend)
                   + aggregate(GraphPart(g, "halo", 40), h[40:], "mean", backend=backend))
    assert out.dtype == dtype == pending.dtype
    hd = h.detach().double()
    want, scale = mean @ hd, mean.abs() @ hd.abs()
    # float32 sums (error below 1e-6 of the terms' sum at these degrees), rounded once to the rows' dtype
    # (at most half an ulp: 2^-8 of the value in bfloat16).  With the halo pending, the own and the halo
    # products are rounded apart and then added: three roundings, each within 2^-8 of the terms' sum.
    u = 2 ** -8 if dtype == torch.bfloat16 else 2 ** -24
    assert ((out.detach().double() - want).abs() <= u * want.abs() + 1e-6 * scale).all()
    assert ((pending.detach().double() - want).abs() <= 3 * u * scale + 1e-6 * scale).all()
    grad = torch.as_tensor(rng.standard_normal(tuple(out.shape)), dtype=dtype)
    out.backward(grad)
    assert h.grad.dtype == dtype
    want, scale = mean.T @ grad.double(), mean.T.abs() @ grad.double().abs()
    assert ((h.grad.double() - want).abs() <= u * want.abs() + 1e-6 * scale).all()

def _saved_bytes(model, rows, graphs, send_idx, rng, precision):
    """What a training step saves (tests/unit/test_memory_model.py's gather), under `precision`."""
    feats = torch.as_tensor(rng.standard_normal((rows.server.n_own, rows.features)).astype(np.float32))
    x0 = feats[: graphs[0].n_src - rows.server.layers[0].n_halo]
    static_halo = feats.clone()

    def gather(l, h):
        if l == 0 and h is x0:
            halo = static_halo.index_select(0, send_idx[0])
        else:
            n = len(send_idx[l])
            halo = halo_exchange(h, send_idx[l], [n], [n], _loopback, precision.wire_dtype())
        return torch.cat([h, halo], dim=0)

    labels = torch.as_tensor(rng.integers(0, rows.num_classes, rows.n_inner))
    train_rows = torch.arange(rows.n_train)
    saved = SavedBytes()
    model.train()
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        with precision.autocast():
            logits = model(x0, graphs, gather, settings=PassSettings(row_dtype=precision.row_dtype))[: rows.n_inner]
        loss = precision.loss(logits[train_rows], labels[train_rows], 7)
    loss.backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    return saved.total


@pytest.mark.parametrize("name,norm,dropout", [("sage", False, 0.5), ("gcn", False, 0.5), ("gcn", True, 0.0),
                                               ("ressage", False, 0.5), ("sage-sum", False, 0.5),
                                               ("gat", False, 0.5), ("gin", False, 0.5), ("sage-max", False, 0.5)])
@pytest.mark.parametrize("features", [24, 8])  # projected first (F > hidden) and aggregated first
def test_bf16_activation_estimate_against_saved_tensor_bytes(name, norm, dropout, features):
    rng = np.random.default_rng(features + len(name))
    rows, graphs, send_idx = _random_plan(rng, 4, features=features)
    torch.manual_seed(0)
    model = build_model(name, features, 16, rows.num_classes, 4, dropout=dropout, norm=norm)
    measured = _saved_bytes(model, rows, graphs, send_idx, rng, BF16)
    spec = mm.ModelSpec(name, features, 16, rows.num_classes, 4, dropout, norm, precision="bf16")
    fp32 = mm.activation_layers(rows, mm.ModelSpec(name, features, 16, rows.num_classes, 4, dropout, norm))
    estimate = mm.activation_layers(rows, spec, device="cpu")["saved"]
    if name not in HALF_WIDTH_MODELS:  # float32 parts under autocast: float32 widths, a bound
        assert measured < estimate == fp32["saved"]
        return
    if not norm and name != "ressage":
        assert estimate == measured  # byte for byte
    else:
        # LayerNorm keeps its statistics and parameters in float32; counted at half width: under by
        # 2 float32 numbers a row and its parameters per LayerNorm (measured 2.0-4.0 %).
        assert 0 < measured - estimate < 0.05 * measured
    assert estimate < 0.55 * fp32["saved"]


def test_bf16_estimate_halves_the_halo_and_its_buffers():
    # fb on a world view of 3 layers: 100 own rows, 40 halo rows of which 25 from the other server.
    layer = mm.LayerRows(n_own_in=100, n_halo=40, n_dst=100, nnz=600, n_send=35, inter_halo=25)
    world = mm.ViewRows("world", 100, 40, 35, (layer,) * 3, inter_halo=25)
    ranks = [mm.RankRows(rank=0, features=12, num_classes=4, n_inner=100, n_train=30, layers=3, k=0, world=world)]
    fp32, bf16 = (mm.ModelSpec("sage", 12, 16, 4, 3, precision=p) for p in ("fp32", "bf16"))
    full, half = mm.inter_server_bytes(ranks, fp32, 2), mm.inter_server_bytes(ranks, bf16, 2)
    assert full["halo"] > 0 and half["halo"] * 2 == full["halo"] and half["gradient"] == full["gradient"]
    e32, e16 = mm.estimate(ranks[0], fp32), mm.estimate(ranks[0], bf16)
    assert e16["breakdown"]["halo_buffers"] * 2 == e32["breakdown"]["halo_buffers"]
    assert e16["breakdown"]["parameters"] == e32["breakdown"]["parameters"]  # float32 master weights
    assert e16["total"] < e32["total"]
    with pytest.raises(mm.MemoryModelError, match="unknown precision 'fp16'"):
        mm.ModelSpec("gcn", 8, 16, 3, 2, precision="fp16")


def test_bad_combinations_are_refused():
    with pytest.raises(ConfigError, match="--halo-dtype float16 would round them again"):
        TrainConfig(shards="s", precision="bf16", halo_dtype="float16")
    with pytest.raises(ConfigError, match="precision"):
        TrainConfig(shards="s", precision="fp16")
    TrainConfig(shards="s", precision="bf16", halo_dtype="bfloat16")  # the same wire: allowed


def test_precision_is_kept_on_resume(tmp_path):
    pytest.importorskip("mpi4py")
    from granndis_hpc import cli
    from granndis_hpc.cluster.errors import ClusterError

    run = tmp_path / "run"
    ns = cli._parse_train_args(["--shards", str(tmp_path / "s"), "--out", str(run), "--precision", "bf16"])
    os.makedirs(run)
    (run / "config.json").write_text(json.dumps(asdict(cli._config_from_args(ns))))
    assert cli._config_from_args(cli._parse_train_args(["--resume", str(run)])).precision == "bf16"
    with pytest.raises(ClusterError, match=r"precision='fp32' \(the run has 'bf16'\)"):
        cli._parse_train_args(["--resume", str(run), "--precision", "fp32"])

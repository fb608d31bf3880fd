"""The per-vertex Linear head (--linear-layers): the models against the independent dense reference
(forward, gradients, keyed dropout, shrinking blocks of an (L - N)-hop preload), its memory estimate
byte for byte against what autograd saves, the options' refusals and `preprocess plan` with it."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from granndis_hpc import memory_model as mm
from granndis_hpc.options.train import TrainConfig
from granndis_hpc.options import ConfigError
from granndis_hpc.nn import PassSettings, build_model
from granndis_hpc.nn.dropout import RowDropout, keep_mask
from tests.dense_reference import dense_logits
from tests.unit.test_memory_model import _measured_saved_bytes, _random_plan
from tests.unit.test_nn_models import DEVICES, _graph, _on, _param_grads, _shrinking_blocks, _whole

@pytest.fixture
def recipe_model():
    from tests import recipe_model

    recipe_model.register()
    yield recipe_model
    recipe_model.unregister()


@pytest.fixture(scope="module")
def small_shards(tmp_path_factory):
    """The memory model tests' synthetic 1500-vertex graph, a full 3-hop set for 2 x 2."""
    from mpi4py import MPI

    from granndis_hpc.preprocess.build.pipeline import build_shards
    from granndis_hpc.preprocess.sources import load

    graph = load("synthetic", vertices=1500, avg_degree=8.0, features=12, classes=4, seed=1)
    out = tmp_path_factory.mktemp("head") / "full3"
    build_shards(graph, out, servers=2, gpus_per_server=2, layers=3, partitioner="metis", comm=MPI.COMM_SELF)
    return out


HEADS = [("sage", 4, 1, True), ("sage", 3, 2, False), ("gcn", 3, 1, True), ("ressage", 4, 2, False),
         ("gat", 3, 1, True), ("gin", 3, 2, False)]


def _head_model(name, layers, linear, norm, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    return build_model(name, 11, 9, 5, layers, dropout=dropout, norm=norm, linear_layers=linear)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,layers,linear,norm", HEADS)
def test_head_forward_and_gradients_equal_dense_reference_with_dropout(name, layers, linear, norm, device):
    indptr, indices, x = _graph(5)
    model = _head_model(name, layers, linear, norm, dropout=0.4).train().to(device)
    assert model.num_layers == layers - linear and len(model.linears) == linear
    labels = torch.from_numpy(np.random.default_rng(5).integers(0, 5, x.shape[0]))
    logits = model(x.to(device), _on(device, _whole(indptr, indices, model)), dropout=RowDropout(7, 2))
    F.cross_entropy(logits, labels.to(device), reduction="sum").backward()
    got = {k: g.cpu() for k, g in _param_grads(model).items()}
    logits = logits.detach().cpu()
    model.cpu().zero_grad()
    ids = torch.arange(x.shape[0])

    def drop(layer, h):  # the keyed masks of vertices 0..N-1, written out
        return h * keep_mask(7, 2, layer, ids, h.shape[1], 0.4).to(h.dtype) / 0.6
    want = dense_logits(name, model, indptr, indices, x, dropout=drop)
    torch.testing.assert_close(logits.double(), want, atol=1e-5, rtol=1e-5)
    F.cross_entropy(want, labels, reduction="sum").backward()
    for key, grad in _param_grads(model).items():
        assert key in got
        torch.testing.assert_close(got[key], grad.float(), atol=1e-4, rtol=1e-4, msg=f"gradient of {key}")
    assert any(k.startswith("linears.") for k in got)


@pytest.mark.parametrize("name,layers,linear,norm", HEADS)
def test_head_needs_only_the_aggregating_hops(name, layers, linear, norm):
    """An (L - N)-hop preload computes the inner rows exactly: the head adds no hop."""
    indptr, indices, x = _graph(6, n=160, edges=330, isolated=9)
    model = _head_model(name, layers, linear, norm).eval()
    inner = np.sort(np.random.default_rng(6).choice(indptr.shape[0] - 1, 17, replace=False))
    rows, graphs = _shrinking_blocks(indptr, indices, inner, layers - linear)
    got = model(x[torch.from_numpy(rows)], graphs)
    want = dense_logits(name, model, indptr, indices, x)[torch.from_numpy(rows[: inner.shape[0]])]
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_no_head_draws_the_parameters_it_drew_before():
    torch.manual_seed(3)
    plain = build_model("sage", 11, 9, 5, 3, norm=True)
    torch.manual_seed(3)
    zero = build_model("sage", 11, 9, 5, 3, norm=True, linear_layers=0)
    assert list(plain.state_dict()) == list(zero.state_dict())
    for a, b in zip(plain.parameters(), zero.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name,norm,dropout,ckpt", [
    ("sage", True, 0.5, False), ("gcn", False, 0.0, False), ("ressage", False, 0.5, False),
    ("ressage", False, 0.5, True), ("gin", True, 0.5, False), ("sage-max", False, 0.0, False)])
def test_head_estimate_equals_saved_tensor_bytes_and_parameters(name, norm, dropout, ckpt):
    rng = np.random.default_rng(11)
    convs, linear = 3, 2
    rows, graphs, send_idx = _random_plan(rng, convs, features=24)
    torch.manual_seed(0)
    model = build_model(name, 24, 16, rows.num_classes, convs + linear, dropout=dropout, norm=norm,
                        linear_layers=linear)
    measured = _measured_saved_bytes(model, rows, graphs, send_idx, rng, PassSettings(checkpoint_activations=ckpt))
    spec = mm.ModelSpec(name, 24, 16, rows.num_classes, convs, dropout, norm, ckpt, linear_layers=linear)
    assert spec.parameters() == sum(p.numel() for p in model.parameters())
    assert [tuple(w) for w in spec.widths()] == [(c.in_features, c.out_features) for c in model.convs]
    act = mm.activation_layers(rows, spec, device="cpu")
    assert act["saved"] == measured and act["head"] > 0
    est = mm.estimate(rows, spec)
    assert est["total"] > mm.estimate(rows, mm.ModelSpec(name, 24, 16, rows.num_classes, convs, dropout, norm,
                                                         ckpt))["total"]


def test_options_refuse_a_head_without_an_aggregating_layer_or_model(recipe_model):
    cfg = TrainConfig(shards="s", layers=4, linear_layers=1)
    assert (cfg.conv_layers, cfg.linear_layers) == (3, 1)
    assert TrainConfig(shards="s", layers=3, linear_layers=0).linear_layers is None  # as before the option
    with pytest.raises(ConfigError, match="leaves no aggregating layer.*--layers 3 or more"):
        TrainConfig(shards="s", layers=2, linear_layers=2)
    with pytest.raises(ValueError, match="leaves no aggregating layer"):
        build_model("sage", 4, 4, 2, 2, linear_layers=2)
    # A registered model whose builder takes no linear_layers: refused by name, everywhere.
    for make in (lambda: TrainConfig(shards="s", model=recipe_model.NAME, layers=3, linear_layers=1),
                 lambda: build_model(recipe_model.NAME, 4, 4, 2, 3, linear_layers=1),
                 lambda: mm.ModelSpec(recipe_model.NAME, 4, 4, 2, 2, linear_layers=1)):
        with pytest.raises((ConfigError, ValueError, mm.MemoryModelError),
                           match=f"model '{recipe_model.NAME}' does not build.*use one of sage, gcn, ressage"):
            make()


def test_plan_estimates_the_head(tmp_path, capsys):
    """`preprocess plan --layers 2 --linear-layers 1`: the 2-hop set's options, the head's memory and
    parameters (gradient bytes) counted."""
    from tests.unit.test_memory_model_cli import SYN, _plan

    res = {}
    for extra in ((), ("--linear-layers", "1")):
        rc, res[len(extra)] = _plan(tmp_path, "--layers", "2", "--no-eas", *extra)
        assert rc == 0
    assert "2-layer sage + 1 Linear" in capsys.readouterr().out
    base = {o["label"]: o for o in res[0]["options"]}
    head = {o["label"]: o for o in res[2]["options"]}
    assert set(base) == set(head) == {"fb", "fb payload=partial", "fb payload=smaller", "flx k=1", "flx k=2",
                                      "flx k=1 payload=partial", "flx k=1 payload=smaller"}
    for label in base:
        if base[label]["payload"] != "rows":  # its choice of layers differs with the head's widths
            continue
        assert head[label]["peak_bytes"] > base[label]["peak_bytes"]
        assert head[label]["inter_server_bytes"]["gradient"] > base[label]["inter_server_bytes"]["gradient"]
    assert SYN  # the same synthetic graph as the memory model's plan tests


def test_mode_auto_estimates_the_head(small_shards):
    """--mode auto's estimates on a 3-hop set for a 3-conv + 1 Linear model: every option costs more
    than without the head, and the head's estimate is what estimate_shard_set gives."""
    plain = mm.choose_shard_sets([str(small_shards)], "sage", 16, 3, 1, batches=(2,))
    head = mm.choose_shard_sets([str(small_shards)], "sage", 16, 3, 1, batches=(2,), linear_layers=1)
    # (fb with a partial payload may be dropped as dominated by fb with rows in one and not the other)
    by_plain = {o.label: o.peak for o in plain.rejected if o.payload == "rows"}
    by_head = {o.label: o.peak for o in head.rejected if o.payload == "rows"}
    assert set(by_plain) == set(by_head) and all(by_head[k] > by_plain[k] for k in by_plain)
    flx = max(e["total"] for e in mm.estimate_shard_set(str(small_shards), "sage", 16, linear_layers=1))
    assert by_head["flx k=3"] == flx


def test_summary_records_the_head():
    from granndis_hpc.metrics import summarize

    shape = {"servers": 2, "ranks_per_server": 2}
    config = {"mode": "flx", "model": "sage", "layers": 4, "linear_layers": 1}
    assert summarize([], config, None, 0, shape, 1.0)["linear_layers"] == 1
    assert summarize([], {**config, "linear_layers": None}, None, 0, shape, 1.0)["linear_layers"] == 0


def test_report_measures_a_head_run_against_a_head_fb_run():
    """`granndis report`: a run's speedup is over an fb run of the same model, its head included."""
    from granndis_hpc.report.data import RunData, find_baselines

    def run(mode, head):
        summary = {"mode": mode, "model": "sage", "layers": 4, "linear_layers": head, "servers": 2,
                   "ranks_per_server": 2}
        return RunData(f"runs/{mode}-{head}", {}, summary, [])
    runs = [run("fb", 0), run("fb", 1), run("flx", 1), run("flx", 0)]
    assert find_baselines(runs) == {0: 0, 1: 1, 2: 1, 3: 0}
    assert runs[2].method == "FLX sage L=4 (1 Linear)" and runs[3].method == "FLX sage L=4"

"""The contract between the engine and a model (nn/contract.py ModelContract, PassSettings), and the one
between the engine's steps and the plans they run over (engine/steps.py PlanView).

A model declares what the engine may ask of it; build_model checks it (nn/models.py check_model) and
refuses, with what to fix, a model whose declaration cannot be right.  A pass's settings travel with the
call: running a model writes nothing onto it or its layers."""
import inspect

import pytest
import torch
from torch import nn

from granndis_hpc.engine import views
from granndis_hpc.engine.steps import PlanView
from granndis_hpc.nn import models
from granndis_hpc.nn.contract import Layer, ModelContract, PassSettings
from granndis_hpc.nn.dropout import RowDropout
from granndis_hpc.nn.graph import LayerGraph
from granndis_hpc.nn.models import GNN, MODELS, PlainGNN, build_model, check_model
from tests.pyg_factories import PYG_HETERO_OPTIONS, PYG_OPTIONS
from tests.unit.test_exchange_group import N, _mirror_group, _rows
from tests.unit.test_hetero_layers import _problem


def _built(name, dropout=0.0, **options):
    typed = MODELS.entry(name).get("typed")
    if name in ("pyg", "pyg-hetero"):
        extra = PYG_OPTIONS if name == "pyg" else PYG_HETERO_OPTIONS
        if not extra:
            pytest.skip("torch_geometric is not installed")
        options = dict(extra, **options)
    if typed:
        types, _, _, _ = _problem(6)
        return build_model(name, 4, 8, 3, 2, dropout=dropout, types=types, **options)
    return build_model(name, 4, 8, 3, 2, dropout=dropout, **options)


BUILT_IN = ("sage", "gcn", "ressage", "gat", "gin", "sage-sum", "sage-max", "rgcn", "rgat", "pyg", "pyg-hetero")


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_model_declares_a_valid_contract_over_layers(name):
    model = _built(name)
    assert isinstance(model.contract, ModelContract) and model.contract.problem() is None
    assert all(isinstance(conv, Layer) for conv in model.convs)
    assert check_model(model, name) is model.contract
    # every parameter the weight-decay split names exists
    assert any(n.startswith(model.contract.first_layer_prefix) for n, _ in model.named_parameters())


def test_the_declared_capabilities():
    assert _built("sage").contract == ModelContract(input_dropout_rows="sources")
    assert _built("ressage").contract == ModelContract(input_dropout_rows="own", first_layer_prefix="encoder.")
    assert _built("gat").contract.source_ids == "none"
    assert _built("gat", attn_dropout=0.5).contract.source_ids == "training"  # edges keyed by their ids
    assert _built("rgat", attn_dropout=0.5).contract.source_ids == "all"  # typed: every graph
    assert _built("rgcn").contract.source_ids == "all"


def test_build_model_refuses_what_the_contract_cannot_describe():
    class OwnForward(PlainGNN):  # a forward of its own and the stack's contract: the pending rows would break
        def forward(self, x, graphs, gather=None):
            return super().forward(x, graphs, gather)

    class OwnForwardDeclared(OwnForward):
        contract = ModelContract(keyed=False, pending_rows=False)

    class NotALayer(PlainGNN):
        def __init__(self, *args):
            super().__init__(*args)
            self.convs[0] = nn.Linear(4, 8)

    class BadRows(PlainGNN):
        contract = ModelContract(input_dropout_rows="halo")

    class NoContract(nn.Module):
        def forward(self, x, graphs, gather=None):
            return x

    cases = {OwnForward: "has a forward of its own; declare its `contract`", NotALayer: r"convs\[0\] is a Linear",
             BadRows: "input_dropout_rows must be one of", NoContract: "declares no `contract`"}
    for cls, message in cases.items():
        MODELS.register("contract-test", lambda f, h, c, l, d, n, cls=cls: (cls("sage", f, h, c, l, d, n)
                                                                          if cls is not NoContract else cls()))
        try:
            with pytest.raises(ValueError, match=message):
                build_model("contract-test", 4, 8, 3, 2)
        finally:
            del MODELS["contract-test"]
    model = OwnForwardDeclared("sage", 4, 8, 3, 2, 0.0, False)
    assert check_model(model, "own") == ModelContract(keyed=False, pending_rows=False)


def _whole_graph(n=12):
    indptr = torch.arange(0, 2 * n + 1, 2)
    indices = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n], 1).reshape(-1)
    return LayerGraph.from_csr(indptr.numpy(), indices.numpy(), n)


@pytest.mark.parametrize("name", ["gcn", "ressage"])
def test_a_pass_writes_nothing_onto_the_model_and_its_settings_apply(name):
    """The run's input dropout, checkpointing and row dtype are the call's: the model's and its layers'
    attributes are the same before and after a pass, and the settings change the result."""
    torch.manual_seed(0)
    model = build_model(name, 4, 8, 3, 3, dropout=0.0).train()
    graphs, x = [_whole_graph()] * 3, torch.randn(12, 4)
    before = {m: dict(vars(m)) for m in model.modules()}
    plain = model(x, graphs, dropout=RowDropout(3, 1))
    settings = PassSettings(input_dropout=0.5, checkpoint_activations=name == "ressage", row_dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        other = model(x, graphs, dropout=RowDropout(3, 1), settings=settings)
    other.float().sum().backward()
    assert {m: dict(vars(m)) for m in model.modules()}.keys() == before.keys()
    for module, attrs in before.items():
        assert vars(module).keys() == attrs.keys(), type(module).__name__
    assert other.dtype == torch.bfloat16 and not torch.allclose(other.float(), plain, atol=1e-2)
    assert torch.equal(model(x, graphs, dropout=RowDropout(3, 1)), plain)  # nothing stayed behind


def test_views_are_plan_views():
    """engine/steps.PlanView is what a step runs over: View and LayeredView both have every member, with
    the protocol's parameters (what the type checker checks statically, here at run time too)."""
    server = views.build_view(_rows(), _mirror_group(None, [], "server"), 2, all_active=True,
                              resolve_keys=views.key_resolver_server(N), device=torch.device("cpu"))
    world = views.build_view(_rows(), _mirror_group(None, [], "world"), 2, all_active=True,
                             resolve_keys=views.key_resolver_server(N), device=torch.device("cpu"))
    for view in (server, views.LayeredView([server, world])):
        assert isinstance(view, PlanView)
        for name in ("gather_fn", "source_ids", "attach_source_ids", "layer_counts"):
            want = list(inspect.signature(getattr(PlanView, name)).parameters)[1:]
            assert list(inspect.signature(getattr(view, name)).parameters) == want, (type(view).__name__, name)
        assert len(view.graphs) == 2 and view.input_features.shape[0] <= view.graphs[0].n_src
    assert not isinstance(object(), PlanView)


def test_gnn_forward_takes_the_keyed_arguments_the_contract_names():
    """ModelContract.keyed: forward(x, graphs, gather, dropout=..., settings=...)."""
    from granndis_hpc.nn.hetero_models import HeteroGNN
    for cls in (GNN, models.ResSAGE, PlainGNN, HeteroGNN):
        assert list(inspect.signature(cls.forward).parameters)[1:] == ["x", "graphs", "gather", "dropout", "settings"]

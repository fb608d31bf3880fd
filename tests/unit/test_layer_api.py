"""The layers' API as PyG documents its convolutions: a docstring with the formula, ``Args:`` (every
constructor argument) and ``Shapes:``, and reset_parameters, which draws what construction draws.

A model's parameters depend only on torch.manual_seed (nn/models.py), and runs, checkpoints and the
recorded results rest on that, so the layers' draws are pinned twice: against a reference build from
nn.Linear and torch.nn.init in each layer's documented order, and reset_parameters against
construction, parameter by parameter and in what the generator draws next."""
import inspect
import math

import pytest
import torch
from torch import nn

from granndis_hpc.nn import build_model
from granndis_hpc.nn.edge_layers import GATConv, GINConv, SAGEMaxConv, SAGESumConv
from granndis_hpc.nn.layers import GCNConv, SAGEConv
from granndis_hpc.registry import MODELS, code_options
from tests.hetero_reference import random_typed_graph

SEED = 3


def _sage_reference(n_in, n_out, bias=True):
    lin_self, lin_neigh = nn.Linear(n_in, n_out, bias=bias), nn.Linear(n_in, n_out, bias=False)
    out = {"lin_self.weight": lin_self.weight, "lin_neigh.weight": lin_neigh.weight}
    if bias:
        out["lin_self.bias"] = lin_self.bias
    return out


def _gcn_reference(n_in, n_out):
    return {"lin.weight": nn.Linear(n_in, n_out, bias=False).weight, "bias": torch.zeros(n_out)}


def _gin_reference(n_in, n_out, eps):
    lin1, lin2 = nn.Linear(n_in, n_out), nn.Linear(n_out, n_out)
    return {"eps": torch.tensor([eps]), "lin1.weight": lin1.weight, "lin1.bias": lin1.bias,
            "lin2.weight": lin2.weight, "lin2.bias": lin2.bias}


def _gat_reference(n_in, n_out, heads, concat):
    lin = nn.Linear(n_in, heads * n_out, bias=False)
    nn.init.xavier_uniform_(lin.weight)
    bound = math.sqrt(6.0 / (heads + n_out))
    att_src = nn.init.uniform_(torch.empty(heads, n_out), -bound, bound)
    att_dst = nn.init.uniform_(torch.empty(heads, n_out), -bound, bound)
    return {"lin.weight": lin.weight, "att_src": att_src, "att_dst": att_dst,
            "bias": torch.zeros(heads * n_out if concat else n_out)}


# (layer builder, reference builder drawing the same parameters in the documented order)
LAYERS = {
    "SAGEConv": (lambda: SAGEConv(7, 5), lambda: _sage_reference(7, 5)),
    "SAGEConv-nobias": (lambda: SAGEConv(4, 6, bias=False), lambda: _sage_reference(4, 6, bias=False)),
    "GCNConv": (lambda: GCNConv(7, 5), lambda: _gcn_reference(7, 5)),
    "GCNConv-nobias": (lambda: GCNConv(4, 6, bias=False),
                       lambda: {"lin.weight": nn.Linear(4, 6, bias=False).weight}),
    "SAGESumConv": (lambda: SAGESumConv(7, 5), lambda: _sage_reference(7, 5)),
    "SAGEMaxConv": (lambda: SAGEMaxConv(5, 7), lambda: _sage_reference(5, 7)),
    "GINConv": (lambda: GINConv(7, 5, eps=0.25), lambda: _gin_reference(7, 5, 0.25)),
    "GATConv": (lambda: GATConv(7, 5, heads=3), lambda: _gat_reference(7, 5, 3, True)),
    "GATConv-mean": (lambda: GATConv(6, 4, heads=2, concat=False, add_self_loops=False),
                     lambda: _gat_reference(6, 4, 2, False)),
}


def _state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _scramble(module):
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(7.0)


def _assert_same(got, want, what):
    assert got.keys() == want.keys(), f"{what}: parameters {sorted(got)} != {sorted(want)}"
    for name in want:
        assert torch.equal(got[name], want[name].detach()), f"{what}: {name} differs"


@pytest.mark.parametrize("cls", [SAGEConv, GCNConv, SAGESumConv, SAGEMaxConv, GINConv, GATConv])
def test_a_layer_documents_its_arguments_and_shapes(cls):
    doc = inspect.getdoc(cls)
    assert "Args:" in doc and "Shapes:" in doc, f"{cls.__name__}: no Args: or Shapes: section"
    args = doc.split("Args:")[1].split("\n\n")[0]
    for name in list(inspect.signature(cls.__init__).parameters)[1:]:
        assert f"{name}:" in args, f"{cls.__name__}: argument {name} is not under Args:"


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_a_layer_draws_its_documented_initialisation(name):
    build, reference = LAYERS[name]
    torch.manual_seed(SEED)
    layer = build()
    after_build = torch.rand(4)
    torch.manual_seed(SEED)
    want = reference()
    assert torch.equal(torch.rand(4), after_build), f"{name}: the constructor draws more or less than its reference"
    _assert_same(_state(layer), {k: v.detach() for k, v in want.items()}, name)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_a_layers_reset_parameters_draws_what_its_constructor_draws(name):
    build, _ = LAYERS[name]
    torch.manual_seed(SEED)
    built = _state(build())
    after_build = torch.rand(4)
    layer = build()
    _scramble(layer)
    torch.manual_seed(SEED)
    layer.reset_parameters()
    assert torch.equal(torch.rand(4), after_build), f"{name}: reset_parameters draws more or less than construction"
    _assert_same(_state(layer), built, name)


def _models():
    out = []
    for name in MODELS:
        if code_options(name):  # pyg, pyg-hetero: the convs are the user's code, with PyG's reset_parameters
            continue
        for norm, linear_layers in ((False, 0), (True, 1)):
            out.append((name, norm, linear_layers))
    return out


@pytest.mark.parametrize("name,norm,linear_layers", _models())
def test_a_models_reset_parameters_draws_what_building_it_draws(name, norm, linear_layers):
    kw = {}
    if MODELS.entry(name).get("typed", False):
        kw["types"] = random_typed_graph(0)[0]
        if name == "rgcn" and norm:
            kw["num_bases"] = 2

    def build():
        return build_model(name, 7, 6, 3, 3, 0.1, norm, linear_layers=linear_layers, **kw)

    torch.manual_seed(0)
    built = _state(build())
    after_build = torch.rand(4)
    model = build()
    _scramble(model)
    torch.manual_seed(0)
    model.reset_parameters()
    assert torch.equal(torch.rand(4), after_build), f"{name}: reset_parameters draws more or less than building"
    _assert_same(_state(model), built, name)


def test_a_module_with_parameters_and_no_reset_is_refused():
    model = build_model("sage", 4, 3, 2, 2, 0.0)
    model.extra = nn.Module()
    model.extra.w = nn.Parameter(torch.zeros(2))
    with pytest.raises(TypeError, match=r"extra \(Module\) holds parameters"):
        model.reset_parameters()

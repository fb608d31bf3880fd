"""The model of docs/extending.md's recipe "add a model", shared by the unit tests (its estimate
against the bytes autograd saves, --mode auto and `preprocess plan` on it) and tests/mpi/test_recipes.py
(every mode, auto included, against a dense reference).

A mean-aggregation MLP with a constructor option of its own (`widen`: hidden width = hidden x widen):
h_{l+1} = W_l (h_v + mean_{u in N(v)} h_u) + b_l, ReLU between layers, no dropout."""
from torch import nn

from granndis_hpc.memory_model import stacks
from granndis_hpc.nn import models
from granndis_hpc.nn.contract import Layer
from granndis_hpc.nn.graph import aggregate
from granndis_hpc.registry import ModelOption
from granndis_hpc.units import FLOAT32_BYTES as F32

NAME = "recipe-meanmlp"


class MeanLayer(Layer):
    """out_v = W (h_v + mean_{u in N(v)} h_u) + b, in the parts of the layer contract (nn/contract.py)."""

    def __init__(self, win, wout):
        super().__init__()
        self.lin = nn.Linear(win, wout)

    def aggregate_part(self, part, m, call):
        return aggregate(part, m, "mean")  # sums over any part of the edges: the parts add up

    def update(self, h_dst, aggregated, call):
        return self.lin(h_dst + aggregated)


class MeanMLP(models.GNN):
    """A stack of MeanLayer with ReLU between layers (the runner's default activation), no norm."""

    def __init__(self, in_features, hidden, num_classes, layers, dropout, norm, widen=1):
        super().__init__()
        self.name, self.num_layers = NAME, layers
        widths = [in_features] + [hidden * widen] * (layers - 1) + [num_classes]
        self.conv_in_widths = widths[:-1]
        self.convs = nn.ModuleList(MeanLayer(widths[i], widths[i + 1]) for i in range(layers))
        self.norms, self.linears = None, nn.ModuleList()


class MeanLayerBytes:
    """What one layer of MeanMLP saves: Linear saves its input, the [n_dst, win] sum (a new storage),
    and its weight when that input needs a gradient; the add and the aggregation save nothing of h."""

    source_grad_paths = 2  # h_src[:n_dst] and the aggregation
    self_loops = False

    @staticmethod
    def parameter_count(win, wout):
        return win * wout + wout

    @staticmethod
    def saved_bytes(n_src, n_dst, win, wout, input_grad):
        weight = win * wout * F32 if input_grad else 0
        return n_dst * win * F32 + weight, weight


class MeanMLPEstimate(stacks.PlainEstimate):
    """Layer 0 reads the static halo (as PlainGNN); the widths follow the `widen` option."""

    def __init__(self):
        super().__init__(MeanLayerBytes)

    def aggregation_input_grad(self, m, layer):
        return self.exchanged(layer)  # it never projects before aggregating

    def widths(self, m):
        w = [m.features] + [m.hidden * m.option("widen")] * (m.layers - 1) + [m.num_classes]
        return [(w[i], w[i + 1]) for i in range(m.layers)]

    def parameters(self, m):
        return sum(self.conv.parameter_count(i, o) for i, o in self.widths(m))

    def activations(self, rows, m, mask_bytes):
        per_layer, seen = [], set()
        for l, ((_, lr), (win, wout)) in enumerate(zip(rows.training_layers(), self.widths(m))):
            parts = [stacks.gather_saved(lr, self.exchanged(l), seen),
                     self.conv.saved_bytes(lr.n_src, lr.n_dst, win, wout, self.exchanged(l))]
            if l >= 1:  # the previous layer's ReLU result (no norm, no dropout in this model)
                parts.append(stacks.between_convs_saved(lr.n_own_in, win, False, 0.0, mask_bytes))
            per_layer.append((sum(p[0] for p in parts), sum(p[1] for p in parts)))
        return {"per_layer": [b for b, _ in per_layer], "fresh_per_layer": [b - pre for b, pre in per_layer],
                "head": 0, "head_fresh": 0, "recompute": 0}


def register():
    """Register the recipe model (undo with unregister)."""
    models.register_model(NAME, estimator=MeanMLPEstimate(),
                          options=[ModelOption("widen", int, 1, "hidden width = --hidden x widen")])(MeanMLP)


def unregister():
    models.MODELS.pop(NAME)

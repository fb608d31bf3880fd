"""The memory estimate of the `pyg` model family (nn/pyg.py): a generous one, not measured per op.

A PyG convolution's internals are its own, so this estimate does not mirror its forward pass byte for
byte (as memory_model/stacks.py does for the built-in layers).  It builds the user's stack once (without
touching torch's random generator) for its widths and parameter count, and assumes per layer what a
message-passing convolution typically keeps for the backward, generously: the source rows, three
tensors of the output width per source row (projections, attention terms), and per edge (self loops
included) its two indices and three tensors of the output width (gathered messages, weighted messages,
attention values); plus the per-edge messages at once in the step's peak.

pyg-hetero (nn/pyg_hetero.py) has every conv once per relation (ModelSpec's ``relations``, as for the
relational models of memory_model/hetero_stacks.py): R times the convs' parameters, and per relation the
per-source-row tensors and self loops; the relations partition the edges, so those count once.
"""
from __future__ import annotations

from typing import Dict, Tuple

from granndis_hpc.units import FLOAT32_BYTES as F32
from granndis_hpc.units import INT64_BYTES as I64

from .hetero_stacks import ProjectedInput, projection, projection_parameters, relations
from .zoo_stacks import EdgeEstimate

_BUILT: Dict[tuple, Tuple[list, int, int]] = {}


class PyGEstimate(EdgeEstimate):

    name = "pyg"

    def _stack(self, m) -> Tuple[list, int, int]:
        """(widths of every layer and the output, parameter count, the convs' parameter count) of the
        user's stack."""
        features = (projection(m) if self.name == "pyg-hetero" else 0) or m.features  # its input projection's
        key = (self.name, m.option("module"), m.option("factory"), features, m.hidden, m.num_classes, m.layers,
               m.linear_layers, m.norm)
        if key not in _BUILT:
            import torch

            from granndis_hpc.nn.pyg import pyg_stack, user_convs
            layers = m.layers + m.linear_layers
            with torch.random.fork_rng(devices=[]):  # the run's parameters are drawn as without the estimate
                convs = user_convs(self.name, features, m.hidden, m.num_classes, layers, m.option("module"),
                                   m.option("factory"), m.linear_layers)
                model = pyg_stack(self.name, convs, features, m.hidden, m.num_classes, 0.0, m.norm,
                                  m.linear_layers)
            _BUILT[key] = (model.widths, sum(p.numel() for p in model.parameters()),
                           sum(p.numel() for p in model.convs.parameters()))
        return _BUILT[key]

    def all_widths(self, m):
        w = self._stack(m)[0]
        return [(w[i], w[i + 1]) for i in range(len(w) - 1)]

    def parameters(self, m):
        return self._stack(m)[1]

    def conv_saved(self, lr, m, layer, win, wout, input_grad, mask_bytes):
        edges = lr.nnz + lr.n_src
        return lr.n_src * (win + 3 * wout) * F32 + edges * (2 * I64 + 3 * wout * F32), 0

    def edge_transient(self, lr, m, layer, win, wout):
        return (lr.nnz + lr.n_src) * wout * F32


class PyGHeteroEstimate(ProjectedInput, PyGEstimate):
    """pyg-hetero: each conv once per relation (after the per-type input projection, where it has one)."""

    name = "pyg-hetero"

    def parameters(self, m):
        _, total, convs = self._stack(m)
        return total + (relations(m) - 1) * convs + projection_parameters(m)

    def conv_saved(self, lr, m, layer, win, wout, input_grad, mask_bytes):
        R = relations(m)
        edges = lr.nnz + R * lr.n_src
        return (lr.n_src * (win + 3 * R * wout) * F32 + edges * (2 * I64 + 3 * wout * F32)
                + R * lr.n_dst * wout * F32, 0)  # (the last: each relation's output rows and their sums)


PYG_ESTIMATE = PyGEstimate()
PYG_HETERO_ESTIMATE = PyGHeteroEstimate()

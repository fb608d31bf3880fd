"""What `preprocess plan --device cpu` adds to a transductive estimate beside the tensors
(memory_model/host.py): the heap's holes, a fraction of the step's transient that depends on the model
family (measured with bench/check_heap_holes.py; the fractions are restated here, not read from the
package)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from granndis_hpc import memory_model as mm
from tests.unit.test_memory_model import _random_plan

# The documented fractions (docs/memory-model.md, "On a CPU device"): R-GCN's step leaves twice its
# transient in holes, R-GAT's once, GAT's half, every other model's 1.5 times.
HOLES = {"rgcn": 2.0, "rgat": 1.0, "sage": 1.5, "gcn": 1.5, "gat": 0.5, "gin": 1.5}
TENSORS = ("features", "graph", "parameters", "gradients", "optimizer", "activations", "halo_buffers",
           "step_transient")


def _spec(name, features=24):
    kw = dict(relations=3) if name in ("rgcn", "rgat") else {}
    return mm.ModelSpec(name, features, 16, 5, 3, **kw)


@pytest.mark.parametrize("name", sorted(HOLES))
def test_the_heap_holes_are_the_model_familys_fraction_of_its_step(name):
    rows, _, _ = _random_plan(np.random.default_rng(7), 3)
    spec = _spec(name)
    plain = mm.estimate(rows, spec, device="cpu")
    resident = mm.estimate(rows, dataclasses.replace(spec, resident=True), device="cpu")
    b = resident["breakdown"]
    # The tensors are the same with or without the host terms; the step is their transient part.
    assert {k: b[k] for k in TENSORS} == plain["breakdown"]
    step = b["activations"] + b["halo_buffers"] + b["step_transient"]
    assert step > 0
    assert b["allocator"] == int(HOLES[name] * step)
    assert b["runtime"] == (256 + 80) << 20
    assert resident["total"] == plain["total"] + b["runtime"] + b["shard_slice"] + b["allocator"]


def test_rgat_counts_fewer_holes_than_rgcn_on_the_same_rows():
    """The same rows and widths: R-GAT's larger step (its per-edge attention tensors) is counted with half
    R-GCN's fraction of holes, so its allocator term is below twice its step while R-GCN's is twice its."""
    rows, _, _ = _random_plan(np.random.default_rng(3), 3, features=16)
    got = {}
    for name in ("rgcn", "rgat"):
        b = mm.estimate(rows, dataclasses.replace(_spec(name, 16), resident=True), device="cpu")["breakdown"]
        got[name] = (b["allocator"], b["activations"] + b["halo_buffers"] + b["step_transient"])
    (rgcn_holes, rgcn_step), (rgat_holes, rgat_step) = got["rgcn"], got["rgat"]
    assert rgat_step > rgcn_step
    assert rgcn_holes == int(2 * rgcn_step) and rgat_holes == rgat_step


def test_no_holes_on_a_gpu_or_without_the_resident_estimate():
    rows, _, _ = _random_plan(np.random.default_rng(5), 3)
    for name in ("rgat", "sage"):
        spec = _spec(name)
        assert "allocator" not in mm.estimate(rows, spec, device="cpu")["breakdown"]
        assert "allocator" not in mm.estimate(rows, dataclasses.replace(spec, resident=True),
                                              device="cuda")["breakdown"]

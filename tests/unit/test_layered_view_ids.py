"""LayeredView hands dropout the global ids of each layer's rows, and refuses a switch of views whose
rows are as many but not the same vertices in the same order (their masks would differ)."""
from types import SimpleNamespace

import pytest
import torch

from granndis_hpc.engine.views import LayeredView
from granndis_hpc.graph.planner import PlanError


def _view(group, n_own_in, n_dst, row_ids):
    layers = [SimpleNamespace(n_own_in=a) for a in n_own_in]
    return SimpleNamespace(group=group, input_features=torch.zeros(n_own_in[0], 1),
                           graphs=[SimpleNamespace(n_dst=d) for d in n_dst], plan=SimpleNamespace(layers=layers),
                           row_ids=row_ids)


def test_row_ids_per_layer_and_switch_check():
    server = _view("server", [9, 6], [6, 4], torch.tensor([5, 1, 7, 3, 2, 8, 0, 4, 6]))
    world = _view("world", [4, 4, 4], [4, 4, 4], torch.tensor([5, 1, 7, 3]))
    plan = LayeredView([server, server, world])
    assert plan.layer_row_ids[0] is server.row_ids and plan.layer_row_ids[2] is world.row_ids
    swapped = _view("world", [4, 4, 4], [4, 4, 4], torch.tensor([1, 5, 7, 3]))
    with pytest.raises(PlanError, match="differently"):
        LayeredView([server, server, swapped])

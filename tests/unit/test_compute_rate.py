"""The compute rates --mode auto measures (memory_model/compute_rate.py)."""
import math

import torch

from granndis_hpc.memory_model import compute_rate


def test_rates_are_positive_and_finite():
    row, edge = compute_rate.measure([(32, 16), (16, 4)], degree=5.0, device=torch.device("cpu"))
    for rate in (row, edge):
        assert rate > 0 and math.isfinite(rate)


def test_time_grows_with_width():
    cpu = torch.device("cpu")
    # the seconds per row (rate x units) of a 16x wider projection, and per edge of a 16x wider aggregation
    assert compute_rate.row_seconds(256, 256, cpu) * 256 * 256 > compute_rate.row_seconds(16, 64, cpu) * 16 * 64
    assert compute_rate.edge_seconds(512, 8, cpu) * 512 > compute_rate.edge_seconds(32, 8, cpu) * 32

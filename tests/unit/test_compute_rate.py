"""The compute rates --mode auto measures (memory_model/compute_rate.py)."""
import math

import pytest
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


def _scripted(timings):
    """A pass that returns the next of `timings` (the first one is the warm-up's) and counts its calls."""
    it = iter(timings)
    calls = []

    def once(widths, degree, device):
        calls.append((tuple(widths), degree))
        return next(it)
    return once, calls


def test_a_rank_keeps_the_median_of_its_passes_after_a_warm_up():
    # warm-up 100x slower (left out); one pass 10x slow and one 10x fast: the median is the typical pass
    once, calls = _scripted([(1.0, 1.0), (0.01, 0.002), (0.1, 0.003), (0.012, 0.0002), (0.011, 0.004), (0.001, 0.001)])
    passes = compute_rate.samples([(8, 4)], 3.0, torch.device("cpu"), repeats=5, once=once)
    assert len(calls) == 6 and passes == [(0.01, 0.002), (0.1, 0.003), (0.012, 0.0002), (0.011, 0.004), (0.001, 0.001)]
    # row: sorted 0.001 0.01 0.011 0.012 0.1 -> 0.011; edge apart: 0.0002 0.001 0.002 0.003 0.004 -> 0.002
    assert compute_rate.median_rates(passes) == (0.011, 0.002)


def test_the_job_takes_the_slowest_rank_per_rate():
    assert compute_rate.combine([(0.011, 0.002), (0.03, 0.001), (0.02, 0.005)]) == (0.03, 0.005)


def test_measure_job_combines_the_ranks_it_gathers():
    # This process is rank 1 of three; the allgather hands back the other ranks' medians around its own.
    once, _ = _scripted([(9.0, 9.0), (0.02, 0.01), (0.04, 0.03), (0.03, 0.02)])
    others = [(0.05, 0.001), (0.01, 0.04)]
    out = compute_rate.measure_job([(8, 4)], 3.0, torch.device("cpu"), lambda mine: [others[0], mine, others[1]],
                                   repeats=3, once=once)
    assert out["per_rank"] == [[0.05, 0.001], [0.03, 0.02], [0.01, 0.04]]
    assert (out["row_s"], out["edge_s"]) == (0.05, 0.04)
    assert "median of 3 passes" in out["method"] and "3 ranks" in out["method"]


def test_repeats_must_be_positive():
    once, _ = _scripted([(1.0, 1.0)])
    with pytest.raises(ValueError, match="repeats"):
        compute_rate.samples([(8, 4)], 3.0, torch.device("cpu"), repeats=0, once=once)

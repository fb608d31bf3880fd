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


def test_fit_step_separates_the_per_row_and_the_fixed_cost():
    # 0.2 s at 1000 rows, 0.3 s at 2000: 1e-4 s a row over a kernel prediction of 5e-5 -> x2, 0.1 s fixed
    scale, fixed = compute_rate.fit_step(0.2, 0.3, 1000, 5e-5)
    assert scale == pytest.approx(2.0) and fixed == pytest.approx(0.1)
    # noise made the larger step no slower: no slope, the larger step's seconds over its prediction
    scale, fixed = compute_rate.fit_step(0.3, 0.25, 1000, 5e-5)
    assert scale == pytest.approx(0.25 / (2000 * 5e-5)) and fixed == 0.0
    # the fixed cost is never negative
    assert compute_rate.fit_step(0.05, 0.2, 1000, 5e-5)[1] == 0.0
    # a growth below the kernels' own prediction is noise: the step runs at least the kernels
    scale, fixed = compute_rate.fit_step(0.2, 0.21, 1000, 5e-5)
    assert scale == 1.0 and fixed == pytest.approx(0.2 - 1000 * 5e-5)


def test_kernel_prediction_counts_the_projected_rows():
    import granndis_hpc.memory_model as mm

    # SAGE 8 -> 8 -> 8 -> 4 (layer 0 reads the static features; layers 1-2 the exchange)
    spec = mm.ModelSpec("sage", features=8, hidden=8, num_classes=4, layers=3)
    n, d, row_s, edge_s = 1024, 3, 1e-3, 1e-2
    edges = 3 * n * d * 8 * edge_s
    # plain: lin_self and lin_neigh project the n rows (or their aggregates) at every layer
    want = 2 * n * (8 * 8 + 8 * 8 + 8 * 4) * row_s + edges
    assert compute_rate.kernel_seconds(spec, n, d, row_s, edge_s) == pytest.approx(want)
    # overlapped: layer 1 (8 -> 8, its halo in flight) projects its n + n/16 sources first; layer 2
    # narrows (8 -> 4), so it projects its sources, halo included, on either path; layer 0 holds the static
    # halo rows, not split, at equal widths: it aggregates first
    h = n // 16
    want = (2 * n * 8 * 8 + (2 * n + h) * 8 * 8 + (2 * n + h) * 8 * 4) * row_s + edges
    assert compute_rate.kernel_seconds(spec, n, d, row_s, edge_s, overlapped=True) == pytest.approx(want)
    # at the run's shape: 2 halo rows per row at hand (the split share moves no projection)
    h = 2 * n
    want = (2 * n * 8 * 8 + (2 * n + h) * 8 * 8 + (2 * n + h) * 8 * 4) * row_s + edges
    assert compute_rate.kernel_seconds(spec, n, d, row_s, edge_s, True, (2.0, 0.95)) == pytest.approx(want)


def test_calibrate_times_the_real_training_step():
    import granndis_hpc.memory_model as mm

    spec = mm.ModelSpec("sage", features=16, hidden=8, num_classes=3, layers=2)
    out = compute_rate.calibrate(spec, 4.0, torch.device("cpu"), 1e-9, 1e-9, repeats=2, shape=(2.0, 0.95))
    assert out["rows"] >= 1024 and 0 < out["step_small_s"] and 0 < out["step_large_s"]
    assert out["shape"] == [2.0, 0.95]  # the overlapped path at the run's halo and boundary rows
    assert out["compute_scale"] >= 1 and math.isfinite(out["compute_scale"]) and out["step_s"] >= 0
    # the world view's overlapped path: at least the plain scale (it runs every product and more)
    assert 0 < out["overlapped_small_s"] and 0 < out["overlapped_large_s"]
    assert out["compute_scale"] <= out["overlap_scale"] and math.isfinite(out["overlap_scale"])
    assert out["overlap_step_s"] >= 0


def test_the_ranks_calibrate_together():
    """With the job's allgather, every timed step starts after all ranks agree (a training step's ranks
    compute at once), and the budget's stop is the ranks' together: the same calls on every rank."""
    import granndis_hpc.memory_model as mm

    spec = mm.ModelSpec("sage", features=16, hidden=8, num_classes=3, layers=2)
    calls = []

    def allgather(mine):
        calls.append(mine)
        return [mine, None if mine is None else (False, None)]  # a peer that is never late nor failing
    out = compute_rate.calibrate(spec, 4.0, torch.device("cpu"), 1e-9, 1e-9, repeats=2, allgather=allgather)
    assert out["compute_scale"] >= 1
    # whether every rank built its steps, then per repeat a start for each of the 4 steps and the budget's check
    assert calls == [(False, None)] + 2 * ([None] * 4 + [(False, None)])
    # a peer over the budget stops this rank too
    calls.clear()
    compute_rate.calibrate(spec, 4.0, torch.device("cpu"), 1e-9, 1e-9, repeats=3,
                           allgather=lambda mine: calls.append(mine) or [mine, None if mine is None else (True, None)])
    assert calls == [(False, None)] + [None] * 4 + [(False, None)]


def test_a_rank_that_cannot_calibrate_stops_every_rank_with_its_reason():
    import granndis_hpc.memory_model as mm

    spec = mm.ModelSpec("sage", features=16, hidden=8, num_classes=3, layers=2)
    with pytest.raises(compute_rate.CalibrationFailed, match="ValueError: no such model"):
        compute_rate.calibrate(spec, 4.0, torch.device("cpu"), 1e-9, 1e-9, repeats=2,
                               allgather=lambda mine: [mine, (False, "ValueError: no such model")])
    # measure_job prices by the kernels alone, saying that rank's reason once
    once, _ = _scripted([(9.0, 9.0), (0.02, 0.01)])
    gathered = iter([[(0.05, 0.001), (0.04, 0.001)], [(False, None), (False, "ValueError: no such model")]])

    def allgather(mine):
        out = next(gathered, None)
        return out if out is not None else [mine, mine]
    out = compute_rate.measure_job([(8, 4)], 3.0, torch.device("cpu"), allgather, repeats=1, once=once, spec=spec)
    assert (out["compute_scale"], out["step_s"]) == (1.0, 0.0)
    assert out["calibration"] == "not calibrated (ValueError: no such model): the kernels' rates alone"


@pytest.mark.parametrize("name", ["sage", "gcn"])
@pytest.mark.parametrize("features", [5, 8, 16])  # widening, equal and narrowing into hidden 8
def test_the_projected_rows_are_the_rows_the_linears_read(name, features):
    """The compute model's projected rows (the model's estimator's projected_rows) against the rows every
    Linear of each conv reads in the real model, plain and on the world view's overlapped path (the halo
    in flight at the exchanged layers, 1 and 2)."""
    import granndis_hpc.memory_model as mm
    from granndis_hpc.nn.models import build_model

    cpu, n = torch.device("cpu"), 64
    spec = mm.ModelSpec(name, features=features, hidden=8, num_classes=3, layers=3)
    model = build_model(name, features, 8, 3, 3).eval()
    seen = [0] * 3

    def count(l):
        def hook(module, args):
            seen[l] += args[0].shape[0]
        return hook
    for l, conv in enumerate(model.convs):
        for lin in conv.modules():
            if isinstance(lin, torch.nn.Linear):
                lin.register_forward_pre_hook(count(l))
    x = torch.randn(n, features)
    for overlapped in (False, True):
        gather, n_halo = compute_rate._world_gather(n, cpu, lambda l: l > 0) if overlapped else (None, 0)
        graph = compute_rate._calibration_graph(n, 3, cpu, n_halo=n_halo)
        seen[:] = [0] * 3
        model(x, [graph] * 3, gather=gather)
        rows = mm.LayerRows(n_own_in=n, n_halo=n_halo, n_dst=n, nnz=3 * n)
        want = [spec.estimator.projected_rows(rows, i, o, overlapped and l > 0)
                for l, (i, o) in enumerate(spec.widths())]
        assert seen == want, (overlapped, seen, want)


@pytest.mark.parametrize("shape,halo_rows,first_rows", [(None, 4, 16), ((2.0, 0.95), 128, 61), ((9.0, 0.0), 256, 1)])
def test_the_overlapped_step_runs_the_world_views_path(shape, halo_rows, first_rows):
    from granndis_hpc.nn.models import build_model
    from granndis_hpc.nn.rows import PendingRows

    cpu = torch.device("cpu")
    # SAGE's layer 0 reads the static halo (feature rows, no gradient); layers 1 and 2 exchange.  The shape's
    # halo rows per row at hand (at most MAX_HALO_SHARE) and its share of the rows computed first (at least one)
    gather, n_halo = compute_rate._world_gather(64, cpu, lambda l: l > 0, shape)
    assert n_halo == halo_rows
    first = gather.boundary(1).first
    assert first.numel() == first_rows and int(first[0]) == 0 and bool((first[1:] > first[:-1]).all())
    boundaries = []
    split = gather.boundary
    gather.boundary = lambda l: boundaries.append(l) or split(l)
    graph = compute_rate._calibration_graph(64, 3, cpu, n_halo=n_halo)
    assert (graph.n_dst, graph.n_src, graph.n_own) == (64, 64 + n_halo, 64)
    model = build_model("sage", 5, 8, 3, 3).eval()
    x = torch.randn(64, 5)
    got = model(x, [graph] * 3, gather=gather)
    assert boundaries == [1, 2]  # layers 0 and 1 compute the next exchange's rows first
    assert split(0) is None and split(1) is not None
    # the exchanged layers' halo handed over in flight, the static one at once, and the same logits as the
    # same rows gathered at once
    static = gather(0, x)
    assert torch.is_tensor(static) and static.shape == (64 + n_halo, 5) and not static.requires_grad
    halos = {l: gather(l, torch.zeros(64, 8)) for l in (1, 2)}
    assert all(isinstance(h, PendingRows) for h in halos.values())
    halos = {0: static[64:], **{l: h.halo() for l, h in halos.items()}}
    want = model(x, [graph] * 3, gather=lambda l, h: torch.cat([h, halos[l]]))
    torch.testing.assert_close(got, want)
    got.sum().backward()  # the exchanged halo rows get their gradient, as the exchange's backward reads it
    assert all(halos[l].grad is not None and halos[l].grad.abs().sum() > 0 for l in (1, 2))


def test_measure_job_keeps_the_slowest_calibration():
    once, _ = _scripted([(9.0, 9.0), (0.02, 0.01)])
    seen = []

    def calibration(spec, degree, device, row, edge, allgather, shape=None):
        seen.append((spec, degree, row, edge))
        return {"compute_scale": 1.5, "step_s": 0.01, "rows": 512}
    others = [{"compute_scale": 2.5, "step_s": 0.002, "rows": 512}]
    gathered = iter([[(0.05, 0.001), None], [others[0], None]])

    def allgather(mine):
        out = next(gathered)
        out[1] = mine
        return out
    out = compute_rate.measure_job([(8, 4)], 3.0, torch.device("cpu"), allgather, repeats=1, once=once,
                                   spec="spec", calibration=calibration)
    assert seen == [("spec", 3.0, 0.05, 0.01)]  # calibrated against the job's rates, not its own
    assert (out["compute_scale"], out["step_s"]) == (2.5, 0.01)
    assert "compute x2.5" in out["method"] and "0.01 s fixed per step" in out["method"]
    # a calibration without the overlapped path's figures: its plain scale, no extra fixed cost
    assert (out["overlap_scale"], out["overlap_step_s"]) == (2.5, 0.0)


def test_measure_job_keeps_the_slowest_overlapped_calibration():
    once, _ = _scripted([(9.0, 9.0), (0.02, 0.01)])
    # ratios to the rank's own plain step 1.4, 1.0 (a disturbed fit) and 1.25; extra fixed costs 1, 40, 4 ms
    cals = [{"compute_scale": 1.5, "step_s": 0.01, "overlap_scale": 2.1, "overlap_step_s": 0.001, "rows": 512},
            {"compute_scale": 2.0, "step_s": 0.002, "overlap_scale": 2.0, "overlap_step_s": 0.04, "rows": 512},
            {"compute_scale": 1.6, "step_s": 0.002, "overlap_scale": 2.0, "overlap_step_s": 0.004, "rows": 512}]
    gathered = iter([[(0.05, 0.001), (0.04, 0.001), (0.04, 0.001)], cals])
    shapes = []
    out = compute_rate.measure_job([(8, 4)], 3.0, torch.device("cpu"), lambda mine: next(gathered), repeats=1,
                                   once=once, spec="spec", shape=(2.0, 0.95),
                                   calibration=lambda *a, **kw: shapes.append(kw["shape"]) or cals[0])
    assert shapes == [(2.0, 0.95)]  # the run's overlapped path's shape, where the calibration takes it
    # the slowest rank's plain scale, times the ranks' median ratio; the median extra fixed cost
    assert out["compute_scale"] == 2.0
    assert out["overlap_scale"] == pytest.approx(2.0 * 1.25) and out["overlap_step_s"] == 0.004
    assert ("overlapped path (2 halo rows and 95% of the rows computed first per row, the run's) x1.25 of that "
            "(ranks 1-1.4) and +0.004 s a step") in out["method"]


def test_a_model_the_step_cannot_build_is_priced_by_the_kernels():
    once, _ = _scripted([(9.0, 9.0), (0.02, 0.01)])

    def calibration(*args, **kw):
        raise ValueError("model 'rgcn' needs a heterogeneous shard set")
    out = compute_rate.measure_job([(8, 4)], 3.0, torch.device("cpu"), lambda mine: [mine], repeats=1, once=once,
                                   spec="spec", calibration=calibration)
    assert (out["compute_scale"], out["step_s"]) == (1.0, 0.0)
    assert "not calibrated (ValueError: model 'rgcn' needs" in out["method"]

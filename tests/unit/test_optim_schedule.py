"""engine/optim.py on one process: the step and cosine rates against torch's own schedulers, the option
rules, and a checkpoint's optimizer state refused for another optimizer or schedule.  (Distributed runs
against single-process references, resume included: tests/mpi/test_schedule.py.)"""
import pytest
import torch

from granndis_hpc.options.train import TrainConfig
from granndis_hpc.options import ConfigError
from granndis_hpc.rundir.checkpoint_files import CheckpointError
from granndis_hpc.engine.optim import ScheduledOptimizer


def cfg(**o):
    return TrainConfig(shards="x", **o)


def rates(c, epochs):
    model = torch.nn.Linear(2, 1)
    opt = ScheduledOptimizer(c, [{"params": list(model.parameters()), "weight_decay": 0.0}], model.parameters())
    return [opt.start_epoch(e) for e in range(epochs)]


@pytest.mark.parametrize("schedule", ["step", "cosine"])
def test_rates_after_warmup_equal_torch_schedulers(schedule):
    c = cfg(lr=0.1, lr_schedule=schedule, warmup_epochs=4, step_size=3, gamma=0.5, min_lr=0.01, epochs=20)
    got = rates(c, 20)
    assert got[:4] == pytest.approx([0.025, 0.05, 0.075, 0.1])
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    ref = (torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5) if schedule == "step"
           else torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=16, eta_min=0.01))
    want = []
    for _ in range(16):
        want.append(opt.param_groups[0]["lr"])
        opt.step()
        ref.step()
    assert got[4:] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("options, message", [
    (dict(momentum=0.9), "--momentum and --nesterov are sgd's"),
    (dict(optimizer="sgd", nesterov=True), "--nesterov needs momentum"),
    (dict(lr_schedule="cosine", min_lr=0.5, lr=0.1), "--min-lr 0.5 must be below --lr 0.1"),
    (dict(lr_schedule="cosine", warmup_epochs=10, epochs=10), "leaves no epoch to decay over"),
    (dict(patience=3, eval_every=0), "--patience counts evaluations"),
])
def test_option_rules(options, message):
    with pytest.raises(ConfigError, match=message):
        cfg(**options)


def test_saved_state_refused_for_another_optimizer_or_schedule():
    model = torch.nn.Linear(2, 1)
    groups = lambda: [{"params": list(model.parameters()), "weight_decay": 0.0}]  # noqa: E731
    saved = ScheduledOptimizer(cfg(lr_schedule="cosine", warmup_epochs=2), groups(), model.parameters())
    saved.start_epoch(3)
    other = ScheduledOptimizer(cfg(lr_schedule="step"), groups(), model.parameters())
    with pytest.raises(CheckpointError, match="lr_schedule: checkpoint 'cosine', this run 'step'.*warmup_epochs"):
        other.load_state_dict(saved.state_dict())
    same = ScheduledOptimizer(cfg(lr_schedule="cosine", warmup_epochs=2, epochs=500), groups(), model.parameters())
    same.load_state_dict(saved.state_dict())
    assert same.horizon == 200 and same.lr == saved.lr  # the run's horizon, whatever --epochs is now
    plain = torch.optim.Adam(groups(), lr=0.01).state_dict()  # a checkpoint written before schedules existed
    ScheduledOptimizer(cfg(), groups(), model.parameters()).load_state_dict(plain)
    with pytest.raises(CheckpointError, match="optimizer: checkpoint 'adam', this run 'adamw'"):
        ScheduledOptimizer(cfg(optimizer="adamw"), groups(), model.parameters()).load_state_dict(plain)


def test_report_plots_the_learning_rate_of_runs_that_record_it(tmp_path):
    import json
    import os

    from granndis_hpc.report.command import render_report
    from tests.unit.test_report import check_png, write_run

    plain, _ = write_run(tmp_path, "plain", "fb", seed=1)
    assert "learning_rate.png" not in [os.path.basename(p) for p in render_report([str(plain)],
                                                                                  str(tmp_path / "r1"))["pngs"]]
    run, _ = write_run(tmp_path, "cosine", "fb", seed=2)
    lrs = rates(cfg(lr=0.1, lr_schedule="cosine", warmup_epochs=2, epochs=12), 12)
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(dict(r, lr=lr)) + "\n" for r, lr in zip(lines, lrs)))
    pngs = render_report([str(run), str(plain)], str(tmp_path / "r2"))["pngs"]
    assert os.path.basename(pngs[-1]) == "learning_rate.png"
    check_png(pngs[-1])

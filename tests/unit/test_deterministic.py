"""--deterministic (engine/preflight.DeterministicKernels): torch's deterministic algorithms for the run,
recorded in summary.json and restored afterwards; two runs with it give bit-identical parameters (one rank,
CPU: GAT, whose softmax sums and messages use index_add, with dropout); and the loss's gather form, which a
GPU uses under the flag, equals torch's cross-entropy."""
import json

import numpy as np
import pytest
import torch

from granndis_hpc import cli
from granndis_hpc.engine.predict_io import read_output
from granndis_hpc.engine.targets import class_loss_by_gather
from granndis_hpc.rundir import checkpoint as ck
from granndis_hpc.rundir import checkpoint_files as cf
from tests.unit.test_shards import build, make_graph

pytest.importorskip("mpi4py")
EPOCHS = 3


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("det") / "set"
    build(make_graph(n=200, m=900, seed=11), out, servers=1, gpus_per_server=1)
    return out


def _run(shards, run_dir):
    cli.run_training(["--shards", str(shards), "--ranks-per-server", "1", "--model", "gat", "--layers", "2",
                      "--hidden", "8", "--dropout", "0.5", "--epochs", str(EPOCHS), "--eval-every", "1",
                      "--checkpoint-every", str(EPOCHS), "--deterministic", "--out", str(run_dir), "--quiet"])
    info = cf.latest_complete(str(run_dir))
    state = ck.read_payload(info.path, info.manifest["files"][cf.SHARED_FILE])
    return state["model"], json.loads((run_dir / "summary.json").read_text())


def test_two_deterministic_runs_give_the_same_bits_and_the_setting_is_restored(shard_set, tmp_path):
    assert not torch.are_deterministic_algorithms_enabled()
    first, summary = _run(shard_set, tmp_path / "a")
    assert summary["compute"]["deterministic"] is True
    assert not torch.are_deterministic_algorithms_enabled()  # restored when the trainer closed
    second, _ = _run(shard_set, tmp_path / "b")
    assert sorted(first) == sorted(second)
    for name, tensor in first.items():
        assert torch.equal(tensor, second[name]), name
    # predict takes the flag too, and restores the setting after its forward.
    outs = []
    for name in ("p1.h5", "p2.h5"):
        cli.run_predict(["--model", str(tmp_path / "a"), "--shards", str(shard_set), "--ranks-per-server", "1",
                         "--deterministic", "--out", str(tmp_path / name), "--quiet"])
        outs.append(read_output(str(tmp_path / name))[0]["logits"])
    assert np.array_equal(outs[0], outs[1]) and not torch.are_deterministic_algorithms_enabled()
    metrics = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert len({round(r["loss"], 6) for r in metrics}) == EPOCHS  # training moved


def test_the_gather_form_of_the_loss_equals_cross_entropy():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(50, 7, generator=g, requires_grad=True)
    labels = torch.randint(0, 7, (50,), generator=g)
    want = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
    got = class_loss_by_gather(logits, labels)
    np.testing.assert_allclose(got.item(), want.item(), rtol=1e-6)
    (g_want,) = torch.autograd.grad(want, logits)
    (g_got,) = torch.autograd.grad(got, logits)
    torch.testing.assert_close(g_got, g_want, rtol=1e-5, atol=1e-6)

"""One rank (a 1x1 shard set, the world is this process): no halo, so the default (overlapped) path runs
no exchange, no cat copy and no gradient hooks, and its epochs equal --no-overlap's and a plain-torch
GraphSAGE written here, epoch by epoch (loss and final parameters)."""
import numpy as np
import pytest
import torch

from granndis_hpc.options.train import TrainConfig
from granndis_hpc.engine.trainer import Trainer
from tests.unit.test_shards import build, make_graph

pytest.importorskip("mpi4py")

EPOCHS = 3


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    graph = make_graph(n=240, m=900, seed=3)
    out = tmp_path_factory.mktemp("one_rank") / "set"
    # Locality blocks of 32 rows: the rank's rows are not in the graph's vertex order the reference uses.
    build(graph, out, servers=1, gpus_per_server=1, layers=2, row_block_rows=32)
    return graph, out


def _trainer(shards, no_overlap):
    return Trainer(TrainConfig(shards=str(shards), mode="flx", model="sage", layers=2, hidden=8, dropout=0.0,
                               no_overlap=no_overlap, ranks_per_server=1, skip_checksums=True))


def _reference(graph, params):
    """Plain-torch SAGE-mean over the whole graph (vertex order of the input), Adam, the same epochs."""
    n = graph.num_vertices
    dst = np.repeat(np.arange(n), np.diff(graph.indptr))
    a = torch.zeros(n, n)
    a[torch.from_numpy(dst), torch.from_numpy(graph.indices.astype(np.int64))] = 1.0
    a = a / a.sum(1, keepdim=True).clamp(min=1.0)  # mean over in-neighbours
    x, y = torch.from_numpy(graph.features), torch.from_numpy(np.asarray(graph.labels, dtype=np.int64))
    train = torch.from_numpy(np.flatnonzero(graph.train_mask))
    w = [p.detach().clone().requires_grad_(True) for p in params]
    opt = torch.optim.Adam(w, lr=0.01)
    losses = []
    for _ in range(EPOCHS):
        opt.zero_grad()
        h = x
        for i in range(2):
            ws, b, wn = w[3 * i:3 * i + 3]
            h = h @ ws.T + b + (a @ h) @ wn.T
            if i == 0:
                h = torch.relu(h)
        loss = torch.nn.functional.cross_entropy(h[train], y[train])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, w


def test_one_rank_default_path_is_plain_and_exact(one_rank):
    graph, shards = one_rank
    runs = {}
    for no_overlap in (False, True):
        t = _trainer(shards, no_overlap)
        try:
            if not no_overlap:
                # Nothing to exchange or reduce: the gather hands the rows through, no hooks are registered.
                assert t.gradsync.alone and t.gradsync._handles == []
                h = torch.zeros(t.world_view.plan.layers[1].n_own_in, 8)
                assert t.world_view.gather_fn("halo", overlap={"world", "server"})(1, h) is h
            names = [f"convs.{i}.{k}" for i in range(2) for k in ("lin_self.weight", "lin_self.bias",
                                                                  "lin_neigh.weight")]
            start = dict(t.model.named_parameters())
            initial = [start[k].detach().clone() for k in names]
            losses = [t.train_epoch()["loss"] for _ in range(EPOCHS)]
            final = [dict(t.model.named_parameters())[k].detach().clone() for k in names]
            runs[no_overlap] = (losses, initial, final)
        finally:
            t.close()
    (l_ov, init, fin_ov), (l_no, _, fin_no) = runs[False], runs[True]
    assert l_ov == l_no and all(torch.equal(a, b) for a, b in zip(fin_ov, fin_no))
    ref_losses, ref_final = _reference(graph, init)
    np.testing.assert_allclose(l_ov, ref_losses, rtol=1e-5)
    for ours, ref in zip(fin_ov, ref_final):
        torch.testing.assert_close(ours, ref.detach(), rtol=1e-4, atol=1e-5)


def test_the_c_kernels_train_as_torch_s_ops(one_rank, monkeypatch):
    """GRANNDIS_CPU_KERNELS=native (nn/cpu_kernels.c) and torch's ops train the same parameters (sparse
    products and keyed dropout), and the run's summary names what it used."""
    _, shards = one_rank
    params, used = {}, {}
    for kernel in ("native", "torch"):
        monkeypatch.setenv("GRANNDIS_CPU_KERNELS", kernel)
        t = Trainer(TrainConfig(shards=str(shards), mode="flx", model="sage", layers=2, hidden=8, dropout=0.5,
                                epochs=EPOCHS, eval_every=EPOCHS, ranks_per_server=1, skip_checksums=True,
                                quiet=True))
        try:
            summary = t.run()
            params[kernel] = [p.detach().clone() for p in t.model.parameters()]
        finally:
            t.close()
        used[kernel] = summary["compute"]["kernels"]
    assert used == {"native": "native", "torch": "torch"}
    for native, torch_s in zip(params["native"], params["torch"]):
        torch.testing.assert_close(native, torch_s, rtol=1e-6, atol=1e-7)


def test_banner_epoch_lines_and_quiet(one_rank, tmp_path, capsys):
    """What a person reads: the banner names mode, model, protocol and shape; each epoch line its learning
    rate and ETA; --quiet keeps only the final result line; summary.json says where start-up went."""
    import json

    from granndis_hpc import cli

    _, shards = one_rank
    args = ["--shards", str(shards), "--mode", "fb", "--model", "sage", "--layers", "2", "--hidden", "8",
            "--epochs", "3", "--ranks-per-server", "1", "--skip-checksums", "--lr", "0.02"]
    summary = cli.run_training(args + ["--out", str(tmp_path / "run")])
    out = capsys.readouterr().out.splitlines()
    banner = next(line for line in out if line.startswith("granndis train:"))
    for part in ("mode fb, exact full-graph", "model sage (2 layers, hidden 8)", "transductive",
                 "1 server(s) x 1 rank(s) on cpu", "3 epochs"):
        assert part in banner, banner
    epochs = [line for line in out if line.startswith("Epoch ")]
    assert len(epochs) == 3 and all(" | LR 0.02 | ETA 0:00:" in line for line in epochs), epochs
    assert epochs[-1].endswith("ETA 0:00:00")
    assert out[-1].startswith("[fb] done: 3 epochs")
    startup = json.loads((tmp_path / "run" / "summary.json").read_text())["startup_s"]
    assert set(startup) == {"launch", "world", "shards", "views", "model", "total"}
    assert all(v >= 0 for v in startup.values()) and startup["total"] >= startup["launch"] + startup["views"]
    # The run's wall time holds its start-up and its training loop (which overlap by the banner's printing).
    assert summary["wall_s"] >= max(startup["total"], summary["total_time_s"])
    assert summary["links"]["inter_Bps"] is None and summary["links"]["verdict"] in out

    cli.run_training(args + ["--quiet"])
    quiet = capsys.readouterr().out.splitlines()
    assert len(quiet) == 1 and quiet[0].startswith("[fb] done: 3 epochs"), quiet


def test_init_from_and_eval_only_take_the_saved_models_options(one_rank, tmp_path):
    """--init-from / --eval-only without the model's options: the saved model's are used; an option given
    is the user's (and must still fit the saved parameters)."""
    import json

    from granndis_hpc import cli
    from granndis_hpc.cluster.errors import ClusterError

    _, shards = one_rank
    base = ["--shards", str(shards), "--ranks-per-server", "1", "--skip-checksums", "--quiet", "--mode", "fb"]
    cli.run_training(base + ["--model", "gat", "--layers", "2", "--hidden", "6", "--norm", "--dropout", "0.3",
                             "--model-option", "heads=2", "--epochs", "2", "--out", str(tmp_path / "saved")])
    summary = cli.run_training(base + ["--init-from", str(tmp_path / "saved"), "--eval-only",
                                       "--out", str(tmp_path / "eval")])
    config = json.loads((tmp_path / "eval" / "config.json").read_text())
    assert (config["model"], config["layers"], config["hidden"], config["norm"], config["dropout"]) == \
        ("gat", 2, 6, True, 0.3)
    assert config["model_option"] == ["heads=2"] and summary["epochs"] == 0
    tuned = cli.run_training(base + ["--init-from", str(tmp_path / "saved"), "--dropout", "0", "--epochs", "1",
                                     "--out", str(tmp_path / "tuned")])
    assert tuned["epochs"] == 1
    assert json.loads((tmp_path / "tuned" / "config.json").read_text())["dropout"] == 0.0
    with pytest.raises(ClusterError, match=r"--hidden 12 \(the model: 6\)"):
        cli.run_training(base + ["--init-from", str(tmp_path / "saved"), "--hidden", "12", "--epochs", "1"])


def test_the_kernels_fall_back_with_one_warning(one_rank, tmp_path, monkeypatch, caplog):
    """An install without the C kernels trains on torch's ops; rank 0 says so once, in one line, at start-up
    (not every rank, not at every call)."""
    import logging

    from granndis_hpc import cli
    from granndis_hpc.nn import cpu_kernels

    _, shards = one_rank
    monkeypatch.setattr(cpu_kernels, "EXTENSION", "granndis_hpc.nn._no_such_kernels")
    monkeypatch.setattr(cpu_kernels, "_tried", False)
    monkeypatch.setattr(cpu_kernels, "_library", None)
    monkeypatch.setenv("GRANNDIS_CPU_KERNELS", "auto")
    with caplog.at_level(logging.WARNING):
        summary = cli.run_training(["--shards", str(shards), "--ranks-per-server", "1", "--skip-checksums",
                                    "--quiet", "--layers", "2", "--hidden", "8", "--epochs", "2"])
    said = [r.getMessage() for r in caplog.records if "C kernels are not available" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0] and "reinstall granndis-hpc" in said[0], said
    assert summary["compute"]["kernels"] == "torch" and summary["compute"]["kernel_dispatch"] is None

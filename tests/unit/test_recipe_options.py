"""The pieces of Kipf & Welling's GCN recipe, serially: row-normalised features (recorded in the manifest
and shown by `info`), input-dropout masks on sparse features, --weight-decay-on first, and the
best-validation record of the summary and best-model.pt."""
import numpy as np
import pytest
import torch

from granndis_hpc import shards
from granndis_hpc.options.train import TrainConfig
from granndis_hpc.options import ConfigError
from granndis_hpc.engine.preflight import optimizer_groups
from granndis_hpc.metrics import summarize
from granndis_hpc.rundir.best_model import write_best_model
from granndis_hpc.nn import build_model
from granndis_hpc.nn.dropout import RowDropout, apply_mask, drop_sparse_rows, keep_elements, keep_mask
from granndis_hpc.preprocess.__main__ import main as preprocess_main
from granndis_hpc.preprocess.sources.canonical import normalize_features
from granndis_hpc.preprocess.sources import load
from granndis_hpc.preprocess.sources.canonical import DataError


def test_row_normalisation_divides_by_row_sums_and_keeps_zero_rows():
    x = np.array([[1, 0, 3], [0, 0, 0], [0.5, 0.5, 0]], dtype=np.float32)
    got = normalize_features(x, "row")
    np.testing.assert_allclose(got, [[0.25, 0, 0.75], [0, 0, 0], [0.5, 0.5, 0]])
    assert got.dtype == np.float32 and x[0, 0] == 1  # a copy: the input is left alone
    assert normalize_features(x, "none") is x
    with pytest.raises(DataError, match="non-negative features, but vertex 1"):
        normalize_features(np.array([[1, 2], [-1, 3]], dtype=np.float32), "row")
    with pytest.raises(DataError, match="choose none or row"):
        normalize_features(x, "l2")


def test_citeseer_rows_sum_to_one_except_its_featureless_vertices(planetoid_root):
    raw = load("planetoid", name="citeseer", root=str(planetoid_root))
    rows = load("planetoid", name="citeseer", root=str(planetoid_root), normalize_features="row")
    sums = rows.features.sum(axis=1)
    empty = raw.features.sum(axis=1) == 0
    assert empty.sum() > 0  # CiteSeer's isolated test vertices have no features: they stay zero
    np.testing.assert_allclose(sums[~empty], 1.0, rtol=1e-5)
    assert (sums[empty] == 0).all()
    assert np.array_equal(rows.features > 0, raw.features > 0) and np.array_equal(rows.labels, raw.labels)


def test_build_records_the_normalisation_and_info_shows_it(tmp_path, planetoid_root, capsys):
    out = tmp_path / "cora-row"
    argv = ["build", "--source", "planetoid", "--name", "cora", "--root", str(planetoid_root), "--servers", "1",
            "--gpus-per-server", "2", "--layers", "2", "--partitioner", "metis", "--normalize-features", "row",
            "--out", str(out)]
    assert preprocess_main(argv) == 0
    manifest = shards.read_manifest(out)
    assert manifest["features"] == {"normalization": "row"}
    sl = shards.read_rank_slice(out, manifest, 0, 0)
    np.testing.assert_allclose(sl.features.sum(axis=1), 1.0, rtol=1e-5)  # Cora has no empty rows
    assert preprocess_main(["info", str(out)]) == 0
    assert "features    normalization row" in capsys.readouterr().out


def test_keep_elements_equal_the_dense_mask_and_sparse_dropout_equals_dense():
    ids = torch.randperm(10000, generator=torch.Generator().manual_seed(0))[:300]
    dense = keep_mask(4, 9, 0, ids, 57, 0.3)
    rows, cols = torch.randint(0, 300, (2000,)), torch.randint(0, 57, (2000,))
    assert torch.equal(keep_elements(4, 9, 0, ids, rows, cols, 0.3), dense[rows, cols])
    x = (torch.rand(300, 57) < 0.05).float() * torch.rand(300, 57)  # sparse: the nonzero path
    want = apply_mask(x, dense, 0.3)
    assert torch.equal(drop_sparse_rows(4, 9, 0, ids, x, 0.3), want)
    dense_x = torch.rand(300, 57) + 0.1  # dense: the keep_mask path
    assert torch.equal(drop_sparse_rows(4, 9, 0, ids, dense_x, 0.3), apply_mask(dense_x, dense, 0.3))
    # RowDropout.sources keys the halo rows by their own ids (the owner's mask), layer 0.
    drop = RowDropout(4, 9, ids[:100], source_ids=ids)
    assert torch.equal(drop.sources(x, 0.3), want)
    with pytest.raises(ValueError, match="source ids"):
        drop.sources(x[:50], 0.3)


def test_weight_decay_on_first_decays_only_the_layer_reading_the_features():
    for name, prefix in (("gcn", "convs.0."), ("sage", "convs.0."), ("ressage", "encoder.")):
        model = build_model(name, 20, 8, 3, 2)
        cfg = TrainConfig(shards="x", model=name, weight_decay=5e-4, weight_decay_on="first")
        decayed, free = optimizer_groups(model, cfg, model.contract)
        names = {id(p): n for n, p in model.named_parameters()}
        assert decayed["weight_decay"] == 5e-4 and free["weight_decay"] == 0.0
        assert decayed["params"] and all(names[id(p)].startswith(prefix) for p in decayed["params"])
        assert free["params"] and not any(names[id(p)].startswith(prefix) for p in free["params"])
        assert len(decayed["params"]) + len(free["params"]) == len(list(model.parameters()))
    (everything,) = optimizer_groups(model, TrainConfig(shards="x", weight_decay=1e-3), model.contract)
    assert len(everything["params"]) == len(list(model.parameters()))
    with pytest.raises(ConfigError, match="--weight-decay is 0"):
        TrainConfig(shards="x", weight_decay_on="first")
    with pytest.raises(ConfigError):
        TrainConfig(shards="x", input_dropout=1.0)


def test_summary_reports_the_best_validation_epoch_and_best_model_file(tmp_path):
    records = [{"time_s": 1.0, "compute_s": 1.0, "intra_comm_s": 0, "inter_comm_s": 0, "grad_sync_s": 0,
                "sampling_s": 0, "bytes": {k: 0 for k in ("intra_halo", "inter_halo", "intra_grad", "inter_grad")}}]
    config = {"mode": "fb", "model": "gcn", "layers": 2}
    best = {"epoch": 7, "train_acc": 1.0, "val_acc": 0.8, "test_acc": 0.83}
    s = summarize(records, config, {"train": 1.0, "val": 0.78, "test": 0.81}, 0, {"servers": 2, "ranks_per_server": 2},
                  1.0, best=best)
    assert s["best_val"] == {"epoch": 7, "train": 1.0, "val": 0.8, "test": 0.83} and s["accuracy"]["test"] == 0.81
    assert summarize(records, config, None, 0, {"servers": 2, "ranks_per_server": 2}, 1.0)["best_val"] is None
    model = build_model("gcn", 5, 4, 2, 2)
    path = write_best_model(str(tmp_path), best, model.state_dict())
    saved = torch.load(path, weights_only=True)
    assert saved["epoch"] == 7 and saved["test_acc"] == 0.83
    fresh = build_model("gcn", 5, 4, 2, 2)
    fresh.load_state_dict(saved["model"])
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters()))

"""The loss and metric functions of engine/targets.py on hand-made cases, and multi-label data on the
way in (canonical checks, the OGB proteins layout's derived features, the content digest)."""
import gzip
import os

import numpy as np
import pytest
import torch

from granndis_hpc.engine import targets
from granndis_hpc.engine.steps import TrainingError
from granndis_hpc.metric_names import metric_of_record, split_keys, summary_key


def test_micro_f1_by_hand():
    y = np.array([[1, 0, 1], [0, 1, 0]])
    logits = np.array([[2.0, 1.0, -1.0], [-3.0, 0.5, 0.0]])  # 0.0 is not > 0: predicted negative
    # TP: (0,0), (1,1) = 2; FP: (0,1) = 1; FN: (0,2) = 1 -> 2*2 / (4 + 1 + 1)
    np.testing.assert_array_equal(targets.f1_counts(logits, y), [2, 1, 1])
    assert targets.micro_f1([2, 1, 1]) == pytest.approx(4 / 6)
    assert targets.micro_f1([0, 0, 0]) == 0.0  # nothing to find and nothing predicted


def test_rocauc_by_hand():
    # task 0: positives 0.9, 0.4; negatives 0.5, 0.1: pairs ordered right 3 of 4 -> 0.75
    scores = np.array([[0.9, 0.3, 0.1], [0.4, 0.3, 0.2], [0.5, 0.1, 0.3], [0.1, 0.8, 0.4]])
    y = np.array([[1, 1, 1], [1, 0, 1], [0, 0, 1], [0, 0, 1]])
    # task 1: positive 0.3 against negatives 0.3 (tie: 0.5), 0.1 (1), 0.8 (0) -> 1.5 / 3 = 0.5
    assert targets.rocauc(scores, y) == pytest.approx((0.75 + 0.5) / 2)  # task 2 (no negative) left out
    assert targets.rocauc(scores[:, 2:], y[:, 2:]) == 0.0  # no task with both classes
    with pytest.raises(ValueError, match="same"):
        targets.rocauc(scores, y[:, :2])


def test_rocauc_equals_pair_counting_on_random_ties():
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 5, size=(60, 4)).astype(np.float32)  # many ties
    y = rng.integers(0, 2, size=(60, 4))
    want = []
    for t in range(4):
        d = scores[y[:, t] == 1, t][:, None] - scores[y[:, t] == 0, t][None, :]
        want.append(((d > 0).sum() + 0.5 * (d == 0).sum()) / d.size)
    assert targets.rocauc(scores, y) == pytest.approx(np.mean(want), rel=1e-12)


def test_loss_single_and_multilabel():
    logits = torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]])
    ids = torch.tensor([2, 1])
    assert targets.loss(logits, ids, 4).item() == pytest.approx(
        torch.nn.functional.cross_entropy(logits, ids, reduction="sum").item() / 4)
    y = torch.tensor([[1, 0, 1], [0, 1, 1]], dtype=torch.uint8)
    bce = torch.nn.BCEWithLogitsLoss()(logits, y.float()).item()  # the mean over the 6 entries
    assert targets.loss(logits, y, 2).item() == pytest.approx(bce)
    assert targets.prediction(logits, True).tolist() == [[1, 0, 1], [0, 1, 0]]
    assert torch.allclose(targets.probabilities(logits, True), torch.sigmoid(logits))


def test_metric_choice_and_keys():
    assert targets.resolve_metric(None, False, "S") == "accuracy"
    assert targets.resolve_metric(None, True, "S") == "micro-f1"
    with pytest.raises(TrainingError, match="--metric accuracy: S holds multi-label targets"):
        targets.resolve_metric("accuracy", True, "S")
    with pytest.raises(TrainingError, match="--metric rocauc: S holds one class id per vertex"):
        targets.resolve_metric("rocauc", False, "S")
    assert split_keys("accuracy") == {"train": "train_acc", "val": "val_acc", "test": "test_acc"}
    assert summary_key("accuracy") == "accuracy" and summary_key("micro-f1") == "micro_f1"
    assert metric_of_record({"val_rocauc": 0.5}) == "rocauc" and metric_of_record({"loss": 1.0}) is None


def test_canonical_multilabel_labels():
    from granndis_hpc.preprocess.sources.canonical import DataError, canonicalize
    n = 4
    src, dst = np.array([0, 1, 2]), np.array([1, 2, 3])
    x = np.ones((n, 2), np.float32)
    masks = [np.array([1, 1, 0, 0], bool), np.array([0, 0, 1, 0], bool), np.array([0, 0, 0, 1], bool)]
    y = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]], dtype=np.float64)
    g = canonicalize("t", n, src, dst, x, y, *masks)
    assert g.labels.dtype == np.uint8 and g.labels.shape == (4, 3) and g.num_classes == 3 and g.multilabel
    with pytest.raises(DataError, match="values other than 0 and 1"):
        canonicalize("t", n, src, dst, x, y * 2, *masks)
    with pytest.raises(DataError, match="num_classes=5 but the multi-label targets have 3 columns"):
        canonicalize("t", n, src, dst, x, y, *masks, num_classes=5)


def _csv_gz(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(",".join(str(v) for v in row) + "\n" for row in rows))


def test_ogb_proteins_layout(tmp_path):
    """raw/ without node features: each vertex's features are the mean of its edges' features."""
    from granndis_hpc.preprocess.build.pipeline import dataset_digest
    from granndis_hpc.preprocess.sources.ogb import load_ogb
    base = tmp_path / "ogbn_proteins"
    edges = [(0, 1), (1, 2), (0, 2), (3, 0)]
    efeat = [[0.2, 1.0], [0.4, 0.0], [0.6, 0.5], [1.0, 0.25]]
    _csv_gz(str(base / "raw" / "edge.csv.gz"), edges)
    _csv_gz(str(base / "raw" / "edge-feat.csv.gz"), efeat)
    _csv_gz(str(base / "raw" / "num-node-list.csv.gz"), [[4]])
    labels = [[1, 0, 1], [0, 1, 1], [0, 0, 1], [1, 1, 0]]
    _csv_gz(str(base / "raw" / "node-label.csv.gz"), labels)
    for part, ids in (("train", [0, 1]), ("valid", [2]), ("test", [3])):
        _csv_gz(str(base / "split" / "species" / f"{part}.csv.gz"), [[i] for i in ids])
    g = load_ogb(str(tmp_path), "ogbn-proteins")
    # vertex 0 is an end of edges 0, 2, 3
    np.testing.assert_allclose(g.features[0], np.mean([efeat[0], efeat[2], efeat[3]], axis=0), rtol=1e-6)
    np.testing.assert_allclose(g.features[3], efeat[3], rtol=1e-6)
    np.testing.assert_array_equal(g.labels, labels)
    assert g.labels.dtype == np.uint8 and g.num_classes == 3
    # the digest sees the targets: one entry changed changes it
    other = load_ogb(str(tmp_path), "ogbn-proteins")
    other.labels[1, 0] = 1
    assert dataset_digest(g) != dataset_digest(other)
    os.remove(base / "raw" / "edge-feat.csv.gz")
    from granndis_hpc.preprocess.sources.canonical import DataError
    with pytest.raises(DataError, match="neither node-feat.csv.gz nor edge-feat.csv.gz"):
        load_ogb(str(tmp_path), "ogbn-proteins")
    # the data.npz layout: edge_feat in place of node_feat, the same graph
    np.savez(base / "raw" / "data.npz", edge_index=np.array(edges).T, edge_feat=np.array(efeat, np.float32),
             num_nodes_list=np.array([4]))
    np.savez(base / "raw" / "node-label.npz", node_label=np.array(labels, np.float32))
    from_npz = load_ogb(str(tmp_path), "ogbn-proteins")
    assert dataset_digest(from_npz) == dataset_digest(g)


def test_memory_model_counts_what_the_multilabel_loss_saves():
    """The estimate of the loss's saved tensors (memory_model/estimate.py) equals SavedBytes' count."""
    from granndis_hpc.engine.epoch import SavedBytes
    from granndis_hpc.memory_model.estimate import _loss_saved
    logits = torch.randn(40, 6, requires_grad=True)
    rows = torch.arange(0, 40, 3)
    y = (torch.rand(40, 6) > 0.5).to(torch.uint8)
    saved = SavedBytes()
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        targets.loss(logits[rows], y[rows], rows.numel())
    assert saved.total == _loss_saved(rows.numel(), 6, multilabel=True)[0]


def test_checkpoint_best_record_of_another_metric():
    """A checkpoint's best-validation record holds the run's metric's keys (a resumed rocauc run)."""
    from granndis_hpc.rundir.checkpoint import _checked_best
    from granndis_hpc.rundir.checkpoint_files import CheckpointError
    best = {"epoch": 3, "model": {}, "train_rocauc": 0.9, "val_rocauc": 0.8, "test_rocauc": 0.7}
    assert _checked_best("ckpt", best) is best
    with pytest.raises(CheckpointError):
        _checked_best("ckpt", {"epoch": 3, "model": {}, "val_rocauc": 0.8})


def test_resume_refuses_another_metric():
    """--metric drives best-model selection and early stopping: the checkpoint's optimizer state holds
    it, so a resume with another metric is refused (and one from before the option is accuracy's)."""
    from granndis_hpc.options.train import TrainConfig
    from granndis_hpc.rundir.checkpoint_files import CheckpointError
    from granndis_hpc.engine.optim import ScheduledOptimizer

    def opt(metric):
        model = torch.nn.Linear(2, 1)
        return ScheduledOptimizer(TrainConfig(shards="x", metric=metric),
                                  [{"params": list(model.parameters()), "weight_decay": 0.0}], model.parameters())
    saved = opt("rocauc").state_dict()
    opt("rocauc").load_state_dict(saved)
    with pytest.raises(CheckpointError, match="metric: checkpoint 'rocauc', this run 'micro-f1'"):
        opt("micro-f1").load_state_dict(saved)
    del saved["options"]["metric"]  # written before --metric existed: accuracy
    opt("accuracy").load_state_dict(saved)
    with pytest.raises(CheckpointError, match="metric"):
        opt("rocauc").load_state_dict(saved)

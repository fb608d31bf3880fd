"""Multi-label targets on Cora's graph, 2 servers x 2 ranks (fb), against a single-process reference.

The fixture: Cora's graph with 32 derived features (its bag of words times a fixed random matrix) and
8 derived 0/1 tasks (signs of further random projections), written as a bundle with [N, 8] labels
(granndis_hpc.preprocess.sources.convert.save_bundle) and built from it.  Training with binary cross-entropy equals a
dense
float64 loop written here (plain torch: the loss as torch.nn.BCEWithLogitsLoss's mean over the
training entries, Adam): the same parameters after training.  The micro-F1 and ROC-AUC the run
reports for every split and epoch equal the metrics computed here (micro-F1 from the counts of
logits > 0; ROC-AUC by counting the correctly ordered positive/negative pairs of each task, ties as
half, averaged over the tasks with both classes, as OGB's Evaluator does) on the dense logits;
`granndis predict --probabilities` writes each task's sigmoid and the 0/1 predictions.
"""
import json
import os

import numpy as np
import pytest
import torch
from mpi4py import MPI

from granndis_hpc import cli
from granndis_hpc.engine.predict_io import read_output
from granndis_hpc.metrics import read_metrics
from tests.dense_reference import dense_logits
from tests.mpi.conftest import build_sets_on_rank0, gather_by_global_id, make_trainer, on_rank0, shared_tmpdir

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
TASKS, FEATURES = 8, 32
OPTS = dict(epochs=6, eval_every=1, hidden=16, lr=0.02, dropout=0.0, seed=3)


def multilabel_cora(cora, path):
    """The fixture's graph (module docstring), through a bundle file as a user writes one."""
    from granndis_hpc.preprocess.sources.convert import save_bundle
    from granndis_hpc.preprocess.sources import load

    rng = np.random.default_rng(7)
    x = (cora.features @ rng.standard_normal((cora.num_features, FEATURES))).astype(np.float32)
    y = (x @ rng.standard_normal((FEATURES, TASKS)) + 0.3 * rng.standard_normal((cora.num_vertices, TASKS))) > 0
    dst = np.repeat(np.arange(cora.num_vertices), np.diff(cora.indptr))
    save_bundle(path, edge_index=np.stack([cora.indices, dst]), features=x, labels=y.astype(np.uint8),
                train_mask=cora.train_mask, val_mask=cora.val_mask, test_mask=cora.test_mask)
    return load("bundle", path=path)


def ref_micro_f1(logits, y):
    pred, y = logits > 0, y.astype(bool)
    tp, fp, fn = (pred & y).sum(), (pred & ~y).sum(), (~pred & y).sum()
    return 2 * tp / (2 * tp + fp + fn)


def ref_rocauc(scores, y):
    """Mean over the tasks with both classes of the share of (positive, negative) pairs ordered right."""
    aucs = []
    for t in range(y.shape[1]):
        pos, neg = scores[y[:, t] == 1, t], scores[y[:, t] == 0, t]
        if len(pos) and len(neg):
            diff = pos[:, None] - neg[None, :]
            aucs.append(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size)
    return float(np.mean(aucs))


def dense_loop(g, model0):
    """Per epoch (after its step) the dense float64 logits, and the final parameters."""
    import copy
    model = copy.deepcopy(model0).double()
    x, y = torch.from_numpy(g.features).double(), torch.from_numpy(g.labels).double()
    train = torch.from_numpy(np.flatnonzero(g.train_mask))
    deg = torch.from_numpy(g.in_degree())
    opt = torch.optim.Adam(model.parameters(), lr=OPTS["lr"])
    per_epoch = []
    for _ in range(OPTS["epochs"]):
        opt.zero_grad()
        logits = dense_logits("sage", model, g.indptr, g.indices, x, degrees=deg)
        torch.nn.BCEWithLogitsLoss()(logits[train], y[train]).backward()
        opt.step()
        with torch.no_grad():
            per_epoch.append(dense_logits("sage", model, g.indptr, g.indices, x, degrees=deg).numpy())
    return per_epoch, list(model.parameters())


@pytest.fixture(scope="module")
def multilabel_set(cora):
    base = shared_tmpdir("granndis-multilabel-")
    bundle = os.path.join(base, "cora-multilabel.npz")
    dirs = build_sets_on_rank0(lambda: multilabel_cora(cora, bundle), {"ml": {"layers": 3, "preload": "full"}},
                               prefix="granndis-multilabel-sets-")
    return base, bundle, dirs["ml"]


def train(shards, out, metric, **extra):
    """The run's summary, its final parameters and (rank 0) its final logits in global-id order."""
    trainer = make_trainer(shards, "fb", out=out, metric=metric, **OPTS, **extra)
    try:
        summary = trainer.run()
        logits = gather_by_global_id(trainer, trainer.inner_logits())
        return summary, [p.detach().clone() for p in trainer.model.parameters()], logits
    finally:
        trainer.close()


def test_multilabel_training_metrics_and_predict_equal_reference(cora, multilabel_set):
    from granndis_hpc.nn.models import build_model
    base, bundle, shards = multilabel_set
    run_dir = os.path.join(base, "run-rocauc")
    summary, params, final = train(shards, run_dir, "rocauc")
    assert summary["metric"] == "rocauc" and set(summary["rocauc"]) == {"train", "val", "test"}
    WORLD.Barrier()
    records = read_metrics(run_dir)
    cli.run_predict(["--model", run_dir, "--shards", shards, "--out", os.path.join(base, "preds"),
                     "--probabilities", "--ranks-per-server", "2", "--quiet"])

    def against_reference():
        from granndis_hpc.preprocess.sources import load
        g = load("bundle", path=bundle)
        assert g.labels.dtype == np.uint8 and g.labels.shape == (cora.num_vertices, TASKS)
        torch.manual_seed(OPTS["seed"])  # the trainer's parameters: seeded, then built
        model0 = build_model("sage", FEATURES, OPTS["hidden"], TASKS, 3, dropout=0.0, norm=False)
        per_epoch, want = dense_loop(g, model0)
        for got, ref in zip(params, want):
            np.testing.assert_allclose(got.double().numpy(), ref.detach().numpy(), rtol=0, atol=2e-5)
        masks = {"train": g.train_mask, "val": g.val_mask, "test": g.test_mask}
        np.testing.assert_allclose(final, per_epoch[-1], rtol=1e-4, atol=2e-5)
        for split, mask in masks.items():  # exact: the run's own float32 logits, the metric computed here
            assert summary["rocauc"][split] == pytest.approx(ref_rocauc(final[mask], g.labels[mask]), rel=1e-12)
        for rec, logits in zip(records, per_epoch):  # the float64 loop's logits: float32 ties may order apart
            for split, mask in masks.items():
                assert rec[f"{split}_rocauc"] == pytest.approx(ref_rocauc(logits[mask], g.labels[mask]), abs=1e-4)
        best = max(range(len(records)), key=lambda e: (records[e]["val_rocauc"], -e))
        assert summary["best_val"]["epoch"] == records[best]["epoch"] == best
        assert summary["best_val"]["test"] == records[best]["test_rocauc"]
        config = json.load(open(os.path.join(run_dir, "config.json")))
        assert config["metric"] == "rocauc"
        # predict: best-model.pt's sigmoid probabilities and 0/1 predictions, in global-id order
        got, prov = read_output(os.path.join(base, "preds"))
        logits = per_epoch[best]
        np.testing.assert_allclose(got["probabilities"], 1 / (1 + np.exp(-logits)), rtol=0, atol=1e-5)
        clear = np.abs(logits) > 1e-4
        assert got["prediction"].dtype == np.uint8 and got["prediction"].shape == logits.shape
        np.testing.assert_array_equal(got["prediction"][clear], (logits > 0)[clear])
        # the report shows the run's metric: its table columns, from summary.json
        from granndis_hpc.report.command import render_report
        table = render_report([run_dir], os.path.join(base, "report"))["table"]
        header, row = ([c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[::2])
        assert header[-2:] == ["Test rocauc", "Test rocauc at best val (epoch)"]
        assert row[-1] == f"{summary['best_val']['test']:.4f} ({summary['best_val']['epoch']})"
    on_rank0(against_reference)

    # micro-f1, the default; --verify-content recomputes the digest from the ranks' rows, uint8 targets too
    summary_f1, params_f1, final_f1 = train(shards, os.path.join(base, "run-f1"), None, verify_content=True)
    assert summary_f1["metric"] == "micro-f1"
    for a, b in zip(params, params_f1):  # the metric chooses the best model, not the trajectory
        assert torch.equal(a, b)

    def f1_against_reference():
        from granndis_hpc.preprocess.sources import load
        g = load("bundle", path=bundle)
        for split, mask in (("train", g.train_mask), ("val", g.val_mask), ("test", g.test_mask)):
            assert summary_f1["micro_f1"][split] == pytest.approx(ref_micro_f1(final_f1[mask], g.labels[mask]),
                                                                  rel=1e-12)
    on_rank0(f1_against_reference)


def test_multilabel_refusals(multilabel_set, cora_shards):
    from granndis_hpc.cluster.errors import ClusterError
    _, _, shards = multilabel_set
    with pytest.raises(ClusterError, match="--metric accuracy: .* multi-label targets"):
        make_trainer(shards, "fb", metric="accuracy")
    with pytest.raises(ClusterError, match="--metric rocauc: .* one class id per vertex"):
        make_trainer(cora_shards[("full", 3)], "fb", metric="rocauc")


def test_distributed_build_of_multilabel_targets_equals_whole_graph_build(multilabel_set):
    """The fixture written as chunks (`preprocess chunk`'s layout, uint8 [N_j, 8] labels) and built from
    the 4 ranks' slices: the same content digest and byte-identical server files as the whole-graph
    build of the same graph."""
    import filecmp
    from granndis_hpc.preprocess.build.pipeline import BuildConfig, build_shards, dataset_digest
    from granndis_hpc.preprocess.formats.chunked import ChunkedSource, graph_pieces, open_chunked, write_chunked
    from granndis_hpc.preprocess.build.distributed import run_build_sliced
    from granndis_hpc.preprocess.build.sliced import load_slice, slice_digest
    from granndis_hpc.preprocess.sources import load

    base, bundle, _ = multilabel_set
    chunks, out = os.path.join(base, "chunks"), os.path.join(base, "dist")

    def write():
        g = load("bundle", path=bundle)
        e, n = graph_pieces(g, 3)
        meta = write_chunked(chunks, name=g.name, num_vertices=g.num_vertices, num_features=g.num_features,
                             num_classes=None, edge_pieces=e, node_pieces=n)
        assert meta["multilabel"] is True and meta["num_classes"] == TASKS
    on_rank0(write)
    whole = load("bundle", path=bundle)
    part = load_slice(WORLD, ChunkedSource(open_chunked(chunks)))
    assert part.labels.dtype == np.uint8 and part.labels.shape[1:] == (TASKS,)
    assert slice_digest(WORLD, part) == dataset_digest(whole)
    opts = dict(servers=2, gpus_per_server=2, seed=3, preload="full", layers=2, partitioner="metis")
    ref = build_shards(whole, out + "-whole", comm=WORLD, **opts)
    got = run_build_sliced(WORLD, part, BuildConfig(out=out + "-sliced", command=ref["command"], **opts))
    assert got["dataset"] == ref["dataset"] and ref["dataset"]["multilabel"] is True
    from granndis_hpc.preprocess.verify.command import format_info
    assert f"{TASKS} binary tasks (multi-label)" in format_info(ref)
    assert got["files"] == ref["files"]
    on_rank0(lambda: all(filecmp.cmp(os.path.join(out + "-whole", f"server-{s:04d}.h5"),
                                     os.path.join(out + "-sliced", f"server-{s:04d}.h5"), shallow=False)
                         for s in range(2)) or pytest.fail("the server files differ"))

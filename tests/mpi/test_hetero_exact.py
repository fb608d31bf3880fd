"""R-GCN and R-GAT on a heterogeneous graph (tests/hetero_graphs.py: papers, authors, fields; five
relations) in every mode (mpirun -n 4).  fb and flx (k = L and k < L) give the logits of the plain-torch
reference (tests/hetero_reference.py) and, after training with dropout, its parameters, on 2x2, 1x4 and
4x1; eas, cob and mb train and the loss falls.  Every edge's relation comes from its endpoints' global ids,
so a halo row without its id would put its edges in the wrong relation: these tests catch that."""
import copy

import numpy as np
import pytest
import torch
from mpi4py import MPI

from tests.hetero_graphs import typed_graph
from tests.hetero_reference import reference_logits, train_reference
from tests.mpi.conftest import assert_views_close, build_sets_on_rank0, make_trainer, view_logits

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
LAYERS, EPOCHS, LR, SEED = 3, 4, 0.01, 3
OPTIONS = {"rgcn": ["num_bases=2"], "rgat": ["heads=2"]}


@pytest.fixture(scope="module")
def typed():
    return typed_graph()


@pytest.fixture(scope="module")
def typed_sets(typed):
    """Full 3-hop sets for 2x2, 1x4 and 4x1 (keyed by ranks per server) and an EAS set for 2x2."""
    specs = {f"typed-{rps}": {"servers": WORLD.size // rps, "gpus_per_server": rps, "layers": LAYERS,
                              "preload": "full"} for rps in (1, 2, 4)}
    specs["typed-eas"] = {"servers": 2, "gpus_per_server": 2, "layers": LAYERS, "preload": "eas", "hops": 1,
                          "fanout": 4}
    specs["typed-inductive"] = {"servers": 2, "gpus_per_server": 2, "layers": LAYERS, "preload": "full",
                                "inductive": True}
    return build_sets_on_rank0(typed, specs, prefix="granndis-typed-")


@pytest.mark.parametrize("model", ["rgcn", "rgat"])
@pytest.mark.parametrize("mode,k", [("fb", None), ("flx", 1)])
def test_logits_equal_reference(typed, typed_sets, model, mode, k):
    extra = {"preloaded_layers": k} if k is not None else {}
    trainer = make_trainer(typed_sets["typed-2"], mode, model, LAYERS, hidden=8, model_option=OPTIONS[model],
                           **extra)
    try:
        views = view_logits(trainer)
        if WORLD.rank == 0:
            want = reference_logits(trainer.model.state_dict(), typed.types, typed.indptr, typed.indices,
                                    typed.features, LAYERS, model).numpy()
            assert_views_close(views, want, f"{model} {mode} k={k}")
    finally:
        trainer.close()


# (model, mode, preloaded layers, ranks per server, embedded types: learnable input rows, exchanged as
# any layer's rows)
RUNS = [("rgcn", "fb", None, 2, "author,field"), ("rgcn", "flx", 3, 4, ""), ("rgcn", "flx", 1, 1, ""),
        ("rgat", "fb", None, 1, ""), ("rgat", "flx", 2, 2, ""), ("rgcn", "flx", 1, 2, "field")]


@pytest.mark.parametrize("model,mode,k,rps,embed", RUNS)
def test_training_with_dropout_equals_reference(typed, typed_sets, model, mode, k, rps, embed):
    extra = {"preloaded_layers": k} if k is not None else {}
    options = OPTIONS[model] + ([f"embed={embed}"] if embed else [])
    trainer = make_trainer(typed_sets[f"typed-{rps}"], mode, model, LAYERS, hidden=8, epochs=EPOCHS, lr=LR,
                           dropout=0.5, seed=SEED, ranks_per_server=rps, model_option=options, eval_every=1,
                           **extra)
    try:
        initial = copy.deepcopy(trainer.model)
        trainer.run()
        accuracy = trainer.evaluate()
        if WORLD.rank == 0:
            want = train_reference(initial, typed, LAYERS, EPOCHS, LR, dropout=0.5, seed=SEED)
            moved = max((want[n] - p.detach().double()).abs().max().item() for n, p in initial.named_parameters())
            assert moved > 1e-2  # training moved the parameters
            for name, got in trainer.model.named_parameters():
                err = (got.detach().double() - want[name]).abs().max().item()
                assert err <= 1e-4 * max(want[name].abs().max().item(), 1.0), \
                    f"{model} {mode} k={k} rps={rps}: {name} max abs error {err:.3e}"
            assert bool(embed) == any(n.startswith("embeddings.") for n in want)
            trained = {n: v.float() for n, v in want.items()}
            logits = reference_logits(trained, typed.types, typed.indptr, typed.indices, typed.features, LAYERS,
                                      model)
            pred = logits.argmax(1).numpy()
            for split in ("train", "val", "test"):
                mask = getattr(typed, f"{split}_mask")
                ref = float((pred[mask] == typed.labels[mask]).mean())
                assert abs(accuracy[split] - ref) < 1e-9, (split, accuracy[split], ref)
    finally:
        trainer.close()


@pytest.mark.parametrize("model,mode,option", [("rgcn", "eas", None), ("rgat", "cob", None), ("rgcn", "mb", None),
                                               ("rgcn", "flx", "inductive"), ("rgat", "fb", "bf16")])
def test_sampled_modes_and_options_train(typed_sets, model, mode, option):
    """eas, cob and mb sample, so they are not compared with the reference, nor are --inductive (its own
    graphs) and --precision bf16 (rounded rows): they train and the loss falls."""
    shards = typed_sets["typed-eas" if mode == "eas" else "typed-inductive" if option == "inductive" else "typed-2"]
    extra = {"batches_per_epoch": 2, "fanout": 4} if mode in ("cob", "mb") else {}
    extra.update({"inductive": {"inductive": True}, "bf16": {"precision": "bf16"}}.get(option, {}))
    trainer = make_trainer(shards, mode, model, LAYERS, hidden=8, lr=0.02, seed=SEED, model_option=OPTIONS[model],
                           **extra)
    try:
        losses = [trainer.train_epoch()["loss"] for _ in range(10)]
    finally:
        trainer.close()
    assert all(np.isfinite(losses)) and np.mean(losses[-3:]) < 0.9 * np.mean(losses[:3]), losses


def test_predict_writes_a_vertex_type_by_its_per_type_ids(typed, typed_sets):
    """`granndis predict` on a typed set: the target type's rows by default (per-type ids beside the global
    ids, the reference's logits), another type's embeddings with --vertex-type, an unknown type refused."""
    import os

    from granndis_hpc import cli
    from granndis_hpc.cluster.errors import ClusterError
    from granndis_hpc.engine.predict_io import read_output
    from tests.mpi.conftest import shared_tmpdir

    base = shared_tmpdir("granndis-typed-predict-")
    run = os.path.join(base, "run")
    trainer = make_trainer(typed_sets["typed-2"], "fb", "rgcn", LAYERS, hidden=8, epochs=2, eval_every=1, out=run)
    try:
        trainer.run()
    finally:
        trainer.close()
    papers, authors = os.path.join(base, "papers"), os.path.join(base, "authors")
    cli.run_predict(["--model", run, "--shards", typed_sets["typed-1"], "--out", papers, "--ranks-per-server", "1",
                     "--quiet"])
    cli.run_predict(["--model", run, "--shards", typed_sets["typed-2"], "--out", authors, "--vertex-type", "author",
                     "--layer", "1", "--quiet"])
    with pytest.raises(ClusterError, match="--vertex-type venue: the set's vertex types are paper, author, field"):
        cli.run_predict(["--model", run, "--shards", typed_sets["typed-2"], "--out", os.path.join(base, "x"),
                         "--vertex-type", "venue", "--quiet"])
    if WORLD.rank == 0:
        state = torch.load(os.path.join(run, "best-model.pt"), weights_only=True)["model"]
        want = reference_logits(state, typed.types, typed.indptr, typed.indices, typed.features, LAYERS).numpy()
        got, prov = read_output(papers)
        lo, hi = typed.types.id_range("paper")
        assert prov["vertex_type"] == "paper" and prov["rows"] == hi - lo
        np.testing.assert_array_equal(got["global_id"], np.arange(lo, hi))
        np.testing.assert_array_equal(got["type_id"], np.arange(hi - lo))
        np.testing.assert_allclose(got["logits"], want[lo:hi], rtol=1e-4, atol=2e-5)
        got, prov = read_output(authors)
        lo, hi = typed.types.id_range("author")
        assert prov["vertex_type"] == "author" and got["embeddings"].shape == (hi - lo, 8)
        np.testing.assert_array_equal(got["type_id"], np.arange(hi - lo))

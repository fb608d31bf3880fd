"""Vertex types of different feature widths (tests/hetero_widths.py: a 7, b 12, c 5 wide, d derived from c)
through the whole pipeline (mpirun -n 4): the shards store each row at its own width, R-GCN and R-GAT
project each type's rows with its own Linear before layer 0, and fb and flx give the plain-torch
reference's logits and, after training with dropout, its parameters (the input Linears included) on
2x2, 1x4 and 4x1; eas, cob and mb train and the loss falls.  Layer 0's halo rows are the projected rows,
exchanged every step: a rank that took them from the features exchanged at set-up would differ here."""
import copy

import numpy as np
import pytest
from mpi4py import MPI

from tests.hetero_widths import COUNTS, reference_logits, train_reference, type_rows, widths_graph
from tests.mpi.conftest import assert_views_close, build_sets_on_rank0, make_trainer, view_logits

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
LAYERS, EPOCHS, LR, SEED = 2, 4, 0.01, 5
OPTIONS = {"rgcn": ["num_bases=2"], "rgat": ["heads=2"]}
TYPE_WIDTHS = (7, 12, 5, 5)  # a, b, c and d (derived from c: c's width), in COUNTS' order


def _own_width_bytes(global_id: np.ndarray) -> int:
    """4 x the rows' own widths, each row's type read from its id (the types own consecutive id ranges)."""
    kind = np.searchsorted(np.cumsum(list(COUNTS.values())), global_id, side="right")
    return 4 * int(np.asarray(TYPE_WIDTHS)[kind].sum())


@pytest.fixture(scope="module")
def typed():
    graph, arrays = widths_graph()
    return graph, type_rows(arrays)


@pytest.fixture(scope="module")
def sets(typed):
    specs = {f"w-{rps}": {"servers": WORLD.size // rps, "gpus_per_server": rps, "layers": LAYERS,
                          "preload": "full"} for rps in (1, 2, 4)}
    specs["w-eas"] = {"servers": 2, "gpus_per_server": 2, "layers": LAYERS, "preload": "eas", "hops": 1, "fanout": 4}
    specs["w-inductive"] = {"servers": 2, "gpus_per_server": 2, "layers": LAYERS, "preload": "full", "inductive": True}
    return build_sets_on_rank0(typed[0], specs, prefix="granndis-widths-")


@pytest.mark.parametrize("model", ["rgcn", "rgat"])
@pytest.mark.parametrize("mode,k", [("fb", None), ("flx", 1)])
def test_logits_equal_reference(typed, sets, model, mode, k):
    graph, rows = typed
    extra = {"preloaded_layers": k} if k is not None else {}
    # --verify-content: the job's rows, held at their own widths, hash to the manifest's digest (of the
    # zero-padded rows), preloaded copies included
    trainer = make_trainer(sets["w-2"], mode, model, LAYERS, hidden=8, model_option=OPTIONS[model],
                           verify_content=True, **extra)
    try:
        assert trainer.model.contract.input_projection
        assert trainer.world_view.halo_features is None  # the features of halo rows are never exchanged
        # Every view holds its own rows at their types' own widths: its bytes are its rows' widths x 4.
        held = [(view.features.nbytes, _own_width_bytes(view.row_ids.numpy()))
                for view in trainer.mode.static_view.views + [trainer.world_view]]
        assert all(got == want for got, want in held), held
        assert sum(b.nbytes for b in trainer.world_view.features.blocks) == held[-1][0]
        # The world views' rows are every vertex once: the types' counts x their widths x 4 over the ranks.
        total = WORLD.allreduce(held[-1][0])
        assert total == 4 * sum(COUNTS[t] * w for t, w in zip(COUNTS, TYPE_WIDTHS)), total
        views = view_logits(trainer)
        if WORLD.rank == 0:
            want = reference_logits(trainer.model.state_dict(), graph, rows, LAYERS, model).numpy()
            assert_views_close(views, want, f"{model} {mode} k={k}")
    finally:
        trainer.close()


# (model, mode, preloaded layers, ranks per server): fb and flx on 2x2, 1x4 (rps 4) and 4x1 (rps 1)
RUNS = [("rgcn", "fb", None, 2), ("rgat", "fb", None, 4), ("rgcn", "fb", None, 1),
        ("rgcn", "flx", 1, 2), ("rgat", "flx", 2, 1), ("rgcn", "flx", 2, 4)]


@pytest.mark.parametrize("model,mode,k,rps", RUNS)
def test_training_with_dropout_equals_reference(typed, sets, model, mode, k, rps):
    graph, rows = typed
    extra = {"preloaded_layers": k} if k is not None else {}
    trainer = make_trainer(sets[f"w-{rps}"], mode, model, LAYERS, hidden=8, epochs=EPOCHS, lr=LR, dropout=0.5,
                           seed=SEED, ranks_per_server=rps, model_option=OPTIONS[model], **extra)
    try:
        initial = copy.deepcopy(trainer.model)
        trainer.run()
        if WORLD.rank == 0:
            want = train_reference(initial, graph, rows, LAYERS, EPOCHS, LR, dropout=0.5, seed=SEED)
            start = {n: p.detach().double() for n, p in initial.named_parameters()}
            for t in graph.types.names[:3]:  # training moved the input Linears of the types that reach a
                assert (want[f"inputs.{t}.weight"] - start[f"inputs.{t}.weight"]).abs().max().item() > 1e-3, t
            for name, got in trainer.model.named_parameters():
                err = (got.detach().double() - want[name]).abs().max().item()
                assert err <= 1e-4 * max(want[name].abs().max().item(), 1.0), \
                    f"{model} {mode} k={k} rps={rps}: {name} max abs error {err:.3e}"
    finally:
        trainer.close()


@pytest.mark.parametrize("model,mode", [("rgcn", "eas"), ("rgat", "cob"), ("rgcn", "mb"), ("rgat", "fb-bf16"),
                                        ("rgcn", "flx-inductive"), ("rgat", "cob-inductive")])
def test_sampled_modes_train(sets, model, mode):
    """eas, cob and mb sample, so they are not compared with the reference, nor are --precision bf16 (rounded
    rows) and --inductive (its own induced graphs; its views take their rows' blocks of the held rows):
    they train and the loss falls."""
    mode, _, option = mode.partition("-")
    extra = {"batches_per_epoch": 2, "fanout": 4} if mode in ("cob", "mb") else {}
    extra.update({"bf16": {"precision": "bf16"}, "inductive": {"inductive": True}}.get(option, {}))
    shards = sets["w-eas" if mode == "eas" else "w-inductive" if option == "inductive" else "w-2"]
    trainer = make_trainer(shards, mode, model, LAYERS, hidden=8, lr=0.02, seed=SEED, model_option=OPTIONS[model],
                           **extra)
    try:
        losses = [trainer.train_epoch()["loss"] for _ in range(10)]
    finally:
        trainer.close()
    assert all(np.isfinite(losses)) and np.mean(losses[-3:]) < 0.9 * np.mean(losses[:3]), losses


def test_predict_on_another_shape_gives_the_reference_logits(typed, sets):
    """`granndis predict` of a run trained on 2x2, on the 4x1 set: the target type's logits are the
    reference's of the saved parameters (the projection included, its halo rows exchanged)."""
    import os

    import torch

    from granndis_hpc import cli
    from granndis_hpc.engine.predict_io import read_output
    from tests.mpi.conftest import shared_tmpdir

    graph, rows = typed
    base = shared_tmpdir("granndis-widths-predict-")
    run, out = os.path.join(base, "run"), os.path.join(base, "pred")
    trainer = make_trainer(sets["w-2"], "fb", "rgcn", LAYERS, hidden=8, epochs=2, eval_every=1, out=run,
                           model_option=OPTIONS["rgcn"])
    try:
        trainer.run()
    finally:
        trainer.close()
    cli.run_predict(["--model", run, "--shards", sets["w-1"], "--out", out, "--ranks-per-server", "1", "--quiet"])
    if WORLD.rank == 0:
        state = torch.load(os.path.join(run, "best-model.pt"), weights_only=True)["model"]
        want = reference_logits(state, graph, rows, LAYERS, "rgcn").numpy()
        got, prov = read_output(out)
        lo, hi = graph.types.id_range("a")
        assert prov["vertex_type"] == "a"
        np.testing.assert_allclose(got["logits"], want[lo:hi], rtol=1e-4, atol=2e-5)


def test_fb_halo_bytes_are_the_projected_rows_every_layer(typed, sets):
    """fb with the projection (direct route): every layer, layer 0 included, exchanges each rank's halo rows
    at the projection's (= hidden) width forward and their gradients backward; counted independently from
    the graph and the ranks' inner vertices, against the ledger's halo bytes of one epoch."""
    graph, _ = typed
    hidden = 8
    trainer = make_trainer(sets["w-2"], "fb", "rgcn", LAYERS, hidden=hidden, model_option=OPTIONS["rgcn"],
                           halo_route="direct")
    try:
        trainer.train_epoch()
        got = sum(trainer.ledger.bytes(c, "halo") for c in ("intra", "inter"))
        inner = trainer.slice.global_id[: trainer.slice.n_inner]
    finally:
        trainer.close()
    got, inners = WORLD.gather(got, root=0), WORLD.gather(inner, root=0)
    if WORLD.rank == 0:
        owner = np.empty(graph.num_vertices, dtype=np.int64)
        for r, ids in enumerate(inners):
            owner[ids] = r
        dst = np.repeat(np.arange(graph.num_vertices), np.diff(graph.indptr))
        pairs = np.unique(np.stack([graph.indices, owner[dst]], 1), axis=0)  # (source, rank that reads it)
        halo_rows = int(np.count_nonzero(owner[pairs[:, 0]] != pairs[:, 1]))
        # forward rows and backward gradients, at the hidden width, in each of the LAYERS layers
        assert sum(got) == 2 * LAYERS * halo_rows * hidden * 4, (sum(got), halo_rows)

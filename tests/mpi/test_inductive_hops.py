"""The train-induced hops of an inductive set (graph/train_hop) and the rows flx and eas train on
(mpirun -n 4), on Cora with a wide training split: its own split's 140 training vertices hardly touch each
other across servers, so their train-induced preloads are the inner rows alone.

Both builds write the hops a plain BFS over the train-induced graph gives (and the same bytes); the rows
each preloaded layer computes and reads are those of the train-induced graph's own preload; flx stays
equal to the single-process reference of tests/mpi/test_inductive_exact.py; a set built without the hops
serves fb and is refused by flx."""
import numpy as np
import pytest
from mpi4py import MPI

from tests.mpi.conftest import build_sets_on_rank0, make_trainer
from tests.mpi.test_inductive_exact import _run, reference

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD


@pytest.fixture(scope="module")
def wide(cora):
    """Cora with 40 % of its vertices training ones."""
    import dataclasses

    draw = np.random.default_rng(5).random(cora.num_vertices)
    return dataclasses.replace(cora, train_mask=draw < 0.4, val_mask=(draw >= 0.4) & (draw < 0.6),
                               test_mask=draw >= 0.6)


@pytest.fixture(scope="module")
def wide_sets(wide):
    """Inductive 2x2 sets of `wide`: a 3-hop full preload ("full") and a 2-hop EAS one ("eas")."""
    spec = {"servers": WORLD.size // 2, "gpus_per_server": 2, "layers": 3, "inductive": True}
    return build_sets_on_rank0(wide, {"full": spec, "eas": {**spec, "preload": "eas", "hops": 2, "fanout": 4}},
                               prefix="granndis-induc-wide-")


def induced_hops(indptr, indices, train, sources, depth):
    """Plain BFS along in-edges between training vertices: every vertex's hop from `sources` (-1 beyond
    `depth`)."""
    hop = np.full(train.shape[0], -1)
    hop[sources] = 0
    dst = np.repeat(np.arange(train.shape[0]), np.diff(indptr))
    for t in range(1, depth + 1):
        step = (hop[dst] == t - 1) & train[indices] & (hop[indices] < 0)
        hop[indices[step]] = t
    return hop


def test_both_builds_write_the_induced_degrees_splits_and_hops(wide):
    """The whole-graph and the distributed build (from chunks, 4 ranks) write byte-identical inductive sets
    (full and EAS preloads) whose datasets equal a NumPy recomputation from the raw arrays (the hops of a
    full preload from the whole graph, of an EAS one from the file's edges); verify finds a changed hop."""
    import hashlib
    import json
    import os
    import shutil

    import h5py

    from granndis_hpc.preprocess.build.pipeline import BuildConfig, build_shards
    from granndis_hpc.preprocess.formats.chunked import ChunkedSource, graph_pieces, open_chunked, write_chunked
    from granndis_hpc.preprocess.build.distributed import run_build_sliced
    from granndis_hpc.preprocess.build.sliced import load_slice
    from granndis_hpc.preprocess.verify.command import verify_shard_set
    from granndis_hpc import shards
    from tests.mpi.conftest import on_rank0, shared_tmpdir

    base = shared_tmpdir("granndis-induc-build-")
    chunks = os.path.join(base, "chunks")
    on_rank0(lambda: write_chunked(chunks, name=wide.name, num_vertices=wide.num_vertices,
                                   num_features=wide.num_features, num_classes=wide.num_classes,
                                   edge_pieces=graph_pieces(wide, 3)[0], node_pieces=graph_pieces(wide, 3)[1]))
    part = load_slice(WORLD, ChunkedSource(open_chunked(chunks)))
    code = shards.split_code(wide.train_mask, wide.val_mask, wide.test_mask)
    edge_dst = np.repeat(np.arange(wide.num_vertices), np.diff(wide.indptr))
    want_degree = np.bincount(edge_dst[wide.train_mask[wide.indices]], minlength=wide.num_vertices)
    for preload, extra in (("full", {}), ("eas", {"hops": 2, "fanout": 3})):
        opts = dict(servers=2, gpus_per_server=2, layers=2, preload=preload, partitioner="metis", seed=1,
                    inductive=True, **extra)
        path = os.path.join(base, f"whole-{preload}")
        whole = build_shards(wide, path, comm=WORLD, **opts)
        sliced = run_build_sliced(WORLD, part, BuildConfig(out=os.path.join(base, f"sliced-{preload}"),
                                                           command=whole["command"], **opts))
        assert sliced["files"] == whole["files"] and sliced["inductive"] is True and sliced["train_hop"] is True
        if WORLD.rank != 0:
            continue
        assert verify_shard_set(path) == []
        reached, left_out = np.zeros(2, dtype=np.int64), 0
        for s in range(2):
            a = shards.read_server_arrays(path, whole, s)
            gid, train = a["vertices/global_id"], a["split/train"]
            assert np.array_equal(a["graph/train_in_degree"], want_degree[gid])
            assert np.array_equal(a["world/src_split"], code[a["world/src_global_id"]])
            if preload == "full":  # the whole train-induced graph, from the server's inner training vertices
                hop = induced_hops(wide.indptr, wide.indices, wide.train_mask,
                                   gid[(a["vertices/hop"] == 0) & train], 2)[gid]
            else:  # the file's own rows and edges
                hop = induced_hops(a["graph/indptr"], a["graph/indices"], train,
                                   np.flatnonzero((a["vertices/hop"] == 0) & train), 2)
            assert np.array_equal(a["graph/train_hop"], np.where(hop >= 0, hop, shards.TRAIN_HOP_UNREACHED))
            reached += np.bincount(hop[hop > 0], minlength=3)[1:]
            left_out += np.count_nonzero(train & (a["vertices/hop"] > 0)) - np.count_nonzero(hop > 0)
        assert reached.all() and left_out > 0, (preload, reached, left_out)
    if WORLD.rank != 0:
        return
    edited = os.path.join(base, "edited")
    shutil.copytree(os.path.join(base, "whole-full"), edited)
    with h5py.File(os.path.join(edited, "server-0001.h5"), "r+") as f:
        f["graph/train_hop"][int(np.flatnonzero(f["graph/train_hop"][:] == 1)[0])] = 2
    with open(os.path.join(edited, "manifest.json")) as f:
        manifest = json.load(f)
    with open(os.path.join(edited, "server-0001.h5"), "rb") as f:
        manifest["files"]["server-0001.h5"]["sha256"] = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(edited, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    assert any("server-0001.h5: graph/train_hop of 1 rows" in p for p in verify_shard_set(edited))


def _layer_counts(lp):
    """(own source rows, halo rows, computed rows, edges, rows sent) of a planner LayerPlan."""
    return (int(lp.n_own_in), int(lp.recv_counts.sum()), int(lp.n_dst), int(lp.indptr[-1]), int(lp.send_counts.sum()))


@pytest.mark.parametrize("mode,k", [("flx", 1), ("flx", 2), ("flx", 3), ("eas", 3)])
def test_the_preloaded_layers_hold_the_train_induced_graphs_own_preload(wide, wide_sets, mode, k):
    """Per server, the rows each preloaded layer l < k computes and reads are those within k-1-l and k-l
    hops of the server's inner training vertices in the train-induced graph (a plain BFS here: over the
    graph for flx, over the EAS file's own edges for eas); the rows held, within k.  --mode auto counts
    every layer's rows (own, halo, computed, edges, sent) of every rank as the run builds them."""
    from granndis_hpc import memory_model as mm
    from granndis_hpc import shards as sets

    path = wide_sets[mode if mode == "eas" else "full"]
    trainer = make_trainer(path, mode, inductive=True, **({"preloaded_layers": k} if mode == "flx" else {}))
    try:
        view, server = trainer.mode.static_view.per_layer[0], trainer.topo.server
        ids = view.row_ids.numpy()
        layers = [(view.plan.layers[l].n_dst, view.plan.layers[l].n_own_in, view._layer_source_ids(l).numpy())
                  for l in range(k)]
        built = [_layer_counts(trainer.mode.static_view.per_layer[l].plan.layers[l]) for l in range(3)]
        manifest, rank = trainer.manifest, trainer.topo.rank
    finally:
        trainer.close()
    parts = WORLD.gather((server, ids, layers), root=0)
    every = WORLD.gather((rank, built), root=0)
    if WORLD.rank != 0:
        return
    m = mm.model_for(manifest, "sage", 16, 3, inductive=True)
    groups = mm.row_groups(mm.set_arrays(path, manifest, mm.read_shard_set(path)[1], inductive=True), 3, m,
                           mm.Sampling(batches=()))
    counted = next(g.rows for g in groups if (g.mode, g.k) == (mode, k))
    for r, want in every:
        lrs = counted[r].training_layers()
        assert [(lr.n_own_in, lr.n_halo, lr.n_dst, lr.nnz, lr.n_send) for _, lr in lrs] == want, r
    for s in range(2):
        a = sets.read_server_arrays(path, manifest, s)
        gid, train, inner = a["vertices/global_id"], a["split/train"], a["vertices/hop"] == 0
        if mode == "flx":
            hop = induced_hops(wide.indptr, wide.indices, wide.train_mask, gid[inner & train], k)
        else:  # the EAS file's hops (2) deep: its rows are all a layer reads
            hop = np.full(wide.num_vertices, -1)
            hop[gid] = induced_hops(a["graph/indptr"], a["graph/indices"], train, np.flatnonzero(inner & train),
                                    int(manifest["preload"]["hops"]))
        within = [set(np.flatnonzero((hop >= 0) & (hop <= d)).tolist()) for d in range(k + 1)]
        mine = [p for p in parts if p[0] == s]
        assert set(np.concatenate([p[1] for p in mine]).tolist()) == within[k]
        for l in range(k):
            assert set(np.concatenate([p[1][:p[2][l][0]] for p in mine]).tolist()) == within[k - 1 - l], l
            assert set(np.concatenate([p[1][:p[2][l][1]] for p in mine]).tolist()) == within[k - l], l
            assert set(np.concatenate([p[2][l][2] for p in mine]).tolist()) <= within[k - l], l
        preloaded_train = np.count_nonzero(train & ~inner)
        assert len(within[k]) - np.count_nonzero(inner & train) < preloaded_train  # rows left out


# Without LayerNorm: on this 40 % training split LayerNorm turns float32 rounding into parameter differences
# of 2e-3 against the float64 reference in fb and flx alike (measured: not a planning error; see the note
# on GCN in test_inductive_exact); without it the rounding stays near 4e-5, where a wrong row, edge or
# degree moves every parameter.
@pytest.mark.parametrize("model,extra", [("sage", {"norm": False}), ("gcn", {"norm": False, "preloaded_layers": 2})])
def test_flx_on_the_train_induced_preload_equals_the_reference(wide, wide_sets, model, extra):
    """flx (k = 3; GCN, whose messages use the deepest rows' stored degrees, k = 2) at 2x2: parameters, logits
    and accuracies equal the single-process reference on the induced graphs."""
    initial, params, logits, summary = _run(wide_sets["full"], "flx", model, 2, **extra)
    if WORLD.rank != 0:
        return
    ref_model, ref = reference(wide, initial, model)
    err = max((params[k] - v).abs().max().item() for k, v in ref_model.named_parameters())
    assert err <= 1e-4, f"{model}: parameter error {err:.3e}"
    for split in ("val", "test"):
        got, expected = logits[split], ref[split][0]
        assert np.array_equal(np.isnan(got), np.isnan(expected)), split
        assert np.nanmax(np.abs(got - expected)) / np.nanmax(np.abs(expected)) < 1e-4, split
    for split in ("train", "val", "test"):
        assert summary["accuracy"][split] == pytest.approx(ref[split][1], abs=1e-12), split


@pytest.fixture(scope="module")
def old_set(wide_sets):
    """The 3-hop set without graph/train_hop (and its manifest entry), as built before it existed."""
    import hashlib
    import json
    import os
    import shutil

    from granndis_hpc.shards import manifest_digests
    from granndis_hpc.preprocess.verify.command import format_info, verify_shard_set
    from tests.mpi.conftest import on_rank0, shared_tmpdir

    old = os.path.join(shared_tmpdir("granndis-induc-old-"), "set")

    def strip():
        import h5py

        shutil.copytree(wide_sets["full"], old)
        with open(os.path.join(old, "manifest.json")) as f:
            manifest = json.load(f)
        del manifest["train_hop"]  # and its digest: the manifest such a build wrote
        manifest["digests"] = manifest_digests(manifest)
        for name in manifest["files"]:
            with h5py.File(os.path.join(old, name), "r+") as f:
                del f["graph/train_hop"]
            with open(os.path.join(old, name), "rb") as f:
                manifest["files"][name] = {"sha256": hashlib.sha256(f.read()).hexdigest(),
                                           "bytes": os.path.getsize(os.path.join(old, name))}
        with open(os.path.join(old, "manifest.json"), "w") as f:
            json.dump(manifest, f)
        assert verify_shard_set(old) == []
        assert "no train-induced hops (built by an earlier version" in format_info(manifest)
    on_rank0(strip)
    return old


def test_a_set_built_before_the_train_induced_hops_serves_fb_and_is_refused_by_flx(old_set):
    """An inductive set without graph/train_hop (as built before it existed) verifies, trains inductively in
    fb, and is refused by --inductive flx (eas checks alike) with the command that rebuilds it; info says so."""
    from granndis_hpc.cluster.errors import ClusterError

    old = old_set
    trainer = make_trainer(old, "fb", inductive=True, epochs=1)
    try:
        assert trainer.run()["protocol"] == "inductive"
    finally:
        trainer.close()
    with pytest.raises(ClusterError, match=f"--inductive --mode flx needs the train-induced hops.*rebuild it with "
                                           f"`granndis preprocess build ... --inductive --out {old} --overwrite`"):
        make_trainer(old, "flx", inductive=True)


def test_mode_auto_offers_fb_and_cob_on_a_set_without_the_hops(old_set):
    """--inductive --mode auto on that set offers fb and cob only (flx and eas would refuse it), says why and
    how to rebuild it, and picks fb when no co-batch count is asked for."""
    from granndis_hpc import memory_model as mm
    from tests.mpi.conftest import on_rank0

    def check():
        kw = dict(inductive=True, job=(2, 2))
        every = mm.choose_shard_sets([old_set], "sage", 16, 3, 1, batches=(2,), **kw)  # nothing fits: all listed
        assert {o.mode for o in every.rejected} == {"fb", "cob"}
        plain = mm.choose_shard_sets([old_set], "sage", 16, 3, 1 << 40, batches=(), **kw)
        assert plain.choice.mode == "fb"
        assert (f"options not considered: flx and eas on {old_set}, which holds no train-induced hops "
                f"(graph/train_hop") in plain.reason and f"--inductive --out {old_set} --overwrite" in plain.reason
        with pytest.raises(mm.MemoryModelError, match="needs the train-induced hops"):
            mm.estimate_shard_set(old_set, "sage", 16, 3, k=1, inductive=True)
    on_rank0(check)

"""Vertex types of different feature widths: canonicalisation, the flat features of the shards (each row at
its own type's width), their readers, verify and the content digest, and the input projection of the
relational models against the plain-torch reference (tests/hetero_widths.py), in one process."""
import json

import h5py
import numpy as np
import pytest
import torch
from mpi4py import MPI

from granndis_hpc.graph.hetero import GraphTypes
from granndis_hpc.nn.models import build_model
from granndis_hpc.preprocess.build.pipeline import build_shards
from granndis_hpc.shards import read_rank_slice
from granndis_hpc.shards.content import dataset_digest
from granndis_hpc.shards.reader import read_server_graph, read_server_rows
from tests.hetero_widths import COUNTS, WIDTHS, reference_logits, type_rows, widths_graph


@pytest.fixture(scope="module")
def typed():
    return widths_graph()


def test_each_type_keeps_its_width_and_derived_takes_its_source(typed):
    graph, a = typed
    types = graph.types
    assert types.widths == (7, 12, 5, 5)  # d derives from c over `about`
    assert types.feature_origin[3] == "mean:about"
    assert graph.num_features == 12
    rows = type_rows(a)
    for t, name in enumerate(types.names):
        lo, hi = types.id_range(name)
        w = types.widths[t]
        np.testing.assert_allclose(graph.features[lo:hi, :w], rows[name], rtol=1e-6, atol=1e-6)
        assert not graph.features[lo:hi, w:].any()
    assert types.feature_bytes(12) == [COUNTS[t] * w * 4 for t, w in zip(types.names, types.widths)]
    again = GraphTypes.from_record(json.loads(json.dumps(types.to_record())))
    assert again == types


def test_one_width_keeps_its_record(typed):
    graph, a = typed
    feats = {t: np.ones((COUNTS[t], 4), np.float32) for t in WIDTHS}
    from granndis_hpc.preprocess.sources.hetero import canonicalize_hetero
    same = canonicalize_hetero("same", a["counts"], feats, a["relations"], a["labels"], a["splits"], "a")
    assert same.types.widths == () and not any("width" in t for t in same.types.to_record()["vertex_types"])
    assert same.num_features == 4


@pytest.fixture(scope="module")
def built(typed, tmp_path_factory):
    graph, _ = typed
    out = tmp_path_factory.mktemp("widths") / "set"
    manifest = build_shards(graph, out, servers=2, gpus_per_server=2, layers=2, comm=MPI.COMM_SELF)
    return out, manifest


def test_shards_store_each_row_at_its_width(typed, built):
    graph, _ = typed
    out, manifest = built
    widths = np.asarray(graph.types.widths)
    assert [t["width"] for t in manifest["dataset"]["types"]["vertex_types"]] == list(widths)
    for s in range(2):
        with h5py.File(out / f"server-{s:04d}.h5", "r") as f:
            gid = f["vertices/global_id"][:]
            flat = f["features"][:]
        kind = graph.types.vertex_type(gid)
        assert flat.ndim == 1 and flat.shape[0] == int(widths[kind].sum())
        # The flat entries are each row's own columns, in row order (an independent unpacking).
        want = np.concatenate([graph.features[v, :widths[k]] for v, k in zip(gid, kind)])
        np.testing.assert_array_equal(flat, want)
        # The readers hold each row at its own width (TypedRows): its type's block, nothing padded.
        server = read_server_graph(out, manifest, s, features=True)
        _assert_own_widths(server["features"], graph, server["global_id"])
        pick = np.array([5, 0, len(gid) - 1, 3])
        np.testing.assert_array_equal(read_server_rows(out, manifest, s, pick), graph.features[gid[pick]])
        for g in range(2):
            sl = read_rank_slice(out, manifest, s, g)
            _assert_own_widths(sl.features, graph, sl.global_id)


def _assert_own_widths(held, graph, gid):
    """held: the rows with global ids gid, one block per type at its own width in row order, whose bytes
    are the rows' own widths x 4; padded, they are the canonical graph's rows."""
    widths = np.asarray(graph.types.widths)
    kind = graph.types.vertex_type(gid)
    assert held.nbytes == 4 * int(widths[kind].sum())
    assert [tuple(b.shape) for b in held.blocks] == [(int((kind == t).sum()), int(w)) for t, w in enumerate(widths)]
    for t, w in enumerate(widths):
        np.testing.assert_array_equal(held.blocks[t], graph.features[gid[kind == t], :w])
    np.testing.assert_array_equal(held.padded(), graph.features[gid])


@pytest.mark.parametrize("block_bytes", [None, 256])
def test_digest_and_verify_cover_the_flat_features(typed, built, tmp_path, monkeypatch, block_bytes):
    from granndis_hpc.preprocess.verify import content as verify_content
    from granndis_hpc.preprocess.verify.command import format_info, verify_shard_set
    from tests.unit.test_shard_tampering import tamper

    if block_bytes is not None:  # the content pass in blocks of a few rows
        monkeypatch.setattr(verify_content, "BLOCK_BYTES", block_bytes)
    graph, _ = typed
    out, manifest = built
    assert manifest["dataset"]["content_sha256"] == dataset_digest(graph)
    assert verify_shard_set(out) == []
    with h5py.File(out / "server-0001.h5", "r") as f:
        inner_entry = 3  # an entry of the file's first row (an inner one)
        hop = f["vertices/hop"][()]
        first_preloaded = int(np.flatnonzero(hop > 0)[0])
        gid = f["vertices/global_id"][()]
    problems = verify_shard_set(tamper(out, tmp_path / "inner", 1, "features", lambda a: _bump(a, inner_entry)))
    assert any("content_sha256" in p and "edited after the build" in p for p in problems), problems
    start = int(graph.types.row_widths(gid[:first_preloaded]).sum())
    problems = verify_shard_set(tamper(out, tmp_path / "copy", 1, "features", lambda a: _bump(a, start)))
    assert len(problems) == 1 and "preloaded rows' features differ" in problems[0], problems
    problems = verify_shard_set(tamper(out, tmp_path / "short", 1, "features", lambda a: a[:-1]))
    assert any("features" in p and "expected" in p for p in problems), problems
    info = format_info(manifest)
    assert "a 60 (7 wide, 1.64 KiB features, target)" in info and "d 10 (5 wide, 200 B features" in info, info


def _bump(a, i):
    a = a.copy()
    a[i] += 1.0
    return a


@pytest.mark.parametrize("model", ["rgcn", "rgat"])
def test_projection_equals_reference_in_one_process(typed, model):
    graph, a = typed
    torch.manual_seed(0)
    options = {"rgat": {"heads": 2}}.get(model, {})
    net = build_model(model, graph.num_features, 8, graph.num_classes, 2, dropout=0.0, types=graph.types, **options)
    assert [tuple(net.inputs[t].weight.shape) for t in graph.types.names] == [(8, 7), (8, 12), (8, 5), (8, 5)]
    assert net.contract.input_projection and net.contract.first_layer_prefix == "inputs."
    n = graph.num_vertices
    from granndis_hpc.nn.graph import LayerGraph
    g = LayerGraph(n, n, torch.from_numpy(graph.indptr), torch.from_numpy(graph.indices),
                   torch.from_numpy(np.diff(graph.indptr)).float(),
                   torch.bincount(torch.from_numpy(graph.indices), minlength=n).float())
    net.eval()
    got = net(torch.from_numpy(graph.features), [g, g]).detach().double()
    want = reference_logits(net.state_dict(), graph, type_rows(a), 2, model)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_project_option_on_one_width_and_refusals(typed):
    graph, a = typed
    feats = {t: np.ones((COUNTS[t], 4), np.float32) for t in WIDTHS}
    from granndis_hpc.preprocess.sources.hetero import canonicalize_hetero
    same = canonicalize_hetero("same", a["counts"], feats, a["relations"], a["labels"], a["splits"], "a")
    plain = build_model("rgcn", 4, 8, 3, 2, types=same.types)
    assert len(plain.inputs) == 0 and not plain.contract.input_projection
    from granndis_hpc.nn.hetero_models import projects_input
    assert projects_input("rgcn", {}, graph.types) and projects_input("rgat", {"project": 3}, same.types)
    assert not projects_input("rgcn", {"project": 0}, same.types) and not projects_input("sage", {}, graph.types)
    projected = build_model("rgcn", 4, 8, 3, 2, types=same.types, project=6)
    assert projected.convs[0].root.shape[0] == 6 and projected.inputs["a"].weight.shape == (6, 4)


@pytest.mark.parametrize("model,options", [("rgcn", {"num_bases": 2}), ("rgat", {"heads": 2}),
                                           ("rgcn", {"project": 6})])
def test_memory_model_counts_the_projection(typed, model, options):
    """The estimate's parameter count is the built model's, the projection's Linears included (per-type
    widths from the set's types), and the model's per-type feature bytes are the types' own widths'."""
    from granndis_hpc.memory_model.estimate import ModelSpec
    graph, _ = typed
    types = graph.types
    spec = ModelSpec(model, graph.num_features, 8, 3, 2, options=tuple(options.items()),
                     relations=types.num_relations, type_widths=tuple(types.width_of(graph.num_features)))
    net = build_model(model, graph.num_features, 8, 3, 2, types=types, **options)
    assert spec.estimator.parameters(spec) == sum(p.numel() for p in net.parameters())
    assert spec.estimator.all_widths(spec)[0][0] == options.get("project", 8)


def test_rgat_edge_transient_counts_one_relations_logits_the_head_copy_and_one_gradient_chunk():
    """R-GAT's per-edge transient: three [E, H] float32 tensors, the projected rows' per-head copy
    [H, n_src, C] and the backward's two gathered chunks [chunk, H C] (nn/edge_sparse.py's chunk), not
    the gathered [E, C] rows per head."""
    from granndis_hpc import memory_model as mm
    from granndis_hpc.memory_model.hetero_stacks import EDGE_CHUNK, RGAT_ESTIMATE
    from granndis_hpc.nn.edge_sparse import _CHUNK

    assert EDGE_CHUNK == _CHUNK
    spec = mm.ModelSpec("rgat", 32, 16, 5, 3, 0.0, relations=4, options={"heads": 3})
    for nnz in (1000, 200_000):
        lr = mm.LayerRows(n_own_in=700, n_halo=300, n_dst=700, nnz=nnz, n_send=50)
        n_src, heads, c = 1000, 3, 16
        expected = 4 * (3 * nnz * heads + heads * n_src * c + 2 * min(nnz, 16384) * heads * c)
        assert RGAT_ESTIMATE.edge_transient(lr, spec, 0, 32, 48) == expected
        # the last conv: out_heads (1) heads of the classes
        expected = 4 * (3 * nnz + n_src * 5 + 2 * min(nnz, 16384) * 5)
        assert RGAT_ESTIMATE.edge_transient(lr, spec, 2, 48, 5) == expected

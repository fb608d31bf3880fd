"""A heterogeneous graph's types record (granndis_hpc/graph/hetero.py) and its way through the build:
the manifest carries it, the content digest covers it, verify checks it and info prints it."""
import dataclasses

import numpy as np
import pytest
from mpi4py import MPI

from granndis_hpc.graph.hetero import GraphTypes, Relation, TypesError, types_of
from granndis_hpc.shards.content import dataset_digest
from tests.hetero_graphs import RELATIONS, typed_graph


def test_vertex_and_edge_types_follow_the_ids():
    types = typed_graph().types
    assert types.vertex_type([0, 159, 160, 249, 250, 261]).tolist() == [0, 0, 1, 1, 2, 2]
    # author -> paper is "writes", paper -> field "has_topic", field -> author no relation
    assert types.edge_type([160, 0, 250], [0, 250, 160]).tolist() == [1, 3, -1]
    assert [len(r) for r in types.destination_relations()] == [3, 1, 1]
    assert GraphTypes.from_record(types.to_record()) == types


def test_every_edge_of_the_generated_graph_has_its_relation():
    g = typed_graph()
    dst = np.repeat(np.arange(g.num_vertices), np.diff(g.indptr))
    kinds = g.types.edge_type(g.indices, dst)
    assert kinds.min() >= 0 and set(kinds.tolist()) == set(range(len(RELATIONS)))


@pytest.mark.parametrize("record_change,message", [
    (lambda t: dict(t, relations=t["relations"] + [["author", "reviews", "paper"]]), "each ordered pair"),
    (lambda t: dict(t, target="venue"), "target type 'venue'"),
    (lambda t: dict(t, relations=[["paper", "in", "venue"]]), "names vertex type 'venue'"),
])
def test_records_that_cannot_describe_a_graph_are_refused(record_change, message):
    with pytest.raises(TypesError, match=message):
        GraphTypes.from_record(record_change(typed_graph().types.to_record()))


def test_labels_and_splits_outside_the_target_type_are_refused():
    g = typed_graph()
    train = g.train_mask.copy()
    train[200] = True  # an author
    with pytest.raises(TypesError, match="train vertices outside the target type 'paper'"):
        g.types.check_graph(g.indptr, g.indices, g.labels, (train, g.val_mask, g.test_mask), "test")
    with pytest.raises(TypesError, match="a pair no relation covers"):
        GraphTypes(g.types.names, g.types.offsets, [r for r in RELATIONS if r.name != "writes"], "paper") \
            .check_graph(g.indptr, g.indices, g.labels, (g.train_mask, g.val_mask, g.test_mask), "test")


def test_the_digest_covers_the_types():
    g = typed_graph()
    plain = dataclasses.replace(g, types=None)
    other = dataclasses.replace(g, types=dataclasses.replace(g.types, relations=(
        Relation("paper", "cites", "paper"), Relation("author", "authors", "paper"),
        *RELATIONS[2:])))
    assert len({dataset_digest(g), dataset_digest(plain), dataset_digest(other)}) == 3


def test_a_typed_build_records_its_types_and_verifies(tmp_path):
    from granndis_hpc.preprocess.build.pipeline import build_shards
    from granndis_hpc.preprocess.verify.command import format_info, verify_shard_set
    from granndis_hpc.units import format_size

    g = typed_graph()
    manifest = build_shards(g, tmp_path / "set", servers=2, gpus_per_server=2, layers=2, partitioner="metis",
                            comm=MPI.COMM_SELF)
    assert types_of(manifest["dataset"]) == g.types
    assert manifest["dataset"]["content_sha256"] == dataset_digest(g)
    assert verify_shard_set(str(tmp_path / "set")) == []
    info = format_info(manifest)
    size = [format_size(n * g.num_features * 4) for n in (160, 90, 12)]  # float32 rows at the one width
    assert size == ["10 KiB", "5.62 KiB", "768 B"]
    assert (f"types       paper 160 ({size[0]} features, target), author 90 ({size[1]} features), field 12 "
            f"({size[2]} features); relations paper__cites__paper") in info

    # `granndis report`'s per-type table of a run on the set, counted here from the graph itself.
    from types import SimpleNamespace
    from granndis_hpc.report.types import types_table
    table = types_table(SimpleNamespace(config={"shards": str(tmp_path / "set")}, label="a run"))
    counts = np.bincount(g.types.vertex_type(np.arange(g.num_vertices)))
    split = [f"{int(m.sum()):,}" for m in (g.train_mask, g.val_mask, g.test_mask)]
    want = [f"| {name}{' (target)' if name == 'paper' else ''} | {counts[t]:,} | "
            f"{format_size(counts[t] * g.features.shape[1] * g.features.itemsize)} | stored | "
            + " | ".join(split if name == "paper" else ["-"] * 3) + " |" for t, name in enumerate(g.types.names)]
    assert table[4:4 + len(want)] == want and len(want) == 3
    assert types_table(SimpleNamespace(config={"shards": str(tmp_path / "moved")}, label="a run")) == []


@pytest.mark.parametrize("partitioner", ["metis", "parmetis"])
def test_partitioning_balances_each_vertex_type(tmp_path, partitioner):
    """Multi-constraint weights, one column per vertex type: the 12 fields spread over the 4 GPUs like
    the 160 papers do (with seed 0, one vertex-count constraint gave 19-27 of the 90 authors and 2-4 of
    the 12 fields per GPU)."""
    from granndis_hpc.preprocess.build.pipeline import build_shards
    from granndis_hpc.shards import read_manifest, read_server_arrays

    g = typed_graph()
    build_shards(g, tmp_path / "set", servers=2, gpus_per_server=2, layers=2, partitioner=partitioner,
                 comm=MPI.COMM_SELF)
    manifest = read_manifest(str(tmp_path / "set"))
    if "scotch" in manifest["partitioner"]["library"]:
        pytest.skip("PT-Scotch's ParMETIS interface balances one constraint (docs/design.md §8)")
    assert manifest["partitioner"]["constraints"][:3] == ["vertices:paper", "vertices:author", "vertices:field"]
    per_gpu = []
    for s in range(2):
        a = read_server_arrays(str(tmp_path / "set"), manifest, s)
        gid, hop = a["vertices/global_id"], a["vertices/hop"]
        offsets = a["vertices/offsets"]
        for gpu in range(2):
            rows = gid[offsets[gpu]:offsets[gpu + 1]][hop[offsets[gpu]:offsets[gpu + 1]] == 0]
            per_gpu.append(np.bincount(g.types.vertex_type(rows), minlength=3))
    per_gpu = np.array(per_gpu)
    assert per_gpu.sum(axis=0).tolist() == [160, 90, 12]
    assert (per_gpu.max(axis=0) <= np.ceil(per_gpu.sum(axis=0) / 4 * 1.1)).all(), per_gpu  # without: 27 authors

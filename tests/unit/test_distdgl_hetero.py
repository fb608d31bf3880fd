"""DistDGL's chunked graph format with several node and edge types (preprocess/formats/distdgl_hetero.py)
on tiny files written in its layout: the graph and digest are `canonicalize_hetero`'s of the same
arrays (types in node_type order, reverse relations, derived features of featureless types, a type
derived from a derived one included), and bad directories are refused naming the file."""
import json

import numpy as np
import pytest

from granndis_hpc.preprocess.sources import load
from granndis_hpc.preprocess.sources.canonical import DataError
from tests.distdgl_hetero_files import graph_arrays, reference, write_distdgl_hetero

FIELDS = ("indptr", "indices", "features", "labels", "train_mask", "val_mask", "test_mask")


@pytest.mark.parametrize("per_chunk,field_width", [(False, 8), (True, 8), (False, 5)])
def test_typed_distdgl_directory_is_canonicalize_hetero_of_its_arrays(tmp_path, per_chunk, field_width):
    from granndis_hpc.preprocess.build.pipeline import dataset_digest

    g = write_distdgl_hetero(tmp_path, per_chunk, field_width=field_width)
    got, ref = load("chunked", path=str(tmp_path)), reference(g)
    assert got.types == ref.types and got.num_classes == ref.num_classes
    assert got.types.names == ("paper", "author", "field", "institution")
    assert got.types.feature_origin == ("stored", "mean:rev_writes", "stored", "mean:affiliated_with")
    assert [r.name for r in got.types.relations][-2:] == ["rev_has_topic", "rev_affiliated_with"]
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(got, field), getattr(ref, field), err_msg=field)
    assert dataset_digest(got) == dataset_digest(ref)


def test_without_symmetrisation_a_type_nothing_leads_into_is_refused_as_in_the_whole_graph_path(tmp_path):
    g = write_distdgl_hetero(tmp_path)
    with pytest.raises(DataError, match=r"vertex types \['author', 'institution'\] have no features"):
        reference(g, symmetrize=False)
    with pytest.raises(DataError, match=r"vertex types \['author', 'institution'\] have no features"):
        load("chunked", path=str(tmp_path), symmetrize=False)


def test_no_symmetrisation_keeps_the_given_relations(tmp_path):
    from granndis_hpc.preprocess.build.pipeline import dataset_digest

    g = write_distdgl_hetero(tmp_path)
    meta = json.loads((tmp_path / "metadata.json").read_text())
    for t in ("author", "institution"):  # give them features, so nothing is derived
        x = np.ones((g["counts"][t], 8), np.float32) * (2 if t == "author" else 3)
        np.save(tmp_path / "node_data" / f"{t}-feat.npy", x)
        meta["node_data"][t] = {"feat": {"format": {"name": "numpy"}, "data": [f"node_data/{t}-feat.npy"]}}
        g["features"][t] = x
    (tmp_path / "metadata.json").write_text(json.dumps(meta))
    got, ref = load("chunked", path=str(tmp_path), symmetrize=False), reference(g, symmetrize=False)
    assert [r.name for r in got.types.relations] == ["writes", "cites", "has_topic", "affiliated_with"]
    assert got.types == ref.types and dataset_digest(got) == dataset_digest(ref)


def _edit(tmp_path, change):
    meta = json.loads((tmp_path / "metadata.json").read_text())
    change(meta)
    (tmp_path / "metadata.json").write_text(json.dumps(meta))


def test_defects_are_named(tmp_path):
    def fresh(name):
        d = tmp_path / name
        write_distdgl_hetero(d)
        return d
    d = fresh("ids")
    np.savetxt(d / "edges" / "has_topic-1.txt", np.array([[39, 6]]), fmt="%d")
    with pytest.raises(DataError, match=r"has_topic-1.txt: destination ids of paper__has_topic__field span \[6, 6\]"):
        load("chunked", path=str(d))
    d = fresh("rows")
    _edit(d, lambda m: m["node_data"]["field"]["feat"]["data"].pop())
    with pytest.raises(DataError, match="node_data.field.feat chunks hold 3 rows but the type has 6"):
        load("chunked", path=str(d))
    d = fresh("labels")
    _edit(d, lambda m: m["node_data"].update(author={"label": m["node_data"]["paper"]["label"]}))
    with pytest.raises(DataError, match=r"node types with a 'label': \['paper', 'author'\].*--target-type"):
        load("chunked", path=str(d))
    with pytest.raises(DataError, match=r"node_data.author \(the target type\) has no \['train_mask'"):
        load("chunked", path=str(d), target_type="author")
    d = fresh("edges")
    _edit(d, lambda m: m["edge_type"].append("paper:refs:paper"))
    with pytest.raises(DataError, match=r"5 edge types with counts \[70, 90, 40, 25\]"):
        load("chunked", path=str(d))
    _edit(d, lambda m: m["num_edges_per_type"].append(0))
    with pytest.raises(DataError, match="edges.paper:refs:paper is missing"):
        load("chunked", path=str(d))
    d = fresh("count")
    _edit(d, lambda m: m["num_edges_per_type"].__setitem__(0, 71))
    with pytest.raises(DataError, match="num_edges_per_type declares 226 edges but the edge files hold 225"):
        load("chunked", path=str(d))


def test_a_relation_whose_files_hold_another_count_is_refused_naming_it_and_its_files(tmp_path):
    """A cut edge file of one relation, and another relation's count lowered by as much: the total
    agrees, the relations do not."""
    write_distdgl_hetero(tmp_path)
    cut = tmp_path / "edges" / "writes-1.txt"
    lines = cut.read_text().splitlines()
    cut.write_text("\n".join(lines[:-1]) + "\n")
    _edit(tmp_path, lambda m: m["num_edges_per_type"].__setitem__(2, m["num_edges_per_type"][2] - 1))
    with pytest.raises(DataError, match=r"declares 70 edges of relation 'author:writes:paper' but its edge files "
                                        r"hold 69 \(writes-0.txt 35, writes-1.txt 34\)"):
        load("chunked", path=str(tmp_path))


def test_two_relations_of_one_type_pair_are_refused_and_types_of_different_widths_load(tmp_path):
    write_distdgl_hetero(tmp_path)

    def second(m):
        m["edge_type"].append("paper:refs:paper")
        m["num_edges_per_type"].append(0)
        m["edges"]["paper:refs:paper"] = {"format": {"name": "csv"}, "data": []}
    _edit(tmp_path, second)
    with pytest.raises(DataError, match="both lead from 'paper' to 'paper'.*Fix: merge"):
        load("chunked", path=str(tmp_path))
    _edit(tmp_path, lambda m: (m["edge_type"].pop(), m["num_edges_per_type"].pop()))
    np.save(tmp_path / "node_data" / "field-feat-0.npy", np.ones((3, 4), np.float32))
    np.save(tmp_path / "node_data" / "field-feat-1.npy", np.ones((3, 4), np.float32))
    got = load("chunked", path=str(tmp_path))  # each type at its own width; derived: its source's
    assert got.types.widths == (8, 8, 4, 8) and got.num_features == 8
    lo, hi = got.types.id_range("field")
    assert (got.features[lo:hi, :4] == 1).all() and not got.features[lo:hi, 4:].any()


def test_arrays_are_what_the_files_hold():
    g = graph_arrays()
    assert sum(g["counts"].values()) == 75 and g["labels"][:3].tolist() == [-1, -1, -1]

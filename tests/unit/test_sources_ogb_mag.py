"""ogbn-mag's download layout (raw/num-node-dict.csv.gz, raw/relations/<src>___<rel>___<dst>/, node-feat/,
node-label/, split/time/paper/) on a miniature written here: types in OGB's order, relations with their
reverses, derived features of authors, institutions and fields of study, labels and splits on papers."""
import gzip

import numpy as np
import pytest

from granndis_hpc.preprocess.sources import load
from granndis_hpc.preprocess.sources.canonical import DataError

COUNTS = {"paper": 6, "author": 4, "institution": 2, "field_of_study": 3}
RELATIONS = {("author", "affiliated_with", "institution"): [(0, 0), (1, 0), (2, 1)],
             ("author", "writes", "paper"): [(0, 0), (0, 1), (1, 2), (2, 3), (3, 4), (3, 5)],
             ("paper", "cites", "paper"): [(1, 0), (2, 0), (5, 4)],
             ("paper", "has_topic", "field_of_study"): [(0, 0), (1, 0), (2, 1), (3, 2)]}


def gz(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(text)


def write_mag(root, seed=0):
    """The miniature in the layout of the download; returns the paper features and labels."""
    rng = np.random.default_rng(seed)
    raw = root / "ogbn_mag" / "raw"
    gz(raw / "num-node-dict.csv.gz", ",".join(COUNTS) + "\n" + ",".join(map(str, COUNTS.values())) + "\n")
    gz(raw / "triplet-type-list.csv.gz", "".join(",".join(t) + "\n" for t in RELATIONS))
    for triplet, edges in RELATIONS.items():
        sub = raw / "relations" / "___".join(triplet)
        gz(sub / "edge.csv.gz", "".join(f"{u},{v}\n" for u, v in edges))
        gz(sub / "num-edge-list.csv.gz", f"{len(edges)}\n")
        gz(sub / "edge_reltype.csv.gz", "".join("0\n" for _ in edges))
    x = rng.random((6, 3)).astype(np.float32)
    gz(raw / "node-feat" / "paper" / "node-feat.csv.gz", "".join(",".join(map(repr, map(float, r))) + "\n" for r in x))
    gz(raw / "node-feat" / "paper" / "node_year.csv.gz", "".join("2019\n" for _ in range(6)))
    gz(raw / "nodetype-has-label.csv.gz", "author,field_of_study,institution,paper\nFalse,False,False,True\n")
    y = np.array([3, 1, 0, 2, 1, 0])
    gz(raw / "node-label" / "paper" / "node-label.csv.gz", "".join(f"{v}\n" for v in y))
    split = root / "ogbn_mag" / "split" / "time"
    gz(split / "nodetype-has-split.csv.gz", "author,field_of_study,institution,paper\nFalse,False,False,True\n")
    for part, ids in (("train", [0, 1, 2]), ("valid", [3]), ("test", [4, 5])):
        gz(split / "paper" / f"{part}.csv.gz", "".join(f"{i}\n" for i in ids))
    return x, y


def test_mag_layout_loads_with_types_and_derived_features(tmp_path):
    x, y = write_mag(tmp_path)
    g = load("ogb", root=str(tmp_path), name="ogbn-mag")
    t = g.types
    assert g.name == "ogbn-mag" and t.names == ("author", "field_of_study", "institution", "paper")
    assert t.offsets == (0, 4, 7, 9, 15) and t.target == "paper" and len(t.relations) == 7
    assert t.feature_origin == ("mean:rev_writes", "mean:has_topic", "mean:affiliated_with", "stored")
    start = dict(zip(t.names, t.offsets))
    # Every raw edge, offset to global ids, in both directions (and nothing else).
    expected = set()
    for (s, _, d), edges in RELATIONS.items():
        for u, v in edges:
            expected |= {(u + start[s], v + start[d]), (v + start[d], u + start[s])}
    dst = np.repeat(np.arange(g.num_vertices), np.diff(g.indptr))
    assert set(zip(g.indices.tolist(), dst.tolist())) == expected
    np.testing.assert_allclose(g.features[9:], x, rtol=1e-6)
    authors = np.stack([x[[0, 1]].mean(0), x[2], x[3], x[[4, 5]].mean(0)])
    np.testing.assert_allclose(g.features[:4], authors, rtol=1e-6)
    np.testing.assert_allclose(g.features[4:7], [x[[0, 1]].mean(0), x[2], x[3]], rtol=1e-6)
    np.testing.assert_allclose(g.features[7:9], [authors[[0, 1]].mean(0), authors[2]], rtol=1e-6)
    assert g.labels.tolist() == [-1] * 9 + y.tolist() and g.num_classes == 4
    assert np.flatnonzero(g.train_mask).tolist() == [9, 10, 11] and np.flatnonzero(g.test_mask).tolist() == [13, 14]


def test_mag_layout_defects_name_the_file(tmp_path):
    write_mag(tmp_path)
    sub = tmp_path / "ogbn_mag" / "raw" / "relations" / "paper___cites___paper"
    gz(sub / "num-edge-list.csv.gz", "5\n")
    with pytest.raises(DataError, match="paper___cites___paper.*num-edge-list"):
        load("ogb", root=str(tmp_path), name="ogbn-mag")
    gz(sub / "num-edge-list.csv.gz", "3\n")
    gz(sub / "edge.csv.gz", "1,0\n2,0\n5,9\n")
    with pytest.raises(DataError, match="edge.csv.gz.*valid ids 0..5"):
        load("ogb", root=str(tmp_path), name="ogbn-mag")
    with pytest.raises(DataError, match="--target-type author has no labels"):
        load("ogb", root=str(tmp_path), name="ogbn-mag", target_type="author")

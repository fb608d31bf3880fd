"""Small heterogeneous graphs generated for the tests (granndis_hpc/graph/hetero.py's form), built with
the homogeneous canonicaliser only, so the tests of the typed pipeline do not rest on the heterogeneous
sources they also test."""
import numpy as np

from granndis_hpc.graph.hetero import GraphTypes, Relation
from granndis_hpc.preprocess.sources.canonical import canonicalize

# (name, count) in id order; papers are the target type.
TYPES = (("paper", 160), ("author", 90), ("field", 12))
RELATIONS = (Relation("paper", "cites", "paper"), Relation("author", "writes", "paper"),
             Relation("paper", "rev_writes", "author"), Relation("paper", "has_topic", "field"),
             Relation("field", "rev_has_topic", "paper"))


def typed_graph(seed: int = 0, width: int = 16, classes: int = 4):
    """A citation-like graph: papers cite papers (symmetric), authors write papers, papers have fields;
    each cross-type relation with its reverse.  Labels follow a paper's fields, so models can learn."""
    rng = np.random.default_rng(seed)
    offsets = np.cumsum([0] + [n for _, n in TYPES])
    n_paper, n_author, n_field = (n for _, n in TYPES)
    paper, author, field = (np.arange(offsets[t], offsets[t + 1]) for t in range(3))
    cites = rng.integers(0, n_paper, size=(2, 3 * n_paper))
    cites = cites[:, cites[0] != cites[1]]
    writes = np.stack([rng.integers(0, n_author, 2 * n_paper), np.repeat(np.arange(n_paper), 2)])
    topic = np.stack([np.arange(n_paper), rng.integers(0, n_field, n_paper)])
    src = np.concatenate([paper[cites[0]], paper[cites[1]], author[writes[0]], paper[writes[1]],
                          paper[topic[0]], field[topic[1]]])
    dst = np.concatenate([paper[cites[1]], paper[cites[0]], paper[writes[1]], author[writes[0]],
                          field[topic[1]], paper[topic[0]]])
    n = int(offsets[-1])
    labels = np.full(n, -1, dtype=np.int64)
    labels[paper] = topic[1] % classes
    features = rng.normal(size=(n, width)).astype(np.float32)
    features[paper, :classes] += 2.0 * np.eye(classes, dtype=np.float32)[labels[paper]] * (rng.random((n_paper,
                                                                                                       1)) < 0.5)
    split = rng.permutation(n_paper)
    masks = [np.zeros(n, dtype=bool) for _ in range(3)]
    for mask, part in zip(masks, np.split(split, [n_paper // 2, 3 * n_paper // 4])):
        mask[paper[part]] = True
    graph = canonicalize("typed-test", n, src, dst, features, labels, *masks, num_classes=classes,
                         symmetrize=False, self_loops="remove")
    graph.types = GraphTypes(tuple(name for name, _ in TYPES), tuple(int(o) for o in offsets), RELATIONS, "paper")
    graph.types.check_graph(graph.indptr, graph.indices, graph.labels,
                            (graph.train_mask, graph.val_mask, graph.test_mask), "typed-test")
    return graph


class SlicedGraph:
    """A whole Graph handed out as a sliced source (preprocess/build/sliced.py protocol, `types`
    included): rank r of P gets the r-th of P contiguous runs of its edges."""

    def __init__(self, graph):
        self.graph, self.name, self.types = graph, graph.name, graph.types
        self.num_vertices, self.num_features = graph.num_vertices, graph.num_features
        self.num_classes = graph.num_classes

    def edge_pieces(self, rank: int, size: int):
        g = self.graph
        dst = np.repeat(np.arange(g.num_vertices, dtype=np.int64), np.diff(g.indptr))
        a, b = rank * g.num_edges // size, (rank + 1) * g.num_edges // size
        yield f"edges {a}..{b}", g.indices[a:b], dst[a:b]

    def nodes(self, lo: int, hi: int) -> dict:
        return {f: [("nodes", getattr(self.graph, f)[lo:hi])]
                for f in ("features", "labels", "train_mask", "val_mask", "test_mask")}

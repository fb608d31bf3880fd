"""A typed synthetic graph with ogbn-mag's statistics (``--generator mag`` of the synthetic source),
generated chunk by chunk where it is used, like synthetic_chunks.py.

Why: the heterogeneous path (granndis_hpc/graph/hetero.py: vertex types own id ranges, an edge's
relation is its endpoints' type pair) needs a benchmark graph of ogbn-mag's size and shape on machines
that cannot download it, built by the distributed build with every rank generating only its share.

Shape (at ``--vertices N``, every count scaled by N / 1,939,743; types in this id order):

* vertex types paper (the target), author, institution, field_of_study in ogbn-mag's proportions
  (736,389 / 1,134,649 / 8,740 / 59,965), rounded so that they add up to N exactly;
* relations author-writes-paper (7,145,660 drawn edges at full size), paper-cites-paper (5,416,271,
  made symmetric), author-affiliated_with-institution (1,043,998), paper-has_topic-field_of_study
  (7,505,078); every cross-type relation has its reverse ``rev_<name>``.  The source hands over both
  directions of every drawn edge, so the reverse relations are exact reverses and ``cites`` is
  symmetric with or without --no-symmetrize.  Canonicalisation merges the pairs drawn twice (a few
  percent at full size; more at small N, where the small types have few vertices per community);
* 128 features for every type: the centroid of the vertex's community (unit Gaussian, one per class)
  plus Gaussian noise of std --feature-noise, the same kind of draw for every type (all "stored");
* 349 classes on the papers: every type's vertices fall in 349 communities (equal blocks of a keyed
  permutation of the type's ids), a paper's class is its community, and an edge's partner lies in its
  first endpoint's community with probability --homophily (else anywhere), so the neighbours of a paper
  of every relation carry its class;
* split by a synthetic year: a keyed permutation ranks the papers, the first 629,571 / 736,389 of them
  (scaled) are train (years before 2018), the next 64,879 / 736,389 val (2018), the rest test (2019).

Degrees are heavy-tailed where ogbn-mag's are: an endpoint drawn with skew a is the position
floor(count * u**a) (u uniform) of its range, so low positions (random ids, by the permutation) are
hubs; authors' productivity, papers' citations and the institutions' and fields' popularity are skewed,
a paper's number of authors, references and topics is not.

Generation: relation r's edges are cut into chunks of EDGE_CHUNK; chunk j draws from
SeedSequence([seed, MAG, r, j]) alone and vertex chunk i's features from (seed, MAG, i), so a build
rank generates only its chunks and the graph is the same for any number of ranks.
"""
from __future__ import annotations

import numpy as np

from granndis_hpc.graph.hetero import GraphTypes, Relation
from granndis_hpc.preprocess.sources.canonical import DataError, canonicalize
from granndis_hpc.preprocess.sources.synthetic import DEFAULTS
from granndis_hpc.preprocess.sources.synthetic_chunks import VERTEX_CHUNK, Feistel

MAG_VERTICES = 1_939_743
MAG_TYPES = (("paper", 736_389), ("author", 1_134_649), ("institution", 8_740), ("field_of_study", 59_965))
# (source type, name, destination type, edges drawn at full size, skew of the source, of the destination)
MAG_RELATIONS = (("author", "writes", "paper", 7_145_660, 1.5, 1.0),
                 ("paper", "cites", "paper", 5_416_271, 1.0, 1.5),
                 ("author", "affiliated_with", "institution", 1_043_998, 1.0, 1.5),
                 ("paper", "has_topic", "field_of_study", 7_505_078, 1.0, 1.5))
MAG_SPLIT = (629_571, 64_879, 41_939)  # papers before 2018, of 2018, of 2019
MAG_FEATURES, MAG_CLASSES = 128, 349
FIRST_YEAR, VAL_YEAR = 2000, 2018
EDGE_CHUNK = 1 << 18  # edges per generator chunk: part of the model (changing it changes the graph)
_MAG = 0x6D6167
_POS, _SPLIT, _EDGES, _FEATURES, _CENTROIDS = range(1, 6)


def scaled_counts(full, n: int) -> np.ndarray:
    """`full` counts scaled by n / MAG_VERTICES, rounded by largest remainder (they sum to the scaled
    total exactly)."""
    full = np.asarray(full, dtype=np.int64)
    exact = full * int(n)
    out = exact // MAG_VERTICES
    total = int(round(int(full.sum()) * int(n) / MAG_VERTICES))
    rest = exact - out * MAG_VERTICES
    order = np.lexsort((np.arange(full.shape[0]), -rest))
    out[order[:max(total - int(out.sum()), 0)]] += 1
    return out


def mag_types(n: int) -> GraphTypes:
    """The types record of the graph with n vertices: the four types and seven relations."""
    counts = scaled_counts([c for _, c in MAG_TYPES], n)
    relations = []
    for src, name, dst, *_ in MAG_RELATIONS:
        relations.append(Relation(src, name, dst))
        if src != dst:
            relations.append(Relation(dst, "rev_" + name, src))
    offsets = np.concatenate([[0], np.cumsum(counts)])
    return GraphTypes(tuple(t for t, _ in MAG_TYPES), tuple(int(o) for o in offsets), tuple(relations), "paper")


class MagSource:
    """The typed synthetic graph as a sliced source (preprocess/build/sliced.py protocol, with `types`);
    see the module docstring.  Takes the synthetic source's options; reads vertices, seed, homophily
    and feature_noise (the other counts are ogbn-mag's)."""

    multilabel = False

    def __init__(self, name: str = "synthetic-mag", vertices: int | None = None, seed: int | None = None,
                 homophily: float | None = None, feature_noise: float | None = None, **_other_generators_options):
        # None: the synthetic source's default (argparse passes None for options not given)
        vertices, seed, homophily, feature_noise = (DEFAULTS[k] if v is None else v for k, v in (
            ("vertices", vertices), ("seed", seed), ("homophily", homophily), ("feature_noise", feature_noise)))
        n = int(vertices)
        floor = -(-MAG_VERTICES // min(c for _, c in MAG_TYPES))  # every type at least one vertex
        problems = []
        if n < floor:
            problems.append(f"--vertices {n} (need at least {floor}: one institution)")
        if not 0 <= homophily <= 1:
            problems.append(f"--homophily {homophily} (need 0..1)")
        if not feature_noise >= 0:
            problems.append(f"--feature-noise {feature_noise} (need >= 0)")
        if problems:
            raise DataError(f"synthetic --generator mag: invalid parameters: {'; '.join(problems)}. "
                            "Fix: change those options")
        self.name, self.canonical = str(name), None
        self.num_vertices, self.num_features, self.num_classes = n, MAG_FEATURES, MAG_CLASSES
        self.seed, self.homophily, self.noise = int(seed), float(homophily), float(feature_noise)
        self.types = mag_types(n)
        self.counts = np.diff(self.types.offsets)
        self.position = [Feistel(int(c), self.seed, _MAG, _POS, t) for t, c in enumerate(self.counts)]
        # Community c of type t holds its positions bounds[t][c]..bounds[t][c+1]-1.
        self.bounds = [(np.arange(MAG_CLASSES + 1, dtype=np.int64) * int(c)) // MAG_CLASSES for c in self.counts]
        self.edge_counts = scaled_counts([r[3] for r in MAG_RELATIONS], n)
        self.edge_counts = np.maximum(self.edge_counts, 1)
        # (relation, chunk) of every edge chunk, in order: build ranks take contiguous runs of them.
        self.chunks = [(r, j) for r, e in enumerate(self.edge_counts) for j in range(-(-int(e) // EDGE_CHUNK))]
        n_paper = int(self.counts[0])
        split = scaled_counts(MAG_SPLIT, n)  # may differ from n_paper by one: test takes the rest
        self.n_train, self.n_val = max(int(split[0]), 1), int(split[1])
        self.split_rank = Feistel(n_paper, self.seed, _MAG, _SPLIT)
        self.centroids = np.random.default_rng(self._seq(_CENTROIDS)).standard_normal(
            (MAG_CLASSES, MAG_FEATURES), dtype=np.float32)

    def _seq(self, *parts: int) -> np.random.SeedSequence:
        return np.random.SeedSequence([self.seed, _MAG, *[int(p) for p in parts]])

    # ---- per-vertex functions of the id -------------------------------------------------------
    def community_of(self, ids) -> np.ndarray:
        """The community (0..348) of every global id, whatever its type."""
        ids = np.asarray(ids, dtype=np.int64)
        kind = self.types.vertex_type(ids)
        out = np.empty(ids.shape[0], dtype=np.int64)
        for t in range(len(self.counts)):  # loop over the four types
            sel = np.flatnonzero(kind == t)
            pos = self.position[t].forward(ids[sel] - self.types.offsets[t])
            out[sel] = np.searchsorted(self.bounds[t], pos, side="right") - 1
        return np.minimum(out, MAG_CLASSES - 1)

    def paper_year(self, ids) -> np.ndarray:
        """The synthetic year of papers `ids` (global ids of papers): the split follows it."""
        q = self.split_rank.forward(np.asarray(ids, dtype=np.int64))
        before = FIRST_YEAR + (q * (VAL_YEAR - FIRST_YEAR)) // max(self.n_train, 1)
        return np.where(q < self.n_train, before, np.where(q < self.n_train + self.n_val, VAL_YEAR, VAL_YEAR + 1))

    def _draw(self, t: int, u: np.ndarray, skew: float, community: np.ndarray | None = None) -> np.ndarray:
        """Global ids of type t at skewed positions floor(count * u**skew) of the whole type, or of
        each draw's `community` block (an empty block, possible when the type has fewer vertices than
        communities, takes the block's first position)."""
        if community is None:
            start, count = np.int64(0), np.int64(self.counts[t])
        else:
            start = self.bounds[t][community]
            count = np.maximum(self.bounds[t][community + 1] - start, 1)
        pos = np.minimum(start + np.minimum((count * u ** skew).astype(np.int64), count - 1), self.counts[t] - 1)
        return self.position[t].inverse(pos) + self.types.offsets[t]

    # ---- chunks -------------------------------------------------------------------------------
    def chunk_edges(self, r: int, j: int):
        """(src, dst) int64 of edge chunk j of relation r: the drawn edges, then their reverses."""
        src_t, _, dst_t, _, a_src, a_dst = MAG_RELATIONS[r]
        s, d = self.types.index(src_t), self.types.index(dst_t)
        m = int(min(EDGE_CHUNK, int(self.edge_counts[r]) - j * EDGE_CHUNK))
        rng = np.random.default_rng(self._seq(_EDGES, r, j))
        src = self._draw(s, rng.random(m), a_src)
        inside = rng.random(m) < self.homophily
        u = rng.random(m)
        dst = self._draw(d, u, a_dst)
        dst[inside] = self._draw(d, u[inside], a_dst, self.community_of(src[inside]))
        return np.concatenate([src, dst]), np.concatenate([dst, src])

    def chunk_nodes(self, i: int) -> dict:
        lo, hi = i * VERTEX_CHUNK, min((i + 1) * VERTEX_CHUNK, self.num_vertices)
        ids = np.arange(lo, hi, dtype=np.int64)
        community = self.community_of(ids)
        x = np.random.default_rng(self._seq(_FEATURES, i)).standard_normal((hi - lo, MAG_FEATURES), dtype=np.float32)
        x *= np.float32(self.noise)
        x += self.centroids[community]
        n_paper = int(self.counts[0])
        paper = ids < n_paper
        labels = np.where(paper, community, -1).astype(np.int64)
        q = np.full(hi - lo, -1, dtype=np.int64)
        q[paper] = self.split_rank.forward(ids[paper])
        return {"features": x, "labels": labels, "train_mask": paper & (q < self.n_train),
                "val_mask": paper & (q >= self.n_train) & (q < self.n_train + self.n_val),
                "test_mask": paper & (q >= self.n_train + self.n_val)}

    # ---- sliced-source protocol ---------------------------------------------------------------
    def edge_pieces(self, rank: int, size: int):
        K = len(self.chunks)
        for r, j in self.chunks[rank * K // size:(rank + 1) * K // size]:
            src, dst = self.chunk_edges(r, j)
            yield f"synthetic mag {MAG_RELATIONS[r][1]} chunk {j}", src, dst

    def nodes(self, lo: int, hi: int) -> dict:
        parts = []
        for i in range(lo // VERTEX_CHUNK, -(-hi // VERTEX_CHUNK)):
            a = i * VERTEX_CHUNK
            piece = self.chunk_nodes(i)
            parts.append({f: v[max(lo, a) - a:hi - a] for f, v in piece.items()})
        out = {}
        for f in ("features", "labels", "train_mask", "val_mask", "test_mask"):
            if parts:
                arr = np.concatenate([p[f] for p in parts]) if len(parts) > 1 else parts[0][f]
            else:
                arr = np.zeros((0, MAG_FEATURES) if f == "features" else (0,),
                               dtype=np.float32 if f == "features" else (np.int64 if f == "labels" else bool))
            out[f] = [("synthetic mag", arr)]
        return out

    def raw(self) -> dict:
        """The whole draw in this process (canonicalize() arguments): the whole-graph reference."""
        edges = [self.chunk_edges(r, j) for r, j in self.chunks]
        nodes = {f: p[0][1] for f, p in self.nodes(0, self.num_vertices).items()}
        return dict(num_vertices=self.num_vertices, src=np.concatenate([e[0] for e in edges]),
                    dst=np.concatenate([e[1] for e in edges]), **nodes, num_classes=self.num_classes)


def load_mag(symmetrize=True, self_loops="remove", name=None, **params):
    """Generate every chunk in this process and canonicalise (with the types record): the whole-graph
    reference of what the build ranks produce from their own chunks."""
    source = MagSource(**({"name": name} if name else {}), **params)
    graph = canonicalize(source.name, symmetrize=symmetrize, self_loops=self_loops, origin="synthetic mag",
                         **source.raw())
    graph.types = source.types
    graph.types.check_graph(graph.indptr, graph.indices, graph.labels,
                            (graph.train_mask, graph.val_mask, graph.test_mask), source.name)
    return graph

"""Synthetic graphs generated where they are used: chunk i of `--generator sbm|local` from (seed, i) alone.

Why: a build rank must generate only its share of the graph, and the graph must be the
same for any number of ranks P (its content digest equal for P = 1, 2, 4, 8).  The earlier generators
drew from global arrays (a permutation of all vertices, one weighted sampler over all of them), so
every rank generated everything.  Here every per-vertex quantity is a function of the vertex id:

* position: a keyed Feistel bijection of [0, N) (`Feistel`), so ids are random with respect to the
  structure (a partitioner has to find it) yet any rank can map ids to positions and back without a
  permutation array;
* community (sbm) = position * K // N, cell (local) = position * cells // N: contiguous position
  blocks, so every community/cell is non-empty and its members are a position range (a uniform
  member is one draw in the range, mapped back through the inverse bijection);
* degree propensity theta from a hash of (seed, id): Pareto with tail exponent 1.5, capped at 1000
  (as before);
* split: a second keyed bijection ranks the vertices: the first round(train_frac N) are train, the
  next round(val_frac N) val, the rest test (the same exact counts as before).

Vertex chunk i holds vertices i*VERTEX_CHUNK .. (i+1)*VERTEX_CHUNK-1.  Its edges are drawn by its
vertices: vertex v draws Poisson(theta_v * D / (2 E[theta])) edges (E[theta] in closed form, so the
expected number of draws is N D / 2 as before without a global sum), each to a partner:

* sbm: with probability `homophily` a uniform member of v's community, else a uniform vertex;
* local: a uniform member of the cell at a Gaussian offset of std local_scale * theta_v**0.1 cells
  per axis from v's cell on the torus, or (probability `long_range`) a uniform vertex.

Its random draws come from the stream SeedSequence([seed, model, purpose, i]); its features are the
class centroid (from the seed) plus noise from the same kind of per-chunk stream.  Labels: sbm
community mod C; local the Voronoi patch of the cell (as before, seeds chosen from the seed), each
patch a class by a shuffled assignment.

What differs from whole-graph generators (docs/performance/preprocess.md): partners are
uniform (not theta-weighted) members, hubs get their degree from their own draws, the split and the
community/cell membership are exact position blocks instead of random draws.  The statistics the
tests hold the generators to (heavy tails, homophily, small cuts and thin halos for `local`,
features that need the neighbours) are unchanged.
"""
from __future__ import annotations

import numpy as np

from granndis_hpc.preprocess.sources.canonical import DataError, canonicalize
from granndis_hpc.preprocess.build.halo import _mix64  # the one splitmix64 finaliser (EAS tie-breaks use it too)
import granndis_hpc.preprocess.sources.synthetic as synthetic
import granndis_hpc.preprocess.sources.synthetic_local as synthetic_local
from granndis_hpc.preprocess.sources.synthetic import DEGREE_EXPONENT, THETA_CAP

VERTEX_CHUNK = 1 << 14  # vertices per generator chunk: part of the model (changing it changes the graph)
_SBM, _LOCAL = 0x73626D, 0x6C6F63
_POS, _SPLIT, _THETA, _EDGES, _FEATURES, _CENTROIDS, _PATCHES, _CLASSES = range(1, 9)


def _key(*parts: int) -> np.uint64:
    h = np.uint64(0x243F6A8885A308D3)
    for p in parts:
        h = _mix64(np.array([h ^ np.uint64(int(p) & 0xFFFFFFFFFFFFFFFF)], dtype=np.uint64))[0]
    return np.uint64(h)


def hash_uniform(key: np.uint64, ids: np.ndarray) -> np.ndarray:
    """A uniform float64 in [0, 1) per id, a pure function of (key, id)."""
    x = _mix64(np.asarray(ids, dtype=np.int64).astype(np.uint64) ^ key)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


class Feistel:
    """A keyed bijection of [0, n) (4-round balanced Feistel network on 2h bits, cycle-walking the
    values >= n back into range): forward(ids) -> positions, inverse(positions) -> ids, vectorised."""

    ROUNDS = 4

    def __init__(self, n: int, *key_parts: int):
        self.n = int(n)
        bits = max(2, int(np.ceil(np.log2(max(self.n, 2)))))
        bits += bits % 2
        self.half = np.uint64(bits // 2)
        self.mask = np.uint64((1 << (bits // 2)) - 1)
        self.keys = [_key(*key_parts, r) for r in range(self.ROUNDS)]

    def _f(self, x, k):
        return _mix64(x ^ k) & self.mask

    def _once(self, x: np.ndarray, inverse: bool) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        if not inverse:
            for k in self.keys:
                left, right = right, left ^ self._f(right, k)
        else:
            for k in reversed(self.keys):
                left, right = right ^ self._f(left, k), left
        return (left << self.half) | right

    def _walk(self, ids, inverse: bool) -> np.ndarray:
        x = self._once(np.asarray(ids, dtype=np.int64).astype(np.uint64), inverse)
        out_of_range = np.flatnonzero(x >= np.uint64(self.n))
        while out_of_range.size:  # < 4x the domain: a few rounds, each on fewer values
            x[out_of_range] = self._once(x[out_of_range], inverse)
            out_of_range = out_of_range[x[out_of_range] >= np.uint64(self.n)]
        return x.astype(np.int64)

    def forward(self, ids) -> np.ndarray:
        return self._walk(ids, False)

    def inverse(self, positions) -> np.ndarray:
        return self._walk(positions, True)


def block_start(block: np.ndarray, n: int, blocks: int) -> np.ndarray:
    """First position of block b when position p is in block p * blocks // n."""
    return -((-np.asarray(block, dtype=np.int64) * n) // blocks)


class SyntheticSource:
    """One synthetic graph as a sliced source (preprocess/build/sliced.py protocol); see the module docstring."""

    def __init__(self, generator: str = "sbm", name: str = "synthetic", **params):
        if generator not in synthetic.GENERATORS:
            raise DataError(f"synthetic: invalid parameters: --generator {generator!r} (unknown). "
                            f"Fix: use one of {', '.join(synthetic.GENERATORS)}")
        unknown = sorted(set(params) - set(synthetic.DEFAULTS) - set(synthetic_local.LOCAL_DEFAULTS))
        if unknown:
            raise TypeError(f"unknown synthetic parameters {unknown}")
        # None = the generator's default (argparse passes None for options not given)
        params = {k: v for k, v in params.items() if v is not None or k == "communities"}
        p = {**synthetic.DEFAULTS, **synthetic_local.LOCAL_DEFAULTS, **params}
        n, F, C = int(p["vertices"]), int(p["features"]), int(p["classes"])
        self.generator, self.name, self.canonical = generator, str(name), None
        self.num_vertices, self.num_features, self.num_classes = n, F, C
        self.seed, self.avg_degree, self.noise = int(p["seed"]), float(p["avg_degree"]), float(p["feature_noise"])
        model = _SBM if generator == "sbm" else _LOCAL
        self.model = model
        if generator == "sbm":
            k = C if p["communities"] is None else int(p["communities"])
            synthetic._check(n, p["avg_degree"], F, C, k, p["train_frac"], p["val_frac"], p["homophily"],
                             p["feature_noise"])
            self.blocks, self.homophily = k, float(p["homophily"])
        else:
            k = synthetic_local.default_communities(n, C) if p["communities"] is None else int(p["communities"])
            synthetic_local._check(n, p["avg_degree"], F, C, k, p["train_frac"], p["val_frac"], p["feature_noise"],
                                   float(p["cell_size"]), float(p["local_scale"]), float(p["long_range"]))
            self.side = synthetic_local.torus_side(n, p["cell_size"])
            self.blocks = self.side * self.side
            self.communities = k
            self.local_scale, self.long_range = float(p["local_scale"]), float(p["long_range"])
            self.hub_spread = synthetic_local.HUB_SPREAD
            self._patches = synthetic_local.PatchMap(self.side, k, self._seq(_PATCHES))
            self.patch_class = np.random.default_rng(self._seq(_CLASSES)).permutation(k) % C
        self.position = Feistel(n, self.seed, model, _POS)
        self.split_rank = Feistel(n, self.seed, model, _SPLIT)
        self.n_train = max(1, int(round(float(p["train_frac"]) * n)))
        self.n_val = int(round(float(p["val_frac"]) * n))
        self.theta_key = _key(self.seed, model, _THETA)
        self.centroids = np.random.default_rng(self._seq(_CENTROIDS)).standard_normal((C, F), dtype=np.float32)
        self.num_chunks = -(-n // VERTEX_CHUNK)
        a = synthetic.DEGREE_EXPONENT - 1.0
        self.mean_theta = 1.0 + (1.0 - synthetic.THETA_CAP ** (1.0 - a)) / (a - 1.0)  # E[min(Pareto, cap)]

    def _seq(self, purpose: int, chunk: int = 0) -> np.random.SeedSequence:
        return np.random.SeedSequence([self.seed, self.model, purpose, int(chunk)])

    def chunk_range(self, i: int):
        return i * VERTEX_CHUNK, min((i + 1) * VERTEX_CHUNK, self.num_vertices)

    # ---- per-vertex functions of the id -------------------------------------------------------
    def theta(self, ids) -> np.ndarray:
        u = hash_uniform(self.theta_key, ids)
        return np.minimum((1.0 - u) ** (-1.0 / (DEGREE_EXPONENT - 1.0)), THETA_CAP)

    def block_of(self, ids) -> np.ndarray:
        """sbm: community; local: torus cell."""
        return (self.position.forward(ids) * self.blocks) // self.num_vertices

    def community_of(self, ids) -> np.ndarray:
        """sbm: the community; local: the label patch."""
        b = self.block_of(ids)
        return b if self.generator == "sbm" else self._patches.of_cells(b)

    def labels_of(self, ids) -> np.ndarray:
        c = self.community_of(ids)
        return (c % self.num_classes if self.generator == "sbm" else self.patch_class[c]).astype(np.int64)

    def _member(self, block: np.ndarray, u: np.ndarray) -> np.ndarray:
        """A uniform vertex of each block (u uniform in [0, 1))."""
        n = self.num_vertices
        start = block_start(block, n, self.blocks)
        count = block_start(block + 1, n, self.blocks) - start
        pos = start + np.minimum((u * count).astype(np.int64), count - 1)
        return self.position.inverse(pos)

    # ---- chunks -------------------------------------------------------------------------------
    def chunk_edges(self, i: int):
        """(src, dst) int64: the edges drawn by the vertices of chunk i."""
        n = self.num_vertices
        lo, hi = self.chunk_range(i)
        ids = np.arange(lo, hi, dtype=np.int64)
        th = self.theta(ids)
        rng = np.random.default_rng(self._seq(_EDGES, i))
        k = rng.poisson(th * (self.avg_degree / (2.0 * self.mean_theta)))
        src = np.repeat(ids, k)
        m = src.shape[0]
        anywhere = rng.integers(0, n, m)
        if self.generator == "sbm":
            inside = rng.random(m) < self.homophily
            u = rng.random(m)
            dst = anywhere
            dst[inside] = self._member(self.block_of(src[inside]), u[inside])
        else:
            side = self.side
            c = self.block_of(src)
            scale = self.local_scale * np.repeat(th, k) ** self.hub_spread
            offset = np.rint(rng.standard_normal((2, m)) * scale).astype(np.int64)
            tc = (c % side + offset[0]) % side + ((c // side + offset[1]) % side) * side
            dst = self._member(tc, rng.random(m))
            far = rng.random(m) < self.long_range
            dst[far] = anywhere[far]
        return src, dst

    def chunk_nodes(self, i: int) -> dict:
        lo, hi = self.chunk_range(i)
        ids = np.arange(lo, hi, dtype=np.int64)
        labels = self.labels_of(ids)
        x = np.random.default_rng(self._seq(_FEATURES, i)).standard_normal((hi - lo, self.num_features),
                                                                            dtype=np.float32)
        x *= np.float32(self.noise)
        x += self.centroids[labels]
        q = self.split_rank.forward(ids)
        return {"features": x, "labels": labels, "train_mask": q < self.n_train,
                "val_mask": (q >= self.n_train) & (q < self.n_train + self.n_val),
                "test_mask": q >= self.n_train + self.n_val}

    # ---- sliced-source protocol ---------------------------------------------------------------
    def edge_pieces(self, rank: int, size: int):
        K = self.num_chunks
        for i in range(rank * K // size, (rank + 1) * K // size):
            src, dst = self.chunk_edges(i)
            yield f"synthetic chunk {i}", src, dst

    def nodes(self, lo: int, hi: int) -> dict:
        parts = []
        for i in range(lo // VERTEX_CHUNK, -(-hi // VERTEX_CHUNK)):
            a, b = self.chunk_range(i)
            piece = self.chunk_nodes(i)
            parts.append({f: v[max(lo, a) - a:min(hi, b) - a] for f, v in piece.items()})
        out = {}
        for f in ("features", "labels", "train_mask", "val_mask", "test_mask"):
            if parts:
                arr = np.concatenate([p[f] for p in parts]) if len(parts) > 1 else parts[0][f]
            else:
                arr = np.zeros((0, self.num_features) if f == "features" else (0,),
                               dtype=np.float32 if f == "features" else (np.int64 if f == "labels" else bool))
            out[f] = [("synthetic", arr)]
        return out

    def raw(self) -> dict:
        """The whole draw in this process (canonicalize() arguments plus community, and for local the
        cell of every vertex and the torus side): the reference the distributed load is tested against."""
        edges = [self.chunk_edges(i) for i in range(self.num_chunks)]
        nodes = {f: p[0][1] for f, p in self.nodes(0, self.num_vertices).items()}
        ids = np.arange(self.num_vertices, dtype=np.int64)
        out = dict(num_vertices=self.num_vertices,
                   src=np.concatenate([e[0] for e in edges]), dst=np.concatenate([e[1] for e in edges]),
                   **nodes, num_classes=self.num_classes,
                   community=self.community_of(ids))
        if self.generator == "local":
            out.update(cell=self.block_of(ids), side=self.side)
        return out


# The whole draw in one process: the generators' reference (tests, `load`), built on SyntheticSource.
def generate_raw(**params) -> dict:
    """The raw DC-SBM draw (before canonicalisation): canonicalize() arguments plus ``community``."""
    return SyntheticSource("sbm", **params).raw()


def generate_any(generator="sbm", **params) -> dict:
    """The raw draw of either generator (canonicalize() arguments plus ``community``; local: ``cell``
    and ``side`` too).  Options of the other generator are ignored."""
    return SyntheticSource(generator, **params).raw()


def load_synthetic(symmetrize=True, self_loops="remove", name="synthetic", **params):
    """Generate every chunk in this process (SyntheticSource) and canonicalise: the whole-graph
    reference of what the build ranks produce from their own chunks (preprocess/build/sliced.py)."""
    raw = generate_any(**params)
    for key in ("community", "cell", "side"):
        raw.pop(key, None)
    return canonicalize(name, symmetrize=symmetrize, self_loops=self_loops, origin="synthetic", **raw)


def generate_local_raw(**params) -> dict:
    """The raw draw (before canonicalisation): canonicalize() arguments plus ``community`` (patch) and
    ``cell`` of every vertex and the torus ``side``; see the module docstring."""
    return SyntheticSource("local", **params).raw()

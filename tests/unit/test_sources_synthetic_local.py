"""Synthetic --generator local: reproducible, local (small cuts and k-hop halos), heavy-tailed, homophilous,
ids random w.r.t. position, options validated; the default DC-SBM pinned."""
import argparse
import hashlib

import numpy as np
import pytest

from granndis_hpc.cluster.group import self_group

from granndis_hpc.preprocess.build.halo import full_khop
from granndis_hpc.preprocess.partition.twolevel import edge_cut, partition_servers
from granndis_hpc.preprocess.sources import add_source_arguments, load, load_from_args
from granndis_hpc.preprocess.sources.canonical import DataError
from granndis_hpc.preprocess.sources import synthetic, synthetic_chunks, synthetic_local

from tests.unit.test_sources_bundle import assert_reproducible_from_seed, graphs_equal
from tests.unit.test_sources_synthetic import nearest_class_mean_accuracy

SMALL = dict(generator="local", vertices=20_000, classes=4, seed=3)
# The locality targets are stated at 200k vertices (docs/performance/locality.md); the boundary of a 2-way
# cut shrinks relative to the graph like 1/sqrt(N), so at this size the bounds are a little looser.
MEDIUM = 50_000


def rows_per_vertex(g, parts, servers, hops):
    """{k: full k-hop preload rows summed over servers / vertices} for k = 1..hops."""
    rows = np.zeros(hops + 1, dtype=np.int64)
    for s in range(servers):
        _, hop = full_khop(g.indptr, g.indices, np.flatnonzero(parts == s), hops)
        rows += np.cumsum(np.bincount(hop, minlength=hops + 1))
    return rows[1:] / g.num_vertices


def digest(g) -> str:
    h = hashlib.sha256()
    for a in (g.indptr, g.indices, g.features, g.labels, g.train_mask, g.val_mask, g.test_mask):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def small():
    return load("synthetic", **SMALL)


@pytest.fixture(scope="module")
def medium_pair():
    """(graph, METIS 2-way partition) for both generators at the same size and degree."""
    out = {}
    for gen in ("local", "sbm"):
        g = load("synthetic", generator=gen, vertices=MEDIUM, seed=0)
        out[gen] = (g, partition_servers(self_group(), g, 2, "metis", 0))
    return out


def test_sbm_default_is_pinned():
    # Digest of the DC-SBM output of the chunk-native generators (their draws differ
    # from whole-graph generators', docs/performance/preprocess.md); a change to it changes every synthetic dataset,
    # say so in the docs.
    # Local-only options must not reach it.
    want = "69ca5548920fe5a335180235474e70d36908b9d2e97393fe78cf7a43d3a0c8f6"
    params = dict(vertices=3000, avg_degree=10, features=8, classes=3, seed=1)
    assert digest(load("synthetic", **params)) == want
    assert digest(load("synthetic", generator="sbm", cell_size=3, local_scale=7.0, long_range=0.5, **params)) == want


def test_reproducible_from_seed(small):
    assert_reproducible_from_seed(lambda **kw: load("synthetic", **kw), SMALL, small)
    # --homophily is the SBM's; the local graph's homophily comes from its geometry (documented).
    graphs_equal(load("synthetic", **dict(SMALL, homophily=0.1)), small)
    # Not the DC-SBM's draw under another name.
    sbm = load("synthetic", **dict(SMALL, generator="sbm"))
    assert sbm.num_edges != small.num_edges or not np.array_equal(sbm.indices, small.indices)


def test_chunked_generation_is_deterministic_and_local(monkeypatch):
    from granndis_hpc.preprocess.sources import synthetic_chunks

    monkeypatch.setattr(synthetic_chunks, "VERTEX_CHUNK", 700)
    monkeypatch.setattr(synthetic, "ROW_CHUNK", 333)
    params = dict(generator="local", vertices=3000, avg_degree=10, features=8, classes=3, seed=1, cell_size=4,
                  long_range=0.0)
    a, b = synthetic_chunks.generate_any(**params), synthetic_chunks.generate_any(**params)
    for key in ("src", "dst", "features", "labels", "train_mask", "cell", "community"):
        assert np.array_equal(a[key], b[key]), key
    dx, dy = torus_offsets(a)
    # Every chunk draws from the kernel (a chunk falling back to uniform partners would fail this).
    near = (dx <= 2) & (dy <= 2)
    for chunk in range(5):
        sl = a["src"] // 700 == chunk
        assert np.mean(near[sl]) > 0.85, (chunk, np.mean(near[sl]))


def torus_offsets(raw):
    side = raw["side"]
    cs, cd = raw["cell"][raw["src"]], raw["cell"][raw["dst"]]
    dx = np.abs(cs % side - cd % side)
    dy = np.abs(cs // side - cd // side)
    return np.minimum(dx, side - dx), np.minimum(dy, side - dy)


@pytest.mark.parametrize("long_range,local_scale", [(0.0, 1.0), (0.1, 1.0), (1.0, 1.0), (0.05, 0.0)])
def test_edge_kernel_and_long_range(long_range, local_scale):
    raw = synthetic_chunks.generate_any(generator="local", vertices=40_000, avg_degree=10, features=4, classes=4,
                                 seed=2, long_range=long_range, local_scale=local_scale)
    dx, dy = torus_offsets(raw)
    far = (dx > 12) | (dy > 12)  # beyond any kernel draw: 5 sigma x theta_max**0.1 = 10 cells
    side = raw["side"]
    uniform_far = 1 - (25 / side) ** 2  # share of a uniform partner's cells farther than 12 on some axis
    assert abs(far.mean() - long_range * uniform_far) < 0.01, (far.mean(), long_range)
    if local_scale == 0.0:  # no offset: every local draw stays in its cell
        own = np.mean((dx == 0) & (dy == 0))
        assert abs(own - (1 - long_range)) < 0.003, own  # 200k draws: binomial std 0.0005
    elif long_range == 0.0:
        near = (dx <= 1) & (dy <= 1)
        # Gaussian, sigma = 1 cell: 0.75 of the draws within one cell per axis; hubs reach wider.
        assert 0.55 < near.mean() < 0.8, near.mean()


def test_partner_is_uniform_inside_its_cell():
    # First endpoints follow theta (the degree tail); partners are uniform in their cell, so how often a
    # vertex is a partner does not follow how often it is a first endpoint (by theta: correlation 0.58).
    raw = synthetic_chunks.generate_any(generator="local", vertices=40_000, avg_degree=10, features=4, classes=4,
                                 seed=2, long_range=0.0)
    first, partner = np.bincount(raw["src"], minlength=40_000), np.bincount(raw["dst"], minlength=40_000)
    assert first.max() > 50 * first.mean()
    assert abs(np.corrcoef(first, partner)[0, 1]) < 0.15
    assert partner.max() < 10 * partner.mean()


def test_partitioner_finds_small_cut_and_thin_halos(medium_pair):
    (g, p), (gs, ps) = medium_pair["local"], medium_pair["sbm"]
    # The targets: a few percent cut, a 2-hop preload well under 1.5 rows per vertex at 200k vertices (measured
    # 1.6 %, 1.38); at 50k the boundary layer is twice as thick relative to the graph (measured 1.57).
    assert p.edge_cut_fraction < 0.04, p.edge_cut_fraction
    assert p.edge_cut_fraction < 0.4 * ps.edge_cut_fraction, (p.edge_cut_fraction, ps.edge_cut_fraction)
    rows, rows_sbm = rows_per_vertex(g, p.parts, 2, 3), rows_per_vertex(gs, ps.parts, 2, 3)
    assert rows[0] < 1.2 and rows[1] < 1.65, rows
    assert rows_sbm[1] > 1.95, rows_sbm  # the DC-SBM replicates everything by 2 hops
    assert np.all(np.diff(rows) > 0)  # the halo still grows with k (the graph is connected)


def test_ids_are_random_with_respect_to_position(small):
    # A partitioner must find the structure: contiguous id ranges cut about half of all edges.
    halves = (np.arange(small.num_vertices) >= small.num_vertices // 2).astype(np.int64)
    assert 0.45 < edge_cut(small.indptr, small.indices, halves) / small.num_edges < 0.55
    raw = synthetic_chunks.generate_any(generator="local", vertices=20_000)
    assert abs(np.corrcoef(np.arange(20_000), raw["cell"])[0, 1]) < 0.03


def test_degrees_heavy_tailed(medium_pair):
    deg = medium_pair["local"][0].in_degree()
    mean = deg.mean()
    # Realised degree after duplicate removal: most of the D = 25 draws survive.
    assert 0.8 * 25 < mean <= 25
    # A Poisson graph of this mean would top out near mean + 5 sqrt(mean) ~ 45.
    assert deg.max() > 20 * mean, deg.max()
    assert np.median(deg) < mean
    assert np.mean(deg > 5 * mean) > 0.003


def test_labels_homophilous_and_neighbours_carry_the_class(small):
    g = small
    rows = np.repeat(np.arange(g.num_vertices), np.diff(g.indptr))
    assert np.mean(g.labels[rows] == g.labels[g.indices]) > 0.8  # chance 0.25
    assert np.all(np.bincount(g.labels, minlength=4) > 0.1 * g.num_vertices)  # every class present
    import scipy.sparse as sp
    a = sp.csr_matrix((np.ones(g.num_edges, np.float32), g.indices, g.indptr), shape=(g.num_vertices,) * 2)
    inv = (1.0 / (g.in_degree() + 1)).astype(np.float32)[:, None]
    h1 = (a @ g.features + g.features) * inv
    own, hop1 = nearest_class_mean_accuracy(g, g.features), nearest_class_mean_accuracy(g, h1)
    assert own < 0.7 and hop1 > 0.9 and hop1 - own > 0.25, (own, hop1)


def test_patches_are_voronoi_regions_of_the_torus():
    side, k = 23, 9
    patch = synthetic_local.patches_of_cells(side, k, np.random.SeedSequence(7))
    assert np.array_equal(np.unique(patch), np.arange(k))
    seeds = np.random.default_rng(np.random.SeedSequence(7)).permutation(side * side)[:k]
    c = np.arange(side * side)

    def dist(a, b):
        d = np.abs(a[:, None] - b[None, :])
        return np.minimum(d, side - d)

    d2 = dist(c % side, seeds % side) ** 2 + dist(c // side, seeds // side) ** 2
    assert np.array_equal(d2[c, patch], d2.min(1))  # each cell in (one of) its nearest seed's patch
    raw = synthetic_chunks.generate_any(generator="local", vertices=5000, classes=3, communities=12)
    assert np.array_equal(np.unique(raw["community"]), np.arange(12))
    # labels are a function of the patch
    pairs = np.unique(np.stack([raw["community"], raw["labels"]], 1), axis=0)
    assert pairs.shape[0] == 12


def test_command_line_options_reach_the_generator():
    p = argparse.ArgumentParser()
    add_source_arguments(p)
    args = p.parse_args(["--generator", "local", "--vertices", "3000", "--avg-degree", "8", "--features", "4",
                         "--cell-size", "8", "--local-scale", "0.5", "--long-range", "0.01", "--seed", "2"])
    g = load_from_args(args)
    graphs_equal(g, load("synthetic", generator="local", vertices=3000, avg_degree=8, features=4, cell_size=8,
                         local_scale=0.5, long_range=0.01, seed=2))
    other = load("synthetic", generator="local", vertices=3000, avg_degree=8, features=4, cell_size=8,
                 local_scale=2.0, long_range=0.01, seed=2)
    assert other.num_edges != g.num_edges or not np.array_equal(other.indices, g.indices)
    with pytest.raises(SystemExit):
        p.parse_args(["--generator", "ring"])


@pytest.mark.parametrize("params,pattern", [
    (dict(generator="ring"), r"synthetic: invalid parameters: --generator 'ring' \(unknown\)\. (?=Fix: use one of "
                             r"sbm, local)"),
    (dict(cell_size=0.5), r"--cell-size 0.5 \(need >= 1"),
    (dict(vertices=3, cell_size=1), r"--cell-size 1.0 gives 4 cells for --vertices 3"),
    (dict(local_scale=-1.0), r"--local-scale -1.0"),
    (dict(local_scale=float("inf")), r"--local-scale inf"),
    (dict(long_range=1.5), r"--long-range 1.5 \(need 0..1\)"),
    (dict(vertices=1000, cell_size=100, classes=2, communities=20), r"--communities 20 \(more than the 9 cells"),
    (dict(classes=8, communities=4), r"--communities 4 \(need >= --classes 8"),
    (dict(vertices=1), r"--vertices 1"),
    (dict(feature_noise=-1.0), r"--feature-noise -1.0"),
    (dict(train_frac=0.7, val_frac=0.5), r"sum <= 1"),
])
def test_bad_parameters(params, pattern):
    params = dict(dict(generator="local"), **params)
    with pytest.raises(DataError, match=rf"{pattern}.*Fix:"):
        load("synthetic", **params)

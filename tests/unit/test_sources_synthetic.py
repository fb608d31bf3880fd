"""Synthetic DC-SBM: reproducible, heavy-tailed, homophilous, features that need neighbours, bad params."""
import numpy as np
import pytest
import scipy.sparse as sp

from granndis_hpc.preprocess.sources import load
from granndis_hpc.preprocess.sources.canonical import DataError
from granndis_hpc.preprocess.sources import synthetic, synthetic_chunks

from tests.unit.test_sources_bundle import assert_reproducible_from_seed

SMALL = dict(vertices=20_000, seed=3)


@pytest.fixture(scope="module")
def small():
    return load("synthetic", **SMALL)


def test_reproducible_from_seed(small):
    other = assert_reproducible_from_seed(lambda **kw: load("synthetic", **kw), SMALL, small)
    assert not np.array_equal(other.train_mask, small.train_mask)


def test_canonical_and_sizes(small):
    n, d = SMALL["vertices"], synthetic.DEFAULTS["avg_degree"]
    assert small.num_vertices == n and small.num_features == 100 and small.num_classes == 16
    # Draws are N*D/2 undirected pairs; duplicates among hubs and loops cost a few percent.
    assert 0.85 * n * d <= small.num_edges <= n * d
    rows = np.repeat(np.arange(n), np.diff(small.indptr))
    key = rows * n + small.indices
    assert np.all(np.diff(key) > 0)  # sorted, no duplicates
    assert np.array_equal(np.sort(small.indices * n + rows), key)  # symmetric
    assert not np.any(rows == small.indices)
    masks = np.stack([small.train_mask, small.val_mask, small.test_mask])
    assert np.all(masks.sum(0) == 1)
    assert masks.sum(1).tolist() == [2000, 2000, 16000]  # defaults 0.1 / 0.1 / rest


def test_degrees_heavy_tailed(small):
    deg = small.in_degree()
    mean = deg.mean()
    # A Poisson (Erdos-Renyi) graph of this mean would top out near mean + 5*sqrt(mean) ~ 50.
    assert deg.max() > 20 * mean
    assert np.median(deg) < mean  # right-skewed
    assert np.mean(deg > 5 * mean) > 0.005


def test_labels_follow_communities():
    raw = synthetic_chunks.generate_raw(vertices=8000, classes=4, communities=12, seed=5, homophily=0.9)
    comm, labels = raw["community"], raw["labels"]
    assert np.array_equal(labels, comm % 4)
    assert np.array_equal(np.unique(comm), np.arange(12))
    same_comm = np.mean(comm[raw["src"]] == comm[raw["dst"]])
    # homophily 0.9 inside + 1/12 of the rest by chance (weighted by community mass, so approx.).
    assert 0.88 < same_comm < 0.95
    g = load("synthetic", vertices=8000, classes=4, communities=12, seed=5, homophily=0.9)
    rows = np.repeat(np.arange(g.num_vertices), np.diff(g.indptr))
    assert np.mean(g.labels[rows] == g.labels[g.indices]) > 0.85  # chance would be ~0.25


def nearest_class_mean_accuracy(g, x):
    """Fit class means on the train split, test accuracy of the nearest mean (an MLP-like probe)."""
    mu = np.stack([x[g.train_mask & (g.labels == c)].mean(0) for c in range(g.num_classes)])
    xt = x[g.test_mask]
    d = (xt ** 2).sum(1)[:, None] - 2 * xt @ mu.T + (mu ** 2).sum(1)[None]
    return np.mean(d.argmin(1) == g.labels[g.test_mask])


def test_neighbours_carry_the_class_signal(small):
    g = small
    a = sp.csr_matrix((np.ones(g.num_edges, np.float32), g.indices, g.indptr), shape=(g.num_vertices,) * 2)
    inv = (1.0 / (g.in_degree() + 1)).astype(np.float32)[:, None]
    h1 = (a @ g.features + g.features) * inv
    own, hop1 = nearest_class_mean_accuracy(g, g.features), nearest_class_mean_accuracy(g, h1)
    assert own < 0.45 and hop1 > 0.85 and hop1 - own > 0.4, (own, hop1)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 1000, 4097, 65_537])
def test_feistel_is_a_bijection_and_inverts(n):
    from granndis_hpc.preprocess.sources.synthetic_chunks import Feistel

    f = Feistel(n, 7, 1)
    ids = np.arange(n)
    pos = f.forward(ids)
    assert np.array_equal(np.sort(pos), ids)  # a permutation of 0..n-1
    assert np.array_equal(f.inverse(pos), ids)
    if n >= 1000:  # random with respect to the ids, and keyed
        assert abs(np.corrcoef(ids, pos)[0, 1]) < 0.1
        assert not np.array_equal(Feistel(n, 8, 1).forward(ids), pos)


@pytest.mark.parametrize("generator", ["sbm", "local"])
def test_chunks_do_not_depend_on_the_rank_count(monkeypatch, generator):
    """A rank's share of the draws is a set of whole chunks, each from (seed, chunk) alone: the union over
    the ranks, and any slice of the vertex rows, is the same whatever the number of ranks."""
    from granndis_hpc.preprocess.sources import synthetic_chunks

    monkeypatch.setattr(synthetic_chunks, "VERTEX_CHUNK", 700)
    src = synthetic_chunks.SyntheticSource(generator, vertices=3000, avg_degree=10, features=8, classes=3, seed=1)
    assert src.num_chunks == 5
    whole = np.concatenate([np.stack(src.chunk_edges(i)) for i in range(5)], axis=1)
    nodes = src.nodes(0, 3000)
    for size in (1, 2, 3, 4, 8):
        pieces = [np.stack([s, d]) for r in range(size) for _, s, d in src.edge_pieces(r, size)]
        assert np.array_equal(np.concatenate(pieces, axis=1), whole), size
        bounds = (np.arange(size + 1) * 3000) // size
        for f in ("features", "labels", "train_mask", "val_mask", "test_mask"):
            parts = [src.nodes(int(bounds[r]), int(bounds[r + 1]))[f][0][1] for r in range(size)]
            assert np.array_equal(np.concatenate(parts), nodes[f][0][1]), (size, f)
    g = load("synthetic", generator=generator, vertices=3000, avg_degree=10, features=8, classes=3, seed=1)
    rows = np.repeat(np.arange(3000), np.diff(g.indptr))
    assert 0.85 * 30_000 <= g.num_edges <= 1.1 * 30_000
    assert np.mean(g.labels[rows] == g.labels[g.indices]) > 0.75
    # Noise around each class centroid keeps its configured scale in every chunk, independently.
    centroids = np.stack([g.features[g.labels == c].mean(0) for c in range(3)])
    noise = g.features - centroids[g.labels]
    assert abs(noise[:700].std() - synthetic.DEFAULTS["feature_noise"]) < 0.6
    assert abs(noise[-300:].std() - synthetic.DEFAULTS["feature_noise"]) < 0.6
    assert abs(np.corrcoef(noise[:700].ravel(), noise[700:1400].ravel())[0, 1]) < 0.05


@pytest.mark.parametrize("params,pattern", [
    (dict(vertices=1), r"--vertices 1"),
    (dict(avg_degree=0), r"--avg-degree 0"),
    (dict(features=0), r"--features 0"),
    (dict(classes=8, communities=4), r"--communities 4 \(need >= --classes 8"),
    (dict(vertices=10, classes=2, communities=11), r"more than --vertices"),
    (dict(train_frac=0.0), r"--train-frac 0.0"),
    (dict(train_frac=0.7, val_frac=0.5), r"sum <= 1"),
    (dict(homophily=1.5), r"--homophily 1.5"),
    (dict(feature_noise=-1.0), r"--feature-noise -1.0"),
])
def test_bad_parameters(params, pattern):
    with pytest.raises(DataError, match=rf"synthetic: invalid parameters:.*{pattern}.*Fix:"):
        load("synthetic", **params)

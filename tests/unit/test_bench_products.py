"""bench/bench_products.py's own logic at toy size: the synthetic graph has ogbn-products' statistics,
the one-machine reference trains exactly the train-induced graph, and the page says what fits."""
import numpy as np
import scipy.sparse as sp

import products_page  # noqa: E402  (bench/ is on pytest's pythonpath: pyproject.toml)
import products_ref
from granndis_hpc.preprocess.sources.synthetic_chunks import load_synthetic


def _graph(n):
    return load_synthetic(symmetrize=True, self_loops="add", **products_ref.graph_params(n))


def test_the_synthetic_graph_has_products_statistics():
    n = 20_000
    g = _graph(n)
    P = products_ref.PRODUCTS
    assert g.num_features == P["features"] and g.num_classes == P["classes"]
    assert set(np.unique(g.labels)) == set(range(P["classes"]))
    deg = np.diff(g.indptr) - 1  # without the self loop the preset adds
    products_degree = P["edges"] / P["vertices"]  # 25.3 directed edges per vertex
    assert abs(deg.mean() / products_degree - 1) < 0.05, deg.mean()
    # split sizes in products' proportions (~196 k train, ~39 k val of 2.45 M)
    assert abs(int(g.train_mask.sum()) - n * P["train"] / P["vertices"]) <= 2
    assert abs(int(g.val_mask.sum()) - n * P["val"] / P["vertices"]) <= 2
    assert not (g.train_mask & g.val_mask).any() and (g.train_mask | g.val_mask | g.test_mask).all()
    # power-law degrees: a heavy tail far above the median, unlike a Poisson graph of the same mean
    assert deg.max() > 8 * np.median(deg) and np.percentile(deg, 99) > 3 * np.median(deg)


def test_induced_csr_is_the_induced_subgraph():
    rng = np.random.default_rng(3)
    n = 300
    a = sp.random(n, n, density=0.05, random_state=4, format="csr")
    a.data[:] = 1
    a = a.tocsr()
    a.sort_indices()
    keep = rng.random(n) < 0.3
    indptr, indices = products_ref.induced_csr(a.indptr.astype(np.int64), a.indices.astype(np.int64), keep)
    want = a[keep][:, keep].tocsr()
    want.sort_indices()
    assert np.array_equal(indptr, want.indptr) and np.array_equal(indices, want.indices)


def test_reference_trains_the_train_induced_graph():
    n = 3_000
    g = _graph(n)
    res = products_ref.reference(n, epochs=1)
    train = g.train_mask
    dst = np.repeat(np.arange(n), np.diff(g.indptr))
    assert res["train_vertices"] == int(train.sum())
    assert res["train_edges"] == int((train[dst] & train[g.indices]).sum())
    assert res["full_graph"] == {"vertices": n, "edges": g.num_edges}
    assert len(res["epoch_s"]) == 1 and all(np.isfinite(res["loss"]))


def test_the_memory_table_compares_each_mode_with_plan():
    gib = 2**30
    records = {"plan": {"fb": {"peak_bytes": 2 * gib}, "flx": {"peak_bytes": 2 * gib}},
               "train": [{"label": "1gbit", "runs": {"fb": {"peak_rss": [gib, 2.2 * gib, gib, gib]},
                                                      "flx": {"peak_rss": [3 * gib, gib, gib, gib]}}}]}
    rows = products_page._memory_table(records, ["fb", "flx"])
    assert rows[2].startswith("| fb | 2.00 |") and rows[2].endswith("| 1.10 | yes |")
    assert rows[3].startswith("| flx | 2.00 |") and rows[3].endswith("| 1.50 | no |")

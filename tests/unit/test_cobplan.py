"""Co-batch plans over the fixed per-rank structure (engine/cobplan.py) against the planner's
exchange-based path, run for every GPU of a server in one process: the same rows, edges, halo tables,
degrees and, without any communication, the send lists the peers' requests would have produced."""
import numpy as np
import pytest

from granndis_hpc.engine import cobplan
from granndis_hpc.graph import planner
from granndis_hpc.graph.csr import csr_from_edges, csr_rows, owner_of, position_lookup
from granndis_hpc.graph.sampler import CoBatchSampler

L, G = 3, 3


def _server(n=240, m=1800, seed=0):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    key = np.unique(src * n + dst)  # self loops included: they count in degrees
    indptr, indices = csr_from_edges(key // n, key % n, n)
    offsets = np.array([0, 70, 150, n])
    return {"indptr": indptr, "indices": indices, "offsets": offsets,
            "in_degree": np.diff(indptr) + rng.integers(0, 3, n),  # global degrees exceed the server's
            "global_id": rng.permutation(10 * n)[:n], "features": rng.standard_normal((n, 5)).astype(np.float32),
            "train": rng.random(n) < 0.3, "hop": np.zeros(n, np.int32)}


def _reference(g, sg, offsets, exact):
    """Every GPU's plan the way the engine planned co-batches before: build_halo, then each owner
    resolves the keys its peers request (the all-to-all simulated here), then build_plan."""
    rows = []
    for gpu in range(G):
        owner = owner_of(offsets, sg.vertices)
        mine = np.flatnonzero(owner == gpu)
        ids = sg.vertices[mine]
        ip, src = csr_rows(sg.indptr, sg.indices, mine)
        src_owner = owner_of(offsets, src)
        own_pos = position_lookup(ids)(src)
        table, sources = planner.build_halo(G, src_owner == gpu, own_pos, src_owner, src,
                                            sg.hop[sg.position_of(src)])
        rows.append((ids, ip, sources, table, sg.hop[mine]))
    plans = []
    for gpu, (ids, ip, sources, table, hop) in enumerate(rows):
        asked = [t.key[t.peer == gpu] for _, _, _, t, _ in rows]
        send_pos = planner.resolve_requests(np.concatenate(asked), position_lookup(ids))
        degree = g["in_degree"][ids] if exact else np.diff(ip)
        plans.append((ids, table, planner.build_plan(
            hop, ip, sources, table, send_pos, np.array([a.size for a in asked]), L,
            complete_degree=degree if exact else None)))
    return plans


@pytest.mark.parametrize("fanout", [-1, 4])
def test_cooperative_plans_equal_the_exchange_based_planner(fanout):
    g = _server()
    exact = fanout < 0
    train = np.flatnonzero(g["train"])
    smp = CoBatchSampler(g["indptr"], g["indices"], train, batches=2, layers=L, fanout=fanout, seed=3, server=0)
    draw = smp.draw(smp.epoch_targets(1)[1], 1, 1)
    sg = draw.to_sampled(g["indptr"], g["indices"])
    # An exact plan checks that computed rows have all their global in-edges: give it the server's.
    if exact:
        g["in_degree"] = np.diff(g["indptr"])
    index = cobplan.ServerIndex(g, L, exact=exact)
    kept = np.diff(sg.indptr)  # kept in-edges per sample row
    loops = np.array([np.sum(sg.indices[sg.indptr[i]:sg.indptr[i + 1]] == v) for i, v in enumerate(sg.vertices)])
    by_vertex = dict(zip(sg.vertices.tolist(), zip(kept.tolist(), loops.tolist())))
    for gpu, (ids, table, ref) in enumerate(_reference(g, sg, g["offsets"], exact)):
        hp = cobplan.cooperative_plan(index, draw, gpu, {})
        np.testing.assert_array_equal(hp.ids, ids)
        np.testing.assert_array_equal(hp.halo_ids, table.key)
        np.testing.assert_array_equal(hp.plan.halo.peer, table.peer)
        np.testing.assert_array_equal(hp.plan.full_send_index, ref.full_send_index)
        np.testing.assert_array_equal(hp.plan.full_send_counts, ref.full_send_counts)
        for mine, want in zip(hp.plan.layers, ref.layers):
            for name in ("send_index", "send_counts", "recv_counts", "indptr", "indices", "halo_rows"):
                np.testing.assert_array_equal(getattr(mine, name), getattr(want, name), err_msg=name)
            assert (mine.n_own_in, mine.n_dst) == (want.n_own_in, want.n_dst)
        # Degrees as the owner would have sent them: global (exact) or kept, minus stored self loops.
        deg = [g["in_degree"][v] if exact else by_vertex[v][0] for v in table.key.tolist()]
        np.testing.assert_array_equal(hp.halo_degree, np.array(deg) - [by_vertex[v][1] for v in table.key.tolist()])
        np.testing.assert_array_equal(hp.loops, [by_vertex[v][1] for v in ids.tolist()])
        np.testing.assert_array_equal(hp.features, g["features"][ids])
        np.testing.assert_array_equal(hp.halo_features, g["features"][table.key])
        np.testing.assert_array_equal(hp.row_ids, g["global_id"][ids])


def test_per_gpu_plan_is_the_whole_dependency_graph_without_halo():
    g = _server(seed=1)
    train = np.flatnonzero(g["train"])
    smp = CoBatchSampler(g["indptr"], g["indices"], train, batches=1, layers=L, fanout=3, seed=0, server=0)
    draw = smp.draw(train[train < 70], 0, 0)
    sg = draw.to_sampled(g["indptr"], g["indices"])
    hp = cobplan.per_gpu_plan(cobplan.ServerIndex(g, L, exact=False), draw, {})
    np.testing.assert_array_equal(hp.ids, sg.vertices)
    assert hp.halo_ids.size == 0 and all(lp.recv_counts.sum() == 0 for lp in hp.plan.layers)
    first = hp.plan.layers[0]
    n = first.n_dst
    np.testing.assert_array_equal(first.indptr, sg.indptr[: n + 1])
    np.testing.assert_array_equal(first.indices, sg.position_of(sg.indices[: sg.indptr[n]]))
    np.testing.assert_array_equal(hp.degree, np.diff(sg.indptr))


def test_prepared_matrices_are_the_lazily_built_ones():
    """The loader builds a co-batch's aggregation matrices ahead (LayerGraph.prepare with the keys an
    earlier graph built): they must be the matrices the step would have built itself."""
    import torch

    from granndis_hpc.nn.graph import aggregate

    g = _server(seed=2)
    train = np.flatnonzero(g["train"])
    smp = CoBatchSampler(g["indptr"], g["indices"], train, batches=1, layers=L, fanout=4, seed=0, server=0)
    draw = smp.draw(train, 0, 0)
    index = cobplan.ServerIndex(g, L, exact=False)
    lazy = cobplan.layer_graphs(cobplan.cooperative_plan(index, draw, 1, {}), torch.device("cpu"))
    ahead = cobplan.layer_graphs(cobplan.cooperative_plan(index, draw, 1, {}), torch.device("cpu"))
    h = torch.randn(lazy[0].n_src, 4, requires_grad=True)
    aggregate(lazy[0], h, "mean").sum().backward()  # builds the forward and the transposed matrix
    keys = lazy[0].cache_keys()
    assert len(keys) == 2
    cobplan.prepare_matrices(ahead, [(0, key) for key in keys])
    for key in keys:
        a, b = lazy[0]._cache[key], ahead[0]._cache[key]
        assert torch.equal(a.to_dense(), b.to_dense())
    # Per layer: the keys of layer 0's graph only on layer 0's graph (the others aggregate differently).
    assert [len(gr.cache_keys()) for gr in ahead] == [2] + [0] * (len(ahead) - 1)

"""The planner against a brute-force reference: G ranks of one server simulated in one process.

For every rank and layer, the sources the plan wires to each computed row must be exactly the row's
in-neighbours in the whole graph (full preload => exact), computed rows must be exactly those with
hop <= L-1-l, and what an owner sends must be, in order, what the reader expects to receive."""
from types import SimpleNamespace

import numpy as np
import pytest

from granndis_hpc.engine import views
from granndis_hpc.graph import planner
from granndis_hpc.graph.csr import csr_from_edges, csr_rows


def random_graph(n, m, rng):
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = src != dst
    src, dst = np.concatenate([src[keep], dst[keep]]), np.concatenate([dst[keep], src[keep]])
    key = np.unique(src * n + dst)
    return csr_from_edges(key // n, key % n, n)


def bfs_hops(indptr, indices, seeds, n, max_hops):
    hop = np.full(n, -1)
    hop[seeds] = 0
    frontier = np.asarray(seeds)
    for h in range(1, max_hops + 1):
        nbrs = np.unique(np.concatenate([indices[indptr[v]:indptr[v + 1]] for v in frontier] + [np.empty(0, int)]))
        new = nbrs[hop[nbrs] < 0]
        hop[new] = h
        frontier = new
    return hop


def server_layout(indptr, indices, inner, G, L, rng):
    """One server's preloaded rows, split over G GPUs, as RankSlice-like objects (format v1 order)."""
    n = indptr.shape[0] - 1
    hop = bfs_hops(indptr, indices, inner, n, L)
    members = np.flatnonzero(hop >= 0)
    owner = rng.integers(0, G, members.size)
    order = np.lexsort((members, hop[members], owner))
    gids, owner = members[order], owner[order]
    offsets = np.searchsorted(owner, np.arange(G + 1))
    local = np.full(n, -1)
    local[gids] = np.arange(gids.size)
    sub_ip, sub_ix = csr_rows(indptr, indices, gids)
    # Induced subgraph in server-local ids.
    keep = local[sub_ix] >= 0
    dst_row = np.repeat(np.arange(gids.size), np.diff(sub_ip))[keep]
    s_ip, s_ix = csr_from_edges(local[sub_ix[keep]], dst_row, gids.size)
    deg = np.diff(indptr)
    slices = []
    for g in range(G):
        rows = np.arange(offsets[g], offsets[g + 1])
        ip, ix = csr_rows(s_ip, s_ix, rows)
        slices.append(SimpleNamespace(
            gpu=g, global_id=gids[rows], hop=hop[gids[rows]], indptr=ip, indices=ix,
            server_offsets=offsets, server_hop=hop[gids], in_degree=deg[gids[rows]],
            features=np.zeros((rows.size, 1), np.float32), n_inner=int((hop[gids[rows]] == 0).sum())))
    return slices


def plan_server(slices, L, exact=True):
    G = len(slices)
    rows = [views.server_rows(s, exact_degrees=True) for s in slices]
    tables = [planner.build_halo(G, r.is_own, r.own_pos, r.peer, r.key, r.src_hop) for r in rows]
    # The request exchange, done by hand: what rank q asks of rank p.
    plans = []
    for p in range(G):
        asked = [tables[q][0].key[tables[q][0].peer == p] for q in range(G)]
        counts = np.array([a.size for a in asked])
        pos = planner.resolve_requests(np.concatenate(asked), views.key_resolver_server(slices[p].global_id.size))
        plans.append(planner.build_plan(rows[p].hop, rows[p].indptr, tables[p][1], tables[p][0], pos, counts, L,
                                        complete_degree=slices[p].in_degree if exact else None))
    return plans, tables


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_plan_wires_exact_neighbourhoods(seed):
    rng = np.random.default_rng(seed)
    n, G, L = 300, 3, 3
    indptr, indices = random_graph(n, 700, rng)
    inner = np.sort(rng.choice(n, 40, replace=False))
    slices = server_layout(indptr, indices, inner, G, L, rng)
    plans, tables = plan_server(slices, L)
    for g, (sl, plan) in enumerate(zip(slices, plans)):
        table = tables[g][0]
        halo_gid = np.array([slices[p].global_id[k] for p, k in zip(table.peer, table.key)], dtype=np.int64)
        for l, lp in enumerate(plan.layers):
            # Computed rows: exactly those with hop <= L-1-l; inputs: hop <= L-l.
            assert lp.n_dst == int((sl.hop <= L - 1 - l).sum())
            assert lp.n_own_in == int((sl.hop <= L - l).sum())
            assert np.all(table.hop[lp.halo_rows] <= L - l)
            assert lp.halo_rows.size == int((table.hop <= L - l).sum())
            col_gid = np.concatenate([sl.global_id[:lp.n_own_in], halo_gid[lp.halo_rows]])
            for i in range(lp.n_dst):
                got = np.sort(col_gid[lp.indices[lp.indptr[i]:lp.indptr[i + 1]]])
                v = sl.global_id[i]
                np.testing.assert_array_equal(got, np.sort(indices[indptr[v]:indptr[v + 1]]))
            # What each owner sends at this layer is, in order, what this rank receives from it.
            for p in range(G):
                lq = plans[p].layers[l]
                start = int(lq.send_counts[:g].sum())
                sent = slices[p].global_id[lq.send_index[start:start + lq.send_counts[g]]]
                recv_from_p = halo_gid[lp.halo_rows][table.peer[lp.halo_rows] == p]
                np.testing.assert_array_equal(sent, recv_from_p)
                assert lq.send_counts[g] == lp.recv_counts[p]


def test_unsorted_rows_and_missing_hops_are_refused():
    rng = np.random.default_rng(5)
    indptr, indices = random_graph(100, 250, rng)
    slices = server_layout(indptr, indices, np.arange(10), 2, 2, rng)
    with pytest.raises(planner.PlanError, match="not active"):
        plan_server(slices, 3)  # a 2-hop preload cannot serve 3 layers exactly
    rows = views.server_rows(slices[0], exact_degrees=True)
    table, src = planner.build_halo(2, rows.is_own, rows.own_pos, rows.peer, rows.key, rows.src_hop)
    with pytest.raises(planner.PlanError, match="sorted by hop"):
        planner.build_plan(rows.hop[::-1].copy(), rows.indptr, src, table, np.empty(0, np.int64),
                           np.zeros(2, np.int64), 2)

"""`build --hops auto` from the build ranks' slices under `mpirun -n 4`, P = 1, 2, 4.

preprocess/plan/halo_counts.py counts every candidate depth's rows with the distributed BFS of the sliced
build, no rank holding the graph.  For the same inputs and P it must give the options, the chosen k and
the printed reasons of the whole-graph plan (plan_sets.plan_options on the assembled graph), and its
row counts must equal an independent single-process count written here with scipy (a k-hop ball by
sparse frontier products, the induced subgraph by slicing, the halos as distinct index pairs).  Cases:
real Cora and a synthetic graph, both read from chunked directories.
"""
import os
import shutil

import numpy as np
import pytest
import scipy.sparse as sps
from mpi4py import MPI
from tests.mpi.conftest import on_every_rank, on_rank0, shared_tmpdir

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
SYNTH = dict(generator="sbm", vertices=1500, avg_degree=8, features=6, classes=3, seed=2)
S, G, L = 2, 2, 3


@pytest.fixture(scope="module")
def chunk_dirs(cora):
    """Cora and the synthetic graph written as 3 edge and 3 node chunks (on rank 0)."""
    from granndis_hpc.preprocess.formats.chunked import graph_pieces, write_chunked
    from granndis_hpc.preprocess.sources import load

    base = shared_tmpdir("granndis-hops-auto-")
    graphs = {"cora": cora, "synthetic": load("synthetic", **SYNTH)}

    def write():
        for name, g in graphs.items():
            e, n = graph_pieces(g, 3)
            write_chunked(os.path.join(base, name), name=g.name, num_vertices=g.num_vertices,
                          num_features=g.num_features, num_classes=g.num_classes, edge_pieces=e, node_pieces=n)
    on_rank0(write)
    yield {name: (os.path.join(base, name), g) for name, g in graphs.items()}
    WORLD.barrier()
    if WORLD.rank == 0:
        shutil.rmtree(base, ignore_errors=True)


def _config(partitioner, budget=None):
    from granndis_hpc.preprocess.plan.command import PlanConfig

    return PlanConfig(servers=S, gpus_per_server=G, layers=L, hidden=16, device="cpu", partitioner=partitioner,
                      seed=1, ks=[0, 1, 2, 3], eas=False, budget=budget)


def _reference_rows(graph, server_of, gpu_of, k):
    """Independent count: (world rows, server-view rows by layer) of every rank r = s*G + g for a k-hop
    full preload, from the whole graph with scipy.  Owners of the preloaded rows follow the build's rule
    (owners.assign_owners, tested on its own in tests/unit), applied to the induced subgraph made here."""
    from granndis_hpc.preprocess.partition.owners import assign_owners

    n = graph.num_vertices
    A = sps.csr_matrix((np.ones(graph.indices.shape[0], dtype=np.int8), graph.indices, graph.indptr), shape=(n, n))
    rank_of = server_of.astype(np.int64) * G + gpu_of
    v, u = A.nonzero()  # edge u -> v
    deg = np.asarray(A.sum(axis=1)).ravel().astype(np.int64)
    cross = rank_of[u] != rank_of[v]
    pairs = np.unique(np.stack([rank_of[v][cross], u[cross]], axis=1), axis=0)
    world = {}
    for r in range(S * G):
        mine = pairs[pairs[:, 0] == r, 1]
        world[r] = dict(n_inner=int(np.count_nonzero(rank_of == r)), nnz=int(deg[rank_of == r].sum()),
                        halo=int(mine.shape[0]), inter=int(np.count_nonzero(server_of[mine] != r // G)),
                        sent=int(np.count_nonzero(rank_of[pairs[:, 1]] == r)),
                        train=int(np.count_nonzero(graph.train_mask & (rank_of == r))))
    views = {}
    for s in range(S):
        hop = np.full(n, -1)
        hop[server_of == s] = 0
        frontier = (server_of == s).astype(np.int8)
        for t in range(1, k + 1):  # frontier @ A^T: the in-neighbours of the frontier
            reached = np.asarray(A.T @ frontier).ravel() > 0
            new = reached & (hop < 0)
            hop[new] = t
            frontier = new.astype(np.int8)
        verts = np.flatnonzero(hop >= 0)
        verts = verts[np.lexsort((verts, hop[verts]))]
        sub = A[verts][:, verts].tocsr()
        sub.sort_indices()
        h = hop[verts]
        owner = assign_owners(sub.indptr.astype(np.int64), sub.indices.astype(np.int64), h,
                              gpu_of[verts].astype(np.int32), G)
        dst, src = sub.nonzero()
        pair = np.unique(np.stack([owner[dst], src], axis=1)[owner[src] != owner[dst]], axis=0)
        for g in range(G):
            rows = []
            for l in range(k):
                lim_in, lim_out = k - l, k - 1 - l
                own_in = (owner == g) & (h <= lim_in)
                out_rows = (owner == g) & (h <= lim_out)
                halo = pair[(pair[:, 0] == g) & (h[pair[:, 1]] <= lim_in)]
                sent = pair[(owner[pair[:, 1]] == g) & (h[pair[:, 1]] <= lim_in)]
                rows.append((int(own_in.sum()), int(halo.shape[0]), int(out_rows.sum()),
                             int(np.isin(dst, np.flatnonzero(out_rows)).sum()), int(sent.shape[0])))
            views[s * G + g] = (int(np.count_nonzero(owner == g)), int(np.count_nonzero(pair[:, 0] == g)),
                                int(np.count_nonzero(owner[pair[:, 1]] == g)), rows)
    return world, views


def _check_against_reference(rows_by_k, graph, server_of, gpu_of):
    for k, rows in rows_by_k.items():
        world, views = _reference_rows(graph, server_of, gpu_of, k)
        assert [r.rank for r in rows] == list(range(S * G))
        for r in rows:
            w = world[r.rank]
            wl = r.world.layers[0]
            assert (r.n_inner, r.n_train, wl.nnz, r.world.n_halo, r.world.inter_halo, r.world.n_send) == (
                w["n_inner"], w["train"], w["nnz"], w["halo"], w["inter"], w["sent"]), (k, r.rank)
            if k == 0:
                assert r.server is None
                continue
            n_own, n_halo, n_send, layers = views[r.rank]
            assert (r.server.n_own, r.server.n_halo, r.server.n_send) == (n_own, n_halo, n_send), (k, r.rank)
            assert [(x.n_own_in, x.n_halo, x.n_dst, x.nnz, x.n_send) for x in r.server.layers] == layers, (k, r.rank)


def on_slices(case, chunk_dirs, monkeypatch, check):
    """check(comm, part, whole) for P = 1, 2, 4: comm the first P world ranks, part this rank's slice of
    the case's chunked directory (load_slice), whole the graph in one piece; a failure on any rank
    fails every rank.  The synthetic case counts in several blocks of pair keys per rank (a few
    thousand edges each)."""
    import granndis_hpc.preprocess.plan.halo_counts as hc

    if case == "synthetic":
        monkeypatch.setattr(hc, "EDGES_PER_BLOCK", 1000)
    for P in (1, 2, 4):
        on_every_rank(lambda: _on_slice(P, *chunk_dirs[case], check), f"P={P} ")


def _on_slice(P, path, whole, check):
    from granndis_hpc.preprocess.formats.chunked import ChunkedSource, open_chunked
    from granndis_hpc.preprocess.build.sliced import load_slice

    comm = WORLD.Split(0 if WORLD.rank < P else MPI.UNDEFINED, WORLD.rank)
    if comm == MPI.COMM_NULL:
        return
    try:
        part = load_slice(comm, ChunkedSource(open_chunked(path)))
        assert part.hi - part.lo < whole.num_vertices or P == 1  # a slice, not the graph
        check(comm, part, whole)
    finally:
        comm.Free()


def _check_auto(case):
    def check(comm, part, whole):
        from granndis_hpc import memory_model as mm
        from granndis_hpc.preprocess.plan.sets import plan_options

        cfg = _config("parmetis" if case == "cora" else "metis")
        result, whole_result = plan_options(comm, part, cfg), plan_options(comm, whole, cfg)
        got, ref = result["options"], whole_result["options"]
        assert [o.to_dict() for o in got] == [o.to_dict() for o in ref]
        assert result["partition"] == whole_result["partition"]
        # (plan_options gathers the loads on rank 0; the counts have them on every rank)
        assert comm.bcast(result["server_loads"] == whole_result["server_loads"] if comm.rank == 0 else None)
        by = {o.label: o.peak for o in ref}
        # Budgets around each depth's peak, and below all: the same decision (k, rejected, reason).
        for budget in (by["flx k=1"] + 1, by["flx k=2"] + 1, by["flx k=3"] + 1, min(by.values()) // 2):
            flx = [o for o in got if o.mode == "flx"]
            assert mm.choose(flx, budget).to_dict() == mm.choose([o for o in ref if o.mode == "flx"], budget).to_dict()
        # The counts themselves against the scipy count on the whole graph (for the partition this P made;
        # that it is the whole-graph build's, tests/mpi/test_dist_build.py checks, and the options above).
        counted = result["counted"]
        on_rank0(lambda: _check_against_reference(counted.rows, whole, counted.partition.parts, counted.gpu_of),
                 comm)
    return check


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", ["cora", "synthetic"])
def test_hops_auto_from_slices_equals_whole_graph(case, chunk_dirs, monkeypatch):
    on_slices(case, chunk_dirs, monkeypatch, _check_auto(case))


@pytest.mark.timeout(240)
def test_build_hops_auto_cli_on_slices(chunk_dirs, capfd):
    """`mpirun -n 4 granndis preprocess build --source chunked ... --hops auto` (in process, on the
    4-rank world): the sliced build prints and records the decision the whole-graph path
    makes (auto_hops on the whole graph: the same record, the same reason); a budget too small for any
    depth fails every rank with exit status 1, the message printed once (rank 0), nothing written."""
    import dataclasses
    import json

    from granndis_hpc.preprocess.__main__ import main
    from granndis_hpc.preprocess.plan.command import PlanConfig, auto_hops
    from granndis_hpc.preprocess.plan.sets import plan_options

    path, whole = chunk_dirs["cora"]
    base = os.path.dirname(path)
    common = ["build", "--source", "chunked", "--path", path, "--servers", str(S), "--gpus-per-server", str(G),
              "--layers", str(L), "--hidden", "16", "--device", "cpu", "--seed", "1", "--hops", "auto"]
    cfg = PlanConfig(servers=S, gpus_per_server=G, layers=L, hidden=16, device="cpu", seed=1)
    by = {o.label: o.peak for o in plan_options(WORLD, whole, dataclasses.replace(cfg, ks=[1, 2, 3], eas=False))[
        "options"]}
    budget = by["flx k=2"] + 1
    ref = auto_hops(WORLD, whole, dataclasses.replace(cfg, budget=budget))
    capfd.readouterr()
    rc = main(common + ["--memory-per-gpu", str(budget), "--out", os.path.join(base, "cli-sliced")])
    out = capfd.readouterr().out
    assert rc == 0
    lines = [x for x in out.splitlines() if "--hops auto: k =" in x]
    if WORLD.rank == 0:
        assert len(lines) == 1 and "k = 2" in lines[0] and lines[0].endswith(ref.reason), lines
        manifest = json.load(open(os.path.join(base, "cli-sliced", "manifest.json")))
        assert manifest["hops_auto"] == ref.to_dict() and manifest["preload"]["hops"] == 2
    else:
        assert not lines
    rc = main(common + ["--memory-per-gpu", "1KiB", "--out", os.path.join(base, "cli-small")])
    err = capfd.readouterr().err
    assert rc == 1 and not os.path.exists(os.path.join(base, "cli-small", "manifest.json"))
    said = [x for x in err.splitlines() if "too small for any full preload" in x]
    assert len(said) == (1 if WORLD.rank == 0 else 0), err
    # More GPUs than vertices: refused by the counts' own check, the same way.
    bad = list(common)
    bad[bad.index("--servers") + 1] = "2000"
    rc = main(bad + ["--memory-per-gpu", "1GiB", "--out", os.path.join(base, "cli-bad")])
    err = capfd.readouterr().err
    said = [x for x in err.splitlines() if "every GPU needs at least one inner vertex" in x]
    assert rc == 1 and len(said) == (1 if WORLD.rank == 0 else 0), err
    assert not os.path.exists(os.path.join(base, "cli-bad", "manifest.json"))

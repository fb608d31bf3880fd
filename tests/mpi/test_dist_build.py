"""The distributed build under `mpirun -n 4`, on sub-communicators of P = 1, 2, 4 ranks.

For the same inputs, seed, layout, partitioner and P, the build from the ranks' slices
(sliced.load_slice + dist_build.run_build_sliced) must give the same partition digest and
byte-identical server files as the whole-graph build (build.build_shards, every rank holding the whole
graph loaded by the independent whole-graph loaders), and the content digest computed from the slices
must equal build.dataset_digest of the whole graph, for any P.  Cases: real Cora read from a chunked
directory (ParMETIS, full 2-hop) and the chunk-native synthetic `local` generator (METIS, EAS)."""
import filecmp
import os
import shutil

import pytest
from mpi4py import MPI
from tests.mpi.conftest import on_every_rank, on_rank0, shared_tmpdir

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
SYNTH = dict(generator="local", vertices=6000, avg_degree=10, features=8, classes=4, seed=5)


@pytest.fixture(scope="module")
def base():
    path = shared_tmpdir("granndis-dist-")
    yield path
    WORLD.barrier()
    if WORLD.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def cora_chunks(base, cora):
    """Cora written as 3 edge and 3 node chunks (on rank 0)."""
    from granndis_hpc.preprocess.formats.chunked import graph_pieces, write_chunked

    out = os.path.join(base, "cora-chunks")

    def write():
        e, n = graph_pieces(cora, 3)
        write_chunked(out, name=cora.name, num_vertices=cora.num_vertices, num_features=cora.num_features,
                      num_classes=cora.num_classes, edge_pieces=e, node_pieces=n)
    on_rank0(write)
    return out


def _sub(P):
    return WORLD.Split(0 if WORLD.rank < P else MPI.UNDEFINED, WORLD.rank)


def _compare(comm, a, b, S):
    """On every rank of comm: are the server files of sets a and b byte-identical (checked on rank 0)?"""
    same = None
    if comm.rank == 0:
        same = all(filecmp.cmp(os.path.join(a, f"server-{s:04d}.h5"), os.path.join(b, f"server-{s:04d}.h5"),
                               shallow=False) for s in range(S))
    return comm.bcast(same)


def _run_case(P, base, case, cora_chunks, tag=""):
    from granndis_hpc.preprocess.build.pipeline import BuildConfig, build_shards, dataset_digest
    from granndis_hpc.preprocess.formats.chunked import ChunkedSource, open_chunked
    from granndis_hpc.preprocess.build.distributed import run_build_sliced
    from granndis_hpc.preprocess.build.sliced import load_slice, slice_digest
    from granndis_hpc.preprocess.sources import load
    from granndis_hpc.preprocess.sources.synthetic_chunks import SyntheticSource
    from tests.conftest import require_planetoid

    comm = _sub(P)
    if comm == MPI.COMM_NULL:
        return None
    try:
        if case == "cora":
            source = ChunkedSource(open_chunked(cora_chunks))
            whole = load("planetoid", name="cora", root=str(require_planetoid()))
            # Blocks of 128 rows: the locality order's METIS calls (on one rank per part) run in both builds.
            opts = dict(preload="full", layers=2, partitioner="parmetis", row_block_rows=128)
        else:
            source = SyntheticSource(**SYNTH)
            whole = load("synthetic", **SYNTH)
            opts = dict(preload="eas", layers=3, hops=2, fanout=4, partitioner="metis", row_block_rows=128)
        part = load_slice(comm, source)
        assert slice_digest(comm, part) == dataset_digest(whole)
        out = os.path.join(base, f"{case}-P{P}{tag}")
        ref = build_shards(whole, out + "-whole", servers=2, gpus_per_server=2, seed=3, comm=comm, **opts)
        cfg = BuildConfig(out=out + "-sliced", servers=2, gpus_per_server=2, seed=3, command=ref["command"], **opts)
        got = run_build_sliced(comm, part, cfg)
        assert got["partition_digest"] == ref["partition_digest"]
        assert got["files"] == ref["files"]  # sha256 and size of every server file
        assert got["dataset"] == ref["dataset"] and got["stats"] == ref["stats"]
        assert _compare(comm, out + "-whole", out + "-sliced", 2)
        return ref["dataset"]["content_sha256"]
    finally:
        comm.Free()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", ["cora", "synthetic"])
def test_sliced_build_equals_whole_graph_build(case, base, cora_chunks):
    digests = []
    for P in (1, 2, 4):
        digest = on_every_rank(lambda: _run_case(P, base, case, cora_chunks), f"P={P} ")
        digests.append(WORLD.bcast(digest))
    assert len(set(digests)) == 1  # the dataset is the same whatever P read it


@pytest.mark.timeout(120)
def test_bad_chunk_fails_on_every_rank(base, cora_chunks):
    """A truncated chunk: every rank raises the same error naming the file; nothing is written."""
    from granndis_hpc.cluster import as_group
    from granndis_hpc.preprocess.formats.chunked import open_chunked

    bad = os.path.join(base, "bad-chunks")
    if WORLD.rank == 0:
        shutil.copytree(cora_chunks, bad)
        path = os.path.join(bad, "edges-00001.npy")
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 16)
    WORLD.barrier()
    group = as_group(WORLD)
    with pytest.raises(Exception) as info:
        with group.errors("opening the dataset"):
            open_chunked(bad)
    assert "edges-00001.npy" in str(info.value) and "truncated" in str(info.value)


@pytest.mark.timeout(120)
def test_a_failed_write_fails_every_rank_without_a_hang(base, cora_chunks, monkeypatch):
    """The writer's file fails after its first block (a full disk, say) while the other ranks are in
    the block rounds: the writer drains the remaining rounds, every rank raises the writer's error,
    and nothing is left in the output directory (no temporary, no manifest)."""
    from granndis_hpc.shards import StreamedDataset
    from granndis_hpc.preprocess.build.pipeline import BuildConfig
    from granndis_hpc.preprocess.formats.chunked import ChunkedSource, open_chunked
    from granndis_hpc.preprocess.build.distributed import run_build_sliced
    from granndis_hpc.preprocess.build.sliced import load_slice

    original = StreamedDataset.blocks

    def failing(self):
        it = original(self)
        first = next(it, None)  # one collective round done
        if first is not None:
            yield first
        raise OSError("No space left on device (injected by the test)")

    monkeypatch.setattr(StreamedDataset, "blocks", failing)  # only the writer calls blocks()
    part = load_slice(WORLD, ChunkedSource(open_chunked(cora_chunks)))
    out = os.path.join(base, "failed-write")
    cfg = BuildConfig(out=out, servers=2, gpus_per_server=2, layers=2, preload="full", partitioner="metis", seed=3)
    with pytest.raises(Exception) as info:
        run_build_sliced(WORLD, part, cfg)
    assert "No space left on device" in str(info.value)
    WORLD.barrier()
    assert os.listdir(out) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("S", [3, 5])
def test_gpu_split(base, cora_chunks, S):
    """gpu_split.split_servers_over_gpus, both builds' GPU split, on 4 ranks.  S = 3 <= P: each server's
    split on its own block of ranks, all at once (server 0 on rank 0, 1 on rank 1, 2 on ranks 2-3);
    S = 5 > P: one server after another over all 4 ranks.  Each rank's rows of a server's symmetric
    inner adjacency (from the slices and from the whole graph) equal a plain NumPy reference for the
    slices each path uses and for METIS' all-on-the-writer; the split gives every inner vertex a GPU,
    is balanced within 5 %, cuts far fewer inner edges than a random split, and is the same from both
    accesses.  Concurrent: each server's GPUs equal one ParMETIS split (gpu_split._parmetis_split) of
    the reference adjacency on that server's block alone, so the blocks' calls do not interfere."""
    import numpy as np

    from granndis_hpc.cluster import as_group
    from granndis_hpc.preprocess.partition import gpu_split
    from granndis_hpc.preprocess.build import slices
    from granndis_hpc.preprocess.formats.chunked import ChunkedSource, open_chunked
    from granndis_hpc.preprocess.build.distributed import SlicedAccess
    from granndis_hpc.preprocess.partition.parmetis import load_parmetis
    from granndis_hpc.preprocess.partition.gpu_split import (gpu_split_dist, gpu_split_groups, slices_dist,
                                                            split_servers_over_gpus)
    from granndis_hpc.preprocess.partition.twolevel import WholeGraphAccess
    from granndis_hpc.preprocess.build.sliced import load_slice
    from granndis_hpc.preprocess.sources import load
    from tests.conftest import require_planetoid

    group = as_group(WORLD)
    whole = load("planetoid", name="cora", root=str(require_planetoid()))
    part = load_slice(WORLD, ChunkedSource(open_chunked(cora_chunks)))
    n, G, P = whole.num_vertices, 2, WORLD.size
    server_of = ((np.arange(n) * 7919) % S).astype(np.int32)  # an arbitrary server partition
    bounds = gpu_split_groups(np.bincount(server_of), P, "parmetis")
    if S <= P:
        np.testing.assert_array_equal(bounds, (np.arange(S + 1) * P) // S)
    else:
        assert bounds is None
    sliced = SlicedAccess(group, part, whole.train_mask)
    sliced.server_of = server_of
    full = WholeGraphAccess(group, whole)
    dst_all = np.repeat(np.arange(n), np.diff(whole.indptr))
    ref_keys = {}
    for s in range(S):
        inner = np.flatnonzero(server_of == s)
        m = inner.shape[0]
        local = np.full(n, -1)
        local[inner] = np.arange(m)
        u, v = local[whole.indices], local[dst_all]
        keep = (u >= 0) & (v >= 0) & (u != v)
        ref_keys[s] = np.unique(np.concatenate([v[keep] * m + u[keep], u[keep] * m + v[keep]]))
        dists = [gpu_split_dist(m, P, "metis", s % P)]
        if bounds is None:
            dists.append(gpu_split_dist(m, P, "parmetis", s % P))
            assert (np.diff(dists[-1]) > 0).all()
        else:
            dists.append(slices_dist(m, P, bounds[s], bounds[s + 1] - bounds[s]))
            assert (np.diff(dists[-1])[bounds[s]:bounds[s + 1]] > 0).all() and dists[-1][-1] == m
        for dist in dists:
            lo, hi = dist[WORLD.rank], dist[WORLD.rank + 1]
            ref = ref_keys[s][(ref_keys[s] >= lo * m) & (ref_keys[s] < hi * m)]
            np.testing.assert_array_equal(sliced.inner_keys(s, inner, dist), ref)
            np.testing.assert_array_equal(full.inner_keys(s, inner, dist), ref)
    gpu_sliced, cons = split_servers_over_gpus(group, sliced, server_of, whole.train_mask, G, "parmetis", 3)
    gpu_full, _ = split_servers_over_gpus(group, full, server_of, whole.train_mask, G, "parmetis", 3)
    np.testing.assert_array_equal(gpu_sliced, gpu_full)
    assert sorted(cons) == [s for s in range(S) if s % P == WORLD.rank]
    rng = np.random.default_rng(0)
    for s in range(S):
        inner = np.flatnonzero(server_of == s)
        g = gpu_sliced[inner]
        assert g.min() == 0 and g.max() == G - 1
        assert np.bincount(g, minlength=G).max() <= 1.05 * inner.shape[0] / G + 1
        same = (server_of[whole.indices] == s) & (server_of[dst_all] == s)
        cut = np.count_nonzero(gpu_sliced[whole.indices[same]] != gpu_sliced[dst_all[same]])
        rand = rng.integers(0, G, n)
        rand_cut = np.count_nonzero(rand[whole.indices[same]] != rand[dst_all[same]])
        assert cut < 0.6 * rand_cut, (s, cut, rand_cut)
    if bounds is not None:
        mine = int(np.searchsorted(bounds, WORLD.rank, side="right")) - 1
        inner = np.flatnonzero(server_of == mine)
        m = inner.shape[0]
        with group.subgroups(mine) as block:
            dist = slices.vtxdist_for(m, block.size)
            lo, hi = dist[block.rank], dist[block.rank + 1]
            keys = ref_keys[mine][(ref_keys[mine] >= lo * m) & (ref_keys[mine] < hi * m)]
            xadj, adjncy = slices.keys_to_adjacency(keys.copy(), m, lo, hi)
            alone = gpu_split._parmetis_split(load_parmetis(), block, mine, server_of, whole.train_mask, dist,
                                              [xadj, adjncy], G, 3, False)
        np.testing.assert_array_equal(gpu_sliced[inner], alone)


@pytest.mark.timeout(120)
def test_byte_bounded_blocks_write_the_same_files(base, cora_chunks, monkeypatch):
    """A writer's block bounded by bytes (dist_server.BLOCK_BYTES, here one feature chunk of Cora's
    1433 features, 182 rows, against ceil(rows / P) ~ 1000 rows) changes the rounds, not the file."""
    import granndis_hpc.preprocess.build.dist_server as dist_server

    monkeypatch.setattr(dist_server, "BLOCK_BYTES", 1)
    assert dist_server.block_rows(2000, 1433, 2) == 182
    on_every_rank(lambda: _run_case(2, base, "cora", cora_chunks, tag="-small-blocks"))

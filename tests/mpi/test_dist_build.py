"""The distributed build (issue 17) under `mpirun -n 4`, on sub-communicators of P = 1, 2, 4 ranks.

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
from tests.mpi.conftest import on_rank0, shared_tmpdir

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
    from preprocess.chunked import graph_pieces, write_chunked

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


def _run_case(P, base, case, cora_chunks):
    from preprocess.build import BuildConfig, build_shards, dataset_digest
    from preprocess.chunked import ChunkedSource, open_chunked
    from preprocess.dist_build import run_build_sliced
    from preprocess.sliced import load_slice, slice_digest
    from preprocess.sources import load
    from preprocess.sources.synthetic_chunks import SyntheticSource
    from tests.conftest import require_planetoid

    comm = _sub(P)
    if comm == MPI.COMM_NULL:
        return None
    try:
        if case == "cora":
            source = ChunkedSource(open_chunked(cora_chunks))
            whole = load("planetoid", name="cora", root=str(require_planetoid()))
            opts = dict(preload="full", layers=2, partitioner="parmetis")
        else:
            source = SyntheticSource(**SYNTH)
            whole = load("synthetic", **SYNTH)
            opts = dict(preload="eas", layers=3, hops=2, fanout=4, partitioner="metis")
        part = load_slice(comm, source)
        assert slice_digest(comm, part) == dataset_digest(whole)
        out = os.path.join(base, f"{case}-P{P}")
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
        error, digest = None, None
        try:
            digest = _run_case(P, base, case, cora_chunks)
        except Exception as exc:  # noqa: BLE001 -- gathered so every rank fails, none hangs
            error = f"P={P} rank {WORLD.rank}: {exc!r}"
        errors = [e for e in WORLD.allgather(error) if e]
        assert not errors, errors
        digests.append(WORLD.bcast(digest))
    assert len(set(digests)) == 1  # the dataset is the same whatever P read it


@pytest.mark.timeout(120)
def test_bad_chunk_fails_on_every_rank(base, cora_chunks):
    """A truncated chunk: every rank raises the same error naming the file; nothing is written."""
    from granndis_hpc.cluster import as_group
    from preprocess.chunked import open_chunked

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
    from preprocess.build import BuildConfig
    from preprocess.chunked import ChunkedSource, open_chunked
    from preprocess.dist_build import run_build_sliced
    from preprocess.sliced import load_slice

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

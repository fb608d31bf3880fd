"""preprocess/partition/row_blocks.py: the locality blocks of every GPU's rows and the file order they give.

The blocks are checked against METIS called here on each part's symmetric inner subgraph made with
scipy from the raw edges; the files' order against its definition.  Training on block-ordered sets is
checked against single-process references by tests/unit/test_one_rank.py and the MPI suite, whose sets
all have their rows in blocks."""
import numpy as np
import pytest
import scipy.sparse
from mpi4py import MPI

from tests.conftest import require_planetoid


@pytest.fixture(scope="module")
def cora():
    from granndis_hpc.preprocess.sources import load

    return load("planetoid", name="cora", root=str(require_planetoid()))


def _parts(graph, S, G):
    from granndis_hpc.preprocess.partition.gpu_split import split_servers_over_gpus
    from granndis_hpc.preprocess.partition.twolevel import WholeGraphAccess, partition_servers
    from granndis_hpc.cluster import as_group

    group = as_group(MPI.COMM_SELF)
    server_of = partition_servers(group, graph, S, "metis", 0).parts
    gpu_of, _ = split_servers_over_gpus(group, WholeGraphAccess(group, graph), server_of, graph.train_mask, G,
                                        "metis", 0)
    return group, server_of, gpu_of


def _reference_blocks(graph, part_of, parts, block_rows):
    """METIS on each part's symmetric inner subgraph without loops, built with scipy."""
    from granndis_hpc.preprocess.partition.metis import metis_part

    n = graph.num_vertices
    a = scipy.sparse.csr_matrix((np.ones(graph.indices.shape[0]), graph.indices, graph.indptr), shape=(n, n))
    sym = ((a + a.T) > 0).astype(np.int8).tolil()
    sym.setdiag(0)
    sym = sym.tocsr()
    sym.eliminate_zeros()
    block = np.zeros(n, dtype=np.int32)
    for t in range(parts):
        inner = np.flatnonzero(part_of == t)
        if inner.shape[0] <= block_rows:
            continue
        sub = sym[inner][:, inner].tocsr()
        sub.sort_indices()
        block[inner] = metis_part(sub.indptr.astype(np.int64), sub.indices.astype(np.int64),
                                  -(-inner.shape[0] // block_rows), None)[0]
    return block


@pytest.mark.parametrize("block_rows", [64, 300, 5000])
def test_blocks_are_metis_on_each_parts_inner_subgraph(cora, block_rows):
    from granndis_hpc.preprocess.partition.twolevel import WholeGraphAccess
    from granndis_hpc.preprocess.partition.row_blocks import part_of, row_blocks

    S, G = 2, 2
    group, server_of, gpu_of = _parts(cora, S, G)
    parts = part_of(server_of, gpu_of, G)
    got = row_blocks(group, WholeGraphAccess(group, cora), parts, S * G, block_rows)
    np.testing.assert_array_equal(got, _reference_blocks(cora, parts, S * G, block_rows))
    for t in range(S * G):
        m = int(np.count_nonzero(parts == t))
        assert got[parts == t].max() < max(1, -(-m // block_rows))
    assert row_blocks(group, WholeGraphAccess(group, cora), parts, S * G, 0) is None


def test_blocks_keep_most_edges_inside_a_block(cora):
    """What the order is for: most edges of a part's inner subgraph join rows of one block (a window of
    as many consecutive ids holds few)."""
    from granndis_hpc.preprocess.partition.twolevel import WholeGraphAccess
    from granndis_hpc.preprocess.partition.row_blocks import part_of, row_blocks

    group, server_of, gpu_of = _parts(cora, 1, 1)
    parts = part_of(server_of, gpu_of, 1)
    block = row_blocks(group, WholeGraphAccess(group, cora), parts, 1, 128)
    dst = np.repeat(np.arange(cora.num_vertices), np.diff(cora.indptr))
    src = cora.indices
    off = src != dst
    inside = np.mean(block[src[off]] == block[dst[off]])
    by_id = np.mean(src[off] // 128 == dst[off] // 128)
    assert inside > 0.6 and inside > 3 * by_id, (inside, by_id)


def test_files_are_in_block_order(cora, tmp_path):
    """Rows of a GPU by (hop, home server, home GPU, block, global id): the inner rows block by block;
    without blocks by (hop, global id), and the manifest says which."""
    import h5py

    from granndis_hpc.preprocess.build.pipeline import build_shards
    from granndis_hpc.preprocess.partition.twolevel import WholeGraphAccess
    from granndis_hpc.preprocess.partition.row_blocks import part_of, row_blocks
    from granndis_hpc.preprocess.verify.command import format_info

    S, G = 2, 2
    group, server_of, gpu_of = _parts(cora, S, G)
    block = row_blocks(group, WholeGraphAccess(group, cora), part_of(server_of, gpu_of, G), S * G, 64)
    for rows in (64, 0):
        m = build_shards(cora, tmp_path / f"r{rows}", servers=S, gpus_per_server=G, layers=2, partitioner="metis",
                         comm=MPI.COMM_SELF, row_block_rows=rows)
        assert m.get("row_block_rows", 0) == rows
        info = format_info(m)
        assert ("locality blocks of about 64 rows" in info) if rows else ("--row-block-rows 0" in info)
        for s in range(S):
            with h5py.File(tmp_path / f"r{rows}" / f"server-{s:04d}.h5") as f:
                gid, hop, owner = (f[k][:] for k in ("vertices/global_id", "vertices/hop", "vertices/owner"))
            if rows:
                key = (gid, block[gid], gpu_of[gid], server_of[gid], hop, owner)
            else:
                key = (gid, hop, owner)
            np.testing.assert_array_equal(np.lexsort(key), np.arange(gid.shape[0]))
            inner = hop == 0
            if rows:  # the inner rows of one GPU are not in id order, yet each block's are
                assert np.any(np.diff(gid[inner & (owner == 0)]) < 0)


def test_verify_accepts_block_order_and_refuses_rows_out_of_hop_order(cora, tmp_path):
    from granndis_hpc.shards import open_server, read_manifest, read_server_arrays
    from granndis_hpc.preprocess.build.pipeline import build_shards
    from granndis_hpc.preprocess.verify.command import _EDGE_SIZED, _file_problems, _nonfinite_rows

    out = tmp_path / "set"
    build_shards(cora, out, servers=2, gpus_per_server=1, layers=2, partitioner="metis", comm=MPI.COMM_SELF,
                 row_block_rows=64)
    manifest = read_manifest(str(out))
    a = read_server_arrays(str(out), manifest, 0, headers=("features", "world/src_split") + _EDGE_SIZED)
    with open_server(str(out), manifest, 0) as f:
        a.update({name: f[name] for name in _EDGE_SIZED})
        a["nonfinite_rows"] = lambda: _nonfinite_rows(f["features"])
        assert _file_problems("server-0000.h5", a, 0, manifest) == []
        last = int(a["vertices/offsets"][1]) - 1  # GPU 0's last row, of the deepest hop
        assert a["vertices/hop"][last] > 0
        a["vertices/hop"] = a["vertices/hop"].copy()
        a["vertices/hop"][last - 1], a["vertices/hop"][last] = a["vertices/hop"][last], 0
        problems = _file_problems("server-0000.h5", a, 0, manifest)
    assert any("rows of a GPU are not sorted by hop" in p for p in problems), problems

"""Cluster primitives against NumPy references, under `mpirun -n 4 ... --with-mpi`.

One mpirun builds three topologies (2 servers x 2, 1 x 4, 4 x 1) for each intra transport (gloo,
mpi): the module-scoped fixture builds one, the tests use it, and `Topology.close()` destroys the
torch process group before the next one is built (torch.distributed can be initialised again after
`destroy_process_group`).  Every rank generates every rank's send data from (seed, rank), so each
rank computes what it must receive with plain NumPy, independently of the code under test.
Assertions come after all collectives of a test, so a failure on one rank cannot desynchronise
the next test.
"""
import pickle
import time
import warnings

import numpy as np
import pytest
import torch
from mpi4py import MPI

from granndis_hpc.cluster import ClusterError, Communicator, Ledger, agree
from granndis_hpc.cluster.layout import MESSAGE_PIECE_BYTES
from tests.mpi.conftest import cluster_fixture

P = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()
SHAPES = [(2, "gloo"), (2, "mpi"), (4, "gloo"), (4, "mpi"), (1, "gloo"), (1, "mpi")]


cluster = cluster_fixture(SHAPES)


def _counts(seed, n, self_blocks=False):
    """counts[src, dst], identical on every rank: uneven, with empty blocks (about a third)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 7, size=(n, n)) * (rng.random((n, n)) > 0.35)
    if not self_blocks:
        np.fill_diagonal(counts, 0)
    return counts


def _rows(seed, rank, n, tail, dtype):
    """What `rank` sends: n rows of shape `tail`, reproducible by every rank."""
    rng = np.random.default_rng([seed, rank])
    if dtype == np.bool_:
        return rng.random((n, *tail)) > 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-10**6, 10**6, size=(n, *tail)).astype(dtype)
    return rng.standard_normal((n, *tail)).astype(dtype)


def _to_torch(a, dtype=None):
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.to(dtype) if dtype is not None else t


CASES = [  # (numpy dtype, row tail, torch dtype override)
    (np.float32, (5,), None),
    (np.int64, (), None),
    (np.bool_, (3,), None),
    (np.float32, (2, 2), torch.bfloat16),
    (np.float64, (0,), None),
]


def _receive_reference(counts, seed, my_col, peer_ids, tail, np_dtype, tdt):
    """Rows each peer j (sender id peer_ids[j]) addresses to column my_col, concatenated in peer order."""
    parts = []
    for j, sender in enumerate(peer_ids):
        rows = _rows(seed, sender, counts[j].sum(), tail, np_dtype)
        begin = counts[j, :my_col].sum()
        parts.append(rows[begin:begin + counts[j, my_col]])
    ref = np.concatenate(parts)
    return _to_torch(ref, tdt)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_intra_exchange_matches_numpy(cluster, case):
    topo, comm, ledger = cluster
    np_dtype, tail, tdt = CASES[case]
    g, me = topo.ranks_per_server, topo.local_rank
    seed = 100 + case
    counts = _counts([seed, topo.server], g, self_blocks=(case == 1))
    mates = [int(r) for r in topo.server_ranks()]
    send = _to_torch(_rows(seed, topo.rank, counts[me].sum(), tail, np_dtype), tdt)
    ledger.reset()
    got = comm.intra_exchange(send, counts[me], counts[:, me], phase="halo")
    expected = _receive_reference(counts, seed, me, mates, tail, np_dtype, tdt)
    row_bytes = int(np.prod(tail, dtype=np.int64)) * send.element_size()
    assert got.dtype == send.dtype and tuple(got.shape) == tuple(expected.shape)
    assert torch.equal(got, expected)
    # Bytes sent to OTHER ranks of the server; a self block is not traffic.
    assert ledger.bytes("intra", "halo") == (counts[me].sum() - counts[me, me]) * row_bytes
    assert ledger.bytes("inter", "halo") == 0


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_world_exchange_matches_numpy(cluster, case):
    topo, comm, ledger = cluster
    np_dtype, tail, tdt = CASES[case]
    seed = 200 + case
    counts = _counts(seed, P, self_blocks=(case == 1))
    me = topo.rank
    send = _to_torch(_rows(seed, me, counts[me].sum(), tail, np_dtype), tdt)
    ledger.reset()
    got = comm.world_exchange(send, counts[me], counts[:, me], phase="evaluation")
    expected = _receive_reference(counts, seed, me, list(range(P)), tail, np_dtype, tdt)
    row_bytes = int(np.prod(tail, dtype=np.int64)) * send.element_size()
    server = np.arange(P) // topo.ranks_per_server           # independent of topo's tables
    same = server == server[me]
    assert torch.equal(got, expected)
    assert ledger.bytes("intra", "evaluation") == (counts[me][same].sum() - counts[me, me]) * row_bytes
    assert ledger.bytes("inter", "evaluation") == counts[me][~same].sum() * row_bytes


@pytest.mark.mpi(min_size=4)
def test_world_exchange_degenerate_patterns_do_not_hang(cluster):
    """All-zero counts, one-way traffic only, and one rank sending everywhere while receiving nothing."""
    topo, comm, ledger = cluster
    me = topo.rank
    results = []
    patterns = [np.zeros((P, P), dtype=int),
                np.triu(np.full((P, P), 3), k=1),                       # only to higher ranks
                np.pad(np.full((1, P - 1), 2), ((0, P - 1), (1, 0)))]   # rank 0 -> everyone
    for k, counts in enumerate(patterns):
        send = _to_torch(_rows(300 + k, me, counts[me].sum(), (4,), np.float32))
        got = comm.world_exchange(send, counts[me], counts[:, me])
        results.append((got, _receive_reference(counts, 300 + k, me, list(range(P)), (4,), np.float32, None)))
    for got, expected in results:
        assert torch.equal(got, expected)


@pytest.mark.mpi(min_size=4)
def test_world_exchange_of_real_cora_features(cluster, planetoid_root):
    """Ranks own contiguous slices of Cora's feature rows and fetch random rows owned by others
    (a halo-like request pattern, megabyte messages)."""
    topo, comm, ledger = cluster
    with open(planetoid_root / "ind.cora.allx", "rb") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # old scipy.sparse.csr pickle path
        features = np.asarray(pickle.load(f, encoding="latin1").todense(), dtype=np.float32)
    n = features.shape[0]
    owner_bounds = np.linspace(0, n, P + 1).astype(int)
    owner = np.searchsorted(owner_bounds, np.arange(n), side="right") - 1
    rng = np.random.default_rng(7)
    wanted = [np.sort(rng.choice(n, size=int(rng.integers(50, 400)), replace=False)) for _ in range(P)]
    wanted = [w[owner[w] != r] for r, w in enumerate(wanted)]        # halo: rows owned elsewhere
    # counts[src, dst] = rows dst wants from src; src sends them in dst order, sorted by id.
    counts = np.array([[np.sum(owner[wanted[dst]] == src) for dst in range(P)] for src in range(P)])
    me = topo.rank
    send_ids = np.concatenate([wanted[dst][owner[wanted[dst]] == me] for dst in range(P)])
    got = comm.world_exchange(torch.from_numpy(features[send_ids]), counts[me], counts[:, me])
    expected = features[wanted[me]]  # grouped by source rank == sorted by id (contiguous owners)
    assert np.array_equal(got.numpy(), expected)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("piece_bytes", [MESSAGE_PIECE_BYTES, 1000, 0])
def test_world_exchange_blocks_of_several_messages_arrive_exactly(cluster, piece_bytes):
    """Blocks between servers travel in messages of at most 32 KiB (cluster/layout.py; another size or
    one message a block with GRANNDIS_MESSAGE_PIECE_BYTES): blocks of several messages and a remainder,
    message ends inside a row (rows of 12 bytes), a block of one short message and empty ones; two
    exchanges in flight at once with the same tag, waited for in reverse order."""
    topo, comm, ledger = cluster
    assert MESSAGE_PIECE_BYTES == 32768
    default, comm.piece_bytes = comm.piece_bytes, piece_bytes
    try:
        _exchange_blocks_of_several_messages(topo, comm, ledger)
    finally:
        comm.piece_bytes = default


@pytest.mark.mpi(min_size=4)
def test_a_bad_message_piece_size_is_one_error_on_every_rank(cluster, monkeypatch):
    topo, _, _ = cluster
    monkeypatch.setenv("GRANNDIS_MESSAGE_PIECE_BYTES", "32k")
    with pytest.raises(ClusterError, match=r"GRANNDIS_MESSAGE_PIECE_BYTES='32k': give a whole number of bytes"):
        Communicator(topo, Ledger())


def _exchange_blocks_of_several_messages(topo, comm, ledger):
    me, row_bytes = topo.rank, 12
    # 5,600 rows = 67,200 bytes: two full messages and 1,664 bytes; + src + dst rows; 3 rows; none
    counts = np.full((P, P), 5600) + np.arange(P)[:, None] + np.arange(P)[None, :]
    counts[0, P - 1], counts[P - 1, 0], counts[1, 0] = 3, 0, 0
    second = counts.T.copy()

    def rows(seed, rank, n):
        return _rows(seed, rank, n, (3,), np.float32)
    ledger.reset()
    first = comm.world_exchange_start(_to_torch(rows(500, me, counts[me].sum())), counts[me], counts[:, me])
    later = comm.world_exchange_start(_to_torch(rows(501, me, second[me].sum())), second[me], second[:, me])
    got_later, got_first = later.wait(), first.wait()
    server = np.arange(P) // topo.ranks_per_server           # independent of topo's tables
    same = server == server[me]
    inter = (counts[me][~same].sum() + second[me][~same].sum()) * row_bytes
    intra = (counts[me][same].sum() - counts[me, me] + second[me][same].sum() - second[me, me]) * row_bytes
    assert torch.equal(got_first, _receive_reference(counts, 500, me, list(range(P)), (3,), np.float32, None))
    assert torch.equal(got_later, _receive_reference(second, 501, me, list(range(P)), (3,), np.float32, None))
    assert ledger.bytes("inter", "halo") == inter
    assert ledger.bytes("intra", "halo") == intra


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("bucket_bytes", [64, 25 << 20])
def test_allreduce_matches_numpy_sum_and_ledger_model(cluster, bucket_bytes):
    topo, comm, ledger = cluster
    shapes = [(13, 7), (1,), (0, 3), (300,), (4, 4, 4)]
    def values(rank):  # integer-valued floats: exact sums in any order
        rng = np.random.default_rng([400, rank])
        return [rng.integers(-1000, 1000, size=s).astype(np.float64) for s in shapes]
    tensors = [torch.from_numpy(v) for v in values(topo.rank)]
    ints = torch.from_numpy(np.random.default_rng([401, topo.rank]).integers(-5, 5, size=(6, 5)))
    ledger.reset()
    comm.allreduce_(tensors + [ints], bucket_bytes=bucket_bytes)
    per_rank = ledger.snapshot()
    totals = ledger.reduce(topo.world)
    expected = [np.sum(parts, axis=0) for parts in zip(*(values(r) for r in range(P)))]
    expected_ints = sum(np.random.default_rng([401, r]).integers(-5, 5, size=(6, 5)) for r in range(P))
    for t, e in zip(tensors, expected):
        assert np.array_equal(t.numpy(), e)
    assert np.array_equal(ints.numpy(), expected_ints)
    # Ledger, computed independently: total payload B over all buckets; job totals are
    # intra = 2*S*(G-1)*B (reduce + broadcast), inter = 2*(S-1)*B (ring among leaders).
    s, g = P // topo.ranks_per_server, topo.ranks_per_server
    payload = sum(int(np.prod(x)) for x in shapes) * 8 + 30 * 8
    assert sum(totals["bytes"]["intra"].values()) == 2 * s * (g - 1) * payload
    assert sum(totals["bytes"]["inter"].values()) == 2 * (s - 1) * payload
    assert totals["bytes"]["intra"]["gradient"] == 2 * s * (g - 1) * payload
    if bucket_bytes > payload:  # one bucket per dtype: per-rank numbers from the star/ring rules
        mine_intra = 0 if g == 1 else ((g - 1) if topo.local_rank == 0 else 1) * payload
        assert per_rank["bytes"]["intra"]["gradient"] == mine_intra
        if topo.local_rank != 0 or s == 1:
            assert per_rank["bytes"]["inter"]["gradient"] == 0
    if s == 1:
        assert sum(per_rank["bytes"]["inter"].values()) == 0
    if g == 1:
        assert sum(per_rank["bytes"]["intra"].values()) == 0


@pytest.mark.mpi(min_size=4)
def test_reduce_flat_start_sums_while_the_caller_computes_with_the_same_bits_everywhere(cluster):
    """The non-blocking hierarchical all-reduce (gradient buckets during backward): float32 sums close to
    NumPy's float64 sum, the same bits on every rank, the blocking all-reduce's ledger bytes; on more
    than 2 servers the leaders' ring completes before wait() while the caller only polls."""
    topo, comm, ledger = cluster
    sizes = [1, 3, 1000, 257]  # fewer elements than servers: empty ring chunks
    def values(rank, k):
        return np.random.default_rng([600, rank, k]).standard_normal(sizes[k]).astype(np.float32)
    ledger.reset()
    flats, pendings = [torch.from_numpy(values(topo.rank, k)) for k in range(len(sizes))], []
    for flat in flats:
        pendings.append(comm.reduce_flat_start(flat, "gradient", pendings[-1] if pendings else None))
    deadline = time.monotonic() + 30  # a caller computing between polls: the stages must move meanwhile
    while not all(p.leaders_done() for p in pendings) and time.monotonic() < deadline:
        for p in pendings:
            p.poll()
        time.sleep(0.005)
    progressed = all(p.leaders_done() for p in pendings)
    # (staged, GRANNDIS_TEST_HOST_STAGING=1: the leaders sum their host copy; the bucket is written in wait())
    before_wait = [(f if p._host is None else p._host).numpy().copy() for p, f in zip(pendings, flats)]
    sums = [p.wait().numpy().copy() for p in pendings]
    overlapped = ledger.snapshot()["bytes"]
    ledger.reset()
    comm.allreduce_([torch.from_numpy(values(topo.rank, k)) for k in range(len(sizes))], bucket_bytes=1)
    blocking = ledger.snapshot()["bytes"]
    everyone = topo.world.allgather([s.tobytes() for s in sums])
    assert progressed
    assert all(mine == everyone[0] for mine in everyone)
    for k, got in enumerate(sums):
        reference = np.sum([values(r, k).astype(np.float64) for r in range(P)], axis=0)
        np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5)
    if topo.servers > 2 and topo.is_leader:  # the ring summed in place before wait() was called
        assert all(np.array_equal(b, s) for b, s in zip(before_wait, sums))
    assert overlapped == blocking


@pytest.mark.mpi(min_size=4)
def test_allreduce_average_equals_mean(cluster):
    topo, comm, ledger = cluster
    def grads(rank):
        return np.random.default_rng([500, rank]).standard_normal((37, 11)).astype(np.float32)
    t = torch.nn.Parameter(torch.from_numpy(grads(topo.rank)))  # a leaf that requires grad
    comm.allreduce_([t], average=True, bucket_bytes=1000)
    mean = np.mean([grads(r).astype(np.float64) for r in range(P)], axis=0)
    np.testing.assert_allclose(t.detach().numpy(), mean, rtol=1e-5, atol=1e-6)


@pytest.mark.mpi(min_size=4)
def test_topology_maps_match_consecutive_servers(cluster):
    topo, comm, ledger = cluster
    g = topo.ranks_per_server
    ranks = np.arange(P)
    leader_size = topo.leader_comm.Get_size() if topo.leader_comm is not None else -1
    assert topo.servers * g == P
    assert topo.server == RANK // g and topo.local_rank == RANK % g
    assert np.array_equal(topo.server_of(ranks), ranks // g)
    assert np.array_equal(topo.local_rank_of(ranks), ranks % g)
    assert all(topo.global_rank(r // g, r % g) == r for r in range(P))
    assert topo.server_comm.Get_size() == g
    assert topo.is_leader == (RANK % g == 0)
    assert leader_size == (topo.servers if topo.is_leader else -1)
    if topo.is_leader:
        assert topo.leader_comm.Get_rank() == topo.server
    # servers of one rank open no torch.distributed group (nothing to exchange inside them)
    assert (topo.intra_group is not None) == (comm.intra_transport == "gloo" and g > 1)


@pytest.mark.mpi(min_size=4)
def test_ledger_reduce_sums_bytes_and_takes_max_seconds(cluster):
    topo, comm, ledger = cluster
    ledger.reset()
    ledger.add("inter", "setup", 10 * (topo.rank + 1), seconds=float(topo.rank))
    total = ledger.reduce(topo.world)
    slowest = ledger.reduce(topo.world, op="max")
    assert total["bytes"]["inter"]["setup"] == 10 * P * (P + 1) // 2
    assert total["seconds"]["inter"]["setup"] == sum(range(P))
    assert slowest["seconds"]["inter"]["setup"] == P - 1
    assert slowest["bytes"]["inter"]["setup"] == total["bytes"]["inter"]["setup"]


@pytest.mark.mpi(min_size=4)
def test_allreduce_scalar(cluster):
    topo, comm, ledger = cluster
    total = comm.allreduce_scalar(topo.rank + 1)
    biggest = comm.allreduce_scalar(float(topo.rank) / 2, op="max")
    vec = comm.allreduce_scalar(np.array([1.0, topo.rank]))
    assert total == P * (P + 1) // 2 and isinstance(total, int)
    assert biggest == (P - 1) / 2
    assert np.array_equal(vec, [P, sum(range(P))])


@pytest.mark.mpi(min_size=4)
def test_agree_names_the_failing_rank_on_every_rank(cluster):
    topo, comm, ledger = cluster
    with pytest.raises(ClusterError, match=r"^rank 2: bad shard on rank 2$") as info:
        agree(topo.world, topo.rank != 2, f"bad shard on rank {topo.rank}")
    assert info.value.collective


@pytest.mark.mpi(min_size=4)
def test_validate_reports_inconsistent_counts_on_every_rank(cluster):
    topo, comm, ledger = cluster
    checked = Communicator(topo, Ledger(), intra_transport=comm.intra_transport, validate=True)
    counts = _counts(600, P)
    recv = counts[:, topo.rank].copy()
    if topo.rank == 1:
        recv[0] += 1  # rank 1 expects one row too many from rank 0
    send = torch.zeros((counts[topo.rank].sum(), 2))
    try:
        with pytest.raises(ClusterError, match=r"rank 1: rank 0 sends \d+ rows but recv_counts\[0\]=\d+"):
            checked.world_exchange(send, counts[topo.rank], recv)
    finally:
        checked.close()


@pytest.mark.mpi(min_size=4)
def test_bad_local_arguments_raise_before_any_communication(cluster):
    topo, comm, ledger = cluster
    g = topo.ranks_per_server
    with pytest.raises(ClusterError, match="one entry per peer"):
        comm.intra_exchange(torch.zeros(0, 2), [0] * (g + 1), [0] * g)
    with pytest.raises(ClusterError, match="rows but send_counts add up to"):
        comm.world_exchange(torch.zeros(3, 2), [1] * P, [0] * P)
    with pytest.raises(ClusterError, match="supported dtypes"):
        comm.allreduce_([torch.zeros(3, dtype=torch.float16)])

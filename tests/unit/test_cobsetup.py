"""The co-batch set-up check of --mode auto (engine/cobsetup.py): it reads the server graph's structure and
no feature row, times co-batches of the rows the planner lays out, and keeps the slowest rank's fit."""
import types

import h5py
import numpy as np
import pytest
import torch

from granndis_hpc import shards
from granndis_hpc.engine import cobsetup
from granndis_hpc.options.train import TrainConfig
from tests.unit.test_shards import build, make_graph

LAYERS = 2


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("cobsetup") / "set"
    build(make_graph(n=900, m=5000, features=64), out, layers=LAYERS)  # 2 servers x 2 GPUs, full 2-hop preload
    return out


@pytest.fixture(scope="module")
def inductive_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("cobsetup") / "inductive"
    build(make_graph(n=900, m=5000, features=64), out, layers=LAYERS, inductive=True)
    return out


def _cfg(path, inductive=False):
    return TrainConfig(shards=str(path), mode="cob", model="sage", layers=LAYERS, hidden=8, epochs=1,
                       inductive=inductive)


def _topo(server, gpu, others=()):
    """One rank of the job; allgather_object adds what `others` (other ranks' (rate, error)) would send."""
    return types.SimpleNamespace(server=server, local_rank=gpu, device=torch.device("cpu"),
                                 allgather_object=lambda mine: [mine, *others])


def _reads(monkeypatch):
    """The HDF5 datasets read from here on, by name, with the bytes of each read."""
    seen = []
    original = h5py.Dataset.__getitem__

    def spy(self, key):
        out = original(self, key)
        seen.append((self.name, int(getattr(out, "nbytes", 0))))
        return out
    monkeypatch.setattr(h5py.Dataset, "__getitem__", spy)
    return seen


def _larger_co_batch_rows(path, server, gpu, inductive=False) -> int:
    """The rows GPU `gpu` computes, over all layers, for the larger timed co-batch, in plain NumPy: its
    targets are the first min(TARGETS, half) of the server's training vertices in the check's shuffled
    order, and layer l computes the GPU's vertices within L-1-l in-edges of them (exact sampling; only
    over edges between training vertices where `inductive`)."""
    manifest = shards.read_manifest(path)
    g = shards.read_server_graph(path, manifest, server)
    train = np.flatnonzero(g["train"] & (g["hop"] == 0))
    perm = np.random.default_rng([0, server]).permutation(train)
    targets = perm[: max(1, min(cobsetup.TARGETS, train.shape[0] // 2))]
    n = g["indptr"].shape[0] - 1
    dst = np.repeat(np.arange(n), np.diff(g["indptr"]))
    src = g["indices"]
    if inductive:
        keep = g["train"][dst] & g["train"][src]
        dst, src = dst[keep], src[keep]
    dist = np.full(n, LAYERS, dtype=np.int64)
    dist[targets] = 0
    for h in range(1, LAYERS):
        frontier = dist == h - 1
        reached = np.unique(src[frontier[dst]])
        dist[reached[dist[reached] > h]] = h
    owned = np.zeros(n, dtype=bool)
    owned[g["offsets"][gpu]:g["offsets"][gpu + 1]] = True
    return int(sum(np.count_nonzero(owned & (dist <= LAYERS - 1 - layer)) for layer in range(LAYERS)))


def test_the_check_reads_no_feature_row(shard_set, monkeypatch):
    seen = _reads(monkeypatch)
    got, graph = cobsetup.measure(_cfg(shard_set), str(shard_set), _topo(0, 1))
    names = {name for name, _ in seen}
    assert "/graph/indices" in names and "/graph/indptr" in names  # the spy sees the check's reads
    assert not [name for name in names if "features" in name], sorted(names)
    # what it read is the structure, well under the server file's features
    with h5py.File(shard_set / shards.server_file_name(0), "r") as f:
        feature_bytes = f["features"].size * f["features"].dtype.itemsize
    assert sum(b for _, b in seen) < feature_bytes
    assert got["rows"] > 0 and "not priced" not in got["method"]
    # what it hands on for a batched mode's loader is the server graph without its features
    manifest = shards.read_manifest(shard_set)
    whole = shards.read_server_graph(shard_set, manifest, 0, features=True)
    assert sorted(graph) == sorted(set(whole) - {"features"})
    assert all(np.array_equal(graph[key], whole[key]) for key in graph)


def test_the_features_read_apart_are_the_server_graph_s(shard_set):
    manifest = shards.read_manifest(shard_set)
    for server in (0, 1):
        whole = shards.read_server_graph(shard_set, manifest, server, features=True)
        features = shards.read_server_features(shard_set, manifest, server)
        assert features.dtype == np.float32 and np.array_equal(features, whole["features"])


@pytest.mark.parametrize("server,gpu", [(0, 0), (1, 1)])
def test_the_fit_is_positive_on_the_rows_of_the_larger_co_batch(shard_set, server, gpu):
    got, _ = cobsetup.measure(_cfg(shard_set), str(shard_set), _topo(server, gpu))
    assert got["rows"] == _larger_co_batch_rows(shard_set, server, gpu)
    assert got["cobatch_s"] >= 0 and got["cobatch_row_s"] >= 0
    # a co-batch of a few hundred rows costs something, and far less than a second on any machine
    larger = got["cobatch_s"] + got["rows"] * got["cobatch_row_s"]
    assert 0 < larger < 1.0, got
    assert f"{got['rows']:,} rows" in got["method"]


def test_an_inductive_check_reads_no_feature_row_and_samples_the_train_induced_graph(inductive_set, monkeypatch):
    seen = _reads(monkeypatch)
    got, graph = cobsetup.measure(_cfg(inductive_set, inductive=True), str(inductive_set), _topo(1, 0))
    assert not [name for name, _ in seen if "features" in name]
    assert got["rows"] == _larger_co_batch_rows(inductive_set, 1, 0, inductive=True) > 0
    # handed on as read: the loader takes the train-induced edges itself
    whole = shards.read_server_graph(inductive_set, shards.read_manifest(inductive_set), 1)
    assert np.array_equal(graph["indices"], whole["indices"]) and "train_in_degree" in graph


def test_the_slowest_rank_s_fixed_and_per_row_are_kept(shard_set):
    others = [((5.0, 0.0, 10), ""), ((0.0, 2.0, 30), "")]  # two other ranks: one all fixed, one all per row
    got, _ = cobsetup.measure(_cfg(shard_set), str(shard_set), _topo(0, 0, others))
    assert (got["cobatch_s"], got["cobatch_row_s"]) == (5.0, 2.0)
    assert got["rows"] == int(np.mean([_larger_co_batch_rows(shard_set, 0, 0), 10, 30]))


def test_an_unreadable_set_is_not_priced(tmp_path):
    got, graph = cobsetup.measure(_cfg(tmp_path), str(tmp_path), _topo(0, 0))
    assert graph is None
    assert (got["cobatch_s"], got["cobatch_row_s"], got["rows"]) == (0.0, 0.0, 0)
    assert "co-batch set-up not priced" in got["method"]


@pytest.mark.parametrize("sliced", [False, True])
def test_plan_times_the_set_up_on_the_graphs_the_build_writes(shard_set, monkeypatch, sliced):
    """`preprocess plan --inter-rate` times a co-batch's set-up with this module's timing (through the cob
    mode's registry entry) on every server's graph of the build, one at a time: the same structure as the
    build's files hold (read_server_graph's, which --mode auto times on), from a whole graph or from slices."""
    from mpi4py import MPI

    from granndis_hpc.preprocess.plan import command as plan
    from granndis_hpc.preprocess.plan.sets import whole_graph_slice

    seen = {}
    timer = cobsetup.time_server_graph

    def spy(graph, layers, sampler, fanout, seed, server, gpu, exact, device):
        seen[server] = graph
        assert (layers, sampler, fanout, gpu, exact) == (LAYERS, "sage", -1, 0, True)
        return timer(graph, layers, sampler, fanout, seed, server, gpu, exact, device)
    monkeypatch.setattr(cobsetup, "time_server_graph", spy)
    graph = make_graph(n=900, m=5000, features=64)
    cfg = plan.PlanConfig(servers=2, gpus_per_server=2, layers=LAYERS, hidden=8, partitioner="metis", device="cpu",
                          hops=LAYERS, eas=False, cob_batches=(2,), cob_fanout=-1, time_setup=True)
    got = plan.plan_options(MPI.COMM_SELF, whole_graph_slice(MPI.COMM_SELF, graph) if sliced else graph, cfg)
    manifest = shards.read_manifest(shard_set)
    assert sorted(seen) == [0, 1] and sorted(got["setup"]) == [(f"--hops {LAYERS}", 0), (f"--hops {LAYERS}", 1)]
    for server, timed in seen.items():
        written = shards.read_server_graph(shard_set, manifest, server)
        for key in ("indptr", "indices", "hop", "offsets", "global_id", "in_degree"):  # what the timing reads
            assert np.array_equal(np.asarray(timed[key]), written[key]), (server, key)
        assert np.array_equal(np.asarray(timed["train"], bool), np.asarray(written["train"], bool)), server
        fixed, row_s, rows = got["setup"][(f"--hops {LAYERS}", server)]
        assert fixed >= 0 and row_s >= 0 and fixed + row_s > 0 and rows > 0

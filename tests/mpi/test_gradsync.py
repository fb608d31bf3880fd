"""GradientSync (gradients reduced in buckets during the backward) against plain torch, under
`mpirun -n 4 ... --with-mpi`.

Every rank builds the same deep model (same seed) and feeds it its own batch, drawn from (seed, rank,
step); each rank also runs every rank's batch through a plain-torch copy of the model, with no
GradientSync, and sums those gradients in float64: the reference.  The model registers its LayerNorms
after all its linear layers (as ressage does), so registration order is not the backward's order; the
buckets must still be several, cut between layers, posted during the backward once the first backward
has taught GradientSync the order, and the ledger must charge the bytes of one bucket.
"""
import copy

import numpy as np
import pytest
import torch
from mpi4py import MPI

from granndis_hpc.cluster.gradsync import GradientSync, layer_of
from tests.mpi.conftest import cluster_fixture, on_every_rank

P = MPI.COMM_WORLD.Get_size()
SHAPES = [(2, "gloo"), (2, "mpi"), (1, "mpi")]
LAYERS, WIDTH = 6, 16


cluster = cluster_fixture(SHAPES)


class Deep(torch.nn.Module):
    """Pre-norm residual blocks; norms registered after every linear layer (ressage's order)."""

    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(5, WIDTH)
        self.convs = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(WIDTH) for _ in range(LAYERS))
        self.head = torch.nn.Linear(WIDTH, 3)

    def forward(self, x):
        h = self.encoder(x)
        for conv, norm in zip(self.convs, self.norms):
            h = h + conv(torch.relu(norm(h)))
        return self.head(h)


def batch(rank, step):
    rng = np.random.default_rng([700, rank, step])
    return (torch.from_numpy(rng.standard_normal((9, 5)).astype(np.float32)),
            torch.from_numpy(rng.integers(0, 3, size=9)))


def loss_of(model, rank, step):
    x, y = batch(rank, step)
    return torch.nn.functional.cross_entropy(model(x), y, reduction="sum")


@pytest.mark.mpi(min_size=4)
def test_bucketed_gradients_during_backward_equal_the_plain_torch_sum(cluster):
    topo, comm, ledger = cluster
    torch.manual_seed(11)
    model = Deep()
    reference = copy.deepcopy(model)
    sync = GradientSync(comm, model.named_parameters())
    results = []
    for step in range(3):
        model.zero_grad(set_to_none=False)
        ledger.reset()
        names = list(sync.bucket_names)  # the layout this backward runs on (finish() may re-plan)
        loss_of(model, topo.rank, step).backward()
        sync.finish()
        got = {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()}
        overlapped = ledger.snapshot()["bytes"]
        ledger.reset()  # the blocking all-reduce of the same bytes in one bucket: the ledger to match
        comm.allreduce_([torch.zeros_like(p) for p in model.parameters()])
        blocking = ledger.snapshot()["bytes"]
        expected = {n: np.zeros(p.shape) for n, p in reference.named_parameters()}
        for r in range(P):
            reference.zero_grad(set_to_none=False)
            loss_of(reference, r, step).backward()
            for n, p in reference.named_parameters():
                expected[n] += p.grad.double().numpy()
        results.append((got, expected, overlapped, blocking, list(sync.posted_at), names))
    everyone = topo.world.allgather([{n: g.tobytes() for n, g in got.items()} for got, *_ in results])
    inter = np.sum(topo.world.allgather([(o["inter"]["gradient"], b["inter"]["gradient"]) for _, _, o, b, _,
                                         _ in results]),
                   axis=0)  # [step, (bucketed, one bucket)]: the job's inter-server gradient bytes
    sync.close()

    def check():
        hooks = len(list(model.parameters()))
        for step, (got, expected, overlapped, blocking, posted_at, names) in enumerate(results):
            for n in got:
                np.testing.assert_allclose(got[n], expected[n], rtol=1e-5, atol=1e-5, err_msg=f"step {step} {n}")
            assert everyone[topo.rank][step] == everyone[0][step]  # the same bits on every rank
            assert 3 <= len(names) <= 2 * 8 + 1
            owners = [{layer_of(n) for n in bucket} for bucket in names]  # cut only between layers
            assert all(not (a & b) for i, a in enumerate(owners) for b in owners[i + 1:])
            # bytes: intra per rank and in total as one bucket; inter as one bucket per rank on 2 servers,
            # in total on more (ring chunks round per bucket)
            assert overlapped["intra"]["gradient"] == blocking["intra"]["gradient"]
            if topo.servers <= 2:
                assert overlapped["inter"]["gradient"] == blocking["inter"]["gradient"]
            assert inter[step, 0] == inter[step, 1]
            if step >= 1:  # the learned order: every bucket posted inside the backward, in order, the
                #             first one before half of the hooks had fired
                assert all(k > 0 for k in posted_at) and posted_at == sorted(posted_at), posted_at
                assert posted_at[0] <= hooks // 2 and posted_at[-1] == hooks, posted_at
                assert set(names[0]) == {"head.weight", "head.bias"}  # the last layer's alone: final first
        # the first backward ran on registration order: norms.0 sat in the first bucket, which therefore
        # waited for (almost) the end of that backward
        assert any(layer_of(n) == "norms.0" for n in results[0][5][0])
        assert results[0][4][0] > hooks // 2, results[0][4]
    on_every_rank(check)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_bucket_of_several_leader_messages_sums_exactly(cluster, dtype):
    """A bucket larger than layout.MESSAGE_PIECE_BYTES crosses between the leaders in several messages (the
    last one shorter): the sum is every rank's values added, the same bits on every rank."""
    topo, comm, ledger = cluster
    numel = 2 * 32768 // torch.tensor([], dtype=dtype).element_size() + 7  # two full messages and 7 elements

    def values(rank):
        return torch.from_numpy(np.random.default_rng([701, rank]).standard_normal(numel)).to(dtype)

    flat = values(topo.rank)
    comm.reduce_flat_start(flat).wait()
    expected = np.sum([values(r).double().numpy() for r in range(P)], axis=0)
    everyone = topo.world.allgather(flat.numpy().tobytes())

    def check():
        np.testing.assert_allclose(flat.double().numpy(), expected, rtol=1e-5, atol=1e-5)
        assert everyone[topo.rank] == everyone[0]
    on_every_rank(check)

"""Self-check of the cluster layer on the machine at hand.

    mpirun -n 4 python -m granndis_hpc.cluster.selfcheck [--ranks-per-server N] [--device cpu|cuda]
                                                        [--intra-transport gloo|nccl|mpi] [--fail-rank R]

Builds the topology, prints one line per server (rank 0), runs each primitive once on random data
with uneven (and empty) blocks, compares the results and the ledger's byte counts with a NumPy
reference, and exits non-zero on any mismatch.  `--fail-rank R` makes rank R raise before the first
collective, to show that the job then fails on every rank instead of hanging.
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from .accounting import allreduce_bytes_model
from .comm import Communicator
from .errors import agree, main_guard
from .layout import plan_buckets
from .ledger import Ledger
from .topology import init_topology
from granndis_hpc.options.parser import parse_options
from granndis_hpc.options.selfcheck import SELFCHECK_PROG, SelfcheckOptions


def _counts_matrix(rng: np.random.Generator, n: int) -> np.ndarray:
    """counts[src, dst]: uneven, about a third of the blocks empty, no self blocks."""
    counts = rng.integers(0, 6, size=(n, n)) * (rng.random((n, n)) > 0.33)
    np.fill_diagonal(counts, 0)
    return counts


def _send_rows(seed: int, rank: int, n_rows: int, width: int) -> np.ndarray:
    """The rows a rank sends, reproducible by any rank from (seed, rank)."""
    return np.random.default_rng([seed, rank]).standard_normal((n_rows, width))


def check_intra(comm: Communicator, seed: int) -> list[str]:
    topo, g = comm.topo, comm.topo.ranks_per_server
    counts = _counts_matrix(np.random.default_rng([seed, topo.server]), g)
    mates = topo.server_ranks()
    sent = _send_rows(seed, topo.rank, counts[topo.local_rank].sum(), 3)
    got = comm.intra_exchange(torch.from_numpy(sent).to(topo.device), counts[topo.local_rank],
                              counts[:, topo.local_rank], phase="halo")
    expected = []
    for j in range(g):   # block that local rank j sent to me, regenerated from its seed
        rows = _send_rows(seed, int(mates[j]), counts[j].sum(), 3)
        start = counts[j, :topo.local_rank].sum()
        expected.append(rows[start:start + counts[j, topo.local_rank]])
    problems = []
    if not np.array_equal(got.cpu().numpy(), np.concatenate(expected)):
        problems.append("intra_exchange result differs from the NumPy reference")
    if comm.ledger.bytes("intra", "halo") != counts[topo.local_rank].sum() * 3 * 8:
        problems.append(f"intra_exchange ledger {comm.ledger.bytes('intra', 'halo')} bytes, "
                        f"expected {counts[topo.local_rank].sum() * 24}")
    return problems


def check_world(comm: Communicator, seed: int) -> list[str]:
    topo, p = comm.topo, comm.topo.world_size
    counts = _counts_matrix(np.random.default_rng([seed, 10_000]), p)
    me = topo.rank
    sent = _send_rows(seed + 1, me, counts[me].sum(), 2).astype(np.float32)
    got = comm.world_exchange(torch.from_numpy(sent).to(topo.device), counts[me], counts[:, me], phase="evaluation")
    expected = []
    for src in range(p):
        rows = _send_rows(seed + 1, src, counts[src].sum(), 2).astype(np.float32)
        start = counts[src, :me].sum()
        expected.append(rows[start:start + counts[src, me]])
    problems = []
    if not np.array_equal(got.cpu().numpy(), np.concatenate(expected)):
        problems.append("world_exchange result differs from the NumPy reference")
    same = np.array([topo.server_of(r) == topo.server for r in range(p)])
    want = {"intra": counts[me][same].sum() * 8, "inter": counts[me][~same].sum() * 8}
    for link, nbytes in want.items():
        if comm.ledger.bytes(link, "evaluation") != nbytes:
            problems.append(f"world_exchange ledger {link} {comm.ledger.bytes(link, 'evaluation')} bytes, "
                            f"expected {nbytes}")
    return problems


def check_allreduce(comm: Communicator, seed: int) -> list[str]:
    topo = comm.topo
    shapes = [(7, 3), (5,), (0,), (129,), (2, 2, 2)]
    def values(rank):  # small integers: float sums are exact whatever the order
        rng = np.random.default_rng([seed + 2, rank])
        return [rng.integers(-50, 50, size=s).astype(np.float64) for s in shapes]
    tensors = [torch.from_numpy(v).to(topo.device) for v in values(topo.rank)]
    bucket_bytes = 200  # several buckets: 7x3 and 5 fill one, 129 is alone, ...
    comm.allreduce_(tensors, phase="gradient", bucket_bytes=bucket_bytes)
    expected = [sum(parts) for parts in zip(*(values(r) for r in range(topo.world_size)))]
    problems = []
    if not all(np.array_equal(t.cpu().numpy(), e) for t, e in zip(tensors, expected)):
        problems.append("allreduce_ result differs from the NumPy sum")
    want = {"intra": 0, "inter": 0}
    for bucket in plan_buckets([int(np.prod(shapes[i])) * 8 for i in range(len(shapes))],
                               [torch.float64] * len(shapes), bucket_bytes):
        n = sum(int(np.prod(shapes[i])) for i in bucket)
        if n:
            model = allreduce_bytes_model(n, 8, topo.servers, topo.ranks_per_server, topo.server, topo.local_rank)
            want = {k: want[k] + model[k] for k in want}
    for link, nbytes in want.items():
        if comm.ledger.bytes(link, "gradient") != nbytes:
            problems.append(f"allreduce_ ledger {link} {comm.ledger.bytes(link, 'gradient')} bytes, expected {nbytes}")
    return problems


def main(argv=None) -> int:
    # The options are declared with every other command's (granndis_hpc/options/selfcheck.py, standard
    # library only): the one import of the options package that the cluster layer makes besides
    # topology.py's (docs/design.md §3).
    args = parse_options(SelfcheckOptions, argv, SELFCHECK_PROG, __doc__.split("\n\n")[0], config=False)

    topo = init_topology(args.ranks_per_server, args.device, args.intra_transport, master_addr=args.master_addr,
                         dist_timeout_s=args.dist_timeout)
    if topo.rank == 0:
        print(topo.describe(), flush=True)
    if args.fail_rank is not None:
        agree(topo.world, 0 <= args.fail_rank < topo.world_size,
              f"--fail-rank {args.fail_rank} is not a rank of this {topo.world_size}-rank job")
        if topo.rank == args.fail_rank:
            raise RuntimeError(f"--fail-rank {args.fail_rank}: failure injected before a collective")
    ledger = Ledger()
    comm = Communicator(topo, ledger)
    problems = check_intra(comm, args.seed) + check_world(comm, args.seed) + check_allreduce(comm, args.seed)
    totals = ledger.reduce(topo.world)
    agree(topo.world, not problems, "; ".join(problems))
    if topo.rank == 0:
        b = totals["bytes"]
        print(f"selfcheck OK: intra_exchange, world_exchange, allreduce_ match NumPy; job bytes "
              f"intra={sum(b['intra'].values())} inter={sum(b['inter'].values())}", flush=True)
    comm.close()
    topo.close()
    return 0


if __name__ == "__main__":
    sys.exit(main_guard(main))

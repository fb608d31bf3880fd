"""Analytic byte model of the hierarchical all-reduce (what the ledger records for it).

Convention: bytes SENT by each rank, payload only, for a bandwidth-optimal algorithm -- so the
numbers do not depend on the MPI library, the message size or the machine.  For one bucket of
n elements of e bytes (B = n*e) on S servers of G ranks:

* intra, reduce to the leader: every non-leader sends its B bytes once (any reduction tree or
  chain has each non-root send exactly B);
* intra, broadcast from the leader: the leader is charged (G-1)*B (any broadcast tree delivers
  B to each of the G-1 others; we charge the root);
* inter, all-reduce among the S leaders, modelled as a ring all-reduce: the bucket is cut into S
  chunks (sizes as numpy.array_split: the first n % S chunks have one element more); in the
  reduce-scatter leader i sends every chunk but chunk (i+1) % S, in the all-gather every chunk but
  chunk (i+2) % S.  Summed over leaders this is exactly 2*(S-1)*B.

So per bucket: intra total over the job = 2*S*(G-1)*B (0 when G = 1); inter total = 2*(S-1)*B
(0 when S = 1).
"""
from __future__ import annotations


def ring_chunk_sizes(n: int, parts: int) -> list[int]:
    base, extra = divmod(int(n), int(parts))
    return [base + 1 if k < extra else base for k in range(parts)]


def allreduce_bytes_model(n_elements: int, element_size: int, servers: int, ranks_per_server: int,
                          server: int, local_rank: int) -> dict:
    """{"intra": bytes, "inter": bytes} this rank is charged for one bucket of the hierarchical all-reduce."""
    payload = int(n_elements) * int(element_size)
    g, s = int(ranks_per_server), int(servers)
    intra = 0 if g == 1 else ((g - 1) * payload if local_rank == 0 else payload)
    inter = 0
    if s > 1 and local_rank == 0:
        chunks = ring_chunk_sizes(n_elements, s)
        inter = int(element_size) * (2 * int(n_elements) - chunks[(server + 1) % s] - chunks[(server + 2) % s])
    return {"intra": intra, "inter": inter}

"""Runtime samplers for Cooperative Batching: a co-batch's dependency graph inside one server's
preloaded subgraph.  Pure NumPy, vectorised, deterministic from (seed, server, epoch, iteration), so
every rank of a server draws the same sample without communicating, and a resumed run draws the same
samples as an uninterrupted one.

A sample is a set of server-local vertices with a hop (0 = target of the co-batch, d = first reached
at hop d) and, for every vertex that some layer computes (hop < L), its kept in-edges.  Vertices are
sorted by (hop, id), so the planner's rule "layer l computes hop <= L-1-l" holds: a kept in-neighbour
of a hop-d vertex has hop <= d + 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from granndis_hpc.graph.csr import bfs_hops, csr_from_edges, csr_row_positions, position_lookup, rank_in_rows

SAMPLERS = ("sage", "saint")


class SamplerError(ValueError):
    pass


@dataclass
class SampledGraph:
    vertices: np.ndarray  # int64 [n] server-local ids, sorted by (hop, id)
    hop: np.ndarray  # int64 [n]
    indptr: np.ndarray  # int64 [n+1] kept in-edges of each vertex (empty for hop == L)
    indices: np.ndarray  # int64 server-local ids of the sources

    def position_of(self, ids: np.ndarray) -> np.ndarray:
        """Row of each server-local id in this sample (-1 if absent)."""
        return position_lookup(self.vertices)(ids)


@dataclass
class Draw:
    """A co-batch's sample as index arrays over the server graph it was drawn from (One-Hop Graph
    Masking's per-co-batch masks over one fixed graph): no new graph is built per co-batch.

    The same sample as the SampledGraph `to_sampled` builds from it (what `CoBatchSampler.sample`
    returns), in a form a rank can split and plan from without renumbering the server's edges."""

    hop: np.ndarray  # int [n_s]: hop of every server vertex in the sample, -1 for the others
    edges: np.ndarray  # int64, increasing: positions in the server CSR of the kept in-edges

    def to_sampled(self, indptr, indices) -> SampledGraph:
        vertices = np.flatnonzero(self.hop >= 0)
        dst = np.searchsorted(indptr, self.edges, side="right") - 1
        return _assemble(vertices, self.hop[vertices].astype(np.int64), indices[self.edges], dst)


def sample_row_positions(indptr, rows, fanout: int, rng: np.random.Generator):
    """Up to `fanout` in-edges of each row, uniformly without replacement (-1 = all), as positions in
    the CSR: (indptr over the rows, positions)."""
    sub_ip, pos = csr_row_positions(indptr, rows)
    if fanout < 0:
        return sub_ip, pos
    counts = np.diff(sub_ip)
    row_of = np.repeat(np.arange(rows.shape[0], dtype=np.int64), counts)
    # Random order inside each row with one int64 key: row in the high bits, a random 32-bit draw in
    # the low bits; a row keeps its `fanout` smallest keys.
    key = (row_of << 32) | rng.integers(0, 1 << 32, pos.shape[0], dtype=np.int64)
    kept_counts = np.minimum(counts, fanout)
    out_ip = np.zeros(rows.shape[0] + 1, dtype=np.int64)
    np.cumsum(kept_counts, out=out_ip[1:])
    # Sorting the keys themselves is ~2.5x cheaper than arg-sorting them: the fanout-th smallest key of
    # each row is a threshold, and the edges at or below it are the kept ones, already in position
    # order.  Only a tie at a threshold (two equal 32-bit draws in one row) keeps more than `fanout`:
    # then the arg-sort below decides, which makes every draw the one it has always been.
    big = counts > fanout
    threshold = np.full(rows.shape[0], np.iinfo(np.int64).max, dtype=np.int64)
    threshold[big] = np.sort(key)[sub_ip[:-1][big] + (fanout - 1)]
    keep = key <= threshold[row_of]
    if np.count_nonzero(keep) == out_ip[-1]:
        return out_ip, pos[keep]
    order = np.argsort(key)
    keep = order[rank_in_rows(sub_ip) < fanout]  # the first `fanout` of each row in the random order
    keep.sort()
    return out_ip, pos[keep]


def sample_rows(indptr, indices, rows, fanout: int, rng: np.random.Generator):
    """Up to `fanout` in-edges of each row, uniformly without replacement (-1 = all): (indptr, sources)."""
    out_ip, pos = sample_row_positions(indptr, rows, fanout, rng)
    return out_ip, indices[pos]


def draw_dependency(indptr, indices, targets, layers: int, fanout: int, rng) -> Draw:
    """GraphSAGE-style: hop by hop, each newly reached vertex keeps up to `fanout` in-edges."""
    kept = [np.zeros(0, dtype=np.int64)]

    # The BFS keeps the first hop at which each vertex is reached; the kept edges are recorded here.
    def expand(frontier, hop_of):
        pos = sample_row_positions(indptr, frontier, fanout, rng)[1]
        kept.append(pos)
        return indices[pos]

    hop = bfs_hops(indptr, indices, targets, layers, expand)
    edges = np.concatenate(kept)
    edges.sort()  # each vertex is expanded once: the positions are distinct
    return Draw(hop=hop, edges=edges)


def draw_induced(indptr, indices, targets) -> Draw:
    """GraphSAINT-style node sampler: the subgraph induced on the batch; every row is a target (the
    "unmasked version" of One-Hop Graph Masking)."""
    n = indptr.shape[0] - 1
    hop = np.full(n, -1, dtype=np.int32)
    hop[np.asarray(targets, dtype=np.int64)] = 0
    rows = np.flatnonzero(hop == 0)
    pos = csr_row_positions(indptr, rows)[1]
    return Draw(hop=hop, edges=pos[hop[indices[pos]] == 0])  # rows ascending: positions increasing


def sample_dependency(indptr, indices, targets, layers: int, fanout: int, rng) -> SampledGraph:
    return draw_dependency(indptr, indices, targets, layers, fanout, rng).to_sampled(indptr, indices)


def induced_batch(indptr, indices, targets) -> SampledGraph:
    return draw_induced(indptr, indices, targets).to_sampled(indptr, indices)


def _assemble(vertices, hop, edge_src, edge_dst) -> SampledGraph:
    order = np.lexsort((vertices, hop))
    vertices, hop = vertices[order], hop[order]
    sg = SampledGraph(vertices=vertices, hop=hop, indptr=np.zeros(1, np.int64), indices=np.zeros(0, np.int64))
    row = sg.position_of(edge_dst)
    sg.indptr, sg.indices = csr_from_edges(edge_src, row, vertices.size)
    return sg


class CoBatchSampler:
    """A server's co-batches: its inner training vertices in `batches` shuffled chunks per epoch,
    each expanded to its L-hop dependency graph inside the server's preloaded subgraph."""

    def __init__(self, indptr, indices, train_ids, batches: int, layers: int, kind: str = "sage",
                 fanout: int = -1, seed: int = 0, server: int = 0):
        if kind not in SAMPLERS:
            raise SamplerError(f"unknown sampler {kind!r}; choose one of {', '.join(SAMPLERS)}")
        if fanout == 0 or fanout < -1:
            raise SamplerError(f"--fanout must be a positive number of neighbours or -1 for all, got {fanout}")
        if len(train_ids) == 0:
            raise SamplerError(f"server {server} holds no training vertices, so it has no co-batches to draw; "
                               f"train with a full-graph mode (--mode flx or fb), or rebuild the shards with "
                               f"fewer servers or a larger training split")
        if batches < 1 or batches > len(train_ids):
            raise SamplerError(f"server {server} has {len(train_ids)} training vertices, which cannot make "
                               f"{batches} co-batches per epoch; use --batches-per-epoch <= {len(train_ids)}")
        self.indptr, self.indices = indptr, indices
        self.train_ids = np.sort(np.asarray(train_ids, dtype=np.int64))
        self.batches, self.layers, self.kind, self.fanout = batches, layers, kind, fanout
        self.seed, self.server = seed, server

    def _rng(self, *stream) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.server, *stream])

    def epoch_targets(self, epoch: int):
        """The epoch's co-batches (shuffled chunks of the training vertices)."""
        perm = self._rng(epoch, 0).permutation(self.train_ids)
        return np.array_split(perm, self.batches)

    @property
    def deterministic(self) -> bool:
        """Whether a co-batch's sample is a function of its targets alone (nothing drawn at random)."""
        return self.kind == "saint" or self.fanout < 0

    def draw(self, targets, epoch: int, iteration: int) -> Draw:
        """Co-batch `iteration` of `epoch` (its targets: epoch_targets(epoch)[iteration], or a GPU's
        share of them) as index arrays over the server graph."""
        if self.kind == "saint":
            return draw_induced(self.indptr, self.indices, targets)
        return draw_dependency(self.indptr, self.indices, targets, self.layers, self.fanout,
                               self._rng(epoch, 1 + iteration))

    def sample(self, targets, epoch: int, iteration: int) -> SampledGraph:
        return self.draw(targets, epoch, iteration).to_sampled(self.indptr, self.indices)

    # Samples depend only on (seed, server, epoch, iteration): nothing else to save for a resume.
    def state_dict(self) -> dict:
        return {"seed": self.seed, "server": self.server, "batches": self.batches, "kind": self.kind,
                "fanout": self.fanout}

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        if state != mine:
            raise SamplerError(f"sampler state {state} does not match this run's sampler {mine}")

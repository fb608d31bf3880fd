"""Synthetic graphs with the locality of real ones: a degree-corrected geometric graph on a 2-D torus.

Why: the DC-SBM of `synthetic.py` joins any two vertices of a community with the same
probability, so a community of N/C vertices is an expander: a 2-way cut of it costs ~half of its
edges and the 3-hop neighbourhood of half the graph is the whole graph.  Real graphs are local at
every scale -- co-purchased products sit in small groups of similar items, inside sub-categories,
inside categories -- so partitioners find cuts of a few percent and a server's k-hop halo is a thin
boundary layer.  Flexible Preloading is only worth measuring on such a graph.

Model (``--generator local``).  Ids are random with respect to position, so a partitioner has to find
the structure (as with real datasets):

* space: a ``side x side`` torus of cells, ``side = round(sqrt(N / cell_size))``; the cells are equal
  blocks of a keyed random permutation of the ids (synthetic_chunks.py), so each holds N/cells vertices.  The torus has
  no border, so no region
  is special and locality is the same everywhere; its nested squares are the hierarchy of communities
  (cell, block of cells, region, ...).
* degree propensity theta exactly as the DC-SBM (Pareto, tail exponent 1.5, capped);
* about N*D/2 edge draws: vertex s draws Poisson(theta_s D / (2 E[theta])) of them; with probability
  ``long_range`` the partner is a uniform vertex (the few long-range links real graphs have),
  otherwise a cell offset (dx, dy) = round(local_scale * theta_s**0.1 * standard normal) per axis
  from s's cell and the partner uniformly inside that cell.  A Gaussian kernel makes the k-hop ball grow like k (its
  radius) instead of D^k, so cuts and k-hop halos are boundary layers; the theta-weighted first
  endpoint makes the degree tail a power law (see HUB_SPREAD and PARTNER_EXPONENT for why hubs reach
  a little further and why the partner is uniform in its cell);
* labels: ``communities`` Voronoi patches (random seed cells, each cell joins its nearest seed on the
  torus), each patch a class by a random balanced assignment (class = shuffled patch index mod C), so
  a class is several irregular regions and neighbours mostly share it (homophily);
* features and split exactly as the DC-SBM (class centroid + Gaussian noise; random split), so the
  GNN-beats-MLP property comes from the graph: see docs/performance/locality.md for the measured nearest
  class mean accuracy on own features against 1-hop and 2-hop means.

Vertex chunk i and its vertices' edges come from (seed, i) alone (synthetic_chunks.py), so a build
rank generates only its chunks and the graph does not depend on the number of ranks.
"""
from __future__ import annotations

import numpy as np

from granndis_hpc.preprocess.sources.canonical import DataError
import granndis_hpc.preprocess.sources.synthetic as synthetic
from granndis_hpc.preprocess.sources.synthetic import common_problems

# Defaults chosen with bench/bench_locality.py (200k vertices, D=25, 2 servers): see docs/performance/locality.md.
# long_range is small because every long-range edge into a server drags its endpoint's whole (k-1)-hop
# ball into the halo: 0.001 instead of 0.0002 took the 2-hop preload from 1.28 to 1.55 rows per vertex
# (measured, before HUB_SPREAD); cell_size 16 with local_scale 1 gives a neighbourhood of ~200 vertices.
LOCAL_DEFAULTS = dict(cell_size=16, local_scale=1.0, long_range=0.0002)
PATCH_VERTICES = 4096  # default patch size: communities = max(C, N // PATCH_VERTICES)
# A vertex's kernel widens as theta**HUB_SPREAD (x2 at the cap theta = 1000): a fixed-width neighbourhood
# holds only a few hundred vertices, which would cap every degree there (measured at 200k, D=25, METIS:
# max degree 466 with 0, 1182 with 0.1, for 2-hop rows per vertex 1.30 -> 1.38), while a wider exponent
# makes hubs global and the 2-hop halo the whole graph (0.5: cut 5.4 %, 1.99 rows per vertex at k=2).
HUB_SPREAD = 0.1


def torus_side(vertices: int, cell_size: float) -> int:
    return max(1, int(round(np.sqrt(vertices / float(cell_size)))))


def default_communities(vertices: int, classes: int) -> int:
    return max(int(classes), int(vertices) // PATCH_VERTICES)


def _check(vertices, avg_degree, features, classes, communities, train_frac, val_frac, feature_noise,
           cell_size, local_scale, long_range):
    problems = common_problems(vertices, avg_degree, features, classes, train_frac, val_frac, feature_noise)
    if not cell_size >= 1:
        problems.append(f"--cell-size {cell_size} (need >= 1 vertex per cell)")
    elif vertices >= 2:
        cells = torus_side(vertices, cell_size) ** 2
        if cells > vertices:
            problems.append(f"--cell-size {cell_size} gives {cells} cells for --vertices {vertices} "
                            "(need at most one cell per vertex: use --cell-size 1 or more vertices)")
        if communities < classes:
            problems.append(f"--communities {communities} (need >= --classes {classes}: each class is a union "
                            "of patches)")
        if communities > cells:
            problems.append(f"--communities {communities} (more than the {cells} cells of the torus: use fewer "
                            "communities or a smaller --cell-size)")
    if not (np.isfinite(local_scale) and local_scale >= 0):
        problems.append(f"--local-scale {local_scale} (need a finite value >= 0, in cells)")
    if not 0 <= long_range <= 1:
        problems.append(f"--long-range {long_range} (need 0..1)")
    if problems:
        raise DataError(f"synthetic --generator local: invalid parameters: {'; '.join(problems)}. "
                        "Fix: change those options")


class PatchMap:
    """Patch of any torus cell: Voronoi regions of `communities` distinct random seed cells (drawn from
    `seq`), answered per query (a KD-tree over the seeds), so a build rank asks only for its cells."""

    def __init__(self, side: int, communities: int, seq: np.random.SeedSequence):
        from scipy.spatial import cKDTree

        self.side = int(side)
        seeds = np.random.default_rng(seq).permutation(self.side * self.side)[:communities]
        # boxsize makes distances periodic (torus); ties go to the lower seed index (deterministic).
        self.tree = cKDTree(self._coords(seeds), boxsize=float(self.side))

    def _coords(self, c):
        return np.stack([c % self.side, c // self.side], axis=1).astype(np.float64)

    def of_cells(self, cells) -> np.ndarray:
        cells = np.asarray(cells, dtype=np.int64)
        out = np.empty(cells.shape[0], dtype=np.int64)
        for lo in range(0, cells.shape[0], synthetic.ROW_CHUNK):  # chunks bound the query's temporaries
            out[lo:lo + synthetic.ROW_CHUNK] = self.tree.query(self._coords(cells[lo:lo + synthetic.ROW_CHUNK]))[1]
        return out


def patches_of_cells(side: int, communities: int, seq: np.random.SeedSequence) -> np.ndarray:
    """Patch of every cell (PatchMap over all cells)."""
    return PatchMap(side, communities, seq).of_cells(np.arange(side * side, dtype=np.int64))

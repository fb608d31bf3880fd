"""Synthetic graphs with the locality of real ones: a degree-corrected geometric graph on a 2-D torus.

Why (issue 11): the DC-SBM of `synthetic.py` joins any two vertices of a community with the same
probability, so a community of N/C vertices is an expander: a 2-way cut of it costs ~half of its
edges and the 3-hop neighbourhood of half the graph is the whole graph.  Real graphs are local at
every scale -- co-purchased products sit in small groups of similar items, inside sub-categories,
inside categories -- so partitioners find cuts of a few percent and a server's k-hop halo is a thin
boundary layer.  Flexible Preloading is only worth measuring on such a graph.

Model (``--generator local``).  Ids are random with respect to position, so a partitioner has to find
the structure (as with real datasets):

* space: a ``side x side`` torus of cells, ``side = round(sqrt(N / cell_size))``; every vertex lives in
  a uniformly random cell (each cell gets at least one vertex).  The torus has no border, so no region
  is special and locality is the same everywhere; its nested squares are the hierarchy of communities
  (cell, block of cells, region, ...).
* degree propensity theta exactly as the DC-SBM (Pareto, tail exponent 1.5, capped);
* N*D/2 edge draws: one endpoint s by theta over all vertices; with probability ``long_range`` the
  other by theta over all vertices (the few long-range links real graphs have), otherwise a cell
  offset (dx, dy) = round(local_scale * theta_s**0.1 * standard normal) per axis from s's cell and the
  other endpoint uniformly inside that cell.  A Gaussian kernel makes the k-hop ball grow like k (its
  radius) instead of D^k, so cuts and k-hop halos are boundary layers; the theta-weighted first
  endpoint makes the degree tail a power law (see HUB_SPREAD and PARTNER_EXPONENT for why hubs reach
  a little further and why the partner is uniform in its cell);
* labels: ``communities`` Voronoi patches (random seed cells, each cell joins its nearest seed on the
  torus), each patch a class by a random balanced assignment (class = shuffled patch index mod C), so
  a class is several irregular regions and neighbours mostly share it (homophily);
* features and split exactly as the DC-SBM (class centroid + Gaussian noise; random split), so the
  GNN-beats-MLP property comes from the graph: see docs/bench-locality.md for the measured nearest
  class mean accuracy on own features against 1-hop and 2-hop means.

Everything is drawn in fixed-size chunks, each from its own stream spawned from the seed, so the
result depends only on the seed and the parameters, and memory is a few arrays of N plus the edge
arrays (as the DC-SBM).
"""
from __future__ import annotations

import numpy as np

from preprocess.canonical import DataError
from preprocess.sources import synthetic
from preprocess.sources.synthetic import (WeightedSampler, common_problems, degree_propensity, generate_features,
                                          split_masks)

# Defaults chosen with bench/bench_locality.py (200k vertices, D=25, 2 servers): see docs/bench-locality.md.
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
# The partner is drawn uniformly inside its cell (theta**0), not by theta as in the DC-SBM: in a
# neighbourhood of a few hundred vertices theta-weighted partners repeat hub-hub pairs many times and
# canonicalisation drops them (measured realised mean degree 20.3 by theta, 22.1 uniform, of 25 drawn).
# Hubs still come from the theta-weighted first endpoint, so the degree tail stays a power law.
PARTNER_EXPONENT = 0.0


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


def _streams(seed: int):
    """Independent generators per purpose; a different root from the DC-SBM's so the two never share draws."""
    root = np.random.SeedSequence([int(seed), 0x6C6F6361])
    names = ("cell", "theta", "edges", "patches", "classes", "centroids", "features", "split")
    return dict(zip(names, root.spawn(len(names))))


def generate_local_edges(cell: np.ndarray, side: int, theta: np.ndarray, num_draws: int, local_scale: float,
                         long_range: float, seq: np.random.SeedSequence):
    """Edge draws (src, dst) of the geometric model, chunk by chunk (see the module docstring)."""
    n = cell.shape[0]
    n_cells = side * side
    id_dtype = np.int32 if n < 2**31 else np.int64
    everywhere = WeightedSampler(theta)
    # The DC-SBM's community trick, per cell (synthetic.grouped_sampler).
    w = theta ** PARTNER_EXPONENT
    by_cell, within, mass, lo_mass, count, start = synthetic.grouped_sampler(cell, w, n_cells, id_dtype)
    src = np.empty(num_draws, dtype=id_dtype)
    dst = np.empty(num_draws, dtype=id_dtype)
    chunks = range(0, num_draws, synthetic.EDGE_CHUNK)
    for lo, child in zip(chunks, seq.spawn(len(chunks))):
        rng = np.random.default_rng(child)
        m = min(lo + synthetic.EDGE_CHUNK, num_draws) - lo
        s = everywhere.sample(rng.random(m) * everywhere.total)
        c = cell[s].astype(np.int64)
        scale = local_scale * theta[s] ** HUB_SPREAD
        offset = np.rint(rng.standard_normal((2, m)) * scale).astype(np.int64)
        tc = (c % side + offset[0]) % side + ((c // side + offset[1]) % side) * side
        pos = within.sample(lo_mass[tc] + rng.random(m) * mass[tc])
        # Float rounding at a cell's upper edge could step into the next cell: clamp.
        d = by_cell[np.clip(pos, start[tc], start[tc] + count[tc] - 1)]
        far = rng.random(m) < long_range
        d[far] = everywhere.sample(rng.random(int(far.sum())) * everywhere.total)
        src[lo:lo + m] = s
        dst[lo:lo + m] = d
    return src, dst


def patches_of_cells(side: int, communities: int, seq: np.random.SeedSequence) -> np.ndarray:
    """Patch of every cell: Voronoi regions of `communities` distinct random seed cells on the torus."""
    from scipy.spatial import cKDTree

    n_cells = side * side
    seeds = np.random.default_rng(seq).permutation(n_cells)[:communities]
    coords = lambda c: np.stack([c % side, c // side], axis=1).astype(np.float64)  # noqa: E731
    # boxsize makes distances periodic (torus); ties go to the lower seed index (deterministic).
    tree = cKDTree(coords(seeds), boxsize=float(side))
    cells = np.arange(n_cells, dtype=np.int64)
    out = np.empty(n_cells, dtype=np.int64)
    for lo in range(0, n_cells, synthetic.ROW_CHUNK):  # chunks bound the query's temporaries
        out[lo:lo + synthetic.ROW_CHUNK] = tree.query(coords(cells[lo:lo + synthetic.ROW_CHUNK]))[1]
    return out


def generate_local_raw(vertices, avg_degree, features, classes, communities, seed, train_frac, val_frac,
                       feature_noise, cell_size=LOCAL_DEFAULTS["cell_size"],
                       local_scale=LOCAL_DEFAULTS["local_scale"], long_range=LOCAL_DEFAULTS["long_range"]) -> dict:
    """The raw draw (before canonicalisation): canonicalize() arguments plus ``community`` (patch) and
    ``cell`` of every vertex and the torus ``side``; see the module docstring."""
    vertices, features, classes = int(vertices), int(features), int(classes)
    communities = default_communities(vertices, classes) if communities is None else int(communities)
    _check(vertices, avg_degree, features, classes, communities, train_frac, val_frac, feature_noise,
           float(cell_size), float(local_scale), float(long_range))
    streams = _streams(seed)
    side = torus_side(vertices, cell_size)
    n_cells = side * side
    cell = np.random.default_rng(streams["cell"]).integers(0, n_cells, vertices)
    # Every cell gets at least one vertex, so a draw never lands in an empty cell.
    cell[np.random.default_rng(streams["cell"].spawn(1)[0]).permutation(vertices)[:n_cells]] = np.arange(n_cells)
    theta = degree_propensity(vertices, streams["theta"])
    num_draws = int(round(vertices * float(avg_degree) / 2))
    src, dst = generate_local_edges(cell, side, theta, num_draws, float(local_scale), float(long_range),
                                    streams["edges"])
    patch_of_cell = patches_of_cells(side, communities, streams["patches"])
    # Shuffled patch index mod C: balanced classes, and neighbouring patches are not in class order.
    patch_class = np.random.default_rng(streams["classes"]).permutation(communities) % classes
    community = patch_of_cell[cell]
    labels = patch_class[community].astype(np.int64)
    x = generate_features(labels, features, classes, float(feature_noise), streams)
    masks = split_masks(vertices, train_frac, val_frac, streams["split"])
    return dict(num_vertices=vertices, src=src, dst=dst, features=x, labels=labels,
                train_mask=masks[0], val_mask=masks[1], test_mask=masks[2], num_classes=classes,
                community=community, cell=cell, side=side)

"""Synthetic graphs at any scale: a degree-corrected stochastic block model (DC-SBM) with learnable labels.

Why this model: real GNN benchmarks (ogbn-products, citation graphs) have heavy-tailed degrees,
community structure that partitioners exploit, and labels that agree with communities (homophily).
A DC-SBM reproduces all three with a handful of parameters, and its features can be made so that
neighbours carry most of the class signal (a GNN beats an MLP), which is what a training demo needs.
Its communities are expanders, though: a 2-way cut costs ~10 % of the edges and a 2-hop preload of half
the graph is the whole graph.  ``--generator local`` (synthetic_local.py) adds the locality of real
graphs; this model stays the default and its output is unchanged.

Model (ids are random with respect to communities, as in real datasets, so partitioning is not trivial):

* community of each vertex uniform in 0..K-1; class = community mod C (K defaults to C);
* degree propensity theta_v ~ Pareto with tail exponent ``DEGREE_EXPONENT`` (P(deg > d) ~ d^-1.5),
  capped at ``THETA_CAP`` times the minimum so one vertex cannot touch most of a small graph;
* N*D/2 undirected edge draws: one endpoint by theta over all vertices, the other by theta inside the
  first endpoint's community with probability ``homophily``, else by theta over all vertices;
  canonicalisation symmetrises and removes duplicates/loops, so the directed edge count is a little
  under N*D (duplicates among hub pairs);
* features = class centroid (unit-variance Gaussian per class) + Gaussian noise of std ``feature_noise``
  per vertex: noisy enough that a classifier on a vertex's own features is poor, while averaging over
  ~D mostly same-class neighbours recovers the class.  Measured with the defaults at 100k vertices
  (nearest class mean fitted on the train split, test accuracy): own features 31 %, mean over self +
  1-hop neighbours 94 %, 2 hops 99.8 % (16 classes, chance 6 %);
* split: a random permutation, first train_frac*N train, next val_frac*N val, the rest test.
  Defaults 0.1 / 0.1 / 0.8 -- like ogbn-products (8 % / 2 % / 90 %) a small labelled fraction, but a
  validation set large enough for stable model selection.

Everything is drawn in fixed-size chunks, each from its own stream spawned from the seed, so results
depend only on the seed and the parameters (never on memory or timing), and memory stays bounded:
an ogbn-products-sized graph (2.45 M vertices, D=25, F=100) is measured in the README/report.
"""
from __future__ import annotations

import numpy as np

from preprocess.canonical import DataError, canonicalize

DEGREE_EXPONENT = 2.5  # density exponent gamma of theta; tail P(theta > t) ~ t^-(gamma-1)
THETA_CAP = 1000.0
EDGE_CHUNK = 1 << 22  # edge draws per chunk (4 M)
ROW_CHUNK = 1 << 15  # feature rows per chunk
DEFAULTS = dict(vertices=100_000, avg_degree=25.0, features=100, classes=16, communities=None, seed=0,
                train_frac=0.1, val_frac=0.1, homophily=0.8, feature_noise=8.0)


def common_problems(vertices, avg_degree, features, classes, train_frac, val_frac, feature_noise) -> list:
    """The option problems both generators share (each adds its own)."""
    problems = []
    if vertices < 2:
        problems.append(f"--vertices {vertices} (need at least 2)")
    if not avg_degree > 0:
        problems.append(f"--avg-degree {avg_degree} (need > 0)")
    if features < 1:
        problems.append(f"--features {features} (need >= 1)")
    if classes < 1:
        problems.append(f"--classes {classes} (need >= 1)")
    if not (0 < train_frac and 0 <= val_frac and train_frac + val_frac <= 1):
        problems.append(f"--train-frac {train_frac} --val-frac {val_frac} (need 0 < train, 0 <= val, sum <= 1)")
    if not feature_noise >= 0:
        problems.append(f"--feature-noise {feature_noise} (need >= 0)")
    return problems


def _check(vertices, avg_degree, features, classes, communities, train_frac, val_frac, homophily,
           feature_noise):
    where = "synthetic"
    problems = common_problems(vertices, avg_degree, features, classes, train_frac, val_frac, feature_noise)
    if communities < classes:
        problems.append(f"--communities {communities} (need >= --classes {classes}: each class is a union "
                        "of communities)")
    if communities > vertices:
        problems.append(f"--communities {communities} (more than --vertices {vertices})")
    if not 0 <= homophily <= 1:
        problems.append(f"--homophily {homophily} (need 0..1)")
    if problems:
        raise DataError(f"{where}: invalid parameters: {'; '.join(problems)}. Fix: change those options")


def _streams(seed: int):
    """Independent generators per purpose (adding a purpose never changes the others' draws)."""
    root = np.random.SeedSequence([int(seed), 0x6E6E6469])
    names = ("community", "theta", "edges", "centroids", "features", "split")
    return dict(zip(names, root.spawn(len(names))))


class WeightedSampler:
    """Draw indices with probability proportional to ``weights`` from positions x in [0, sum(weights)).

    Same answer as ``searchsorted(cumsum(weights), x, side="right")`` but with a guide table
    (Chen & Asau): bucket j of equal mass remembers the first index it contains, so each draw needs
    a couple of gathers instead of ~log2(N) cache-missing binary-search steps -- 5-10x faster for
    millions of random draws.  The refinement loop runs at most (max indices per bucket) times,
    a small constant for weights bounded below (here theta >= 1).
    """

    def __init__(self, weights: np.ndarray):
        self.cum = np.cumsum(weights, dtype=np.float64)
        self.total = float(self.cum[-1])
        n = self.cum.shape[0]
        self.guide = np.searchsorted(self.cum, np.arange(n) * (self.total / n), side="right")
        # The answer for a draw in bucket j lies in [guide[j], guide[j+1]] (last bucket: up to n-1).
        widths = np.append(np.diff(self.guide), n - 1 - self.guide[-1])
        self.max_steps = int(widths.max()) + 1

    def sample(self, x: np.ndarray) -> np.ndarray:
        n = self.cum.shape[0]
        idx = self.guide[np.minimum((x * (n / self.total)).astype(np.int64), n - 1)]
        for _ in range(self.max_steps):
            advance = self.cum[idx] <= x
            if not advance.any():
                break
            idx += advance
            np.minimum(idx, n - 1, out=idx)  # x at the very top (float rounding) stays in range
        return idx


def grouped_sampler(group: np.ndarray, weights: np.ndarray, n_groups: int, id_dtype):
    """One sampler over vertices ordered by group: group c owns the mass interval [lo[c], lo[c] + mass[c])
    and the index range [start[c], start[c] + count[c]).  Returns (order, sampler, mass, lo, count, start)."""
    order = np.argsort(group, kind="stable").astype(id_dtype)
    within = WeightedSampler(weights[order])
    mass = np.bincount(group, weights=weights, minlength=n_groups)
    lo = np.concatenate(([0.0], np.cumsum(mass)[:-1]))
    count = np.bincount(group, minlength=n_groups)
    start = np.concatenate(([0], np.cumsum(count)[:-1]))
    return order, within, mass, lo, count, start


def generate_edges(community: np.ndarray, theta: np.ndarray, num_draws: int, homophily: float,
                   seq: np.random.SeedSequence):
    """DC-SBM edge draws (src, dst) as int32/int64 arrays, generated chunk by chunk."""
    n = community.shape[0]
    k = int(community.max()) + 1
    id_dtype = np.int32 if n < 2**31 else np.int64
    everywhere = WeightedSampler(theta)
    by_comm, within, comm_mass, comm_lo, comm_count, comm_start = grouped_sampler(community, theta, k, id_dtype)
    src = np.empty(num_draws, dtype=id_dtype)
    dst = np.empty(num_draws, dtype=id_dtype)
    chunks = range(0, num_draws, EDGE_CHUNK)
    for lo, child in zip(chunks, seq.spawn(len(chunks))):
        rng = np.random.default_rng(child)
        hi = min(lo + EDGE_CHUNK, num_draws)
        s = everywhere.sample(rng.random(hi - lo) * everywhere.total)
        c = community[s]
        # The other endpoint: inside s's community (by theta) with prob. homophily, else anywhere.
        inside = rng.random(hi - lo) < homophily
        d = everywhere.sample(rng.random(hi - lo) * everywhere.total)
        ci = c[inside]
        pos = within.sample(comm_lo[ci] + rng.random(ci.shape[0]) * comm_mass[ci])
        # Float rounding at a community's upper edge could step into the next block: clamp.
        d[inside] = by_comm[np.clip(pos, comm_start[ci], comm_start[ci] + comm_count[ci] - 1)]
        src[lo:hi] = s
        dst[lo:hi] = d
    return src, dst


def generate_features(labels: np.ndarray, num_features: int, num_classes: int, noise: float,
                      streams) -> np.ndarray:
    centroids = np.random.default_rng(streams["centroids"]).standard_normal(
        (num_classes, num_features), dtype=np.float32)
    n = labels.shape[0]
    out = np.empty((n, num_features), dtype=np.float32)
    chunks = range(0, n, ROW_CHUNK)
    for lo, child in zip(chunks, streams["features"].spawn(len(chunks))):
        hi = min(lo + ROW_CHUNK, n)
        rng = np.random.default_rng(child)
        rng.standard_normal((hi - lo, num_features), dtype=np.float32, out=out[lo:hi])
        out[lo:hi] *= np.float32(noise)
        out[lo:hi] += centroids[labels[lo:hi]]
    return out


def generate_raw(vertices=DEFAULTS["vertices"], avg_degree=DEFAULTS["avg_degree"],
                 features=DEFAULTS["features"], classes=DEFAULTS["classes"], communities=None,
                 seed=DEFAULTS["seed"], train_frac=DEFAULTS["train_frac"], val_frac=DEFAULTS["val_frac"],
                 homophily=DEFAULTS["homophily"], feature_noise=DEFAULTS["feature_noise"]) -> dict:
    """The raw DC-SBM draw (before canonicalisation) as a dict of canonicalize() arguments
    plus ``community``; see the module docstring for the model."""
    vertices, features, classes = int(vertices), int(features), int(classes)
    communities = classes if communities is None else int(communities)
    _check(vertices, avg_degree, features, classes, communities, train_frac, val_frac, homophily,
           feature_noise)
    streams = _streams(seed)
    community = np.random.default_rng(streams["community"]).integers(0, communities, vertices)
    # Every community gets at least one vertex, so community sampling never meets an empty block.
    community[np.random.default_rng(streams["community"].spawn(1)[0]).permutation(vertices)[:communities]] = \
        np.arange(communities)
    labels = (community % classes).astype(np.int64)
    theta = degree_propensity(vertices, streams["theta"])
    num_draws = int(round(vertices * float(avg_degree) / 2))
    src, dst = generate_edges(community, theta, num_draws, float(homophily), streams["edges"])
    x = generate_features(labels, features, classes, float(feature_noise), streams)
    masks = split_masks(vertices, train_frac, val_frac, streams["split"])
    return dict(num_vertices=vertices, src=src, dst=dst, features=x, labels=labels,
                train_mask=masks[0], val_mask=masks[1], test_mask=masks[2], num_classes=classes,
                community=community)


def degree_propensity(vertices: int, stream) -> np.ndarray:
    """theta_v ~ Pareto with tail exponent DEGREE_EXPONENT, capped at THETA_CAP (both generators)."""
    u = np.random.default_rng(stream).random(vertices)
    return np.minimum((1.0 - u) ** (-1.0 / (DEGREE_EXPONENT - 1.0)), THETA_CAP)


def split_masks(vertices: int, train_frac: float, val_frac: float, stream):
    """Train/val/test masks from one random permutation: the first train_frac*N, the next val_frac*N, the rest."""
    perm = np.random.default_rng(stream).permutation(vertices)
    n_train = max(1, int(round(train_frac * vertices)))
    n_val = int(round(val_frac * vertices))
    masks = []
    for lo, hi in ((0, n_train), (n_train, n_train + n_val), (n_train + n_val, vertices)):
        m = np.zeros(vertices, dtype=bool)
        m[perm[lo:hi]] = True
        masks.append(m)
    return masks


# The two generators: the DC-SBM here (default, unchanged), and the geometric graph with the locality of
# real graphs in synthetic_local.py.  Options of one generator are ignored by the other, as options of
# other sources are (one parser serves all).
GENERATORS = ("sbm", "local")
SBM_ONLY = ("homophily",)


def generate_any(generator="sbm", cell_size=None, local_scale=None, long_range=None, **params) -> dict:
    """The raw draw of either generator (canonicalize() arguments plus ``community``)."""
    if generator not in GENERATORS:
        raise DataError(f"synthetic: invalid parameters: --generator {generator!r} (unknown). "
                        f"Fix: use one of {', '.join(GENERATORS)}")
    if generator == "sbm":
        return generate_raw(**params)
    from preprocess.sources.synthetic_local import LOCAL_DEFAULTS, generate_local_raw

    for key in SBM_ONLY:
        params.pop(key, None)
    given = dict(cell_size=cell_size, local_scale=local_scale, long_range=long_range)
    local = {k: LOCAL_DEFAULTS[k] if v is None else v for k, v in given.items()}
    full = {**{k: DEFAULTS[k] for k in DEFAULTS if k not in SBM_ONLY}, **params}  # unknown keys: TypeError
    return generate_local_raw(**full, **local)


def load_synthetic(symmetrize=True, self_loops="remove", name="synthetic", **params):
    """Generate (see `generate_raw` / `synthetic_local.generate_local_raw`) and canonicalise."""
    raw = generate_any(**params)
    for key in ("community", "cell", "side"):
        raw.pop(key, None)
    return canonicalize(name, symmetrize=symmetrize, self_loops=self_loops, origin="synthetic", **raw)

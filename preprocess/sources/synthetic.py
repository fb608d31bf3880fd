"""Synthetic graphs at any scale: a degree-corrected stochastic block model (DC-SBM) with learnable labels.

Why this model: real GNN benchmarks (ogbn-products, citation graphs) have heavy-tailed degrees,
community structure that partitioners exploit, and labels that agree with communities (homophily).
A DC-SBM reproduces all three with a handful of parameters, and its features can be made so that
neighbours carry most of the class signal (a GNN beats an MLP), which is what a training demo needs.
Its communities are expanders, though: a 2-way cut costs ~10 % of the edges and a 2-hop preload of half
the graph is the whole graph.  ``--generator local`` (synthetic_local.py) adds the locality of real
graphs; this model stays the default.

Model (ids are random with respect to communities, as in real datasets, so partitioning is not trivial):

* community of each vertex: one of K equal blocks of a keyed random permutation of the ids; class =
  community mod C (K defaults to C);
* degree propensity theta_v ~ Pareto with tail exponent ``DEGREE_EXPONENT`` (P(deg > d) ~ d^-1.5),
  capped at ``THETA_CAP`` times the minimum so one vertex cannot touch most of a small graph;
* about N*D/2 undirected edge draws: vertex v draws Poisson(theta_v D / (2 E[theta])) of them, each to a
  uniform member of v's community with probability ``homophily``, else to a uniform vertex;
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

Generation (synthetic_chunks.py): vertex chunk i and the edges its vertices draw come from
(seed, i) alone, so a build rank generates only its chunks and the graph is the same for any number of
ranks.  This changed the draws once (partners are uniform members of the community instead of
theta-weighted, the split and communities are exact blocks of a keyed id permutation); the model's
statistics, which the tests check, did not.
"""
from __future__ import annotations

from granndis_hpc.preprocess.sources.canonical import DataError

DEGREE_EXPONENT = 2.5  # density exponent gamma of theta; tail P(theta > t) ~ t^-(gamma-1)
THETA_CAP = 1000.0
ROW_CHUNK = 1 << 15  # rows per chunk of the local generator's patch queries
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


# The generators: the DC-SBM here (default), the geometric graph with the locality of real graphs in
# synthetic_local.py, and the typed graph with ogbn-mag's statistics in synthetic_mag.py.  Options of
# one generator are ignored by the others, as options of other sources are (one parser serves all).
GENERATORS = ("sbm", "local", "mag")

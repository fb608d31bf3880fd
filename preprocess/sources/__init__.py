"""Dataset sources for the offline preprocessing stage: load raw data and canonicalise it into a `Graph`.

    planetoid  Cora / CiteSeer / PubMed raw `ind.*` files, standard (Kipf/PyG public) split
    ogb        OGB node-property datasets in their downloaded raw/ + split/ layout
    bundle     one .npz / .h5 file with edge_index or CSR, features, labels, splits
    chunked    a directory of memory-mappable .npy chunks + metadata.json (preprocess/chunked.py;
               `python -m preprocess chunk` writes one from any source); a build rank reads only its slice
    synthetic  degree-corrected SBM at any scale (default; `make demo` uses it), or with
               ``--generator local`` a geometric graph with the locality of real graphs

Command line: `add_source_arguments(parser)` adds the options, `load_from_args(args)` loads.
Programmatic: `load(source, **options)` with the options' argparse names (``dest``), e.g.
``load("synthetic", vertices=10_000, seed=3)`` or ``load("planetoid", name="cora", root=DIR)``;
canonicalisation options are ``symmetrize`` (bool) and ``self_loops`` (remove|keep|add).
Every bad input raises `DataError` (a ValueError) naming the file, the problem and the fix.
"""
from __future__ import annotations

import argparse

from granndis_hpc.graph.csr import Graph
from preprocess.canonical import (FEATURE_NORMALIZATIONS, SELF_LOOP_MODES, DataError,  # noqa: F401 (re-exported)
                                  canonicalize, normalize_features)
from preprocess.sources.synthetic import DEFAULTS as _SYNTHETIC_DEFAULTS
from preprocess.sources.synthetic import GENERATORS as _GENERATORS
from preprocess.sources.synthetic_local import LOCAL_DEFAULTS as _LOCAL_DEFAULTS

SOURCES = ("planetoid", "ogb", "bundle", "synthetic", "chunked")

# Every option load() accepts, with its default (the same defaults argparse uses).
OPTION_DEFAULTS = dict(name=None, root=None, path=None, split_scheme=None, symmetrize=True,
                       self_loops="remove", normalize_features="none", **_SYNTHETIC_DEFAULTS, generator="sbm", **_LOCAL_DEFAULTS)
# Which options each source reads (others are accepted and ignored, so one parser serves all).
_USES = {
    "planetoid": ("name", "root"),
    "ogb": ("name", "root", "split_scheme"),
    "bundle": ("name", "path"),
    "chunked": ("name", "path"),
    "synthetic": tuple(_SYNTHETIC_DEFAULTS) + ("generator",) + tuple(_LOCAL_DEFAULTS),
}


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the dataset-source and canonicalisation options to ``parser`` (in their own groups)."""
    d = OPTION_DEFAULTS
    g = parser.add_argument_group("dataset source")
    g.add_argument("--source", choices=SOURCES, default="synthetic",
                   help="where the graph comes from (default: synthetic)")
    g.add_argument("--name", default=None,
                   help="planetoid: cora|citeseer|pubmed; ogb: e.g. ogbn-arxiv; bundle: dataset name "
                        "(default: file name)")
    g.add_argument("--root", default=None, metavar="DIR",
                   help="planetoid: directory with ind.NAME.* files; ogb: dataset directory (holding raw/ "
                        "and split/) or its parent")
    g.add_argument("--path", default=None, metavar="FILE",
                   help="bundle: the .npz or .h5 file; chunked: the directory holding metadata.json")
    g.add_argument("--split-scheme", default=None, metavar="DIR",
                   help="ogb: subdirectory of split/ (default: the only one present)")
    s = parser.add_argument_group("synthetic source (degree-corrected SBM, or --generator local)")
    s.add_argument("--generator", choices=_GENERATORS, default=d["generator"],
                   help="sbm: degree-corrected SBM, communities are expanders (default); local: geometric "
                        "graph on a torus with the locality of real graphs (small cuts and k-hop halos)")
    s.add_argument("--vertices", type=int, default=d["vertices"], metavar="N", help="default %(default)s")
    s.add_argument("--avg-degree", type=float, default=d["avg_degree"], metavar="D",
                   help="average directed in-degree before duplicate removal (default %(default)s)")
    s.add_argument("--features", type=int, default=d["features"], metavar="F", help="default %(default)s")
    s.add_argument("--classes", type=int, default=d["classes"], metavar="C", help="default %(default)s")
    s.add_argument("--communities", type=int, default=None, metavar="K",
                   help="sbm: communities, class = community mod C (default: C); local: label patches "
                        "(default: max(C, N/4096))")
    s.add_argument("--seed", type=int, default=d["seed"], metavar="S", help="default %(default)s")
    s.add_argument("--train-frac", type=float, default=d["train_frac"], help="default %(default)s")
    s.add_argument("--val-frac", type=float, default=d["val_frac"], help="default %(default)s; rest is test")
    s.add_argument("--homophily", type=float, default=d["homophily"],
                   help="sbm: fraction of edge draws inside a community (default %(default)s)")
    s.add_argument("--cell-size", type=float, default=d["cell_size"], metavar="M",
                   help="local: mean vertices per torus cell (default %(default)s)")
    s.add_argument("--local-scale", type=float, default=d["local_scale"], metavar="SIGMA",
                   help="local: std of an edge's cell offset per axis, in cells (default %(default)s)")
    s.add_argument("--long-range", type=float, default=d["long_range"], metavar="P",
                   help="local: fraction of edge draws to a vertex anywhere (default %(default)s)")
    s.add_argument("--feature-noise", type=float, default=d["feature_noise"],
                   help="per-vertex feature noise std; class centroids have unit scale (default %(default)s)")
    c = parser.add_argument_group("canonicalisation")
    c.add_argument("--no-symmetrize", dest="symmetrize", action="store_false",
                   help="keep edge directions as given (default: add reverse edges)")
    c.add_argument("--self-loops", choices=SELF_LOOP_MODES, default=d["self_loops"],
                   help="remove (default), keep those in the data, or add one per vertex")
    c.add_argument("--normalize-features", choices=FEATURE_NORMALIZATIONS, default=d["normalize_features"],
                   help="none (default), or row: divide every feature row by its sum (Kipf & Welling's GCN "
                        "recipe); recorded in the manifest (`info` shows it)")


def load(source: str, **options) -> Graph:
    """Load ``source`` with ``options`` (argparse dest names, see OPTION_DEFAULTS), canonicalise, and
    normalise the features as ``normalize_features`` says."""
    import dataclasses

    how = options.pop("normalize_features", OPTION_DEFAULTS["normalize_features"])
    graph = _load_canonical(source, **options)
    if how == "none":
        return graph
    return dataclasses.replace(graph, features=normalize_features(graph.features, how, origin=f"{source}: features"))


def features_record(how: str) -> dict:
    """The manifest's record of the feature preprocessing (`info` prints it, a run's summary copies it)."""
    return {"features": {"normalization": how}}


def _load_canonical(source: str, **options) -> Graph:
    if source not in SOURCES:
        raise DataError(f"{source!r}: unknown source. Fix: use one of {', '.join(SOURCES)}")
    unknown = sorted(set(options) - set(OPTION_DEFAULTS))
    if unknown:
        raise DataError(f"{source}: unknown options {unknown}. Fix: use only {sorted(OPTION_DEFAULTS)}")
    opts = {**OPTION_DEFAULTS, **options}
    canon = dict(symmetrize=bool(opts["symmetrize"]), self_loops=opts["self_loops"])
    picked = {k: opts[k] for k in _USES[source]}
    if source == "planetoid":
        from preprocess.sources.planetoid import load_planetoid
        if picked["name"] is None:
            raise DataError("planetoid: no --name given. Fix: pass --name cora|citeseer|pubmed")
        return load_planetoid(picked["root"], picked["name"], **canon)
    if source == "ogb":
        from preprocess.sources.ogb import load_ogb
        return load_ogb(picked["root"], picked["name"], picked["split_scheme"], **canon)
    if source == "bundle":
        from preprocess.sources.bundle import load_bundle
        return load_bundle(picked["path"], picked["name"], **canon)
    if source == "chunked":
        from preprocess.chunked import load_chunked
        return load_chunked(picked["path"], picked["name"], **canon)
    from preprocess.sources.synthetic import load_synthetic
    return load_synthetic(**canon, **picked)


def load_from_args(args: argparse.Namespace) -> Graph:
    """Load the graph described by a namespace parsed with `add_source_arguments`."""
    options = {k: getattr(args, k) for k in OPTION_DEFAULTS if hasattr(args, k)}
    return load(args.source, **options)


# Sources a build rank can read a slice of (preprocess/sliced.py); the others are loaded whole.
SLICED_SOURCES = ("chunked", "synthetic")


def sliced_from_args(args: argparse.Namespace):
    """The sliced source (preprocess/sliced.py protocol) the namespace describes, or None when its source
    is loaded whole by every rank."""
    options = {k: getattr(args, k) for k in OPTION_DEFAULTS if hasattr(args, k)}
    return sliced_source(args.source, **options)


def sliced_source(source: str, **options):
    opts = {**OPTION_DEFAULTS, **options}
    if source == "chunked":
        from preprocess.chunked import open_source
        return open_source(opts["path"], opts["name"])
    if source == "synthetic":
        from preprocess.sources.synthetic_chunks import SyntheticSource
        return SyntheticSource(**{k: opts[k] for k in _USES["synthetic"]})
    return None

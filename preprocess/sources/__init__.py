"""Dataset sources for the offline preprocessing stage: load raw data and canonicalise it into a `Graph`.

    planetoid  Cora / CiteSeer / PubMed raw `ind.*` files, standard (Kipf/PyG public) split
    ogb        OGB node-property datasets in their downloaded raw/ + split/ layout (ogbn-mag with its types)
    reddit     Reddit as DGL and PyG download it (reddit_data.npz + reddit_graph.npz, the published split)
    igb        IGB's homogeneous paper graph (processed/paper*/ .npy files, memory-mapped; IGB's 60/20/20 split);
               a build rank reads only its slice
    igbh       IGBH, the heterogeneous IGB (processed/<type>/node_feat.npy, processed/<src>__<rel>__<dst>/
               edge_index.npy, memory-mapped; IGB's fractions as contiguous splits of the papers)
    bundle     one .npz / .h5 file with edge_index or CSR, features, labels, splits; or a heterogeneous
               graph's arrays per vertex type and relation (preprocess/sources/bundle_hetero.py)
    chunked    a directory of memory-mappable .npy chunks + metadata.json (preprocess/formats/chunked.py;
               `granndis preprocess chunk` writes one from any source); a build rank reads only its slice
    synthetic  degree-corrected SBM at any scale (default; `make demo` uses it), or with
               ``--generator local`` a geometric graph with the locality of real graphs, or with
               ``--generator mag`` a typed graph with ogbn-mag's statistics

Command line: `SourceOptions` declares the options (`add_source_arguments(parser)` adds them to a
plain parser), `load_from_args(args)` loads.
Programmatic: `load(source, **options)` with the options' argparse names (``dest``), e.g.
``load("synthetic", vertices=10_000, seed=3)`` or ``load("planetoid", name="cora", root=DIR)``;
canonicalisation options are ``symmetrize`` (bool) and ``self_loops`` (remove|keep|add).
Every bad input raises `DataError` (a ValueError) naming the file, the problem and the fix.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Optional

from granndis_hpc.graph.csr import Graph
from granndis_hpc.options import Options, add_options, option
from granndis_hpc.registry import Registry
from granndis_hpc.preprocess.sources.canonical import (FEATURE_NORMALIZATIONS, SELF_LOOP_MODES, DataError,
                                                       normalize_features)
from granndis_hpc.preprocess.sources.synthetic import DEFAULTS as _SYNTHETIC_DEFAULTS
from granndis_hpc.preprocess.sources.synthetic import GENERATORS as _GENERATORS
from granndis_hpc.preprocess.sources.synthetic_local import LOCAL_DEFAULTS as _LOCAL_DEFAULTS

# The sources: one line each.  An entry names its loader ("module:function", imported when used: the
# loaders' own dependencies load only for the source asked for), the options it reads (`uses`; the
# others are accepted and ignored, so one parser serves all) and, for a source a build rank reads a
# slice of (preprocess/build/sliced.py), its `sliced` opener.  Every loader takes its `uses` and the
# canonicalisation options as keywords and returns a canonical Graph.  docs/extending.md, "add a
# dataset source".
SOURCES = Registry("source")
SOURCES.declare("planetoid", "granndis_hpc.preprocess.sources.planetoid:load_planetoid", uses=("name", "root"))
SOURCES.declare("ogb", "granndis_hpc.preprocess.sources.ogb:load_ogb", uses=("name", "root", "split_scheme",
                                                                             "target_type"))
SOURCES.declare("reddit", "granndis_hpc.preprocess.sources.reddit:load_reddit", uses=("name", "root"))
SOURCES.declare("igb", "granndis_hpc.preprocess.sources.igb:load_igb", uses=("name", "root", "num_classes"),
                sliced="granndis_hpc.preprocess.sources.igb:IgbSource")
SOURCES.declare("igbh", "granndis_hpc.preprocess.sources.igbh:load_igbh", uses=("name", "root", "num_classes"),
                sliced="granndis_hpc.preprocess.sources.igbh:IgbhSource")
SOURCES.declare("bundle", "granndis_hpc.preprocess.sources.bundle:load_bundle", uses=("name", "path", "target_type"))
SOURCES.declare("synthetic", "granndis_hpc.preprocess.sources.synthetic_any:load_synthetic",
                uses=tuple(_SYNTHETIC_DEFAULTS) + ("generator",) + tuple(_LOCAL_DEFAULTS),
                sliced="granndis_hpc.preprocess.sources.synthetic_any:open_synthetic")
SOURCES.declare("chunked", "granndis_hpc.preprocess.formats.chunked:load_chunked", uses=("name", "path", "target_type"),
                sliced="granndis_hpc.preprocess.formats.chunked:open_source")

# Every option load() accepts, with its default (the same defaults argparse uses).
OPTION_DEFAULTS = dict(name=None, root=None, path=None, split_scheme=None, target_type=None, num_classes=19,
                       symmetrize=True,
                       self_loops="remove", normalize_features="none", **_SYNTHETIC_DEFAULTS, generator="sbm",
                       **_LOCAL_DEFAULTS)


def _source_names():
    return tuple(SOURCES)  # read when the option is checked: a source registered after import is valid


_d = OPTION_DEFAULTS
_SOURCE, _SYNTHETIC, _CANON = ("dataset source", "synthetic source (degree-corrected SBM, or --generator local)",
                               "canonicalisation")


@dataclass
class SourceOptions(Options):
    """The dataset-source and canonicalisation options of every `granndis preprocess` command that reads
    a dataset (granndis_hpc/options/ derives their parser); the defaults are OPTION_DEFAULTS'."""
    source: str = option("synthetic", choices=_source_names, group=_SOURCE, help="where the graph comes from")
    name: Optional[str] = option(None, group=_SOURCE, help="planetoid: cora|citeseer|pubmed; ogb: e.g. ogbn-arxiv, "
                                                           "ogbn-mag; "
                                                           "igb, igbh: the size directory under --root (tiny, small, "
                                                           "medium, ...); bundle, reddit: dataset name (default: "
                                                           "file name, reddit)")
    root: Optional[str] = option(None, group=_SOURCE, metavar="DIR",
                                 help="planetoid: directory with ind.NAME.* files; ogb: dataset directory (holding "
                                      "raw/ and split/) or its parent; reddit: directory with reddit_data.npz and "
                                      "reddit_graph.npz (or PyG's root, holding raw/); igb, igbh: the processed/ "
                                      "directory, its parent, or IGB's root with --name")
    path: Optional[str] = option(None, group=_SOURCE, metavar="FILE",
                                 help="bundle: the .npz or .h5 file; chunked: the directory holding metadata.json")
    split_scheme: Optional[str] = option(None, group=_SOURCE, metavar="DIR",
                                         help="ogb: subdirectory of split/ (default: the only one present)")
    target_type: Optional[str] = option(None, group=_SOURCE, metavar="TYPE",
                                        help="bundle, ogb, chunked: in a heterogeneous graph with several labelled "
                                             "vertex types, the one to learn (default: the only labelled type); "
                                             "docs/heterogeneous.md")
    num_classes: int = option(_d["num_classes"], choices=(19, 2983), group=_SOURCE,
                              help="igb, igbh: the label set, 19 (node_label_19.npy) or 2983 (node_label_2K.npy)")
    generator: str = option(_d["generator"], choices=_GENERATORS, group=_SYNTHETIC,
                            help="sbm: degree-corrected SBM, communities are expanders; local: geometric graph on a "
                                 "torus with the locality of real graphs (small cuts and k-hop halos); mag: "
                                 "typed graph with ogbn-mag's types, relations and split (reads --vertices, "
                                 "--seed, --homophily, --feature-noise)")
    vertices: int = option(_d["vertices"], group=_SYNTHETIC, metavar="N")
    avg_degree: float = option(_d["avg_degree"], group=_SYNTHETIC, metavar="D",
                               help="average directed in-degree before duplicate removal")
    features: int = option(_d["features"], group=_SYNTHETIC, metavar="F")
    classes: int = option(_d["classes"], group=_SYNTHETIC, metavar="C")
    communities: Optional[int] = option(None, group=_SYNTHETIC, metavar="K",
                                        help="sbm: communities, class = community mod C (default: C); local: label "
                                             "patches (default: max(C, N/4096))")
    seed: int = option(_d["seed"], group=_SYNTHETIC, metavar="S",
                       help="seed of the synthetic graph; build and plan partition and sample with it too")
    train_frac: float = option(_d["train_frac"], group=_SYNTHETIC)
    val_frac: float = option(_d["val_frac"], group=_SYNTHETIC, help="rest is test")
    homophily: float = option(_d["homophily"], group=_SYNTHETIC, help="sbm: fraction of edge draws inside a community")
    cell_size: float = option(_d["cell_size"], group=_SYNTHETIC, metavar="M",
                              help="local: mean vertices per torus cell")
    local_scale: float = option(_d["local_scale"], group=_SYNTHETIC, metavar="SIGMA",
                                help="local: std of an edge's cell offset per axis, in cells")
    long_range: float = option(_d["long_range"], group=_SYNTHETIC, metavar="P",
                               help="local: fraction of edge draws to a vertex anywhere")
    feature_noise: float = option(_d["feature_noise"], group=_SYNTHETIC,
                                  help="per-vertex feature noise std; class centroids have unit scale")
    symmetrize: bool = option(True, flag="--no-symmetrize", group=_CANON,
                              help="keep edge directions as given (default: add reverse edges)")
    self_loops: str = option(_d["self_loops"], choices=SELF_LOOP_MODES, group=_CANON,
                             help="remove, keep those in the data, or add one per vertex")
    normalize_features: str = option(_d["normalize_features"], choices=FEATURE_NORMALIZATIONS, group=_CANON,
                                     help="none, or row: divide every feature row by its sum (Kipf & Welling's GCN "
                                          "recipe); recorded in the manifest (`info` shows it)")


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the dataset-source and canonicalisation options to a plain ``parser`` (in their own groups),
    with their defaults; the preprocess commands take them as part of their options class instead."""
    add_options(parser, SourceOptions, with_defaults=True, config=False)


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


def _picked(source: str, options: dict) -> dict:
    """The options `source` reads, after the defaults; DataError for an unknown source or option."""
    if source not in SOURCES:
        raise DataError(f"{source!r}: unknown source. Fix: use one of {', '.join(SOURCES)}")
    unknown = sorted(set(options) - set(OPTION_DEFAULTS))
    if unknown:
        raise DataError(f"{source}: unknown options {unknown}. Fix: use only {sorted(OPTION_DEFAULTS)}")
    opts = {**OPTION_DEFAULTS, **options}
    return {k: opts[k] for k in SOURCES.entry(source).get("uses", ())}


def _load_canonical(source: str, **options) -> Graph:
    picked = _picked(source, options)
    opts = {**OPTION_DEFAULTS, **options}
    return SOURCES[source](**picked, symmetrize=bool(opts["symmetrize"]), self_loops=opts["self_loops"])


def load_from_args(args: argparse.Namespace) -> Graph:
    """Load the graph described by a namespace parsed with `add_source_arguments`."""
    options = {k: getattr(args, k) for k in OPTION_DEFAULTS if hasattr(args, k)}
    return load(args.source, **options)


def sliced_from_args(args: argparse.Namespace):
    """The sliced source (preprocess/build/sliced.py protocol) the namespace describes, or None when its source
    is loaded whole by every rank."""
    options = {k: getattr(args, k) for k in OPTION_DEFAULTS if hasattr(args, k)}
    return sliced_source(args.source, **options)


def sliced_source(source: str, **options):
    """The source's sliced opener called with the options it reads, or None (a source loaded whole)."""
    opener = SOURCES.entry(source).resolve("sliced") if source in SOURCES else None
    return None if opener is None else opener(**_picked(source, options))

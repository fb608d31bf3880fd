"""A graph held in Python -- a PyG ``Data``, a DGL graph, or a dict of arrays with save_bundle's keywords --
as the canonical Graph the build takes, and its content digest (the key of the shard-set cache).

Every rank of a job holds the whole graph (the script loads it on every rank) and canonicalises it
itself; the ranks then compare their digests, so a script whose ranks hold different graphs (a random
split drawn without a seed) is refused on every rank before anything is built from it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from granndis_hpc.api.errors import GranndisError

# The canonicalisation options a build takes (preprocess's SourceOptions): part of the set's cache key.
CANONICAL_OPTIONS = ("symmetrize", "self_loops", "normalize_features")


def is_graph(obj: Any) -> bool:
    """Whether `obj` is a graph held in Python (rather than a shard set or its path)."""
    from granndis_hpc.preprocess.sources.convert import is_dgl, is_pyg, is_pyg_hetero

    return isinstance(obj, Mapping) or is_pyg(obj) or is_pyg_hetero(obj) or is_dgl(obj) or _is_canonical(obj)


def shards_path(obj: Any, what: str) -> str:
    """The shard directory `obj` names (a ShardSet or a path); OptionError for anything else."""
    import os

    from granndis_hpc.api.errors import OptionError

    if isinstance(obj, (str, os.PathLike)):
        return os.fspath(obj)
    raise OptionError(f"{what}: expected a graph (a PyG Data, a DGL graph, a dict of arrays), a ShardSet or a shard "
                      f"directory, got {type(obj).__name__}")


def _is_canonical(obj) -> bool:
    from granndis_hpc.graph.csr import Graph

    return isinstance(obj, Graph)


def default_name(obj: Any) -> str:
    name = getattr(obj, "name", None)
    return name if isinstance(name, str) and name else "graph"


def canonical(obj: Any, name: str, symmetrize: bool = True, self_loops: str = "remove",
              normalize_features: str = "none"):
    """The canonical Graph of `obj` (what `granndis preprocess build --source bundle` would load from the
    same arrays saved with save_bundle); DataError for bad arrays.  An already canonical Graph (a
    source's loader's) is taken as it is, its features normalised as asked."""
    from granndis_hpc.preprocess.sources.canonical import canonicalize, normalize_features as normalize
    from granndis_hpc.preprocess.sources.convert import graph_arrays
    from granndis_hpc.preprocess.sources.hetero import canonicalize_hetero

    if _is_canonical(obj):
        graph = dataclasses.replace(obj, name=name)
    else:
        a = graph_arrays(None, **obj) if isinstance(obj, Mapping) else graph_arrays(obj)
        if "counts" in a:  # a HeteroData: canonicalize_hetero's arguments, its types ride with the graph
            graph = canonicalize_hetero(name, **a, symmetrize=symmetrize, self_loops=self_loops, origin=name)
        else:
            graph = canonicalize(name, a["num_vertices"], a["src"], a["dst"], a["features"], a["labels"],
                                 a["train_mask"], a["val_mask"], a["test_mask"], num_classes=a["num_classes"],
                                 symmetrize=symmetrize, self_loops=self_loops, origin=name)
    if normalize_features != "none":
        graph = dataclasses.replace(graph, features=normalize(graph.features, normalize_features,
                                                              origin=f"{name}: features"))
    return graph


def agreed_graph(obj: Any, name: str, **canonical_options):
    """Collective: (canonical Graph, its content digest) on every rank, refused on every rank alike when
    the graph is bad on any rank or the ranks hold different graphs."""
    from granndis_hpc.api.errors import agreed
    from granndis_hpc.cluster import as_group
    from granndis_hpc.shards.content import dataset_digest

    graph = digest = None
    with agreed("the graph"):
        graph = canonical(obj, name, **canonical_options)
        digest = dataset_digest(graph)
    digests = as_group(None).allgather_object(digest)
    if len(set(digests)) > 1:
        groups = {}
        for rank, d in enumerate(digests):
            groups.setdefault(d, []).append(rank)
        listing = "; ".join(f"ranks {','.join(map(str, r))}: {d[:12]}" for d, r in groups.items())
        raise GranndisError(f"the ranks hold different graphs (content digests {listing}); every rank must load "
                            f"the same graph: draw random splits or features with a fixed seed")
    return graph, digest

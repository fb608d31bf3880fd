"""Feature floats per row that a rank holds, where a heterogeneous set's vertex types have different
feature widths (ModelSpec's ``type_widths`` and ``type_counts``).

Such rows are held at their own type's width (graph/typed_features.py: the shard slice, a sampler's server
rows, and the views of a model that projects each type), never padded to the widest.  A rank's rows are
counted at the mean width over the set's vertices: partitioning balances every vertex type across servers
and GPUs (one constraint per type), so a rank's mix of types is the set's.  A model that reads the features
as they are (a homogeneous model on such a set) holds its views' rows zero-padded to the widest width.
No torch here."""
from __future__ import annotations


def typed(m) -> bool:
    """Whether the set's types have different feature widths."""
    return len(set(getattr(m, "type_widths", None) or ())) > 1


def held_width(m) -> float:
    """Mean feature floats per row held at the rows' own widths (the widest width where the set has one
    width, or where its type counts are unknown: an upper bound)."""
    widths = getattr(m, "type_widths", None) or ()
    counts = getattr(m, "type_counts", None) or ()
    if not typed(m) or len(counts) != len(widths) or sum(counts) <= 0:
        return float(m.features)
    return sum(int(c) * int(w) for c, w in zip(counts, widths)) / sum(int(c) for c in counts)


def view_width(m) -> float:
    """Feature floats per own row of a view: at their own widths for a model that projects each type
    (its estimator's ``projects``), else the widest width (the padded rows it reads)."""
    projects = getattr(m.estimator, "projects", lambda _: False)(m)
    return held_width(m) if projects else float(m.features)

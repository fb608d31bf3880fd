"""Which layer graphs carry their source rows' global ids (``graph.source_ids``), and giving them.

Two kinds of model read them:
- a model whose attention dropout keys edges by their endpoints' ids (GAT with attn_dropout > 0:
  ``edge_keyed_dropout``) needs them on its training graphs only;
- a typed model (a heterogeneous graph's R-GCN or R-GAT: registry capability ``typed``, registry.typed) tells each
  source row's vertex type, and so each edge's relation, from its global id (granndis_hpc/graph/hetero.py),
  and needs them on every graph it runs on: training, evaluation, prediction and each co-batch.

Giving them is collective over a view's peers (the halo rows' ids are exchanged once per view and
cached), so every rank calls these functions at the same point of its set-up.
"""
from __future__ import annotations


def give_source_ids(model, train_view, other_views=()) -> None:
    """Collective: source ids on the graphs `model` reads them from (module docstring).  train_view:
    a full-graph mode's static training plan (None in batched modes, whose co-batches carry them
    themselves: engine/cobplan.py); other_views: the evaluation and inductive views."""
    typed = bool(getattr(model, "needs_source_ids", False))
    if train_view is not None and (typed or getattr(model, "edge_keyed_dropout", False)):
        train_view.attach_source_ids()
    if typed:
        for view in other_views:
            if view is not None and view is not train_view:
                view.attach_source_ids()

"""Which layer graphs carry their source rows' global ids (``graph.source_ids``), and giving them.

A model's contract says which (nn/contract.py ModelContract.source_ids):
- "training": its attention dropout keys edges by their endpoints' ids (GAT with attn_dropout > 0), so it
  needs them on its training graphs only;
- "all": a typed model (a heterogeneous graph's R-GCN or R-GAT: registry capability ``typed``) tells each
  source row's vertex type, and so each edge's relation, from its global id (granndis_hpc/graph/hetero.py),
  and needs them on every graph it runs on: training, evaluation, prediction and each co-batch.

Giving them is collective over a view's peers (the halo rows' ids are exchanged once per view and
cached), so every rank calls these functions at the same point of its set-up.
"""
from __future__ import annotations

from granndis_hpc.nn.contract import ModelContract


def give_source_ids(contract: ModelContract, train_view, other_views=()) -> None:
    """Collective: source ids on the graphs the model of `contract` reads them from (module docstring).
    train_view: a full-graph mode's static training plan (None in batched modes, whose co-batches carry
    them themselves: engine/cobplan.py); other_views: the evaluation and inductive views."""
    if train_view is not None and contract.source_ids != "none":
        train_view.attach_source_ids()
    if contract.source_ids == "all":
        for view in other_views:
            if view is not None and view is not train_view:
                view.attach_source_ids()

"""A small heterogeneous graph whose vertex types have different feature widths (a 7, b 12, c 5, d none:
derived from c), and a plain-torch reference of the relational models with their per-type input
projection (nn/hetero_models.py), in float64.  The reference reads each type's features as generated, at
its own width, and derives d's itself (the mean of its c in-neighbours), so it does not rest on the
padded rows the pipeline holds."""
from __future__ import annotations

from typing import Dict

import numpy as np
import torch

from granndis_hpc.preprocess.sources.hetero import canonicalize_hetero
from tests import hetero_reference
from tests.hetero_reference import reference_forward

COUNTS = {"a": 60, "b": 40, "c": 30, "d": 10}
WIDTHS = {"a": 7, "b": 12, "c": 5}
CLASSES = 3


def arrays(seed: int = 0) -> dict:
    """canonicalize_hetero's arguments: per-type features, relations in per-type ids, a's labels and split."""
    rng = np.random.default_rng(seed)
    features = {t: rng.normal(size=(COUNTS[t], w)).astype(np.float32) for t, w in WIDTHS.items()}
    labels = rng.integers(0, CLASSES, COUNTS["a"])
    features["a"][:, :CLASSES] += 2.0 * np.eye(CLASSES, dtype=np.float32)[labels]

    def rel(s, d, e):
        return rng.integers(0, COUNTS[s], e), rng.integers(0, COUNTS[d], e)

    # 120 `about` edges: each c has several d in-neighbours, so R-GAT's attention over d -> c has a gradient
    # (a destination with one in-edge gives att_dst none, and Adam would turn rounding noise into steps).
    relations = {("a", "cites", "a"): rel("a", "a", 150), ("b", "writes", "a"): rel("b", "a", 120),
                 ("a", "in", "c"): rel("a", "c", 80), ("c", "about", "d"): rel("c", "d", 120)}
    order = rng.permutation(COUNTS["a"])
    splits = {"train": order[:30], "val": order[30:45], "test": order[45:]}
    return {"counts": dict(COUNTS), "features": features, "relations": relations, "labels": labels,
            "splits": splits}


def widths_graph(seed: int = 0):
    """The canonical graph (graph.types.widths set) and the arrays it was made from."""
    a = arrays(seed)
    graph = canonicalize_hetero("typed-widths", a["counts"], a["features"], a["relations"], a["labels"], a["splits"],
                                "a", num_classes=CLASSES)
    return graph, a


def type_rows(a: dict) -> Dict[str, np.ndarray]:
    """Every type's rows at its own width: the stored ones as generated, d's the mean of its distinct c
    in-neighbours over `about` (zeros without one)."""
    rows = dict(a["features"])
    c_ids, d_ids = a["relations"][("c", "about", "d")]
    pair = np.unique(np.stack([d_ids, c_ids], 1), axis=0)
    total = np.zeros((COUNTS["d"], WIDTHS["c"]))
    np.add.at(total, pair[:, 0], rows["c"][pair[:, 1]])
    count = np.bincount(pair[:, 0], minlength=COUNTS["d"])
    rows["d"] = total / np.maximum(count, 1)[:, None]
    return rows


def projected(p: Dict[str, torch.Tensor], rows: Dict[str, np.ndarray]) -> torch.Tensor:
    """Layer 0's input rows in global-id order: each type's rows through its input Linear."""
    out = [torch.as_tensor(rows[t], dtype=torch.float64) @ p[f"inputs.{t}.weight"].T + p[f"inputs.{t}.bias"]
           for t in COUNTS]
    return torch.cat(out)


def reference_logits(model_state, graph, rows, layers: int, model: str) -> torch.Tensor:
    p = {k: v.detach().double() for k, v in model_state.items()}
    return reference_forward(p, graph.types, graph.indptr, graph.indices, projected(p, rows), layers, model)


def train_reference(model, graph, rows, layers: int, epochs: int, lr: float, dropout: float, seed: int):
    """tests/hetero_reference.train_reference with the input Linears trained too: layer 0 reads each
    type's rows projected by the parameters being trained."""
    return hetero_reference.train_reference(model, graph, layers, epochs, lr, dropout, seed,
                                            features=lambda p: projected(p, rows))

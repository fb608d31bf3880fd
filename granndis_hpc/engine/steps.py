"""The types the training loop and the modes share: what a mode is given (RunContext), what it yields
(Step), what both raise (TrainingError), and the plan a step runs over (PlanView).

A module of its own so that the loop (engine/trainer.py), the registry of modes (engine/modes.py) and
the batched steps (engine/cobatch.py) import it and not each other: modes.py imports cobatch.py, which
imports only this.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Collection, Dict, List, Optional, Protocol, Sequence, runtime_checkable

import torch

from granndis_hpc import shards
from granndis_hpc.cluster.exchange_group import ExchangeGroup
from granndis_hpc.nn.graph import LayerGraph
from granndis_hpc.nn.rows import HaloGather

if TYPE_CHECKING:  # names for the annotations only (the loop imports these modules anyway)
    from granndis_hpc.cluster.comm import Communicator
    from granndis_hpc.cluster.topology import Topology
    from granndis_hpc.options.train import TrainConfig


class TrainingError(RuntimeError):
    """A problem every rank detects identically (configuration, shard/mode mismatch, NaN loss)."""


@runtime_checkable
class PlanView(Protocol):
    """What a step runs the model over: engine/views.View (one view) or LayeredView (one per layer).
    Both are checked against it (tests/unit/test_model_contract.py: isinstance, and the type checker)."""

    @property
    def input_features(self) -> torch.Tensor:
        """Layer 0's own input rows (a graph.typed_features.TypedRows where the types' widths differ and the
        model projects each type)."""

    @property
    def graphs(self) -> Sequence[LayerGraph]:
        """One LayerGraph per layer."""

    @property
    def layer_row_ids(self) -> Optional[tuple]:
        """Dropout's row ids per layer (nn/dropout.py RowIds): a tuple, or None (rows are 0..n-1)."""

    def gather_fn(self, phase: str, overlap: Collection[str] = ()) -> HaloGather:
        """The model's gather(l, h) for a phase ("halo": training, "evaluation"); overlap: the exchange
        group names whose halos travel while the layers compute (--overlap-halos)."""

    def source_ids(self) -> Optional[torch.Tensor]:
        """Layer 0's source rows' global ids (exchanged once, cached)."""

    def attach_source_ids(self) -> None:
        """Collective: every layer graph gets its source rows' global ids (``graph.source_ids``)."""

    def layer_counts(self) -> List[dict]:
        """Per layer, what the overlap cost model reads (View.layer_counts)."""


@dataclass
class RunContext:
    """What every mode may use, built once by the Trainer before the mode's set-up."""

    cfg: "TrainConfig"
    topo: "Topology"
    comm: "Communicator"
    device: torch.device
    manifest: dict
    slice: shards.RankSlice
    world_view: PlanView  # exact, every layer on the world exchange (also what evaluation runs)
    labels: torch.Tensor  # labels of this rank's inner rows
    split_rows: Dict[str, torch.Tensor]  # inner-row positions of train/val/test
    split_totals: Dict[str, int]  # global counts
    # The exchange groups by name ("world", "server"), training halo in --halo-dtype on both.
    groups: Dict[str, ExchangeGroup]
    # --inductive (engine/inductive.py): world_view, labels and split_rows are the train-induced graph's,
    # and the preloaded views keep only its rows and edges.
    inductive: bool = False
    # Whether views exchange the halo's input features at set-up: not for a model that projects them
    # first (nn/contract.py ModelContract.input_projection).
    static_features: bool = True


@dataclass
class Step:
    """One optimizer step's inputs on this rank."""

    view: PlanView
    rows: torch.Tensor  # positions of the loss's target rows among the last layer's rows
    labels: torch.Tensor  # their labels
    num_targets: int  # global number of target rows of this step (the loss is their mean)
    sampling_s: float = 0.0  # host work (sampling, planning) left on the critical path before the step
    host_s: Optional[Dict[str, float]] = None  # batched modes: host seconds of this co-batch per phase
    accounting: Optional[Callable[[], Dict]] = None  # collective: rows held/computed, redundancy


# Per-layer counts of View.layer_counts the epoch record keeps (rows_per_layer), beside rows held/computed.
LAYER_COUNT_KEYS = ("group", "send_rows", "halo_rows", "edges", "halo_edges")


def rows_accounting(topo, view: PlanView) -> Dict:
    """Collective: the rows every rank holds (layer sources) and computes per layer, on rank 0."""
    record = {"rank": topo.rank, "rows_held": [int(g.n_src) for g in view.graphs],
              "rows_computed": [int(g.n_dst) for g in view.graphs]}
    counts = view.layer_counts()  # the overlap cost model's inputs (granndis_hpc/report/linkmodel.py)
    record.update({key: [c[key] for c in counts] for key in LAYER_COUNT_KEYS})
    per_rank = topo.gather_object(record)
    return {"rows_per_layer": per_rank} if topo.rank == 0 else {}

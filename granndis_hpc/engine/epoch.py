"""Per-epoch accounting of the training loop: the activation bytes autograd saves (SavedBytes), and the
epoch record built from the ledger and the per-rank times (epoch_record)."""
from __future__ import annotations

import math
from typing import Dict

import numpy as np
import torch

from granndis_hpc.cluster.errors import raised_everywhere
from granndis_hpc.cluster.ledger import Ledger
from granndis_hpc.engine.steps import TrainingError


class SavedBytes:
    """Counts what autograd keeps for the backward pass (each storage once): the activation memory of
    a step, exact and the same on CPU and GPU.  (Resident-memory deltas are not: the C heap keeps freed
    blocks.)  Recomputed blocks (--checkpoint-activations) save only their inputs, and so count less."""

    def __init__(self):
        self.total, self._seen = 0, set()

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            storage = t.untyped_storage()
            key = (storage.device.type, storage.data_ptr())
            if key not in self._seen:
                self._seen.add(key)
                self.total += storage.nbytes()
        except (RuntimeError, NotImplementedError):  # sparse and other storage-less tensors
            pass
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t


def epoch_record(ledger: Ledger, topo, comm, epoch: int, elapsed: float, grad_s: float, local_loss: float,
                 sampling_s: float = 0.0, layer_seconds=None) -> Dict:
    """Collective: the record of epoch `epoch` (0-based) from this rank's ledger and times: the slowest
    rank's time breakdown, the loss, and the exact bytes per link class.  layer_seconds: this rank's
    [2, layers] forward / backward compute seconds per layer (engine/layerclock.py); with it the record
    holds every rank's (`layer_compute_s`), the overlap limit's per-rank timeline (report/linkmodel.py)."""
    led = ledger
    # Set-up traffic inside an epoch is per-step planning of co-batched training: count it as halo.
    intra = led.seconds("intra", "halo") + led.seconds("intra", "setup")
    inter = led.seconds("inter", "halo") + led.seconds("inter", "setup")
    times = np.array([elapsed, intra, inter, grad_s, elapsed - intra - inter - grad_s - sampling_s,
                      sampling_s])
    # The slowest rank's own breakdown, so that its parts add up to the epoch time (the maxima of
    # each part over ranks came from different ranks and could sum past the epoch).
    # Every rank's row of a world x (6 + 2 layers) table, summed: all ranks see every rank's times and
    # per-layer compute (outside the timed region; 48 + 16 L bytes per rank).
    layers = 0 if layer_seconds is None else int(np.shape(layer_seconds)[1])
    table = np.zeros((topo.world_size, times.size + 2 * layers))
    table[topo.rank, :times.size] = times
    if layers:
        table[topo.rank, times.size:] = np.asarray(layer_seconds, dtype=np.float64).reshape(-1)
    table = comm.allreduce_scalar(table, "sum")
    per_layer, table = table[:, times.size:], table[:, :times.size]
    slowest_rank = int(np.argmax(table[:, 0]))
    slowest = table[slowest_rank]
    # Every rank's loss is its share of the global mean: their sum is the loss.
    loss = float(comm.allreduce_scalar(local_loss, "sum"))
    if not math.isfinite(loss):
        # Every rank holds the same all-reduced loss, so every rank raises this together.
        raise raised_everywhere(TrainingError(
            f"loss became {loss} at epoch {epoch + 1}; lower --lr or check the features for extreme "
            f"values (`granndis preprocess verify` checks that they are finite)"))
    # Bytes per rank (exact): their sum is the traffic per link class; the busiest rank and the
    # busiest server's inter-server egress are what a slow link waits for.
    per_rank = Ledger.record_classes(led.gather_bytes(topo.world))
    inter = per_rank["inter_halo"] + per_rank["inter_grad"]
    per_server = np.zeros(topo.servers, dtype=np.int64)
    np.add.at(per_server, topo.server_of(np.arange(inter.size)), inter)
    record = {
        "epoch": epoch, "time_s": float(slowest[0]), "intra_comm_s": float(slowest[1]),
        "inter_comm_s": float(slowest[2]), "grad_sync_s": float(slowest[3]),
        "compute_s": float(slowest[4]), "sampling_s": float(slowest[5]), "slowest_rank": slowest_rank,
        "loss": loss,
        "bytes": {k: int(v.sum()) for k, v in per_rank.items()},
        "max_rank_bytes": {k: int(v.max()) for k, v in per_rank.items()},
        "inter_bytes_per_server": [int(b) for b in per_server],
    }
    if layers:  # every rank's compute, and its share per layer and direction (the rest: loss, optimizer, ...)
        record["layer_compute_s"] = {
            "compute": [float(v) for v in table[:, 4]],
            "forward": [[float(v) for v in row[:layers]] for row in per_layer],
            "backward": [[float(v) for v in row[layers:]] for row in per_layer],
            "server": [int(s) for s in topo.server_of(np.arange(topo.world_size))]}
    return record

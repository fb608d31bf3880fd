"""A process's random streams (torch CPU, CUDA when used, NumPy, Python `random`) as a stateful
object, saved per rank in every checkpoint so that a resumed run repeats the same numbers."""
from __future__ import annotations

import random
from typing import Dict

import numpy as np
import torch

from granndis_hpc.rundir.checkpoint_files import CheckpointError


def rng_state(device: torch.device) -> Dict:
    """This process's random streams (the ones dropout and samplers draw from)."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(legacy=False),
             "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: Dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if device.type == "cuda":
        if "cuda" not in state:
            raise CheckpointError("the checkpoint was written on CPU and holds no CUDA random state; "
                                  "resume it with --device cpu")
        torch.cuda.set_rng_state(state["cuda"], device)


class RNGState:
    """A process's random streams as a stateful object (state_dict / load_state_dict)."""

    def __init__(self, device: torch.device):
        self.device = device

    def state_dict(self) -> Dict:
        return rng_state(self.device)

    def load_state_dict(self, state: Dict) -> None:
        set_rng_state(state, self.device)

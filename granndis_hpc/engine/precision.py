"""`--precision`: the dtype the layers compute in (fp32, or bf16 under torch.autocast).

bf16 is mixed precision as torch.autocast defines it, with the engine owning the policy:
- the parameters, their gradients and the optimizer state stay float32 (master weights): autocast
  casts a weight to bfloat16 where an op reads it (its cast copy is what the backward keeps), and the
  gradient flows back through the cast into the float32 parameter;
- the model's forward runs inside `autocast()` (the run's device type: "cpu", or "cuda"), in training
  and in evaluation alike, so the evaluated model is the one that was trained;
- every conv's source rows and output rows are rounded to bfloat16 (`row_dtype`, the pass settings'
  row dtype the layer runner rounds to: nn/contract.py PassSettings): autocast runs
  an addition with a float32 operand in float32, so a bias added after the aggregation (GCN) or any
  float32 parameter would otherwise widen every activation after it back to float32; and layer 0's
  float32 input features, rounded once, are one bfloat16 tensor that the conv's Linear layers share
  (autocast would make each its own copy), so every layer saves what it saves in float32 at half width
  (the memory model's rule, memory_model/estimate.py);
- the loss is computed outside autocast on the logits widened to float32 (`loss`), and the backward
  starts there;
- training halo rows travel in bfloat16 (the exchange group's wire dtype, as --halo-dtype bfloat16), so
  the halo is half width whatever op made its rows; their gradients come back at the received rows'
  dtype, bfloat16 too;
- the sparse aggregation, which the CPU has no bfloat16 kernel for, is computed in float32 and rounded
  to bfloat16 (nn/graph.py).

A bf16 run is not exact (its result differs from float32 training by rounding) and the rounding
depends on which sums a rank computes, so its checkpoints resume only on the same shape.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Optional

import torch

from granndis_hpc.engine import targets

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class PrecisionError(RuntimeError):
    """The device cannot compute in the precision asked for."""


class Precision:
    def __init__(self, name: str, device: torch.device):
        self.name, self.dtype, self.device_type = name, DTYPES[name], torch.device(device).type
        if self.reduced and self.device_type == "cuda" and not torch.cuda.is_bf16_supported():
            raise PrecisionError(f"--precision {name}: this GPU ({torch.cuda.get_device_name(device)}) has no "
                                 f"bfloat16 arithmetic; use --precision fp32")

    @property
    def reduced(self) -> bool:
        return self.dtype != torch.float32

    @property
    def exact(self) -> bool:
        return not self.reduced

    def wire_dtype(self) -> Optional[torch.dtype]:
        """The dtype training halo rows travel in under this precision (None: as they are)."""
        return self.dtype if self.reduced else None

    def autocast(self):
        """The context the model's forward runs in: autocast to the compute dtype, or nothing for fp32."""
        if not self.reduced:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, count: int) -> torch.Tensor:
        """The step's loss (engine/targets.loss) of its target rows' logits, in float32 (outside autocast:
        its log-softmax and sum over classes would otherwise read bfloat16 logits)."""
        with torch.autocast(self.device_type, enabled=False) if self.reduced else contextlib.nullcontext():
            return targets.loss(logits.float(), labels, count)

    @property
    def row_dtype(self) -> Optional[torch.dtype]:
        """The dtype the layer runner (nn/runner.call_layer) rounds every layer's source rows (the halo
        when it arrives) and output rows (each part of a boundary-first split when it is computed) to:
        the pass settings' ``row_dtype``.  Without it a float32 parameter (GCN's bias) would widen every
        later activation back to float32.  None for fp32."""
        return self.dtype if self.reduced else None

    def entry(self) -> Dict:
        """summary.json's plan entry: the precision, and why the run is inexact under bf16."""
        out: Dict[str, Any] = {"precision": self.name}
        if self.reduced:
            out["exact"] = False
            out["inexact_because"] = (f"--precision {self.name}: the layers compute in {str(self.dtype)[6:]} "
                                      f"(torch.autocast) and the halo rows are rounded to it")
        return out

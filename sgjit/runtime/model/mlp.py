"""The dense SwiGLU feed-forward of a decoder layer (also Qwen2-MoE's shared expert): gate and up
fused into one weight at load, so it is two GEMMs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from sgjit.kernels.ops import OpTable, PrepareWeight


class WeightSource(Protocol):
    """What the feed-forward loaders need of the model's weight taker (llama.py)."""

    def __call__(self, name: str) -> torch.Tensor: ...

    def layer_gemm(self, name: str) -> Any: ...

    def stack(self, parts: list) -> Any: ...


@dataclass(slots=True)
class DenseMLP:
    gate_up: Any  # [2 intermediate, hidden], as ops.prepare_weight left it
    down: Any  # [hidden, intermediate]

    def __call__(self, ops: OpTable, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(ops.silu_mul(ops.linear(x, self.gate_up, None)), self.down, None)

    @classmethod
    def load(cls, take: WeightSource, prefix: str, prepare: PrepareWeight) -> DenseMLP:
        """`prefix` + gate_proj / up_proj / down_proj."""
        gate_up = take.stack([take.layer_gemm(f"{prefix}{n}_proj.weight") for n in ("gate", "up")])
        return cls(prepare(gate_up), prepare(take.layer_gemm(f"{prefix}down_proj.weight")))

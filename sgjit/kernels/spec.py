"""What the kernels are specialised on and what the selector hands back: the model's shapes, the
static bounds of the steps to serve, and per op the variant chosen with its tunables and reason."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
_DTYPE_NAMES[torch.float8_e4m3fn] = "fp8_e4m3"


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


@dataclass(frozen=True, slots=True)
class ModelShapes:
    """What the kernels are specialised on."""

    dtype: str  # "bfloat16" | "float16" | "float32"
    kv_dtype: str  # the dtype names above or "fp8_e4m3"
    hidden: int
    intermediate: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_dim: int
    vocab: int
    page_size: int
    qk_norm: bool = False
    experts: int = 0  # routed experts of a sparse MoE model (0 = dense)
    expert_intermediate: int = 0

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def kv_bytes(self) -> int:
        return 1 if self.kv_dtype == "fp8_e4m3" else 2

    @classmethod
    def from_config(cls, mc: Any, dtype: torch.dtype, kv_dtype: torch.dtype, page_size: int) -> ModelShapes:
        moe = mc.moe
        return cls(
            dtype=dtype_name(dtype), kv_dtype=dtype_name(kv_dtype), hidden=mc.hidden_size,
            intermediate=mc.intermediate_size, num_heads=mc.num_heads, num_kv_heads=mc.num_kv_heads,
            head_dim=mc.head_dim, rope_dim=mc.rope.dim or mc.head_dim, vocab=mc.vocab_size,
            page_size=page_size, qk_norm=mc.qk_norm, experts=moe.num_experts if moe else 0,
            expert_intermediate=moe.intermediate_size if moe else 0,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Workload:
    """Static bounds of the steps to serve (the runtime's limits, or a graph bucket's)."""

    max_batch: int = 256  # rows in a decode step
    max_context: int = 8192  # longest row's KV length: bounds the decode split count
    max_prefill_tokens: int = 2048
    batch_invariant: bool = False  # deterministic mode: a row's numerics independent of its batch


@dataclass(frozen=True, slots=True)
class KernelChoice:
    variant: str
    tunables: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""


@dataclass(frozen=True, slots=True)
class KernelSet:
    choices: Mapping[str, KernelChoice]
    shapes: ModelShapes
    workload: Workload

    def __getitem__(self, op: str) -> KernelChoice:
        return self.choices[op]

    def describe(self) -> str:
        lines = []
        for op, c in self.choices.items():
            knobs = ", ".join(f"{k}={getattr(v, 'name', v)}" for k, v in c.tunables.items())
            lines.append(f"{op}: {c.variant}{' (' + knobs + ')' if knobs else ''} — {c.reason}")
        return "\n".join(lines)

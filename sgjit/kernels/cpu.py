"""The CPU op table. With sgjit's C++ kernels (sgjit/kernels/cpp/, built on first use): GEMMs on
GGUF blocks kept packed, and fused RMSNorm, add+RMSNorm, SiLU·mul, RoPE+KV store and paged attention,
all batch-invariant. Dense fp32 GEMMs go through oneDNN with weights packed once at load: for the
small batches of decoding it runs near memory bandwidth, where torch's default BLAS path reaches
about half of it on the machines measured (docs/performance.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sgjit.kernels import reference
from sgjit.kernels.cpp.build import native
from sgjit.kernels.cpp.ops import CppOps
from sgjit.kernels.cpp.panels import PanelWeight, to_panels
from sgjit.kernels.fp8 import Fp8Weight
from sgjit.kernels.ops import OpTable
from sgjit.kernels.quant import QuantWeight


def onednn_available() -> bool:
    """oneDNN's packed-weight linear (the op torch's own CPU compiler uses) works in this build."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        w = torch.ops.mkldnn._reorder_linear_weight(torch.ones(8, 8), 1)
        y = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 8), w, None, "none", [], "")
        return bool(torch.allclose(y, torch.full((2, 8), 8.0)))
    except (AttributeError, RuntimeError):
        return False


def packed_gguf_available(dtype: torch.dtype) -> bool:
    """GGUF weights can stay packed on this CPU for this compute dtype: the C++ kernels built."""
    return dtype in (torch.float32, torch.bfloat16) and native() is not None


def linear_onednn(x: torch.Tensor, weight: Any, bias: torch.Tensor | None = None) -> torch.Tensor:
    if isinstance(weight, Fp8Weight):
        return reference.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")


def prepare_weight_onednn(weight: torch.Tensor | QuantWeight | Fp8Weight) -> Any:
    """oneDNN's packed fp32 layout; FP8 weights stay FP8 (computed by the reference path: for
    checking, not for speed)."""
    if isinstance(weight, Fp8Weight):
        return weight
    if isinstance(weight, QuantWeight):
        weight = weight.dequantize()
    return torch.ops.mkldnn._reorder_linear_weight(weight.float().contiguous(), 1)


def cpu_ops(dtype: torch.dtype) -> OpTable:
    """The CPU op table for a compute dtype: the C++ kernels where they built, oneDNN GEMMs for
    dense fp32 weights when torch has them, the torch reference ops for the rest."""
    dense_linear: Callable = reference.linear
    dense_prepare: Callable = reference.prepare_weight
    if dtype == torch.float32 and onednn_available():
        dense_linear, dense_prepare = linear_onednn, prepare_weight_onednn
    lib = native()
    if lib is None:
        return reference.REFERENCE_OPS.with_overrides(linear=dense_linear, prepare_weight=dense_prepare)
    cpp = CppOps(lib)

    def linear(x: torch.Tensor, weight: Any, bias: torch.Tensor | None = None) -> torch.Tensor:
        return (
            cpp.linear(x, weight, bias) if isinstance(weight, PanelWeight) else dense_linear(x, weight, bias)
        )

    def prepare_weight(weight: Any) -> Any:
        return to_panels(weight) if isinstance(weight, QuantWeight) else dense_prepare(weight)

    return reference.REFERENCE_OPS.with_overrides(
        linear=linear, prepare_weight=prepare_weight, rmsnorm=cpp.rmsnorm, add_rmsnorm=cpp.add_rmsnorm,
        silu_mul=cpp.silu_mul, rope_store_kv=cpp.rope_store_kv, attention=cpp.attention,
    )  # fmt: skip

"""CPU variants of ops where torch's default path leaves speed behind. fp32 GEMMs through oneDNN with
weights packed once at load run near memory bandwidth for the small batches of decoding, where the
default BLAS path reaches about half of it on the machines measured (docs/performance.md)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from sgjit.kernels import reference
from sgjit.kernels.fp8 import Fp8Weight
from sgjit.kernels.ops import OpTable
from sgjit.kernels.quant import Int4Weight, QuantWeight, int4_available, int4_packable, linear_int4, pack_int4

log = logging.getLogger(__name__)


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


def prepare_weight_onednn(weight: torch.Tensor | QuantWeight | Fp8Weight) -> Any:
    """oneDNN's packed fp32 layout; GGUF blocks torch's int4 GEMM takes stay 4-bit (`quant.py`);
    FP8 weights stay FP8 (computed by the reference path: for checking, not for speed)."""
    if isinstance(weight, Fp8Weight):
        return weight
    if isinstance(weight, QuantWeight):
        if int4_packable(weight) and int4_available():
            return pack_int4(weight)
        weight = weight.dequantize()
    return torch.ops.mkldnn._reorder_linear_weight(weight.float().contiguous(), 1)


def linear_onednn(x: torch.Tensor, weight: Any, bias: torch.Tensor | None = None) -> torch.Tensor:
    if isinstance(weight, Int4Weight):
        return linear_int4(x, weight, bias)
    if isinstance(weight, Fp8Weight):
        return reference.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")


def cpu_ops(dtype: torch.dtype) -> OpTable:
    """The CPU op table for a compute dtype: oneDNN GEMMs for fp32 when torch has them (and int4
    GEMMs on packed GGUF weights)."""
    if dtype == torch.float32 and onednn_available():
        return reference.REFERENCE_OPS.with_overrides(
            linear=linear_onednn, prepare_weight=prepare_weight_onednn
        )
    return reference.REFERENCE_OPS

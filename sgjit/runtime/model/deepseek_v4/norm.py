"""DeepSeek-V4's two RMSNorms, in transformers' order of rounding."""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Statistics and the (float32) weight applied in float32, the result rounded once to `x`'s dtype."""
    xf = x.float()
    return (weight * (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps))).to(x.dtype)


def unit_rmsnorm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS normalisation without a weight (statistics in float32, result in `x`'s dtype)."""
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)

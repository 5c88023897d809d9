"""Rotary position embedding tables. The model keeps one `[max_positions, rot_dim]` table of
`cos || sin` halves; every rope op (reference or kernel) indexes it by position."""

from __future__ import annotations

import math

import torch

from sgjit.runtime.model.config import RopeConfig


def inverse_frequencies(rope: RopeConfig, freq_factors: torch.Tensor | None = None) -> torch.Tensor:
    """Per-pair inverse frequencies, with Llama-3 / linear scaling or GGUF's `rope_freqs` factors."""
    inv = 1.0 / (rope.theta ** (torch.arange(0, rope.dim, 2, dtype=torch.float64) / rope.dim))
    if freq_factors is not None:
        return inv / freq_factors.to(torch.float64)
    if rope.scaling_type == "linear":
        return inv / rope.factor
    if rope.scaling_type == "llama3":
        low_wavelen = rope.original_max_position / rope.low_freq_factor
        high_wavelen = rope.original_max_position / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
        mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
        return torch.where(mid, (1 - smooth) * inv / rope.factor + smooth * inv, scaled)
    return inv


def cos_sin_table(
    rope: RopeConfig, max_positions: int, device: torch.device, freq_factors: torch.Tensor | None = None
) -> torch.Tensor:
    """`[max_positions, rope.dim]` float32: the first half cos, the second half sin."""
    inv = inverse_frequencies(rope, freq_factors)
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(torch.float32).to(device)

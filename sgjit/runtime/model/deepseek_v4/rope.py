"""DeepSeek-V4's RoPE: interleaved pairs (channels 2i, 2i+1 rotate together) on the trailing
`rope_head_dim` channels of a head, the leading ones left as they are. Two frequency sets: "main"
for sliding-only layers, "compress" (another theta, optionally YaRN) for CSA/HCA layers, their
compressed entries and the indexer. Angles are taken per step in float32 from the positions, as
transformers does, so no table bounds the context."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sgjit.runtime.model.deepseek_v4.config import YarnScaling


def inverse_frequencies(theta: float, dim: int, yarn: YarnScaling | None = None) -> torch.Tensor:
    """float32 [dim / 2]; YaRN blends interpolated and original frequencies over the band between its
    beta_fast and beta_slow rotation counts (bounds rounded outwards, as transformers does)."""
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    if yarn is None:
        return 1.0 / pos_freqs

    def correction_dim(rotations: float) -> float:
        return dim * math.log(yarn.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(yarn.beta_fast)), 0)
    high = min(math.ceil(correction_dim(yarn.beta_slow)), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / ((high - low) or 0.001)).clamp(0, 1)
    keep = 1 - ramp  # share of the original (extrapolated) frequency
    return (1.0 / (yarn.factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep


@dataclass(slots=True)
class Rotary:
    inv_freq: torch.Tensor  # float32 [rope_dim / 2]

    @property
    def dim(self) -> int:
        return 2 * self.inv_freq.shape[0]

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float()[:, None] * self.inv_freq[None, :]
        return angles.cos(), angles.sin()

    def apply(
        self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], inverse: bool = False
    ) -> torch.Tensor:
        """`x` [N, D] or [N, H, D] rotated by each row's angle (`cos_sin` [N, rope_dim / 2]);
        `inverse` rotates back (transformers' "-sin")."""
        cos, sin = cos_sin
        if x.dim() == 3:
            cos, sin = cos[:, None], sin[:, None]
        if inverse:
            sin = -sin
        r = self.dim
        pairs = x[..., -r:].float().unflatten(-1, (r // 2, 2))
        a, b = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
        return torch.cat([x[..., :-r], rotated.to(x.dtype)], dim=-1)

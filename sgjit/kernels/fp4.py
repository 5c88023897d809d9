"""FP4 (OCP e2m1) weights as DeepSeek-V4's released checkpoints store their routed experts: two 4-bit
codes a byte along the input dimension (the low nibble is the first value), and one power-of-two
scale (e8m0) per `group` consecutive inputs of a row. sgjit computes on such weights dequantized:
every e2m1 value times a power of two is exact in bf16, so dequantizing at load loses nothing."""

from __future__ import annotations

import torch

# e2m1 by code: bit 3 the sign, bits 2-1 the exponent, bit 0 the mantissa
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """float32 [..., 2 * K2] from the codes packed two a byte in `packed` [..., K2] (uint8 or int8)."""
    codes = packed.view(torch.uint8)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    low, high = table[(codes & 0x0F).long()], table[(codes >> 4).long()]
    return torch.stack([low, high], dim=-1).flatten(-2)


def dequantize_e2m1(
    packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """[..., K] = e2m1 value x its group's scale. `packed` [..., K / 2]; `scale` [..., K / group]
    (float8_e8m0fnu as stored, or any float dtype); `group` follows from the two shapes."""
    values = unpack_e2m1(packed)
    k, groups = values.shape[-1], scale.shape[-1]
    if groups == 0 or k % groups or scale.shape[:-1] != values.shape[:-1]:
        raise ValueError(
            f"FP4 scales {tuple(scale.shape)} do not tile a weight of {tuple(values.shape)} values"
        )
    grouped = values.reshape(*values.shape[:-1], groups, k // groups) * scale.float()[..., None]
    return grouped.reshape(values.shape).to(dtype)

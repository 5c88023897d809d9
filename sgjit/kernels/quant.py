"""GGUF-quantized GEMM weights kept packed, and their form for torch's CPU int4 GEMM.

`QuantWeight` holds a 2-D weight as the GGUF file stores it: rows of quantization blocks along the
input dimension. Every format here has a 4-bit form with groups of 32 inputs, which
`torch.ops.aten._weight_int4pack_mm_for_cpu` computes on without unpacking to floats:

    w = (q - 8) * scale + zero,   q in 0..15, one (scale, zero) per group of 32 inputs

  Q4_0: w = d (q - 8)              -> scale d,      zero 0
  Q4_1: w = d q + m                -> scale d,      zero m + 8 d
  Q4_K: w = d sc q - dmin m        -> scale d sc,   zero 8 d sc - dmin m   (8 groups per 256-block)
  Q8_0: w = d q, q in -127..127, split as q = 16 hi + lo (hi in -8..7, lo in 0..15): two 4-bit
        weights, hi + 8 with scale 16 d and lo with scale d, zero 8 d, summed after the GEMM.

Every mapping is exact in the file's fp16 scales. torch's CPU kernel is fast only on bf16
(fp32 activations take a scalar path ~25x slower, measured on this machine's AVX-512 CPU), so the
GEMM runs in bf16: the activations and the (scale, zero) pairs are rounded to bf16 (relative
error <= 2^-9, far under the 4-bit quantization's own), and accumulation is fp32 inside the kernel."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

GROUP = 32  # inputs per (scale, zero): every format's block or sub-block
# GGUF block layouts: (weights per block, bytes per block)
BLOCKS = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q8_0": (32, 34), "Q4_K": (256, 144)}
QUANT_TYPES = frozenset(BLOCKS)


@dataclass(frozen=True, slots=True)
class QuantWeight:
    """A weight `[out_features, in_features]` as GGUF blocks: `raw` is uint8 `[out, bytes per row]`."""

    qtype: str
    raw: np.ndarray
    in_features: int

    @property
    def out_features(self) -> int:
        return int(self.raw.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    def dequantize(self) -> torch.Tensor:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        w = dequantize(self.raw, GGMLQuantizationType[self.qtype])
        return torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32).reshape(self.shape))

    def rows(self, index: np.ndarray) -> QuantWeight:
        """The rows in `index` order (a row is whole blocks, so any row permutation stays exact)."""
        return replace(self, raw=np.ascontiguousarray(self.raw[index]))

    @staticmethod
    def cat(parts: list[QuantWeight]) -> QuantWeight:
        """Rows of `parts` stacked (q|k|v, gate|up); all of one format and input width."""
        first = parts[0]
        if any(p.qtype != first.qtype or p.in_features != first.in_features for p in parts):
            raise ValueError("cannot stack GGUF weights of different formats or widths")
        return replace(first, raw=np.concatenate([p.raw for p in parts]))


def from_gguf(qtype: str, raw: np.ndarray, shape: tuple[int, int]) -> QuantWeight:
    """A GGUF tensor's data (uint8, `[out, bytes per row]`) with its `(out, in)` shape."""
    per_block, nbytes = BLOCKS[qtype]
    out, k = shape
    if k % per_block or raw.dtype != np.uint8 or raw.shape != (out, k // per_block * nbytes):
        raise ValueError(f"{qtype} tensor of shape {shape} has {raw.shape} bytes")
    return QuantWeight(qtype, np.ascontiguousarray(raw), k)


def four_bit(w: QuantWeight) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """`w` as 4-bit parts `(q uint8 [out, in], scale fp32 [out, in/32], zero fp32 [out, in/32])` whose
    dequantized weights, `(q - 8) * scale + zero` by groups, sum to `w` (one part; two for Q8_0)."""
    per_block, nbytes = BLOCKS[w.qtype]
    out, k = w.shape
    blocks = w.raw.reshape(out, k // per_block, nbytes)
    f16 = lambda b: b.copy().view(np.float16)[..., 0].astype(np.float32)  # noqa: E731
    if w.qtype == "Q8_0":
        d = f16(blocks[..., 0:2])[..., None]  # [out, blocks, 1]
        q = blocks[..., 2:].copy().view(np.int8).astype(np.int16)
        hi, lo = q >> 4, q & 15  # q = 16 hi + lo
        zeros = np.zeros_like(d)
        return [
            _part((hi + 8).reshape(out, k), 16 * d, zeros),
            _part(lo.reshape(out, k), d, 8 * d),
        ]
    if w.qtype == "Q4_K":
        from gguf.quants import Q4_K

        n = out * (k // per_block)
        flat = blocks.reshape(n, nbytes)
        d, dmin = f16(flat[:, 0:2]), f16(flat[:, 2:4])
        sc, mn = Q4_K.get_scale_min(flat[:, 4:16])
        scale = d[:, None] * sc.astype(np.float32)  # [n, 8]
        zero = 8 * scale - dmin[:, None] * mn.astype(np.float32)
        nib = flat[:, 16:].reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        q = (nib & 15).reshape(out, k)  # per 32-byte chunk: low nibbles, then high ones
        return [_part(q, scale.reshape(out, -1, 1), zero.reshape(out, -1, 1))]
    d = f16(blocks[..., 0:2])[..., None]
    body = blocks[..., 4:] if w.qtype == "Q4_1" else blocks[..., 2:]
    nib = body[..., None, :] >> np.array([0, 4], dtype=np.uint8).reshape(2, 1)  # low nibbles first
    q = (nib & 15).reshape(out, k)
    zero = f16(blocks[..., 2:4])[..., None] + 8 * d if w.qtype == "Q4_1" else np.zeros_like(d)
    return [_part(q, d, zero)]


def _part(q: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    out = q.shape[0]
    return (
        q.astype(np.uint8),
        scale.reshape(out, -1).astype(np.float32),
        zero.reshape(out, -1).astype(np.float32),
    )


@dataclass(frozen=True, slots=True)
class Int4Weight:
    """A QuantWeight prepared for `_weight_int4pack_mm_for_cpu`: its 4-bit parts stacked along the
    outputs (`parts` of them, summed after the GEMM)."""

    packed: torch.Tensor  # uint8 [parts * out, in / 2]
    scales_zeros: torch.Tensor  # bf16 [in / 32, parts * out, 2]
    out_features: int
    parts: int


def int4_packable(w: QuantWeight) -> bool:
    """torch's packing wants the outputs in multiples of 16."""
    return w.out_features % 16 == 0


def pack_int4(w: QuantWeight) -> Int4Weight:
    parts = four_bit(w)
    q = torch.from_numpy(np.concatenate([p[0] for p in parts]).astype(np.int32))
    scale = np.concatenate([p[1] for p in parts])  # [parts * out, in / 32]
    zero = np.concatenate([p[2] for p in parts])
    sz = torch.from_numpy(np.ascontiguousarray(np.stack([scale.T, zero.T], axis=-1))).to(torch.bfloat16)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    return Int4Weight(packed, sz, w.out_features, len(parts))


def linear_int4(x: torch.Tensor, w: Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    lead = x.shape[:-1]
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(
        x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous(), w.packed, GROUP, w.scales_zeros
    ).float()
    if w.parts == 2:
        y = y[:, : w.out_features] + y[:, w.out_features :]
    if bias is not None:
        y = y + bias
    return y.reshape(*lead, w.out_features)


def int4_available() -> bool:
    """torch's CPU int4 GEMM exists in this build and computes what it should."""
    try:
        q = torch.full((16, 64), 9, dtype=torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        sz = torch.zeros(2, 16, 2, dtype=torch.bfloat16)
        sz[..., 0] = 1.0
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            torch.ones(1, 64, dtype=torch.bfloat16), packed, GROUP, sz
        )
        return bool(torch.allclose(y.float(), torch.full((1, 16), 64.0)))
    except (AttributeError, RuntimeError):
        return False

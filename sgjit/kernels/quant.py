"""GGUF-quantized GEMM weights kept packed. `QuantWeight` holds a 2-D weight as the GGUF file stores
it: rows of quantization blocks along the input dimension. `decompose` gives every format as small
integers and per-group float32 scales, groups of 32 inputs, exactly:

  Q4_0: w = d q - 8 d            q in 0..15   -> scale d,     min -8 d
  Q4_1: w = d q + m              q in 0..15   -> scale d,     min m
  Q4_K: w = d sc q - dmin m      q in 0..15   -> scale d sc,  min -dmin m   (8 groups per 256-block)
  Q8_0: w = d q                  q in -127..127 -> scale d,   no min

(fp16 d times a 6-bit sc has at most 17 significant bits, so even Q4_K's products are exact in
float32.) The CPU kernels (sgjit/kernels/cpp/) compute on these integers directly."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

GROUP = 32  # inputs per (scale, min): every format's block or sub-block
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


def decompose(w: QuantWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """`(q [out, in], scale [out, in / 32], min [out, in / 32])` with w = scale * q + min by groups of
    32 inputs: q uint8 0..15 for the 4-bit formats; int8 and no min (None) for Q8_0."""
    per_block, nbytes = BLOCKS[w.qtype]
    out, k = w.shape
    blocks = w.raw.reshape(out, k // per_block, nbytes)
    f16 = lambda b: b.copy().view(np.float16)[..., 0].astype(np.float32)  # noqa: E731
    if w.qtype == "Q8_0":
        return blocks[..., 2:].copy().view(np.int8).reshape(out, k), f16(blocks[..., 0:2]), None
    if w.qtype == "Q4_K":
        from gguf.quants import Q4_K

        n = out * (k // per_block)
        flat = blocks.reshape(n, nbytes)
        d, dmin = f16(flat[:, 0:2]), f16(flat[:, 2:4])
        sc, mn = Q4_K.get_scale_min(flat[:, 4:16])
        scale = d[:, None] * sc.astype(np.float32)  # [n, 8]
        low = -(dmin[:, None] * mn.astype(np.float32))
        nib = flat[:, 16:].reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        q = (nib & 15).reshape(out, k)  # per 32-byte chunk: low nibbles, then high ones
        return q, scale.reshape(out, -1), low.reshape(out, -1)
    d = f16(blocks[..., 0:2])
    body = blocks[..., 4:] if w.qtype == "Q4_1" else blocks[..., 2:]
    nib = body[..., None, :] >> np.array([0, 4], dtype=np.uint8).reshape(2, 1)  # low nibbles first
    low = f16(blocks[..., 2:4]) if w.qtype == "Q4_1" else -8 * d
    return (nib & 15).reshape(out, k), d, low

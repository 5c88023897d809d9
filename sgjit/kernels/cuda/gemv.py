"""The linear op on the GPU (gemv.cu): sgjit's GEMV for decode-sized batches, cuBLAS (bf16/fp16
weights) or cuBLASLt's FP8 GEMM (`Fp8Weight`, the activations quantized per token in one launch by
fp8_quant.cu) for the rest.

The selector sets how many rows go to the GEMV for each weight kind (`dense_rows`, `fp8_rows`; 0 =
never): up to there it streams the weight once at close to copy bandwidth, past it the tensor-core
GEMMs win. Row counts are bucketed to the compiled instantiations (1, 2, 4, 8, 16). The names, tiles
and input checks here are shared with the fused decode GEMVs (fused_gemv.py)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from sgjit.kernels.cuda.fp8_quant import Fp8Quantize
from sgjit.kernels.cuda.module import compile_kernels, launch, ptr
from sgjit.kernels.fp8 import Fp8Weight, fp8_matmul_fits, linear_reference, linear_scaled_mm
from sgjit.kernels.sources import CPP_TYPES

WARPS = 4  # a block: WARPS warps of NPW output channels each
THREADS = 32 * WARPS
ROW_BUCKETS = (1, 2, 4, 8, 16)
# rows bucket -> (output channels a warp owns, loads in flight per channel and lane); more channels
# a warp reuse each x vector, more loads in flight cut the memory round trips a warp waits through
# in sequence (K / (32 x UNROLL) of them). `--only gemv_tiles` of bench.kernels swept them (H100,
# 2026-12-07): (1, 4) within 2% of the best at one row on every 8B weight in bf16; for FP8 weights at
# 2-4 rows (2, 2) is the best on o_proj and down, (4, 1) on gate_up (bf16 products of 2+ rows go to
# cuBLAS on the 8B; FP8 at one row: FP8_TILES below). Neither changes a lane's
# summation order, so a row's bits do not depend on M. At 8 and 16 rows more loads in flight spill
# on sm_80. NPW 0 selects the tensor-core body (16-bit weights, up to 32 rows; gemv.cuh): 16 channels
# a block, its warps splitting K, UNROLL 64-element blocks in flight a warp.
Tiles = dict[int, tuple[int, int]]
TILES: Tiles = {1: (1, 4), 2: (2, 2), 4: (2, 2), 8: (4, 1), 16: (4, 1)}
# FP8 weights at one row: two channels a warp halve the conversions of x a weight byte costs, which
# bound the FP8 loop (docs/performance.md: ~1.8 warp instructions a cycle an SM at copy bandwidth);
# `--only gemv_tiles` on the H100, 2026-12-07: o_proj 8.1-8.2 vs 8.7-8.9 us, down 21.8-21.9 vs
# 22.2-22.5, gate_up 41.4 vs 41.0-41.4.
FP8_TILES: Tiles = {**TILES, 1: (2, 2)}
# The tensor-core body at every rows bucket, for the tile sweep and the tests. Not the default: on the
# H100 (docs/performance.md, 2026-12-07) it streams 2-8 rows at about its one-row speed (2.7x the FMA
# body at 8 rows on o_proj), but so does cuBLAS on the 8B's weights (at 8 rows: o_proj 15.4 vs 16.1
# us, gate_up 78.4 vs 78.5, down 50.3 vs 43.4); the fused kernels' prologues grow with the rows they
# normalise, and at 16-32 rows it is 1.05-2.1x slower than cuBLAS (each block re-reads every input
# row, likely from L2). As the default for 2-32 rows it made the 8B's b=8 and b=32 decode slower.
MMA_TILES: Tiles = {b: (0, 2) for b in ROW_BUCKETS}
FP8_KIND = "fp8_e4m3"
_BYTES_PER_LOAD = 16


def gemv_name(dtype: str, weight: str, rows: int, npw: int, unroll: int, kernel: str = "gemv_kernel",
              kv: str | None = None) -> str:  # fmt: skip
    """A gemv.cu kernel's name expression; `kv`: the KV pool element of the RoPE epilogue."""
    kv_arg = f"{CPP_TYPES[kv]}, " if kv else ""
    return f"{kernel}<{CPP_TYPES[dtype]}, {kv_arg}{CPP_TYPES[weight]}, {rows}, {npw}, {unroll}, {WARPS}>"


def bucket(m: int) -> int:
    return next(b for b in ROW_BUCKETS if b >= m)


MMA_CHANNELS = 16  # a block's channels in the tensor-core body (gemv.cuh's MMA_CPB)


def tile_of(rows: int, weight: str, tiles: Tiles | None = None) -> tuple[int, int]:
    """The (NPW, UNROLL) tile for `rows` rows of a `weight` kind: `tiles`' entry for the rows bucket
    (None: the weight kind's default, TILES or FP8_TILES), except that the tensor-core body (NPW 0)
    takes 16-bit weights only: FP8 weights get FP8_TILES' there."""
    b = bucket(rows)
    fp8 = weight == FP8_KIND
    tile = (tiles or (FP8_TILES if fp8 else TILES))[b]
    return FP8_TILES[b] if tile[0] == 0 and fp8 else tile


def channels_per_block(rows: int, weight: str, tiles: Tiles | None = None) -> int:
    """A block's output channels: WARPS x NPW, or the tensor-core body's 16 (NPW 0)."""
    npw = tile_of(rows, weight, tiles)[0]
    return WARPS * npw if npw else MMA_CHANNELS


def aligned_rows(t: torch.Tensor) -> bool:
    return t.dim() == 2 and t.stride(1) == 1 and t.stride(0) % 8 == 0 and t.data_ptr() % 16 == 0


def weight_parts(weight: torch.Tensor | Fp8Weight) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the streamed elements, the per-channel scales or None)."""
    return (weight.data, weight.scale) if isinstance(weight, Fp8Weight) else (weight, None)


def gemv_fits(x: torch.Tensor, weight: torch.Tensor | Fp8Weight, dtype: torch.dtype) -> bool:
    """What every gemv.cu kernel takes: x and a dense weight in the model dtype (or an FP8 weight),
    K a whole number of 16-byte loads, the weight contiguous and 16-byte aligned."""
    data, _ = weight_parts(weight)
    fp8 = isinstance(weight, Fp8Weight)
    k = x.shape[-1]
    return (
        x.is_cuda
        and x.dtype == dtype
        and (fp8 or data.dtype == dtype)
        and x.numel() > 0
        and k % (_BYTES_PER_LOAD // data.element_size()) == 0
        and data.is_contiguous()
        and data.dim() == 2
        and data.shape[1] == k
        and data.data_ptr() % 16 == 0
    )


def flat_rows(x: torch.Tensor) -> torch.Tensor:
    """x as [M, K] rows the kernels can read (16-byte aligned, unit inner stride)."""
    flat = x.reshape(-1, x.shape[-1])
    return flat if aligned_rows(flat) else flat.contiguous()


class GemvLinear:
    def __init__(
        self, dtype: torch.dtype, dtype_name: str, dense_rows: int, fp8_rows: int,
        tiles: Tiles | None = None, pdl: bool = False,
    ) -> None:  # fmt: skip
        """`tiles`: the tile per rows bucket (None: each weight kind's default; another map only to
        compare or test tiles);
        `pdl`: launch to overlap the kernel before inside captured graphs (pdl.py)."""
        self.pdl = pdl
        if not {dense_rows, fp8_rows} <= {0, *ROW_BUCKETS}:
            raise ValueError(f"GEMV row limits must be 0 or one of {ROW_BUCKETS}")
        self.dtype, self.dtype_name = dtype, dtype_name
        self.dense_rows, self.fp8_rows = dense_rows, fp8_rows
        self.tiles = tiles
        names = {}
        for kind, limit in ((dtype_name, dense_rows), (FP8_KIND, fp8_rows)):
            for b in ROW_BUCKETS:
                if b <= limit:
                    names[(kind, b)] = gemv_name(dtype_name, kind, b, *tile_of(b, kind, tiles))
        compiled = compile_kernels("gemv", sorted(set(names.values()))) if names else {}
        self._kernels = {key: compiled[n] for key, n in names.items()}
        self.quantize = Fp8Quantize(dtype, dtype_name)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor | Fp8Weight, bias: torch.Tensor | None = None):
        fp8 = isinstance(weight, Fp8Weight)
        m = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if m <= (self.fp8_rows if fp8 else self.dense_rows) and self._fits(x, weight, bias):
            return self._gemv(x, weight, bias, fp8)
        if not fp8:
            return F.linear(x, weight, bias)
        return (
            linear_scaled_mm(x, weight, bias, self.quantize.rows)
            if fp8_matmul_fits(x, weight)
            else linear_reference(x, weight, bias)
        )

    def _fits(self, x: torch.Tensor, weight, bias) -> bool:
        return gemv_fits(x, weight, self.dtype) and (
            bias is None or (bias.dtype == self.dtype and bias.is_contiguous())
        )

    def _gemv(self, x: torch.Tensor, weight, bias, fp8: bool) -> torch.Tensor:
        lead, k = x.shape[:-1], x.shape[-1]
        flat = flat_rows(x)
        data, scale = weight_parts(weight)
        m, n = flat.shape[0], data.shape[0]
        b, kind = bucket(m), FP8_KIND if fp8 else self.dtype_name
        kernel = self._kernels[kind, b]
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        launch(
            kernel, (-(-n // channels_per_block(m, kind, self.tiles)),), THREADS,
            (ptr(flat), ptr(data), ptr(scale), ptr(bias), ptr(out), np.int32(m), np.int32(n), np.int32(k),
             np.int64(flat.stride(0)), np.int64(n)), pdl=self.pdl,
        )  # fmt: skip
        return out.reshape(*lead, n)

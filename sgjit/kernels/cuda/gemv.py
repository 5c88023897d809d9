"""The linear op on the GPU (gemv.cu): sgjit's GEMV for decode-sized batches, cuBLAS (bf16/fp16
weights) or cuBLASLt's FP8 GEMM (`Fp8Weight`) for the rest.

The selector sets how many rows go to the GEMV for each weight kind (`dense_rows`, `fp8_rows`; 0 =
never): up to there it streams the weight once at close to copy bandwidth, past it the tensor-core
GEMMs win. Row counts are bucketed to the compiled instantiations (1, 2, 4, 8, 16)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from sgjit.kernels.cuda.module import compile_kernels, launch, ptr
from sgjit.kernels.fp8 import Fp8Weight, fp8_matmul_fits, linear_reference, linear_scaled_mm
from sgjit.kernels.sources import CPP_TYPES

THREADS = 128  # GEMV_THREADS in gemv.cu
ROW_BUCKETS = (1, 2, 4, 8, 16)
# rows bucket -> (output channels a warp owns, loads in flight per channel and lane); more channels
# a warp reuse each x vector, fewer keep more of the weight in flight.
TILES: dict[int, tuple[int, int]] = {1: (1, 4), 2: (2, 2), 4: (2, 2), 8: (4, 1), 16: (4, 1)}
_BYTES_PER_LOAD = 16


def gemv_name(dtype: str, weight: str, rows: int, npw: int, unroll: int) -> str:
    return f"gemv_kernel<{CPP_TYPES[dtype]}, {CPP_TYPES[weight]}, {rows}, {npw}, {unroll}>"


def bucket(m: int) -> int:
    return next(b for b in ROW_BUCKETS if b >= m)


def _aligned_rows(t: torch.Tensor) -> bool:
    return t.dim() == 2 and t.stride(1) == 1 and t.stride(0) % 8 == 0 and t.data_ptr() % 16 == 0


class GemvLinear:
    def __init__(self, dtype: torch.dtype, dtype_name: str, dense_rows: int, fp8_rows: int) -> None:
        if not {dense_rows, fp8_rows} <= {0, *ROW_BUCKETS}:
            raise ValueError(f"GEMV row limits must be 0 or one of {ROW_BUCKETS}")
        self.dtype, self.dtype_name = dtype, dtype_name
        self.dense_rows, self.fp8_rows = dense_rows, fp8_rows
        names = {}
        for kind, limit in ((dtype_name, dense_rows), ("fp8_e4m3", fp8_rows)):
            for b in ROW_BUCKETS:
                if b <= limit:
                    names[(kind, b)] = gemv_name(dtype_name, kind, b, *TILES[b])
        compiled = compile_kernels("gemv", sorted(set(names.values()))) if names else {}
        self._kernels = {key: compiled[n] for key, n in names.items()}

    def __call__(self, x: torch.Tensor, weight: torch.Tensor | Fp8Weight, bias: torch.Tensor | None = None):
        fp8 = isinstance(weight, Fp8Weight)
        m = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if m <= (self.fp8_rows if fp8 else self.dense_rows) and self._fits(x, weight, bias, fp8):
            return self._gemv(x, weight, bias, fp8)
        if not fp8:
            return F.linear(x, weight, bias)
        return (
            linear_scaled_mm(x, weight, bias)
            if fp8_matmul_fits(x, weight)
            else linear_reference(x, weight, bias)
        )

    def _fits(self, x: torch.Tensor, weight, bias, fp8: bool) -> bool:
        data = weight.data if fp8 else weight
        k = x.shape[-1]
        per_load = _BYTES_PER_LOAD // data.element_size()
        return (
            x.is_cuda
            and x.dtype == self.dtype
            and (fp8 or data.dtype == self.dtype)
            and x.numel() > 0
            and k % per_load == 0
            and data.is_contiguous()
            and data.shape[1] == k
            and data.data_ptr() % 16 == 0
            and (bias is None or (bias.dtype == self.dtype and bias.is_contiguous()))
        )

    def _gemv(self, x: torch.Tensor, weight, bias, fp8: bool) -> torch.Tensor:
        lead, k = x.shape[:-1], x.shape[-1]
        flat = x.reshape(-1, k)
        if not _aligned_rows(flat):
            flat = flat.contiguous()
        data, scale = (weight.data, weight.scale) if fp8 else (weight, None)
        m, n = flat.shape[0], data.shape[0]
        b = bucket(m)
        kernel = self._kernels["fp8_e4m3" if fp8 else self.dtype_name, b]
        npw, _ = TILES[b]
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        grid = -(-n // (THREADS // 32 * npw))
        launch(
            kernel, (grid,), THREADS,
            (ptr(flat), ptr(data), ptr(scale), ptr(bias), ptr(out), np.int32(m), np.int32(n), np.int32(k),
             np.int64(flat.stride(0)), np.int64(n)),
        )  # fmt: skip
        return out.reshape(*lead, n)

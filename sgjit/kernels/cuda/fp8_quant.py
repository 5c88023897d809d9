"""Per-token e4m3 of the activations going into an FP8 GEMM (fp8_quant.cu): one launch instead of
torch's seven kernels (float, abs, amax, div, clamp, div, cast), with the same bits as
`fp8.quantize_rows`, which it falls back to for rows the kernel does not take."""

from __future__ import annotations

import numpy as np
import torch

from sgjit.kernels import fp8
from sgjit.kernels.cuda.module import compile_kernels, launch, ptr
from sgjit.kernels.sources import CPP_TYPES

BLOCK = 256  # threads a row: 8 warps, K / 2048 vectors each at K = 4096..14336


def quantize_rows_name(dtype: str) -> str:
    return f"quantize_rows_kernel<{CPP_TYPES[dtype]}, {BLOCK}>"


def _rows_fit(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """[M, K] rows of the model dtype on the GPU, read as 16-byte vectors: K and the row stride a
    multiple of 8 elements, unit inner stride, a 16-byte aligned start."""
    return (
        x.is_cuda
        and x.dtype == dtype
        and x.dim() == 2
        and x.shape[1] % 8 == 0
        and x.stride(1) == 1
        and x.stride(0) % 8 == 0
        and x.data_ptr() % 16 == 0
    )


class Fp8Quantize:
    def __init__(self, dtype: torch.dtype, dtype_name: str) -> None:
        self.dtype = dtype
        name = quantize_rows_name(dtype_name)
        self.kernel = compile_kernels("fp8_quant", [name])[name]

    def rows(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [M, K] -> (e4m3 [M, K], float32 scales [M, 1]), as `fp8.quantize_rows` returns them."""
        if x.numel() == 0 or not _rows_fit(x, self.dtype):
            return fp8.quantize_rows(x)
        m, k = x.shape
        data = torch.empty((m, k), dtype=fp8.FP8, device=x.device)
        scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
        launch(self.kernel, (m,), BLOCK, (ptr(x), ptr(data), ptr(scale), np.int32(k), np.int64(x.stride(0))))
        return data, scale

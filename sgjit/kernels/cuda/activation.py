"""SiLU-and-mul (activation.cu)."""

from __future__ import annotations

import numpy as np
import torch

from sgjit.kernels import reference
from sgjit.kernels.cuda.module import compile_kernels, launch, ptr
from sgjit.kernels.sources import CPP_TYPES

BLOCK = 256


def silu_mul_name(dtype: str) -> str:
    return f"silu_mul_kernel<{CPP_TYPES[dtype]}>"


class SiluMul:
    def __init__(self, dtype: torch.dtype, dtype_name: str, sm_count: int) -> None:
        self.dtype = dtype
        self.max_blocks = sm_count * 16  # grid-stride beyond this: enough blocks in flight
        self.kernel = compile_kernels("activation", [silu_mul_name(dtype_name)])[silu_mul_name(dtype_name)]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        inter = x.shape[-1] // 2
        if x.dtype != self.dtype or not x.is_cuda or inter % 8 or x.numel() == 0:
            return reference.silu_mul(x)
        x = x.contiguous()
        out = torch.empty((*x.shape[:-1], inter), dtype=x.dtype, device=x.device)
        rows = x.numel() // x.shape[-1]
        grid = min(self.max_blocks, -(-rows * inter // 8 // BLOCK))
        launch(self.kernel, (grid,), BLOCK, (ptr(x), ptr(out), np.int64(rows), np.int32(inter)))
        return out

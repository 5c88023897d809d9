"""RMSNorm and fused add+RMSNorm (norm.cu). One instantiation per row width: the model's hidden size
(and head_dim for per-head q/k norms) is compiled up front, any other width on first use."""

from __future__ import annotations

import numpy as np
import torch

from sgjit.kernels import reference
from sgjit.kernels.cuda.module import compile_kernels, launch, ptr
from sgjit.kernels.sources import CPP_TYPES


def norm_layout(hidden: int) -> tuple[int, int]:
    """(threads per row, 8-wide vectors per thread): about four vectors a thread in registers,
    rows narrower than a warp served by sub-warp groups."""
    vecs = hidden // 8
    tpr = min(512, 1 << max(0, (-(-vecs // 4) - 1).bit_length()))
    return tpr, -(-vecs // tpr)


def norm_name(dtype: str, hidden: int, add: bool) -> str:
    tpr, items = norm_layout(hidden)
    return f"rmsnorm_kernel<{CPP_TYPES[dtype]}, {tpr}, {items}, {'true' if add else 'false'}>"


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in t.stride()[:-1]) and t.stride(-1) == 1


class RMSNorm:
    def __init__(self, dtype: torch.dtype, dtype_name: str, widths: tuple[int, ...]) -> None:
        self.dtype = dtype
        self.dtype_name = dtype_name
        self._kernels: dict[tuple[int, bool], object] = {}
        self._compile(widths)

    def _compile(self, widths: tuple[int, ...]) -> None:
        names = {(w, add): norm_name(self.dtype_name, w, add) for w in widths for add in (False, True)}
        kernels = compile_kernels("norm", sorted(set(names.values())))
        self._kernels.update({k: kernels[n] for k, n in names.items()})

    def _kernel(self, hidden: int, add: bool):
        if (hidden, add) not in self._kernels:
            self._compile((hidden,))
        return self._kernels[(hidden, add)]

    def _usable(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        return x.dtype == weight.dtype == self.dtype and x.is_cuda and x.shape[-1] % 8 == 0 and x.numel() > 0

    def _launch(self, x, residual, weight, out, summed, rows, inner, s_outer, s_inner, eps, add) -> None:
        hidden = x.shape[-1]
        tpr, _ = norm_layout(hidden)
        block = max(tpr, 256)
        grid = -(-rows // (block // tpr))
        launch(
            self._kernel(hidden, add), (grid,), block,
            (ptr(x), ptr(residual), ptr(weight), ptr(out), ptr(summed), np.int32(rows), np.int32(hidden),
             np.int32(inner), np.int64(s_outer), np.int64(s_inner), np.float32(eps)),
        )  # fmt: skip

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if not self._usable(x, weight):
            return reference.rmsnorm(x, weight, eps)
        shape = x.shape
        if x.dim() > 3:
            x = x.reshape(-1, shape[-1])
        if not _aligned(x):
            x = x.contiguous()
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if x.dim() == 3:  # per-head norm over a strided [tokens, heads, head_dim] view
            inner, s_outer, s_inner = x.shape[1], x.stride(0), x.stride(1)
        else:
            inner, s_outer, s_inner = 1, x.stride(0) if x.dim() == 2 else x.shape[-1], 0
        rows = x.numel() // x.shape[-1]
        self._launch(x, None, weight.contiguous(), out, None, rows, inner, s_outer, s_inner, eps, False)
        return out.view(shape)

    def add_rmsnorm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._usable(x, weight) or residual.dtype != x.dtype or residual.shape != x.shape:
            return reference.add_rmsnorm(x, residual, weight, eps)
        x, residual = x.contiguous(), residual.contiguous()
        out, summed = torch.empty_like(x), torch.empty_like(x)
        rows = x.numel() // x.shape[-1]
        self._launch(x, residual, weight.contiguous(), out, summed, rows, 1, 0, 0, eps, True)
        return out, summed

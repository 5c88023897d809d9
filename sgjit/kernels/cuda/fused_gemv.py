"""The decode step's fused GEMVs (gemv.cu), one object behind the four fused ops: the RMSNorm of the
input rows in the prologue of the q|k|v, gate|up and LM-head projections, RoPE and the paged KV write
in the q|k|v epilogue, SiLU-and-mul in the gate|up epilogue, the residual add in the o_proj and down
epilogues. A layer is then four kernels and attention.

Steps of up to `rows` tokens run on the kernels; whatever they do not take (more rows, a shape or
dtype they were not built for) runs as the table's unfused ops (`reference.Composition`), which is
also what every kernel computes, rounding for rounding. Instantiations for weights in the model
dtype are compiled up front, those for FP8 weights on first use."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from sgjit.kernels.cuda.gemv import (
    FP8_KIND,
    ROW_BUCKETS,
    THREADS,
    Tiles,
    bucket,
    channels_per_block,
    flat_rows,
    gemv_fits,
    gemv_name,
    tile_of,
    weight_parts,
)
from sgjit.kernels.cuda.module import allow_smem, compile_kernels, launch, ptr, resident_blocks
from sgjit.kernels.fp8 import Fp8Weight
from sgjit.kernels.ops import LayerKV
from sgjit.kernels.reference import Composition

RESIDUAL, NORM, SILU, ROPE = "gemv_residual_kernel", "rmsnorm_gemv_kernel", "rmsnorm_gemv_silu_kernel", "rmsnorm_gemv_rope_kernel"  # fmt: skip
KERNELS = (RESIDUAL, NORM, SILU, ROPE)
_NORMED = (NORM, SILU, ROPE)  # kernels that normalise their rows into shared memory first
_STATIC_SMEM = 8192  # the body's reduction scratch, output tile and tensor-core sums, with room


def fused_name(
    kernel: str, dtype: str, weight: str, rows: int, kv_dtype: str, tiles: Tiles | None = None
) -> str:
    return gemv_name(
        dtype,
        weight,
        bucket(rows),
        *tile_of(rows, weight, tiles),
        kernel=kernel,
        kv=kv_dtype if kernel == ROPE else None,
    )


class FusedGemv:
    def __init__(
        self,
        dtype: torch.dtype,
        dtype_name: str,
        kv_dtype_name: str,
        rows: int,
        sm_count: int,
        smem_per_block: int,
        composed: Composition,
        pdl: bool = False,
        tiles: Tiles | None = None,
    ) -> None:
        """`smem_per_block`: the device's opt-in shared memory per block (bounds rows x K of the
        normalised input); `composed`: the unfused ops for what the kernels do not take; `pdl`:
        launch to overlap the kernel before inside captured graphs (pdl.py); `tiles`: the GEMV tile
        per rows bucket (gemv.py; None: each weight kind's default; another map to compare or test
        tiles)."""
        self.pdl, self.tiles = pdl, tiles
        if rows not in ROW_BUCKETS:
            raise ValueError(f"fused GEMV rows must be one of {ROW_BUCKETS}")
        self.dtype, self.dtype_name, self.kv_name = dtype, dtype_name, kv_dtype_name
        self.rows = rows
        self.sm_count = sm_count
        self.smem_limit = smem_per_block - _STATIC_SMEM
        self.composed = composed
        self._kernels: dict[str, object] = {}
        self._compile(
            [fused_name(k, dtype_name, dtype_name, b, kv_dtype_name, tiles) for k in KERNELS for b in ROW_BUCKETS
             if b <= rows]
        )  # fmt: skip

    def _compile(self, names: list[str]) -> None:
        for name, kernel in compile_kernels("gemv", names).items():
            if name.startswith(_NORMED):
                allow_smem(kernel, self.smem_limit)
            self._kernels[name] = kernel

    def _kind(self, weight: Tensor | Fp8Weight) -> str:
        return FP8_KIND if isinstance(weight, Fp8Weight) else self.dtype_name

    def _kernel(self, kernel: str, weight: Tensor | Fp8Weight, m: int):
        name = fused_name(kernel, self.dtype_name, self._kind(weight), m, self.kv_name, self.tiles)
        if name not in self._kernels:
            self._compile([name])
        return self._kernels[name]

    def _channels(self, weight: Tensor | Fp8Weight, m: int) -> int:
        """Output channels a block of the kernel for `weight` at `m` rows owns."""
        return channels_per_block(m, self._kind(weight), self.tiles)

    # ----- what the kernels take -----
    def _takes(self, x: Tensor, weight: Tensor | Fp8Weight, bias: Tensor | None = None) -> bool:
        m = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
        return (
            0 < m <= self.rows
            and gemv_fits(x, weight, self.dtype)
            and (bias is None or (bias.dtype == self.dtype and bias.is_contiguous()))
        )

    def _norm_takes(self, x: Tensor, norm_weight: Tensor, weight: Tensor | Fp8Weight, bias=None) -> bool:
        k = x.shape[-1]
        return (
            self._takes(x, weight, bias)
            and k % 8 == 0
            and x.numel() * x.element_size() <= self.smem_limit
            and norm_weight.dtype == self.dtype
            and norm_weight.is_contiguous()
            and norm_weight.numel() == k
            and norm_weight.data_ptr() % 16 == 0
        )

    def _launch_normed(self, kernel, groups: int, x: Tensor, args: tuple) -> None:
        """A kernel with the norm prologue: at most one wave of blocks, each normalising the rows
        once and then serving every channel group it strides over."""
        smem = x.numel() * x.element_size()
        grid = min(groups, self.sm_count * resident_blocks(kernel, THREADS, smem))
        launch(kernel, (grid,), THREADS, args, smem=smem, pdl=self.pdl)

    # ----- the ops -----
    def linear_residual(self, x: Tensor, weight: Tensor | Fp8Weight, residual: Tensor) -> Tensor:
        data, scale = weight_parts(weight)
        n = data.shape[0] if data.dim() == 2 else -1
        if not (self._takes(x, weight) and residual.dtype == self.dtype and residual.shape[-1] == n
                and residual.numel() == x.numel() // x.shape[-1] * n and residual.stride(-1) == 1):  # fmt: skip
            return self.composed.linear_residual(x, weight, residual)
        flat, res = flat_rows(x), residual.reshape(-1, n)
        m, k = flat.shape
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        launch(
            self._kernel(RESIDUAL, weight, m), (-(-n // self._channels(weight, m)),), THREADS,
            (ptr(flat), ptr(data), ptr(scale), ptr(res), ptr(out), np.int32(m), np.int32(n), np.int32(k),
             np.int64(flat.stride(0)), np.int64(res.stride(0)), np.int64(n)), pdl=self.pdl,
        )  # fmt: skip
        return out.view(residual.shape)

    def rmsnorm_linear(
        self,
        x: Tensor,
        norm_weight: Tensor,
        eps: float,
        weight: Tensor | Fp8Weight,
        bias: Tensor | None = None,
    ) -> Tensor:
        if not self._norm_takes(x, norm_weight, weight, bias):
            return self.composed.rmsnorm_linear(x, norm_weight, eps, weight, bias)
        data, scale = weight_parts(weight)
        flat = flat_rows(x)
        (m, k), n = flat.shape, data.shape[0]
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        self._launch_normed(
            self._kernel(NORM, weight, m), -(-n // self._channels(weight, m)), flat,
            (ptr(flat), ptr(norm_weight), np.float32(eps), ptr(data), ptr(scale), ptr(bias), ptr(out),
             np.int32(m), np.int32(n), np.int32(k), np.int64(flat.stride(0)), np.int64(n)),
        )  # fmt: skip
        return out.reshape(*x.shape[:-1], n)

    def rmsnorm_gate_up_silu(
        self, x: Tensor, norm_weight: Tensor, eps: float, gate_up_weight: Tensor | Fp8Weight
    ) -> Tensor:
        data, scale = weight_parts(gate_up_weight)
        if not (self._norm_takes(x, norm_weight, gate_up_weight) and data.shape[0] % 2 == 0):
            return self.composed.rmsnorm_gate_up_silu(x, norm_weight, eps, gate_up_weight)
        flat = flat_rows(x)
        (m, k), inter = flat.shape, data.shape[0] // 2
        out = torch.empty((m, inter), dtype=x.dtype, device=x.device)
        self._launch_normed(
            self._kernel(SILU, gate_up_weight, m), -(-inter // (self._channels(gate_up_weight, m) // 2)), flat,
            (ptr(flat), ptr(norm_weight), np.float32(eps), ptr(data), ptr(scale), ptr(out), np.int32(m),
             np.int32(inter), np.int32(k), np.int64(flat.stride(0)), np.int64(inter)),
        )  # fmt: skip
        return out.reshape(*x.shape[:-1], inter)

    def rmsnorm_qkv_rope(
        self, x: Tensor, norm_weight: Tensor, eps: float, qkv_weight: Tensor | Fp8Weight, qkv_bias: Tensor | None,
        cos_sin: Tensor, kv: LayerKV, slot_mapping: Tensor,
    ) -> Tensor:  # fmt: skip
        data, scale = weight_parts(qkv_weight)
        hkv, d = kv.k.shape[2], kv.k.shape[3]
        heads = data.shape[0] // d if data.dim() == 2 else 0
        m, rot = x.numel() // max(x.shape[-1], 1), cos_sin.shape[-1]
        if not (
            self._norm_takes(x, norm_weight, qkv_weight, qkv_bias)
            and heads * d == data.shape[0] and heads > 2 * hkv
            and kv.k.dtype == kv.v.dtype and (kv.k.dtype == self.dtype or kv.k.dtype == torch.float8_e4m3fn)
            and (kv.k.dtype == torch.float8_e4m3fn) == (self.kv_name == FP8_KIND)
            and kv.k.is_contiguous() and kv.v.is_contiguous()
            and cos_sin.shape == (m, rot) and rot % 2 == 0 and 0 < rot <= d and d % 2 == 0
            and slot_mapping.numel() == m
        ):  # fmt: skip
            return self.composed.rmsnorm_qkv_rope(
                x, norm_weight, eps, qkv_weight, qkv_bias, cos_sin, kv, slot_mapping
            )
        flat = flat_rows(x)
        k = flat.shape[1]
        hq = heads - 2 * hkv
        cos_sin = cos_sin.float().contiguous()
        slots = slot_mapping.long().contiguous()
        q = torch.empty((m, hq, d), dtype=x.dtype, device=x.device)
        pairs = heads * d // 2
        self._launch_normed(
            self._kernel(ROPE, qkv_weight, m), -(-pairs // (self._channels(qkv_weight, m) // 2)), flat,
            (ptr(flat), ptr(norm_weight), np.float32(eps), ptr(data), ptr(scale), ptr(qkv_bias), ptr(cos_sin),
             ptr(slots), ptr(q), ptr(kv.k), ptr(kv.v), np.int32(m), np.int32(k), np.int64(flat.stride(0)),
             np.int32(hq), np.int32(hkv), np.int32(d), np.int32(rot), np.float32(kv.k_scale), np.float32(kv.v_scale)),
        )  # fmt: skip
        return q

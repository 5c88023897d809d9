"""The op-table entries backed by the C++ kernels. Each checks what the kernel takes (float32 or
bfloat16, the strides it reads) and hands anything else to the torch reference op; outputs are
allocated here and passed down as addresses."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import Tensor

from sgjit.kernels import reference
from sgjit.kernels.cpp.panels import PanelWeight
from sgjit.kernels.ops import AttentionMetadata, LayerKV

DTYPES = (torch.float32, torch.bfloat16)


def _rows(x: Tensor) -> Tensor | None:
    """`x` as [rows, width] with unit stride along the width, without a copy where possible."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else None


def _heads(t: Tensor) -> bool:
    """[tokens, heads, D] with heads packed (views of the fused qkv output qualify)."""
    return t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2]


class CppOps:
    def __init__(self, lib: ModuleType) -> None:
        self.lib = lib

    def linear(self, x: Tensor, w: PanelWeight, bias: Tensor | None = None) -> Tensor:
        if x.dtype not in DTYPES:
            return self.linear(x.float(), w, bias).to(x.dtype)
        lead = x.shape[:-1]
        x2 = _rows(x)
        if x2 is None:
            x2 = x.reshape(-1, x.shape[-1]).contiguous()
        m = x2.shape[0]
        y = torch.empty(m, w.out_features, dtype=x.dtype)
        b = bias.float().contiguous() if bias is not None else None
        if m:
            bf16 = x.dtype == torch.bfloat16
            self.lib.linear_panels(
                x2.data_ptr(), bf16, m, w.in_features, x2.stride(0), w.data.data_ptr(), w.bits, w.out_features,
                0 if b is None else b.data_ptr(), y.data_ptr(), bf16, w.out_features,
            )  # fmt: skip
        return y.reshape(*lead, w.out_features)

    def rmsnorm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        x2 = _rows(x)
        if x2 is None or x.dtype not in DTYPES or weight.dtype != x.dtype or not weight.is_contiguous():
            return reference.rmsnorm(x, weight, eps)
        out = torch.empty(x2.shape, dtype=x.dtype)
        self.lib.rmsnorm(
            x2.data_ptr(), x.dtype == torch.bfloat16, x2.shape[0], x2.shape[1], x2.stride(0), weight.data_ptr(),
            eps, out.data_ptr(),
        )  # fmt: skip
        return out.view(x.shape)

    def add_rmsnorm(self, x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        ok = x.dtype in DTYPES and residual.dtype == weight.dtype == x.dtype and x.shape == residual.shape
        if not (ok and x.is_contiguous() and residual.is_contiguous() and weight.is_contiguous()):
            return reference.add_rmsnorm(x, residual, weight, eps)
        out, summed = torch.empty_like(x), torch.empty_like(x)
        self.lib.add_rmsnorm(
            x.data_ptr(), residual.data_ptr(), x.dtype == torch.bfloat16, x.numel() // x.shape[-1], x.shape[-1],
            weight.data_ptr(), eps, out.data_ptr(), summed.data_ptr(),
        )  # fmt: skip
        return out, summed

    def silu_mul(self, x: Tensor) -> Tensor:
        if x.dtype not in DTYPES or not x.is_contiguous():
            return reference.silu_mul(x)
        half = x.shape[-1] // 2
        out = torch.empty(*x.shape[:-1], half, dtype=x.dtype)
        self.lib.silu_mul(x.data_ptr(), x.dtype == torch.bfloat16, x.numel() // x.shape[-1], half, out.data_ptr())
        return out

    def rope_store_kv(
        self, q: Tensor, k: Tensor, v: Tensor, cos_sin: Tensor, kv: LayerKV, slot_mapping: Tensor
    ) -> Tensor:
        n, hq, d = q.shape
        ok = q.dtype in DTYPES and k.dtype == v.dtype == kv.k.dtype == kv.v.dtype == q.dtype
        if not (ok and all(_heads(t) for t in (q, k, v)) and kv.k.is_contiguous() and kv.v.is_contiguous()):
            return reference.rope_store_kv(q, k, v, cos_sin, kv, slot_mapping)
        cs = cos_sin.float().contiguous()
        slots = slot_mapping.long().contiguous()
        out = torch.empty(n, hq, d, dtype=q.dtype)
        if n:
            self.lib.rope_store_kv(
                q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
                q.dtype == torch.bfloat16, cs.data_ptr(), cs.shape[1], slots.data_ptr(), n, hq, k.shape[1], d,
                kv.k.data_ptr(), kv.v.data_ptr(), out.data_ptr(),
            )  # fmt: skip
        return out

    def attention(self, q: Tensor, kv: LayerKV, meta: AttentionMetadata, scale: float) -> Tensor:
        n, hq, d = q.shape
        hkv = kv.k.shape[2]
        ok = q.dtype in DTYPES and kv.k.dtype == kv.v.dtype == q.dtype and _heads(q) and d % 16 == 0
        if not (ok and d <= 256 and hq % hkv == 0 and kv.k.is_contiguous() and kv.v.is_contiguous()):
            return reference.attention(q, kv, meta, scale)
        qo, lens = meta.qo_indptr.int().contiguous(), meta.kv_lens.int().contiguous()
        table = meta.page_table.int().contiguous()
        out = torch.empty(n, hq, d, dtype=q.dtype)
        self.lib.attention(
            q.data_ptr(), q.stride(0), q.dtype == torch.bfloat16, kv.k.data_ptr(), kv.v.data_ptr(), meta.page_size,
            hkv, d, table.data_ptr(), table.stride(0), qo.data_ptr(), lens.data_ptr(), meta.num_rows, hq, scale,
            out.data_ptr(),
        )  # fmt: skip
        return out

"""The op-table entries backed by the C++ kernels. Each checks what the kernel takes (float32 or
bfloat16, the strides it reads) and hands anything else to the torch reference op; outputs are
allocated here and passed down as addresses. A decode step of a small model is ~250 of these
calls, so the checks are kept to a few attribute reads, and what every layer of a step shares (the
attention metadata, the rope rows and KV slots) is converted once a step, not once a layer."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import Tensor

from sgjit.kernels import reference
from sgjit.kernels.cpp.panels import PanelWeight
from sgjit.kernels.ops import AttentionMetadata, LayerKV

DTYPES = (torch.float32, torch.bfloat16)


def _heads(t: Tensor) -> bool:
    """[tokens, heads, D] with heads packed (views of the fused qkv output qualify)."""
    return t.stride(2) == 1 and t.stride(1) == t.shape[2]


class CppOps:
    def __init__(self, lib: ModuleType) -> None:
        self.lib = lib
        self._step_meta: tuple[Tensor, Tensor, Tensor] | None = None
        self._meta_args: tuple = ()
        self._step_rope: tuple[Tensor, Tensor] | None = None
        self._rope_args: tuple = ()

    def linear(self, x: Tensor, w: PanelWeight, bias: Tensor | None = None) -> Tensor:
        if x.dtype not in DTYPES:
            return self.linear(x.float(), w, bias).to(x.dtype)
        x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        m = x2.shape[0]
        y = torch.empty(m, w.out_features, dtype=x.dtype)
        b = 0 if bias is None else bias.float().contiguous()
        if m:
            bf16 = x.dtype == torch.bfloat16
            self.lib.linear_panels(
                x2.data_ptr(), bf16, m, w.in_features, x2.stride(0), w.address, w.bits, w.half_scales, w.out_features,
                0 if bias is None else b.data_ptr(), y.data_ptr(), bf16, w.out_features,
            )  # fmt: skip
        return y if x.dim() == 2 else y.view(*x.shape[:-1], w.out_features)

    def rmsnorm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        if (
            x2.stride(-1) != 1
            or x.dtype not in DTYPES
            or weight.dtype != x.dtype
            or not weight.is_contiguous()
        ):
            return reference.rmsnorm(x, weight, eps)
        out = torch.empty(x2.shape, dtype=x.dtype)
        self.lib.rmsnorm(
            x2.data_ptr(), x.dtype == torch.bfloat16, x2.shape[0], x2.shape[1], x2.stride(0), weight.data_ptr(),
            eps, out.data_ptr(),
        )  # fmt: skip
        return out if x.dim() == 2 else out.view(x.shape)

    def add_rmsnorm(self, x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        if not (
            x.dtype in DTYPES and residual.dtype == weight.dtype == x.dtype and x.shape == residual.shape
            and x.is_contiguous() and residual.is_contiguous() and weight.is_contiguous()
        ):  # fmt: skip
            return reference.add_rmsnorm(x, residual, weight, eps)
        out, summed = torch.empty_like(x), torch.empty_like(x)
        d = x.shape[-1]
        self.lib.add_rmsnorm(
            x.data_ptr(), residual.data_ptr(), x.dtype == torch.bfloat16, x.numel() // d, d, weight.data_ptr(), eps,
            out.data_ptr(), summed.data_ptr(),
        )  # fmt: skip
        return out, summed

    def silu_mul(self, x: Tensor) -> Tensor:
        if x.dtype not in DTYPES or not x.is_contiguous():
            return reference.silu_mul(x)
        half = x.shape[-1] // 2
        out = torch.empty(*x.shape[:-1], half, dtype=x.dtype)
        self.lib.silu_mul(
            x.data_ptr(), x.dtype == torch.bfloat16, x.numel() // x.shape[-1], half, out.data_ptr()
        )
        return out

    def _rope_rows(self, cos_sin: Tensor, slot_mapping: Tensor) -> tuple:
        """(cos_sin address, its width, slots address), converted once for the step's tensors."""
        if (
            self._step_rope is None
            or self._step_rope[0] is not cos_sin
            or self._step_rope[1] is not slot_mapping
        ):
            cs, slots = cos_sin.float().contiguous(), slot_mapping.long().contiguous()
            self._step_rope = (cos_sin, slot_mapping)
            self._rope_args = (cs.data_ptr(), cs.shape[1], slots.data_ptr(), cs, slots)
        return self._rope_args

    def rope_store_kv(
        self, q: Tensor, k: Tensor, v: Tensor, cos_sin: Tensor, kv: LayerKV, slot_mapping: Tensor
    ) -> Tensor:
        n, hq, d = q.shape
        ok = q.dtype in DTYPES and k.dtype == v.dtype == kv.k.dtype == kv.v.dtype == q.dtype
        if not (
            ok and _heads(q) and _heads(k) and _heads(v) and kv.k.is_contiguous() and kv.v.is_contiguous()
        ):
            return reference.rope_store_kv(q, k, v, cos_sin, kv, slot_mapping)
        out = torch.empty(n, hq, d, dtype=q.dtype)
        if n:
            cs, width, slots = self._rope_rows(cos_sin, slot_mapping)[:3]
            self.lib.rope_store_kv(
                q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
                q.dtype == torch.bfloat16, cs, width, slots, n, hq, k.shape[1], d, kv.k.data_ptr(), kv.v.data_ptr(),
                out.data_ptr(),
            )  # fmt: skip
        return out

    def _meta(self, meta: AttentionMetadata) -> tuple:
        """The metadata's addresses (int32, contiguous), converted once for the step's tensors."""
        key = (meta.qo_indptr, meta.kv_lens, meta.page_table)
        if self._step_meta is None or any(a is not b for a, b in zip(key, self._step_meta)):
            qo, lens = meta.qo_indptr.int().contiguous(), meta.kv_lens.int().contiguous()
            table = meta.page_table.int().contiguous()
            self._step_meta = key
            self._meta_args = (
                table.data_ptr(),
                table.stride(0),
                qo.data_ptr(),
                lens.data_ptr(),
                qo,
                lens,
                table,
            )
        return self._meta_args

    def attention(self, q: Tensor, kv: LayerKV, meta: AttentionMetadata, scale: float) -> Tensor:
        n, hq, d = q.shape
        hkv = kv.k.shape[2]
        ok = q.dtype in DTYPES and kv.k.dtype == kv.v.dtype == q.dtype and d % 16 == 0 and d <= 256
        if not (ok and _heads(q) and hq % hkv == 0 and kv.k.is_contiguous() and kv.v.is_contiguous()):
            return reference.attention(q, kv, meta, scale)
        table, table_stride, qo, lens = self._meta(meta)[:4]
        out = torch.empty(n, hq, d, dtype=q.dtype)
        self.lib.attention(
            q.data_ptr(), q.stride(0), q.dtype == torch.bfloat16, kv.k.data_ptr(), kv.v.data_ptr(), meta.page_size,
            hkv, d, table, table_stride, qo, lens, meta.num_rows, hq, scale, out.data_ptr(),
        )  # fmt: skip
        return out

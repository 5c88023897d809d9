"""RoPE on q and k fused with the paged KV write (rope.cu)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from sgjit.kernels import reference
from sgjit.kernels.cuda.module import compile_kernels, launch, ptr
from sgjit.kernels.ops import LayerKV
from sgjit.kernels.sources import CPP_TYPES

BLOCK = 256


def rope_name(dtype: str, kv_dtype: str, head_dim: int, rope_dim: int) -> str:
    return f"rope_store_kv_kernel<{CPP_TYPES[dtype]}, {CPP_TYPES[kv_dtype]}, {head_dim}, {rope_dim}>"


def _head_view_ok(t: torch.Tensor) -> bool:
    """[tokens, heads, D] with contiguous heads and 16-byte aligned token rows (views of qkv qualify)."""
    return (
        t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2]
        and t.stride(0) % 8 == 0 and t.data_ptr() % 16 == 0
    )  # fmt: skip


class RopeStoreKV:
    def __init__(self, dtype: torch.dtype, names: tuple[str, str], head_dim: int, rope_dim: int) -> None:
        self.dtype = dtype
        self.head_dim = head_dim
        self.rope_dim = rope_dim
        name = rope_name(names[0], names[1], head_dim, rope_dim)
        self.kernel = compile_kernels("rope", [name])[name]

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, cos_sin: Tensor, kv: LayerKV, slot_mapping: Tensor
    ) -> Tensor:
        n, hq, d = q.shape
        if q.dtype != self.dtype or d != self.head_dim or cos_sin.shape[-1] != self.rope_dim or n == 0:
            return reference.rope_store_kv(q, k, v, cos_sin, kv, slot_mapping)
        q, k, v = (t if _head_view_ok(t) else t.contiguous() for t in (q, k, v))
        cos_sin = cos_sin.contiguous().float()
        slots = slot_mapping.contiguous().long()
        hkv = k.shape[1]
        out = torch.empty((n, hq, d), dtype=q.dtype, device=q.device)
        units = n * (hq + 2 * hkv)
        grid = -(-units // (BLOCK // (d // 16)))
        launch(
            self.kernel, (grid,), BLOCK,
            (ptr(q), ptr(k), ptr(v), np.int64(q.stride(0)), np.int64(k.stride(0)), np.int64(v.stride(0)),
             ptr(cos_sin), ptr(slots), ptr(out), ptr(kv.k), ptr(kv.v), np.int32(n), np.int32(hq),
             np.int32(hkv), np.float32(kv.k_scale), np.float32(kv.v_scale)),
        )  # fmt: skip
        return out

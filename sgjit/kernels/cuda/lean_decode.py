"""Lean decode attention (lean_decode.cu): the latency-bound decode steps (few rows x kv heads) in one
launch, registers only, each (row, kv head)'s key splits merged by its last CTA. The grid is (kv
heads, splits, rows) with the split count fixed by the step's static context bound, so a captured CUDA
graph replays for any lengths up to it; the kernel cuts each row's real keys from `kv_lens`.

The op owns one int32 counter a (row, kv head) pair, zero between launches (the kernel's last CTA of
a pair resets it), so every layer and every graph replay shares them: its launches go in order on one
stream, as a runtime's steps do."""

from __future__ import annotations

import math

import numpy as np
import torch

from sgjit.kernels.arch import DeviceProfile
from sgjit.kernels.cuda.module import compile_kernels, launch, ptr
from sgjit.kernels.ops import AttentionMetadata, LayerKV
from sgjit.kernels.sources import CPP_TYPES
from sgjit.kernels.spec import ModelShapes

LOG2E = 1.0 / math.log(2.0)
WARPS = 8  # H100, B=1, 512 keys: 7.4 us a call with 8 warps, 8.7 with 4 (docs/performance.md)
MIN_SPLIT_KEYS = 64  # a split's least keys: two blocks a warp, so the loads of one hide behind the other
CTAS_PER_SM = 2  # the grid's target: this many CTAs a SM across the step's (row, kv head) pairs
MAX_PAIRS = 4096  # counters the op holds (the attention op sends it registry.LEAN_MAX_PAIRS at most)


def keys_per_warp(group: int) -> int:
    """Keys a warp takes at once: a block's keys x query heads (the group rounded up to a power of two)
    make at most 32 scores, one a lane after the transpose reduction; 8 at most (registers)."""
    gp = 1 << max(0, (group - 1).bit_length())
    return max(1, min(8, 32 // gp))


def lean_decode_name(shapes: ModelShapes, warps: int = WARPS) -> str:
    return (
        f"lean_decode_kernel<{CPP_TYPES[shapes.dtype]}, {CPP_TYPES[shapes.kv_dtype]}, {shapes.head_dim}, "
        f"{shapes.group}, {shapes.page_size}, {warps}, {keys_per_warp(shapes.group)}>"
    )


class LeanDecode:
    def __init__(
        self,
        profile: DeviceProfile,
        shapes: ModelShapes,
        device: torch.device | str = "cuda",
        warps: int = WARPS,
        ctas_per_sm: int = CTAS_PER_SM,
        min_split_keys: int = MIN_SPLIT_KEYS,
    ) -> None:
        """`warps`, `ctas_per_sm`, `min_split_keys`: the launch's shape (benchmark sweeps set them)."""
        self.profile, self.shapes = profile, shapes
        self.warps, self.ctas_per_sm, self.min_split_keys = warps, ctas_per_sm, min_split_keys
        name = lean_decode_name(shapes, warps)
        self.kernel = compile_kernels("lean_decode", [name])[name]
        self.counters = torch.zeros(MAX_PAIRS, dtype=torch.int32, device=device)

    def splits(self, rows: int, max_context: int) -> int:
        """The grid's split count for `rows` rows under a context bound: about `ctas_per_sm` CTAs a SM,
        no more splits than the bound has `min_split_keys` runs of keys."""
        pairs = rows * self.shapes.num_kv_heads
        want = -(-self.ctas_per_sm * self.profile.sm_count // pairs)
        return max(1, min(want, -(-max_context // self.min_split_keys)))

    def split_keys(self, splits: int, max_context: int) -> int:
        """Keys a split takes: the bound cut into `splits`, at least `min_split_keys`, whole blocks."""
        kpw = keys_per_warp(self.shapes.group)
        keys = max(-(-max_context // splits), self.min_split_keys)
        return -(-keys // kpw) * kpw

    def serves(self, q: torch.Tensor, meta: AttentionMetadata) -> bool:
        """A decode step (one query a row) of few enough pairs, 16-byte aligned query rows, a
        contiguous page table (its row stride bounds the page ids the kernel reads)."""
        rows, table = meta.num_rows, meta.page_table
        return (
            meta.is_decode and q.shape[0] == rows and rows * self.shapes.num_kv_heads <= MAX_PAIRS
            and q.stride(0) % 8 == 0 and q.data_ptr() % 16 == 0 and table.is_contiguous()
        )  # fmt: skip

    def __call__(
        self, q: torch.Tensor, kv: LayerKV, meta: AttentionMetadata, scale: float, pdl: bool = False
    ) -> torch.Tensor:
        s = self.shapes
        rows, hq, d = q.shape
        hkv, g = s.num_kv_heads, s.group
        splits = self.splits(rows, meta.max_kv_len)
        fp8 = kv.k.dtype == torch.float8_e4m3fn
        k_scale, v_scale = (kv.k_scale, kv.v_scale) if fp8 else (1.0, 1.0)
        out = torch.empty((rows, hq, d), dtype=q.dtype, device=q.device)
        part_o = torch.empty((rows * hkv * splits, g, d), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((rows * hkv * splits, g), dtype=torch.float32, device=q.device)
        table = meta.page_table
        launch(
            self.kernel, (hkv, splits, rows), 32 * self.warps,
            (ptr(q), np.int64(q.stride(0)), ptr(kv.k), ptr(kv.v), ptr(table), np.int32(table.stride(0)),
             ptr(meta.kv_lens), np.int32(hkv), np.int32(self.split_keys(splits, meta.max_kv_len)), ptr(out),
             ptr(part_o), ptr(part_lse),
             ptr(self.counters), np.float32(scale * LOG2E * k_scale), np.float32(v_scale)),
            pdl=pdl,
        )  # fmt: skip
        return out

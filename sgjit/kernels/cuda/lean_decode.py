"""Lean decode attention (lean_decode.cu): the latency-bound decode steps (few rows x kv heads) in one
launch, registers only, each (row, kv head)'s key splits merged by its last CTA. The grid is (kv
heads, splits, rows) with the split count fixed by the step's static context bound, so a captured CUDA
graph replays for any lengths up to it; the kernel cuts each row's real keys from `kv_lens`.

The grid is one wave: the splits a pair are the CTAs the device holds at once (the occupancy
calculator's count at the kernel's registers) over the pairs, and no more than the bound has
`min_split_keys` runs of keys. On sm_90 a pair's splits, up to 8 (rounded down to a power of two),
form a thread-block cluster and merge through distributed shared memory; otherwise through global
memory, by the last CTA of the pair to finish: the op owns one int32 counter a (row, kv head) pair,
zero between launches (that CTA resets it), so every layer and every graph replay shares them: its
launches go in order on one stream, as a runtime's steps do."""

from __future__ import annotations

import math

import numpy as np
import torch

from sgjit.kernels.arch import DeviceProfile
from sgjit.kernels.cuda.module import compile_kernels, launch, ptr, resident_blocks
from sgjit.kernels.ops import AttentionMetadata, LayerKV
from sgjit.kernels.sources import CPP_TYPES
from sgjit.kernels.spec import ModelShapes

LOG2E = 1.0 / math.log(2.0)
WARPS = 8  # H100, B=1, 512 keys: 7.4 us a call with 8 warps, 8.7 with 4 (docs/performance.md)
MIN_SPLIT_KEYS = 64  # a split's least keys: two blocks a warp, so the loads of one hide behind the other
MAX_CLUSTER = 8  # splits a cluster on sm_90 (the portable cluster size); 1: merge through global memory
STATIC_SMEM = 48 * 1024  # bytes of static shared memory a CTA may declare
MAX_PAIRS = 4096  # counters the op holds (the attention op sends it registry.LEAN_MAX_PAIRS at most)


def keys_per_warp(group: int) -> int:
    """Keys a warp takes at once: a block's keys x query heads (the group rounded up to a power of two)
    make at most 32 scores, one a lane after the transpose reduction; 8 at most (registers)."""
    gp = 1 << max(0, (group - 1).bit_length())
    return max(1, min(8, 32 // gp))


def fitting_warps(shapes: ModelShapes, warps: int = WARPS) -> int:
    """`warps` halved until the CTA's static shared memory fits 48 KiB: each warp leaves its running
    max, sum and output (group x head_dim floats) there for the CTA's merge (group 12 at head_dim 128
    takes 6 KiB a warp, so 4 warps)."""
    per_warp = 4 * shapes.group * (shapes.head_dim + 2)
    while warps > 1 and warps * per_warp + 8 * shapes.group + 4 > STATIC_SMEM:
        warps //= 2
    return warps


def lean_decode_name(shapes: ModelShapes, warps: int = WARPS, cluster: int = 1) -> str:
    """`cluster`: splits a thread-block cluster (sm_90 only), 1 for none."""
    warps = fitting_warps(shapes, warps)
    return (
        f"lean_decode_kernel<{CPP_TYPES[shapes.dtype]}, {CPP_TYPES[shapes.kv_dtype]}, {shapes.head_dim}, "
        f"{shapes.group}, {shapes.page_size}, {warps}, {keys_per_warp(shapes.group)}, {cluster}>"
    )


class LeanDecode:
    def __init__(
        self,
        profile: DeviceProfile,
        shapes: ModelShapes,
        device: torch.device | str = "cuda",
        warps: int = WARPS,
        ctas_per_sm: int | None = None,
        min_split_keys: int = MIN_SPLIT_KEYS,
        max_cluster: int = MAX_CLUSTER,
    ) -> None:
        """`warps`, `ctas_per_sm` (None: as many as the SM holds), `min_split_keys`, `max_cluster` (1:
        no clusters): the launch's shape (benchmark sweeps set them)."""
        self.profile, self.shapes = profile, shapes
        self.warps = fitting_warps(shapes, warps)
        self.min_split_keys = min_split_keys
        self.max_cluster = max_cluster if tuple(profile.compute_capability) >= (9, 0) else 1
        self._kernels = {1: self._compile(1)}
        self.ctas_per_sm = ctas_per_sm or resident_blocks(self._kernels[1], 32 * self.warps, 0)
        self.counters = torch.zeros(MAX_PAIRS, dtype=torch.int32, device=device)

    def _compile(self, cluster: int):
        name = lean_decode_name(self.shapes, self.warps, cluster)
        return compile_kernels("lean_decode", [name])[name]

    def kernel(self, cluster: int):
        if cluster not in self._kernels:
            self._kernels[cluster] = self._compile(cluster)
        return self._kernels[cluster]

    def splits(self, rows: int, max_context: int) -> int:
        """The grid's split count for `rows` rows under a context bound: the CTAs one wave holds over
        the pairs, no more splits than the bound has `min_split_keys` runs of keys; at most
        `max_cluster` of them are rounded down to a power of two (one cluster)."""
        pairs = rows * self.shapes.num_kv_heads
        fit = max(1, self.ctas_per_sm * self.profile.sm_count // pairs)
        n = max(1, min(fit, -(-max_context // self.min_split_keys)))
        return 1 << (n.bit_length() - 1) if n <= self.max_cluster else n

    def cluster(self, splits: int) -> int:
        """The cluster a launch of `splits` splits takes: all of them, up to `max_cluster`."""
        return splits if 1 < splits <= self.max_cluster else 1

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
        cluster = self.cluster(splits)
        out = torch.empty((rows, hq, d), dtype=q.dtype, device=q.device)
        part_o = part_lse = None  # a cluster merges in shared memory
        if cluster == 1 and splits > 1:
            part_o = torch.empty((rows * hkv * splits, g, d), dtype=torch.float32, device=q.device)
            part_lse = torch.empty((rows * hkv * splits, g), dtype=torch.float32, device=q.device)
        table = meta.page_table
        launch(
            self.kernel(cluster), (hkv, splits, rows), 32 * self.warps,
            (ptr(q), np.int64(q.stride(0)), ptr(kv.k), ptr(kv.v), ptr(table), np.int32(table.stride(0)),
             ptr(meta.kv_lens), np.int32(hkv), np.int32(self.split_keys(splits, meta.max_kv_len)), ptr(out),
             ptr(part_o), ptr(part_lse),
             ptr(self.counters), np.float32(scale * LOG2E * k_scale), np.float32(v_scale)),
            pdl=pdl,
        )  # fmt: skip
        return out

"""Streaming decode attention (decode.cu): one kernel that splits every row's keys flat over all SMs,
then the merge of the rows it cut. The grid is one wave of resident CTAs for the device, capped by the
static bound of the step's work (rows x context bound), so a captured CUDA graph replays for any
lengths up to the bound; the kernel reads the real ones from `kv_lens`."""

from __future__ import annotations

import math

import numpy as np
import torch

from sgjit.kernels.arch import DeviceProfile
from sgjit.kernels.cuda.module import allow_smem, compile_kernels, launch, ptr
from sgjit.kernels.ops import AttentionMetadata, LayerKV
from sgjit.kernels.registry import StreamTile
from sgjit.kernels.sources import CPP_TYPES
from sgjit.kernels.spec import ModelShapes

LOG2E = 1.0 / math.log(2.0)
MERGE_BLOCK = 128


def stream_decode_name(shapes: ModelShapes, tile: StreamTile) -> str:
    return (
        f"stream_decode_kernel<{CPP_TYPES[shapes.dtype]}, {CPP_TYPES[shapes.kv_dtype]}, {shapes.head_dim}, "
        f"{shapes.group}, {shapes.page_size}, {tile.heads}, {tile.stages}>"
    )


def stream_merge_name(shapes: ModelShapes) -> str:
    return f"stream_merge_kernel<{CPP_TYPES[shapes.dtype]}, {shapes.head_dim}>"


class StreamDecode:
    """Decode steps (one query a row) of one model shape. `ctas(rows, context)` is the grid a step
    launches; the op owns no buffers (the partial results come from torch's allocator, which a
    graph capture turns into static memory)."""

    def __init__(self, profile: DeviceProfile, shapes: ModelShapes, tile: StreamTile) -> None:
        self.profile, self.shapes, self.tile = profile, shapes, tile
        names = [stream_decode_name(shapes, tile), stream_merge_name(shapes)]
        kernels = compile_kernels("decode", names)
        self.kernel, self.merge = kernels[names[0]], kernels[names[1]]
        allow_smem(self.kernel, profile.smem_per_block_optin)
        self.groups = shapes.num_kv_heads // tile.heads  # head groups: CTAs' units of a key tile

    def smem_bytes(self, rows: int) -> int:
        return self.tile.smem_bytes(self.shapes.head_dim, self.shapes.kv_bytes, rows)

    def serves(self, q: torch.Tensor, meta: AttentionMetadata) -> bool:
        """A decode step (one query a row) whose rows' key counts fit in shared memory beside the
        ring, with 16-byte aligned query rows."""
        rows = meta.num_rows
        return (
            meta.is_decode and q.shape[0] == rows and q.stride(0) % 8 == 0 and q.data_ptr() % 16 == 0
            and self.smem_bytes(rows) <= self.profile.smem_per_block_optin
        )  # fmt: skip

    def ctas(self, rows: int, max_context: int) -> int:
        """One wave of resident CTAs (by the compiled kernel's registers and this step's shared
        memory), no more than the step's 16-key units can keep busy."""
        s = self.shapes
        resident = self.tile.blocks_per_sm(self.profile, s.head_dim, s.kv_bytes, rows, self.kernel.num_regs)
        units = rows * self.groups * -(-max_context // StreamTile.KEYS)
        return max(1, min(self.profile.sm_count * max(1, resident), units))

    def __call__(self, q: torch.Tensor, kv: LayerKV, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        s = self.shapes
        rows, hq, d = q.shape
        hgg = self.tile.heads * s.group  # query heads of a CTA
        ctas = self.ctas(rows, meta.max_kv_len)
        fp8 = kv.k.dtype == torch.float8_e4m3fn
        k_scale, v_scale = (kv.k_scale, kv.v_scale) if fp8 else (1.0, 1.0)
        out = torch.empty((rows, hq, d), dtype=q.dtype, device=q.device)
        part_o = torch.empty((2 * ctas, hgg, d), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((2 * ctas, hgg), dtype=torch.float32, device=q.device)
        spans = torch.empty((2 * rows * self.groups,), dtype=torch.int32, device=q.device)
        table = meta.page_table
        launch(
            self.kernel, (ctas,), self.tile.threads,
            (ptr(q), np.int64(q.stride(0)), ptr(kv.k), ptr(kv.v), ptr(table), np.int32(table.stride(0)),
             ptr(meta.kv_lens), np.int32(rows), np.int32(s.num_kv_heads), ptr(out), ptr(part_o), ptr(part_lse),
             ptr(spans), np.float32(scale * LOG2E * k_scale), np.float32(v_scale)),
            self.smem_bytes(rows),
        )  # fmt: skip
        launch(
            self.merge, (rows, -(-hq * d // MERGE_BLOCK)), MERGE_BLOCK,
            (ptr(part_o), ptr(part_lse), ptr(spans), ptr(meta.kv_lens), ptr(out), np.int32(hq), np.int32(hgg)),
        )  # fmt: skip
        return out

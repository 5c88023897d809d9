"""The Hopper prefill kernel (attention_sm90.cu), compiled for sm_90a: the arch-specific target that
has the warpgroup MMAs. CuPy passes NVRTC `-arch=sm_90` for the device; NVRTC keeps the stronger
`-arch=sm_90a` given with it (checked with NVRTC 13.0: the cubin's target is sm_90a either order).
`PagedAttention` calls it for prefill and mixed steps; decode stays on attention.cu.
`SGJIT_SM90_WATCHDOG=<ms>` builds it with the kernel's barrier watchdog (debug runs: a deadlock
traps instead of hanging the process). A tile with the TMA schedule bit loads K/V through tensor
maps over the pool (tensor_map.py), built on the pool's first launch: one box a page, or where a
tile's pages are consecutive ids (what the page allocator hands a fresh prompt), one box a 64-column
block of the tile. The grid is persistent: a CTA a SM (the kernel holds one a SM), each walking its
share of the work list, so a CTA's next item loads (its Q, its first K/V tiles) while it finishes
the last one; `persistent=False` launches a CTA an item instead (for comparison)."""

from __future__ import annotations

import numpy as np
import torch

from sgjit.errors import KernelError
from sgjit.kernels.cuda.module import allow_smem, compile_kernels, launch, ptr
from sgjit.kernels.cuda.tensor_map import PoolMaps
from sgjit.kernels.ops import AttentionMetadata, LayerKV
from sgjit.kernels.registry import Sm90Tile
from sgjit.kernels.sources import CPP_TYPES
from sgjit.kernels.spec import ModelShapes
from sgjit.settings import env

SM90_OPTIONS = ("-arch=sm_90a",)
# Registers a thread the kernel must be built with (attention_sm90.cu's LAUNCH_REGS): its setmaxnreg
# split (RegSplit, per schedule) redistributes 384 x 168 and deadlocks if the CTA holds fewer.
LAUNCH_REGS = 168


def attention_sm90_name(shapes: ModelShapes, tile: Sm90Tile) -> str:
    return (
        f"attention_sm90_kernel<{CPP_TYPES[shapes.dtype]}, {shapes.head_dim}, {shapes.group}, "
        f"{shapes.page_size}, {tile.bn}, {tile.stages}, {tile.schedule}>"
    )


class Sm90Prefill:
    """One instantiation of the kernel, launched over a host-built work list of (row, m tile)."""

    def __init__(self, shapes: ModelShapes, tile: Sm90Tile, sm_count: int, persistent: bool = True) -> None:
        if shapes.kv_dtype != shapes.dtype:
            raise ValueError(f"the sm_90 prefill kernel reads {shapes.dtype} pools, not {shapes.kv_dtype}")
        if not tile.serves_page(shapes.page_size):
            raise ValueError(f"sm_90 prefill tile {tile.name} cannot read pages of {shapes.page_size} slots")
        self.shapes, self.tile = shapes, tile
        name = attention_sm90_name(shapes, tile)
        watchdog_ms = env().sm90_watchdog_ms
        defines = (f"SGJIT_SM90_WATCHDOG={watchdog_ms}",) if watchdog_ms > 0 else ()
        self.kernel = compile_kernels("attention_sm90", [name], defines, SM90_OPTIONS)[name]
        if self.kernel.num_regs != LAUNCH_REGS:
            raise KernelError(
                f"{name} was built with {self.kernel.num_regs} registers a thread, not {LAUNCH_REGS}: its "
                "setmaxnreg split would deadlock; fix RegSplit in attention_sm90.cu"
            )
        self.smem = tile.smem_bytes(shapes.head_dim)
        allow_smem(self.kernel, self.smem)
        # Pages smaller than a tile: also the run maps, one box a 64-column block of a tile whose
        # pages are consecutive (the kernel checks each tile).
        runs = tile.bn if shapes.page_size < tile.bn else None
        self.maps = PoolMaps(min(shapes.page_size, tile.bn), runs) if tile.tma else None
        self.sm_count, self.persistent = sm_count, persistent

    def __call__(
        self,
        q: torch.Tensor,
        kv: LayerKV,
        meta: AttentionMetadata,
        scale_log2: float,
        work: torch.Tensor,
        grid: tuple[int, int, int],
        out: torch.Tensor,
        part_o: torch.Tensor | None,
        part_lse: torch.Tensor | None,
    ) -> None:
        hkv, items, splits = grid
        table = meta.page_table
        maps, layer = self.maps(kv.k, kv.v) if self.maps is not None else (None, 0)
        total = hkv * items * splits
        # A split of a row's keys can be empty, which the kernel's walk over several items does not
        # take: rows split (few long rows: fewer items than SMs anyway) get a CTA an item.
        ctas = min(total, self.sm_count) if self.persistent and splits == 1 else total
        launch(
            self.kernel, (ctas,), Sm90Tile.THREADS,
            (ptr(q), np.int64(q.stride(0)), ptr(kv.k), ptr(kv.v), ptr(table), np.int32(table.stride(0)),
             ptr(meta.qo_indptr), ptr(meta.kv_lens), ptr(work), np.int32(items), np.int32(splits), ptr(out),
             ptr(part_o), ptr(part_lse), np.int32(q.shape[0]), np.int32(hkv), np.float32(scale_log2), ptr(maps),
             np.int32(layer)),
            self.smem,
        )  # fmt: skip

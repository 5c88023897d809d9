"""Paged attention (attention.cu): one decode instantiation, one prefill/mixed instantiation and the
split merge, all specialised on (dtype, KV dtype, head_dim, GQA group, page size, tile). Decode steps
go to the streaming kernel (cuda/decode.py) where the selector gave it a tile.

Decode steps launch a grid that depends only on the batch size and a static context bound (the
split count), never on this step's lengths, so a captured CUDA graph replays for any lengths.
Prefill and mixed steps (not graph-captured) build a work list of (row, m tile) on the host, longest
first, once per step's metadata and shared by every layer. On compute capability 9.0 the selector
may hand a `prefill_sm90` tile: those steps then run the warpgroup-MMA kernel (attention_sm90.py)
over the same work list."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import torch

from sgjit.errors import KernelError
from sgjit.kernels import reference
from sgjit.kernels.arch import DeviceProfile
from sgjit.kernels.cuda.attention_sm90 import Sm90Prefill
from sgjit.kernels.cuda.decode import StreamDecode
from sgjit.kernels.cuda.lean_decode import LeanDecode
from sgjit.kernels.cuda.module import allow_smem, compile_kernels, launch, ptr
from sgjit.kernels.ops import AttentionMetadata, LayerKV
from sgjit.kernels.registry import (
    LEAN_MAX_KEYS,
    LEAN_MAX_PAIRS,
    SMALL_DECODE_CTAS_PER_SM,
    AttnTile,
    Sm90Tile,
    StreamTile,
)
from sgjit.kernels.selector import decode_splits
from sgjit.kernels.sources import CPP_TYPES
from sgjit.kernels.spec import ModelShapes

log = logging.getLogger(__name__)

LOG2E = 1.0 / math.log(2.0)
MERGE_BLOCK = 256
MAX_GRID_Y = 65535


def attention_name(shapes: ModelShapes, tile: AttnTile) -> str:
    t = tile
    return (
        f"attention_kernel<{CPP_TYPES[shapes.dtype]}, {CPP_TYPES[shapes.kv_dtype]}, {shapes.head_dim}, "
        f"{shapes.group}, {shapes.page_size}, {t.mw}, {t.wm}, {t.wn}, {t.bn}, {t.stages}>"
    )


def merge_name(shapes: ModelShapes) -> str:
    return f"merge_splits_kernel<{CPP_TYPES[shapes.dtype]}, {shapes.head_dim}>"


@dataclass(slots=True)
class _Plan:
    """Launch shape of one step (cached per metadata object, i.e. per step)."""

    meta: AttentionMetadata
    kernel: object  # an attention.cu kernel, or the Sm90Prefill op
    tile: AttnTile | Sm90Tile
    grid: tuple[int, int, int]
    work: torch.Tensor | None
    m_tiles: int


class PagedAttention:
    def __init__(
        self,
        profile: DeviceProfile,
        shapes: ModelShapes,
        dtype: torch.dtype,
        decode_tile: AttnTile,
        prefill_tile: AttnTile,
        max_context: int,
        fixed_splits: int | None = None,
        kv_prefetch: int = 0,
        split_len: int = 0,
        stream_tile: StreamTile | None = None,
        prefill_sm90: Sm90Tile | None = None,
        pdl: bool = False,
        small_decode_tile: AttnTile | None = None,
        lean_decode: bool = False,
    ) -> None:
        """`pdl`: launch the mma.sync kernel and the merge to overlap the kernel before them inside
        captured graphs (pdl.py; the selector's `dependent_launch`). `small_decode_tile`: the mma.sync
        decode tile of steps whose rows x kv heads give fewer than SMALL_DECODE_CTAS_PER_SM CTAs a SM
        before any split (`decode_tile` serves the larger ones). `lean_decode`: steps of at most
        registry.LEAN_MAX_PAIRS (row, kv head) pairs whose pairs x context bound is at most
        LEAN_MAX_KEYS run on lean_decode.cu instead (one launch, splits merged in it)."""
        self.profile, self.shapes, self.dtype = profile, shapes, dtype
        self.pdl = pdl
        self.decode_tile, self.prefill_tile = decode_tile, prefill_tile
        self.small_decode_tile = small_decode_tile if not split_len else None
        self.max_context = max_context
        self.fixed_splits = fixed_splits  # decode split count set by hand (benchmarks, tests)
        # > 0: every split holds this many keys from position 0 (batch-invariant mode; the selector
        # then gives decode and prefill one tile, so a query's result depends on nothing but itself).
        if split_len % decode_tile.bn or split_len % prefill_tile.bn or split_len < 0:
            raise ValueError(f"split_len {split_len} must be a multiple of the tiles' key blocks")
        self.split_len = split_len
        small = self.small_decode_tile or decode_tile
        names = [
            attention_name(shapes, decode_tile),
            attention_name(shapes, prefill_tile),
            merge_name(shapes),
            attention_name(shapes, small),
        ]
        defines = (f"SGJIT_KV_L2_PREFETCH={kv_prefetch}",) if kv_prefetch else ()
        kernels = compile_kernels("attention", sorted(set(names)), defines)
        self.decode_kernel, self.prefill_kernel = kernels[names[0]], kernels[names[1]]
        self.merge_kernel, self.small_decode_kernel = kernels[names[2]], kernels[names[3]]
        for kern, tile in (
            (self.decode_kernel, decode_tile), (self.prefill_kernel, prefill_tile), (self.small_decode_kernel, small)
        ):  # fmt: skip
            allow_smem(kern, tile.smem_bytes(shapes.head_dim, shapes.kv_bytes))
        if prefill_sm90 is not None and split_len:
            raise ValueError("the sm_90 prefill kernel has no fixed key splits (batch-invariant mode)")
        self.sm90 = Sm90Prefill(shapes, prefill_sm90, profile.sm_count) if prefill_sm90 is not None else None
        self._plan: _Plan | None = None
        # Decode steps stream the pool with decode.cu where the selector gave it a tile; the
        # mma.sync decode instantiation above serves the rest (batch-invariant splits, groups > 16)
        # and takes over should decode.cu not build.
        self.stream = None
        if stream_tile is not None and not split_len:
            try:
                self.stream = StreamDecode(profile, shapes, stream_tile)
            except KernelError as e:
                log.warning("streaming decode kernel unavailable (%s); decode uses the mma.sync kernel", e)
        self.lean = None
        if lean_decode and not split_len:
            try:
                self.lean = LeanDecode(profile, shapes)
            except KernelError as e:
                log.warning("lean decode kernel unavailable (%s); small steps use the mma.sync kernel", e)

    def _leans(self, rows: int, max_kv_len: int) -> bool:
        """Whether a decode step of `rows` rows under a context bound runs on lean_decode.cu: the
        latency-bound steps of a few (row, kv head) pairs over short contexts, where it measured faster
        (registry.LEAN_MAX_PAIRS, LEAN_MAX_KEYS: pairs x the bound)."""
        pairs = rows * self.shapes.num_kv_heads
        return self.lean is not None and pairs <= LEAN_MAX_PAIRS and pairs * max_kv_len <= LEAN_MAX_KEYS

    def _small_ctas(self, rows: int) -> int | None:
        """CTAs of a `rows`-row decode step on the small-step tile before any key split (None: no
        such tile)."""
        small = self.small_decode_tile
        if small is None:
            return None
        return rows * self.shapes.num_kv_heads * -(-self.shapes.group // small.bm)

    def _decode_tile(self, rows: int) -> tuple[AttnTile, object]:
        """The mma.sync decode tile and kernel of a step of `rows` rows."""
        ctas = self._small_ctas(rows)
        if ctas is not None and ctas < SMALL_DECODE_CTAS_PER_SM * self.profile.sm_count:
            return self.small_decode_tile, self.small_decode_kernel
        return self.decode_tile, self.decode_kernel

    def _streams(self, rows: int) -> bool:
        """Whether a decode step of `rows` rows runs on decode.cu: every step it can hold, except
        steps of at most half the SMs' worth of small-tile CTAs, which the small mma.sync tile
        decodes faster (fp8 pools on the H100: 14.4 vs 17.1 us at one row and 512 keys, 21.6 vs
        41.9 at 4096; level at 8 rows and 4096 keys; 7% slower at 16 rows)."""
        if self.stream is None or self.stream.smem_bytes(rows) > self.profile.smem_per_block_optin:
            return False
        ctas = self._small_ctas(rows)
        return ctas is None or 2 * ctas > self.profile.sm_count

    def splits_for_batch(self, batch: int, max_context: int | None = None) -> int:
        """Decode split count for a batch size and a static context bound (a graph bucket's)."""
        if self.split_len:
            return -(-(max_context or self.max_context) // self.split_len)
        if self.fixed_splits is not None:
            return self.fixed_splits
        tile = self._decode_tile(batch)[0]
        return decode_splits(self.profile, tile, self.shapes, batch, max_context or self.max_context)

    def decode_launch(self, rows: int, max_kv_len: int) -> tuple[str, int]:
        """The static part of a decode step's launch for `rows` rows under a context bound: the kernel
        and its grid's split count. A CUDA graph captured under one bound serves another wherever
        this is the same (see `DecodeGraphs.context_bucket`)."""
        if self._leans(rows, max_kv_len):
            return "lean", self.lean.splits(rows, max_kv_len)
        if self._streams(rows):
            return "stream", self.stream.ctas(rows, max_kv_len)
        return f"split {self._decode_tile(rows)[0].name}", self.splits_for_batch(rows)

    def _plan_for(self, meta: AttentionMetadata) -> _Plan:
        if self._plan is not None and self._plan.meta is meta:
            return self._plan
        g, hkv = self.shapes.group, self.shapes.num_kv_heads
        if meta.is_decode:
            tile, kernel = self._decode_tile(meta.num_rows)
            m_tiles = -(-g // tile.bm)
            grid = (hkv, meta.num_rows * m_tiles, self.splits_for_batch(meta.num_rows))
            plan = _Plan(meta, kernel, tile, grid, None, m_tiles)
        else:
            tile = self.prefill_tile if self.sm90 is None else self.sm90.tile
            bm = tile.bm if isinstance(tile, AttnTile) else tile.BM
            qo, kvl = meta.qo_indptr_host, meta.kv_lens_host
            items = []  # (keys to visit, row, m tile): the heaviest tiles start first
            for b in range(meta.num_rows):
                q_len = qo[b + 1] - qo[b]
                for mt in range(-(-q_len * g // bm)):
                    last_token = min(q_len - 1, ((mt + 1) * bm - 1) // g)
                    items.append((kvl[b] - q_len + last_token, b, mt))
            items.sort(key=lambda it: -it[0])
            # NOTE: non_blocking: a blocking copy would wait for the step still running (overlap)
            work = torch.tensor([[b, mt] for _, b, mt in items], dtype=torch.int32).to(
                meta.qo_indptr.device, non_blocking=True
            )
            ctas = len(items) * hkv
            splits = 1
            if self.split_len:
                splits = -(-meta.max_kv_len // self.split_len)
            elif 0 < ctas < self.profile.sm_count:  # few long rows: split their keys too
                splits = max(
                    1, min(-(-2 * self.profile.sm_count // ctas), meta.max_kv_len // (4 * tile.bn), 16)
                )
            kernel = self.prefill_kernel if self.sm90 is None else self.sm90
            plan = _Plan(meta, kernel, tile, (hkv, len(items), splits), work, 1)
        self._plan = plan
        return plan

    def __call__(self, q: torch.Tensor, kv: LayerKV, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        s = self.shapes
        if (
            q.dtype != self.dtype or q.shape[-1] != s.head_dim or meta.page_size != s.page_size
            or q.shape[1] != s.num_heads or q.stride(-1) != 1 or q.stride(1) != s.head_dim
            or kv.k.dtype != kv.v.dtype or not kv.k.is_contiguous() or not kv.v.is_contiguous()
            or meta.page_table.dtype != torch.int32 or not meta.page_table.is_contiguous()
        ):  # fmt: skip
            return reference.attention(q, kv, meta, scale)
        if self._leans(meta.num_rows, meta.max_kv_len) and self.lean.serves(q, meta):  # serves: decode only
            return self.lean(q, kv, meta, scale, pdl=self.pdl)
        if self.stream is not None and self.stream.serves(q, meta) and self._streams(meta.num_rows):
            return self.stream(q, kv, meta, scale)
        plan = self._plan_for(meta)
        n, hq, d = q.shape
        out = torch.empty((n, hq, d), dtype=q.dtype, device=q.device)
        splits = plan.grid[2]
        part_o = part_lse = None
        if splits > 1:
            part_o = torch.empty((splits, n, hq, d), dtype=torch.float32, device=q.device)
            part_lse = torch.empty((splits, n, hq), dtype=torch.float32, device=q.device)
        if plan.kernel is self.sm90:
            self.sm90(q, kv, meta, scale * LOG2E * kv.k_scale, plan.work, plan.grid, out, part_o, part_lse)
        else:
            self._launch(plan, q, kv, meta, scale, out, part_o, part_lse)
        if splits > 1:
            rows = n * hq
            launch(
                self.merge_kernel, (-(-rows * 32 // MERGE_BLOCK),), MERGE_BLOCK,  # a warp a row
                (ptr(part_o), ptr(part_lse), ptr(out), np.int32(rows), np.int32(splits)), pdl=self.pdl,
            )  # fmt: skip
        return out

    def _launch(
        self,
        plan: _Plan,
        q: torch.Tensor,
        kv: LayerKV,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor,
        part_o: torch.Tensor | None,
        part_lse: torch.Tensor | None,
    ) -> None:
        """attention.cu over the plan's grid."""
        s, table = self.shapes, meta.page_table
        hkv, items, splits = plan.grid
        n, d = q.shape[0], q.shape[-1]
        for base in range(0, items, MAX_GRID_Y):  # one launch unless a prefill has > 65535 m tiles
            launch(
                plan.kernel, (hkv, min(MAX_GRID_Y, items - base), splits), plan.tile.threads,
                (ptr(q), np.int64(q.stride(0)), ptr(kv.k), ptr(kv.v), ptr(table), np.int32(table.stride(0)),
                 ptr(meta.qo_indptr), ptr(meta.kv_lens), ptr(plan.work), np.int32(base), np.int32(plan.m_tiles),
                 ptr(out), ptr(part_o), ptr(part_lse), np.int32(n), np.int32(s.num_kv_heads),
                 np.float32(scale * LOG2E * kv.k_scale), np.float32(kv.v_scale), np.int32(self.split_len)),
                plan.tile.smem_bytes(d, s.kv_bytes), pdl=self.pdl,
            )  # fmt: skip

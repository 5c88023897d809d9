"""The decode megakernel (megakernel.cu): a dense small model's whole decode step in one launch.

One instantiation per rows bucket (1, 2, 4, 8 up to the selector's `rows`), each launched as one wave
of resident CTAs (the occupancy calculator's count at its shared memory: the grid barriers need every
CTA on an SM at once) and owning, across launches, its barrier counter (zeroed once here; the
kernel leaves it as a next launch needs it, so a CUDA graph replays it as is). Everything else a
step needs comes from torch's allocator, as for the other ops.

A step the kernel does not take (more rows, a prefill, weights not plain tensors of the model dtype,
a KV pool of another dtype) returns None and the model runs its layers."""

from __future__ import annotations

import math

import numpy as np
import torch

from sgjit.kernels.arch import DeviceProfile
from sgjit.kernels.cuda.gemv import ROW_BUCKETS, TILES, bucket
from sgjit.kernels.cuda.module import allow_smem, compile_kernels, launch, ptr, resident_blocks
from sgjit.kernels.ops import AttentionMetadata, DecodeWeights, LayerKV
from sgjit.kernels.sources import CPP_TYPES
from sgjit.kernels.spec import ModelShapes

WARPS = 16  # a CTA: 16 warps, one per SM (the kernel's __launch_bounds__(512, 1))
THREADS = 32 * WARPS
LAYER_FIELDS = 9  # MegaLayer's pointers
MAX_SPLITS = 32  # attention splits of one (row, kv head)
MIN_SPLIT_KEYS = 32  # megakernel.cu's MIN_SPLIT_KEYS

LOG2E = 1.0 / math.log(2.0)
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def keys_a_warp(head_dim: int, group: int) -> int:
    """megakernel.cu's KeyLanes::KPW: the keys a warp's attention takes at once, a key a group of
    lanes of 4 dims each where a kv head's query dims are at most 256, else a key a warp."""
    dims_a_lane = 4 if head_dim * group <= 256 else head_dim // 32
    return 32 // (head_dim // dims_a_lane)


# The GEMV tiles of the layered kernels, but 8 rows at 2 channels a warp, not 4: the kernel's other
# phases leave 4 x 8 accumulators no room at 128 registers a thread (spills; tests/kernels/
# test_kernels_build.py). The tile changes no output's bits (gemv.py: a lane sums in one order).
MEGA_TILES = {**TILES, 8: (2, 1)}


def megakernel_name(dtype: str, rows: int, head_dim: int, group: int) -> str:
    b = bucket(rows)
    npw, unroll = MEGA_TILES[b]
    return f"decode_megakernel<{CPP_TYPES[dtype]}, {b}, {npw}, {unroll}, {WARPS}, {head_dim}, {group}>"


def smem_bytes(rows: int, hidden: int, q_size: int, head_dim: int, group: int) -> int:
    """Dynamic shared memory: a GEMV phase's input rows (normalised, or o_proj's merged attention
    output of q_size a row), or attention's scratch (a unit's result and log2-sum-exp, then every
    warp's piece and its max and sum), whichever is larger."""
    rows_in = bucket(rows) * max(hidden, q_size) * 2
    attn = 4 * (group * head_dim + group + WARPS * group * head_dim + 2 * WARPS * group)
    return max(rows_in, attn)


class _Instance:
    """One rows bucket's kernel, its grid and the device state it keeps across launches."""

    def __init__(self, kernel, profile: DeviceProfile, shapes: ModelShapes, rows: int) -> None:
        self.kernel = kernel
        self.smem = smem_bytes(
            rows, shapes.hidden, shapes.num_heads * shapes.head_dim, shapes.head_dim, shapes.group
        )
        allow_smem(kernel, self.smem)
        # one wave: every CTA resident at once, or a barrier would wait for a CTA that cannot start
        self.grid = profile.sm_count * resident_blocks(kernel, THREADS, self.smem)
        self.barrier = torch.zeros(1, dtype=torch.int64, device="cuda")


class DecodeMegakernel:
    def __init__(
        self, profile: DeviceProfile, shapes: ModelShapes, rows: int, defines: tuple[str, ...] = ()
    ) -> None:
        """`rows`: the largest step served (a rows bucket); built on the current CUDA device.
        `defines`: macros of megakernel.cu (SGJIT_MEGA_TRACE=1: the profiling build)."""
        self.shapes, self.rows = shapes, rows
        self.dtype = _DTYPES[shapes.dtype]
        names = {
            b: megakernel_name(shapes.dtype, b, shapes.head_dim, shapes.group)
            for b in ROW_BUCKETS
            if b <= rows
        }
        kernels = compile_kernels("megakernel", sorted(set(names.values())), defines)
        self._instances = {b: _Instance(kernels[n], profile, shapes, b) for b, n in names.items()}
        self._tables: dict[int, tuple[DecodeWeights, tuple[int, ...], torch.Tensor | None]] = {}

    # ----- what the kernel takes -----
    def _plain(self, t: object, *shape: int) -> bool:
        return (
            isinstance(t, torch.Tensor) and t.is_cuda and t.dtype == self.dtype and t.is_contiguous()
            and tuple(t.shape) == shape and t.data_ptr() % 16 == 0
        )  # fmt: skip

    def _table(self, w: DecodeWeights, kv_layers: list[LayerKV]) -> torch.Tensor | None:
        """The layers' pointers on the device ([layers, 9] int64, MegaLayer's order), built once per
        weights and pool (so before a graph captures the step: its warm-up runs come first), or
        None where a tensor is not what the kernel reads."""
        kv_ptrs = tuple(p for kv in kv_layers for p in (kv.k.data_ptr(), kv.v.data_ptr()))
        hit = self._tables.get(id(w))
        if hit is not None and hit[0] is w and hit[1] == kv_ptrs:
            return hit[2]
        table = self._build_table(w, kv_layers)
        self._tables[id(w)] = (w, kv_ptrs, table)
        return table

    def _build_table(self, w: DecodeWeights, kv_layers: list[LayerKV]) -> torch.Tensor | None:
        s = self.shapes
        h, d, inter = s.hidden, s.head_dim, s.intermediate
        q_size, qkv = s.num_heads * d, (s.num_heads + 2 * s.num_kv_heads) * d
        ok = (
            len(kv_layers) == len(w.layers)
            and self._plain(w.embed, s.vocab, h) and self._plain(w.lm_head, s.vocab, h)
            and self._plain(w.final_norm, h)
            and w.rope.dtype == torch.float32 and w.rope.is_contiguous() and w.rope.shape[-1] == s.rope_dim
        )  # fmt: skip
        rows = []
        for layer, kv in zip(w.layers, kv_layers):
            ok = ok and (
                self._plain(layer.attn_norm, h) and self._plain(layer.qkv, qkv, h)
                and (layer.qkv_bias is None or self._plain(layer.qkv_bias, qkv))
                and self._plain(layer.o_proj, h, q_size) and self._plain(layer.ffn_norm, h)
                and self._plain(layer.gate_up, 2 * inter, h) and self._plain(layer.down, h, inter)
                and all(t.dtype == self.dtype and t.is_contiguous() and t.shape[2:] == (s.num_kv_heads, d)
                        and t.shape[1] == s.page_size for t in (kv.k, kv.v))
            )  # fmt: skip
            if not ok:
                return None
            parts = (layer.attn_norm, layer.qkv, layer.qkv_bias, layer.o_proj, layer.ffn_norm, layer.gate_up,
                     layer.down, kv.k, kv.v)  # fmt: skip
            rows.append([0 if t is None else t.data_ptr() for t in parts])
        return torch.tensor(rows, dtype=torch.int64, device=w.embed.device) if ok and rows else None

    # ----- the op -----
    def __call__(
        self, w: DecodeWeights, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
        kv_layers: list[LayerKV], meta: AttentionMetadata,
    ) -> torch.Tensor | None:  # fmt: skip
        m, s = input_ids.shape[0], self.shapes
        if not (
            0 < m <= self.rows and meta.is_decode and meta.num_rows == m
            and positions.shape == (m,) and slot_mapping.shape == (m,)
            and input_ids.dtype == positions.dtype == slot_mapping.dtype == torch.int64
            and meta.kv_lens.dtype == meta.page_table.dtype == torch.int32 and meta.page_table.stride(-1) == 1
        ):  # fmt: skip
            return None
        table = self._table(w, kv_layers)
        if table is None:
            return None
        inst = self._instances[bucket(m)]
        d, g, hkv, rot = s.head_dim, s.group, s.num_kv_heads, s.rope_dim
        hq = hkv * g
        dev, dt = input_ids.device, self.dtype
        hidden = torch.empty((m, s.hidden), dtype=dt, device=dev)
        q = torch.empty((m, hq, d), dtype=dt, device=dev)
        act = torch.empty((m, s.intermediate), dtype=dt, device=dev)
        part = torch.empty((m * hkv * MAX_SPLITS * (g * d + g),), dtype=torch.float32, device=dev)
        logits = torch.empty((m, s.vocab), dtype=torch.float32, device=dev)
        pt = meta.page_table
        launch(
            inst.kernel, (inst.grid,), THREADS,
            (ptr(input_ids), ptr(positions), ptr(slot_mapping), ptr(meta.kv_lens), ptr(pt), np.int32(pt.stride(0)),
             np.int32(s.page_size), ptr(w.embed), ptr(table), np.int32(len(w.layers)), ptr(w.final_norm),
             ptr(w.lm_head), ptr(w.rope), np.int32(m), np.int32(s.hidden), np.int32(s.intermediate),
             np.int32(hkv), np.int32(rot), np.int32(s.vocab), np.float32(w.eps), np.float32(w.scale * LOG2E),
             np.int32(MAX_SPLITS), ptr(hidden), ptr(q), ptr(act), ptr(part), ptr(logits),
             ptr(inst.barrier)),
            smem=inst.smem,
        )  # fmt: skip
        return logits

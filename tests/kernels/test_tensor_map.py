"""The TMA producer's tensor maps (sgjit/kernels/cuda/tensor_map.py) as the glue computes them on
the CPU: for the runtime's pool layout, the 5-D map the kernel's coordinates (column, head, slot,
page, layer) assume, its boxes of whole 128-byte swizzle rows, and the layer a pool view is."""

from __future__ import annotations

import pytest
import torch

from sgjit.kernels.cuda.tensor_map import (
    BOX_COLS,
    L2_PROMOTION_128B,
    SWIZZLE_128B,
    layer_of,
    pool_map,
    run_map,
)
from sgjit.kernels.registry import SM90_PREFILL_TILES, SM90_TMA, Sm90Tile
from sgjit.runtime.kv_pool import PagedKVPool


def test_llama_pool_map():
    """Llama-3-8B's pool: 32 layers of [1000 pages, 16 slots, 8 kv heads, 128] bf16, 128-key tiles."""
    m = pool_map((1000, 16, 8, 128), 32, 2, 16)
    assert m.dims == (128, 8, 16, 1000, 32)  # innermost first
    # byte strides of head, slot, page, layer: each a multiple of 16 as the driver requires
    assert m.strides == (256, 8 * 256, 16 * 8 * 256, 1000 * 16 * 8 * 256)
    assert all(s % 16 == 0 for s in m.strides)
    assert m.box == (64, 1, 16, 1, 1) and m.box[0] * 2 == 128  # 128-byte rows: the 128-byte swizzle's width
    assert m.swizzle == SWIZZLE_128B and m.l2_promotion == L2_PROMOTION_128B and m.rank == 5


def test_map_strides_match_the_pool_tensor():
    """The map's strides are the pool tensor's own (in bytes), for head_dim 64 and 128, fp16 and bf16."""
    for shape, dtype in (((3, 7, 32, 2, 64), torch.float16), ((2, 5, 64, 4, 128), torch.bfloat16)):
        pool = torch.empty(shape, dtype=dtype)
        m = pool_map(shape[1:], shape[0], pool.element_size(), 32)
        assert m.dims == tuple(reversed(shape))
        assert m.strides == tuple(s * pool.element_size() for s in reversed(pool.stride()[:-1]))


def test_run_map_reads_pages_and_slots_as_one_dimension():
    """The run map's slot coordinate page * page_size + slot lands where the pool tensor keeps that
    slot: its strides are the pool's slot and layer strides, and a box spans a tile's 128 rows
    (8 consecutive pages of 16)."""
    shape = (2, 5, 16, 4, 128)  # layers, pages, slots, kv heads, head_dim
    pool = torch.empty(shape, dtype=torch.bfloat16)
    m = run_map(shape[1:], shape[0], 2, 128)
    assert m.dims == (128, 4, 5 * 16, 2) and m.box == (64, 1, 128, 1) and m.rank == 4
    es = pool.element_size()
    assert m.strides == (pool.stride(3) * es, pool.stride(2) * es, pool.stride(0) * es)
    flat = pool.view(2, 5 * 16, 4, 128)  # slot s of page p is row p * 16 + s
    assert flat.stride(1) * es == m.strides[1]
    with pytest.raises(ValueError, match="8-row"):
        run_map(shape[1:], shape[0], 2, 12)
    with pytest.raises(ValueError, match="16-bit"):
        run_map(shape[1:], shape[0], 1, 128)


def test_boxes_need_whole_swizzle_atoms_and_16_bit_values():
    with pytest.raises(ValueError, match="8-row"):
        pool_map((10, 4, 8, 128), 1, 2, 4)  # pages of 4 slots: half an atom
    with pytest.raises(ValueError, match="within a page"):
        pool_map((10, 16, 8, 128), 1, 2, 32)  # a box past its page
    with pytest.raises(ValueError, match="16-bit"):
        pool_map((10, 16, 8, 128), 1, 1, 16)  # fp8 pools stay on attention.cu
    with pytest.raises(ValueError, match="head_dim"):
        pool_map((10, 16, 8, 96), 1, 2, 16)
    assert BOX_COLS * 2 == 128


def test_layer_views_of_the_runtime_pool():
    """Each LayerKV of PagedKVPool is its layer of one allocation: one map serves them all."""
    pool = PagedKVPool(3, 6, 16, 2, 64, torch.bfloat16, torch.device("cpu"))
    base = pool.k.untyped_storage().data_ptr()
    for i, layer in enumerate(pool.layers):
        assert layer_of(layer.k) == (base, 3, i)
        assert layer_of(layer.v)[1:] == (3, i)


def test_a_standalone_or_partial_tensor_is_its_own_pool():
    k = torch.empty(5, 16, 2, 64, dtype=torch.float16)
    assert layer_of(k) == (k.data_ptr(), 1, 0)
    big = torch.empty(3 * k.numel() + 8, dtype=torch.float16)
    off = big[8 : 8 + k.numel()].view(k.shape)  # not on a layer boundary of its allocation
    assert layer_of(off) == (off.data_ptr(), 1, 0)


def test_tma_tiles_are_named_and_need_pages_of_eight():
    tma = [t for t in SM90_PREFILL_TILES if t.tma]
    assert {t.name for t in tma} >= {"sm90b128s2t", "sm90b128s2opt", "sm90b64s3t"}
    assert all(t.schedule & SM90_TMA for t in tma)
    assert Sm90Tile(128, 2, SM90_TMA).serves_page(8) and not Sm90Tile(128, 2, SM90_TMA).serves_page(4)
    assert Sm90Tile(128, 2).serves_page(4) and not Sm90Tile(128, 2).serves_page(2)  # 32 pages a tile at most

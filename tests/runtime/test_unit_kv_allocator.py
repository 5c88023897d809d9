"""Unit tests of the KV page allocator and the paged pool (sgjit/runtime/kv_pool.py): no model, tiny
CPU tensors."""

from __future__ import annotations

import pytest
import torch

from sgjit.runtime.kv_pool import SCRATCH_PAGE, PageAllocator, PagedKVPool


def _pool(num_pages: int = 5, page_size: int = 4, layers: int = 2, kv_heads: int = 1, head_dim: int = 8):
    return PagedKVPool(layers, num_pages, page_size, kv_heads, head_dim, torch.float32, torch.device("cpu"))


# ----- PageAllocator -----


def test_fresh_allocator_accounting() -> None:
    """A fresh allocator has every page but the scratch page free, and only the scratch page is held."""
    a = PageAllocator(6)
    assert a.num_pages == 6
    assert a.num_usable == 5
    assert a.num_free == 5
    assert a.refcount[SCRATCH_PAGE] == 1
    assert a.refcount[1:].tolist() == [0] * 5


def test_alloc_hands_out_low_ids_first_with_refcount_one() -> None:
    """Pages come out lowest id first, each with one reference, and leave the free list."""
    a = PageAllocator(6)
    assert a.alloc(2) == [1, 2]
    assert a.alloc(1) == [3]
    assert a.refcount[[1, 2, 3]].tolist() == [1, 1, 1]
    assert a.num_free == 2
    assert a.num_usable == 5  # usable does not depend on what is taken


def test_released_pages_come_back_in_their_order() -> None:
    """A request's pages, released, are the next request's pages in the same (consecutive) order:
    the sm_90 prefill loads a tile of consecutive pages as one box."""
    a = PageAllocator(32)
    first = a.alloc(8)
    assert first == list(range(1, 9))
    a.decref(first)
    assert a.alloc(8) == first
    a.incref([3])  # a page still held (the prefix cache) stays out; the others keep their order
    a.decref(first)
    assert a.alloc(3) == [1, 2, 4]


def test_alloc_zero_pages() -> None:
    """Asking for no pages gives an empty list and changes nothing."""
    a = PageAllocator(4)
    assert a.alloc(0) == []
    assert a.num_free == 3


def test_scratch_page_never_handed_out() -> None:
    """Draining the whole pool never yields page 0, and page 0 keeps its reference."""
    a = PageAllocator(8)
    pages = a.alloc(7)
    assert pages is not None
    assert SCRATCH_PAGE not in pages
    assert sorted(pages) == list(range(1, 8))
    a.decref(pages)
    again = a.alloc(7)
    assert again is not None and SCRATCH_PAGE not in again
    assert a.refcount[SCRATCH_PAGE] == 1


def test_running_out_of_pages_returns_none_and_keeps_state() -> None:
    """A request for more pages than are free fails as a whole: nothing is taken."""
    a = PageAllocator(4)
    assert a.alloc(4) is None  # 3 usable
    assert a.num_free == 3
    assert a.alloc(2) == [1, 2]
    assert a.alloc(2) is None
    assert a.num_free == 1
    assert a.refcount[3] == 0
    assert a.alloc(1) == [3]
    assert a.num_free == 0
    assert a.alloc(1) is None


def test_decref_frees_at_zero_and_page_is_reused() -> None:
    """A page returns to the free list only when its last reference goes, and is then handed out again."""
    a = PageAllocator(4)
    p = a.alloc(1)
    assert p == [1]
    a.incref(p)
    assert a.refcount[1] == 2
    a.decref(p)
    assert a.refcount[1] == 1
    assert a.num_free == 2  # still held once
    a.decref(p)
    assert a.refcount[1] == 0
    assert a.num_free == 3
    # the freed page is the next one handed out (free list is a stack)
    assert a.alloc(1) == [1]


def test_incref_decref_count_duplicates() -> None:
    """A page listed twice takes (and gives back) two references."""
    a = PageAllocator(4)
    pages = a.alloc(1)
    assert pages is not None
    p = pages[0]
    a.incref([p, p])
    assert a.refcount[p] == 3
    a.decref([p, p])
    assert a.refcount[p] == 1
    assert a.num_free == 2


def test_decref_below_zero_raises() -> None:
    """Releasing a page more often than it was taken is an error, not a silent double free."""
    a = PageAllocator(4)
    pages = a.alloc(1)
    assert pages is not None
    a.decref(pages)
    with pytest.raises(RuntimeError, match="released more often"):
        a.decref(pages)
    # the page was not pushed onto the free list a second time
    assert a.num_free == 3


def test_free_pages_are_each_handed_out_once() -> None:
    """After mixed alloc/free traffic, every usable page is free exactly once."""
    a = PageAllocator(10)
    x = a.alloc(4)
    y = a.alloc(3)
    assert x is not None and y is not None
    assert not set(x) & set(y)
    a.decref(x[1:3])
    z = a.alloc(2)
    assert z is not None and sorted(z) == sorted(x[1:3])
    a.decref(x[:1] + x[3:] + y + z)
    everything = a.alloc(9)
    assert everything is not None and sorted(everything) == list(range(1, 10))
    assert a.num_free == 0


# ----- PagedKVPool -----


def test_pool_tensor_shapes_and_layers() -> None:
    """K and V are one tensor each, [layers, pages, page_size, kv_heads, head_dim]; each layer's view
    shares their storage."""
    pool = _pool(num_pages=5, page_size=4, layers=2, kv_heads=1, head_dim=8)
    assert pool.k.shape == (2, 5, 4, 1, 8)
    assert pool.v.shape == (2, 5, 4, 1, 8)
    assert pool.k.dtype == torch.float32 and pool.k.device.type == "cpu"
    assert len(pool.layers) == 2
    pool.layers[1].k[3, 2, 0, 5] = 42.0
    assert pool.k[1, 3, 2, 0, 5].item() == 42.0
    pool.layers[0].v.fill_(7.0)
    assert torch.all(pool.v[0] == 7.0)
    assert pool.layers[0].k_scale == 1.0 and pool.layers[0].v_scale == 1.0
    assert isinstance(pool.allocator, PageAllocator)
    assert pool.allocator.num_pages == 5


def test_capacity_tokens_excludes_scratch_page() -> None:
    """Capacity counts usable pages only: (num_pages - 1) * page_size."""
    assert _pool(num_pages=5, page_size=4).capacity_tokens == 16
    assert _pool(num_pages=2, page_size=16).capacity_tokens == 16
    pool = _pool(num_pages=5, page_size=4)
    pool.allocator.alloc(3)
    assert pool.capacity_tokens == 16  # capacity, not what is free


@pytest.mark.parametrize(("tokens", "pages"), [(0, 0), (1, 1), (3, 1), (4, 1), (5, 2), (8, 2), (9, 3)])
def test_pages_for_rounds_up(tokens: int, pages: int) -> None:
    """pages_for is the ceiling of tokens / page_size."""
    assert _pool(page_size=4).pages_for(tokens) == pages


def test_bytes_per_token() -> None:
    """K and V of every layer: 2 * layers * kv_heads * head_dim * element size, the same from the
    instance and from the static helper."""
    pool = _pool(layers=3, kv_heads=2, head_dim=8)
    assert pool.bytes_per_token == 2 * 3 * 2 * 8 * 4
    assert PagedKVPool.bytes_per_token_for(3, 2, 8, torch.float32) == pool.bytes_per_token
    assert PagedKVPool.bytes_per_token_for(3, 2, 8, torch.float16) == pool.bytes_per_token // 2

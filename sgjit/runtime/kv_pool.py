"""`PagedKVPool`: one preallocated K/V tensor pair for all layers, handed out in pages. Pages are
reference-counted: a running request, the prefix cache and a pinned plan each hold a reference, and a
page returns to the free list when the last one lets go. Page 0 is never handed out: padded rows
(CUDA-graph buckets) write their garbage there."""

from __future__ import annotations

import logging

import numpy as np
import torch

from sgjit.kernels.ops import LayerKV
from sgjit.runtime.loader.kv_scales import KVScales

log = logging.getLogger(__name__)

SCRATCH_PAGE = 0


class PageAllocator:
    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self.refcount = np.zeros(num_pages, dtype=np.int32)
        self.refcount[SCRATCH_PAGE] = 1
        self._free = list(range(num_pages - 1, SCRATCH_PAGE, -1))  # stack; low ids first

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_usable(self) -> int:
        return self.num_pages - 1

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        self.refcount[pages] = 1
        return pages

    def incref(self, pages: list[int]) -> None:
        for p in pages:
            self.refcount[p] += 1

    def decref(self, pages: list[int]) -> None:
        """Pages whose last reference goes return to the stack so that they come out again in the
        order they were given: a request's consecutive pages make the next prompt's consecutive
        pages, which the Hopper prefill loads a whole tile at a time (one TMA box, not one a page)."""
        freed = []
        for p in pages:
            self.refcount[p] -= 1
            if self.refcount[p] == 0:
                freed.append(p)
            elif self.refcount[p] < 0:
                raise RuntimeError(f"page {p} released more often than taken")
        self._free.extend(reversed(freed))


class PagedKVPool:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        scales: KVScales | None = None,
    ) -> None:
        """`scales`: an fp8 pool's per-layer K/V scales (stored = value / scale; 1.0 without);
        a 16-bit pool stores values as they are and ignores them."""
        self.page_size = page_size
        self.num_pages = num_pages
        self.dtype = dtype
        shape = (num_layers, num_pages, page_size, num_kv_heads, head_dim)
        # Zeroing a multi-GB pool costs seconds on a CPU, so there it stays uninitialised: attention
        # never reads a slot no token was written to, except masked padding that it zeroes itself.
        make = torch.zeros if device.type == "cuda" else torch.empty
        self.k = make(shape, dtype=dtype, device=device)
        self.v = make(shape, dtype=dtype, device=device)
        fp8 = dtype == torch.float8_e4m3fn
        k_scales = scales.k if fp8 and scales is not None else (1.0,) * num_layers
        v_scales = scales.v if fp8 and scales is not None else (1.0,) * num_layers
        self.layers = [LayerKV(self.k[i], self.v[i], k_scales[i], v_scales[i]) for i in range(num_layers)]
        self.allocator = PageAllocator(num_pages)

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.k[0, 0, 0].numel() * self.k.shape[0] * self.k.element_size()

    @property
    def capacity_tokens(self) -> int:
        return self.allocator.num_usable * self.page_size

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    @staticmethod
    def bytes_per_token_for(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()

"""DeepSeek-V4's paged cache: the engine's pages (one id per `page_size` tokens, shared by all layers,
reference-counted by the allocator, shared through the radix cache) carry for every layer

- the sliding-window K=V of each token (`kv` [pages, page_size, head_dim]); every token is kept, not
  only the last window, so a page means the same thing as in the Llama pool and can be shared;
- for CSA/HCA layers, the compressed entries that complete inside the page (`entries`
  [pages * slots, head_dim], slots = max(1, page_size / rate)): entry w covers tokens
  [w * rate, (w + 1) * rate) and lives in the page of its last token; CSA layers also keep the
  indexer's compressed keys (`index_keys`);
- the compressor's open windows after the last token written to the page (`state` [pages, n, 2,
  head_dim], float32): each open entry as the log-sum-exp of its tokens' gates and the
  gate-weighted mean of their values, per channel, which is all a later token needs to finish the
  entry. A full page's state is its last token's, so a request that takes a cached prefix resumes
  the compressor from the prefix's last page; a partial page belongs to one request.

Everything in a page depends only on the tokens up to it, which is what the radix cache needs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgjit.errors import UnsupportedModelError
from sgjit.runtime.kv_pool import PageAllocator
from sgjit.runtime.model.deepseek_v4.config import CSA, DeepseekV4Config


def entry_slots(rate: int, page_size: int) -> int:
    """Compressed entries that can complete inside one page."""
    if rate % page_size and page_size % rate:
        raise UnsupportedModelError(
            f"DeepSeek-V4 needs page_size and every compress rate to divide one another (rate {rate}, "
            f"page_size {page_size}); pick a power-of-two page_size"
        )
    return max(1, page_size // rate)


@dataclass(slots=True)
class CompressedCache:
    entries: torch.Tensor  # [pages * slots, dim]
    state: torch.Tensor  # float32 [pages, open accumulators, 2 (log-sum-exp, mean), dim]


@dataclass(slots=True)
class DeepseekV4LayerCache:
    kv: torch.Tensor  # [pages, page_size, head_dim]
    compressed: CompressedCache | None = None  # CSA and HCA layers
    index: CompressedCache | None = None  # CSA layers: the indexer's keys


class DeepseekV4KVPool:
    """The pool the scheduler hands pages of (same allocator and page arithmetic as `PagedKVPool`)."""

    def __init__(
        self,
        v4: DeepseekV4Config,
        head_dim: int,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.page_size = page_size
        self.num_pages = num_pages
        self.dtype = dtype
        self.layers: list[DeepseekV4LayerCache] = []
        for i, kind in enumerate(v4.layer_types):
            cache = DeepseekV4LayerCache(
                torch.zeros(num_pages, page_size, head_dim, dtype=dtype, device=device)
            )
            rate = v4.compress_rate(i)
            if rate:
                cache.compressed = _compressed(
                    rate, kind == CSA, head_dim, num_pages, page_size, dtype, device
                )
            if kind == CSA:
                cache.index = _compressed(rate, True, v4.index_head_dim, num_pages, page_size, dtype, device)
            self.layers.append(cache)
        self.allocator = PageAllocator(num_pages)
        self.bytes_per_token = self.bytes_per_token_for(v4, head_dim, page_size, dtype)

    @property
    def capacity_tokens(self) -> int:
        return self.allocator.num_usable * self.page_size

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    @staticmethod
    def bytes_per_token_for(v4: DeepseekV4Config, head_dim: int, page_size: int, dtype: torch.dtype) -> int:
        size = torch.empty(0, dtype=dtype).element_size()
        per_page = 0
        for i, kind in enumerate(v4.layer_types):
            per_page += page_size * head_dim * size
            rate = v4.compress_rate(i)
            dims = [head_dim] + ([v4.index_head_dim] if kind == CSA else [])
            for d in dims if rate else []:
                per_page += entry_slots(rate, page_size) * d * size + (2 if kind == CSA else 1) * 2 * d * 4
        return -(-per_page // page_size)


def _compressed(
    rate: int,
    overlap: bool,
    dim: int,
    num_pages: int,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> CompressedCache:
    slots = entry_slots(rate, page_size)
    return CompressedCache(
        entries=torch.zeros(num_pages * slots, dim, dtype=dtype, device=device),
        state=torch.zeros(num_pages, 2 if overlap else 1, 2, dim, dtype=torch.float32, device=device),
    )

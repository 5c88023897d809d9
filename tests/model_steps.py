"""Ragged forward steps of a `LlamaModel` on its own paged pool, for tests that run one model on
several op tables (kernels, reference, float32 oracle) and compare their logits step by step."""

from __future__ import annotations

import torch

from sgjit.kernels.ops import AttentionMetadata, OpTable
from sgjit.runtime.forward_batch import ForwardBatch
from sgjit.runtime.kv_pool import PagedKVPool
from sgjit.runtime.model.llama import LlamaModel


class Side:
    """One model + ops table with its own pool and page lists (rows own interleaved pages, so a
    row's tokens are not contiguous in the pool); `step` runs the tokens from `starts` on."""

    def __init__(
        self, model: LlamaModel, ops: OpTable, rows: int, max_tokens: int, page: int = 16,
        kv_dtype: torch.dtype | None = None,
    ) -> None:  # fmt: skip
        cfg, dev = model.config, model.device
        self.model, self.ops, self.page, self.device = model, ops, page, dev
        per_row = -(-max_tokens // page)
        self.pool = PagedKVPool(
            cfg.num_layers, rows * per_row + 1, page, cfg.num_kv_heads, cfg.head_dim, kv_dtype or model.dtype, dev
        )  # fmt: skip
        self.pool.k.zero_()  # NOTE: CPU pools start uninitialised; a NaN in a masked key still
        self.pool.v.zero_()  # poisons torch's SDPA (the mask is added to the scores)
        self.pages = [list(range(1 + r, 1 + rows * per_row, rows)) for r in range(rows)]

    def step(self, seqs: list[list[int]], starts: list[int], all_positions: bool = False) -> torch.Tensor:
        ids, positions, slots, qo, logits_idx = [], [], [], [0], []
        for toks, start, pages in zip(seqs, starts, self.pages):
            for p in range(start, len(toks)):
                ids.append(toks[p])
                positions.append(p)
                slots.append(pages[p // self.page] * self.page + p % self.page)
            logits_idx.extend(range(qo[-1], len(ids)) if all_positions else [len(ids) - 1])
            qo.append(len(ids))
        kv_lens = [len(t) for t in seqs]
        dev = self.device
        meta = AttentionMetadata(
            qo_indptr=torch.tensor(qo, dtype=torch.int32, device=dev),
            kv_lens=torch.tensor(kv_lens, dtype=torch.int32, device=dev),
            page_table=torch.tensor([p[: -(-max(kv_lens) // self.page)] for p in self.pages], dtype=torch.int32, device=dev),
            page_size=self.page, max_q_len=max(qo[i + 1] - qo[i] for i in range(len(seqs))),
            max_kv_len=max(kv_lens), qo_indptr_host=qo, kv_lens_host=kv_lens,
        )  # fmt: skip
        batch = ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            attn=meta,
            logits_indices=torch.tensor(logits_idx, dtype=torch.int64, device=dev),
        )
        self.model.ops = self.ops
        return self.model.forward(batch, self.pool.layers)

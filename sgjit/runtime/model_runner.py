"""Turns a scheduled batch into a `ForwardBatch` (flat token ids, positions, KV slots, page table)
and runs the model on it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgjit.kernels.ops import AttentionMetadata
from sgjit.runtime.cuda_graph import DecodeGraphs
from sgjit.runtime.forward_batch import ForwardBatch
from sgjit.runtime.kv_pool import PagedKVPool
from sgjit.runtime.model.deepseek_v4.cache import DeepseekV4KVPool
from sgjit.runtime.model.deepseek_v4.model import DeepseekV4Model
from sgjit.runtime.model.llama import LlamaModel
from sgjit.runtime.sampler import RowSampling
from sgjit.runtime.scheduler import RowChunk


@dataclass(slots=True)
class StepLogits:
    """Logits of one step, with where each batch row's entries are: `sample_index[b]` is the logits
    row of b's last position; `prompt_index[b]` = (first logits row, first position, count) of the
    positions whose logits give b's owed input logprobs."""

    logits: torch.Tensor
    sample_index: dict[int, int]  # batch row -> logits row of its last position
    prompt_index: dict[int, tuple[int, int, int]]  # batch row -> (first logits row, first position, count)


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel | DeepseekV4Model,
        pool: PagedKVPool | DeepseekV4KVPool,
        graphs: DecodeGraphs | None = None,
    ) -> None:
        self.model = model
        self.pool = pool
        self.device = model.device
        self.graphs = graphs

    def build(
        self, rows: list[RowChunk]
    ) -> tuple[ForwardBatch, dict[int, int], dict[int, tuple[int, int, int]]]:
        ps = self.pool.page_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        qo_indptr = [0]
        kv_lens: list[int] = []
        logits_idx: list[int] = []
        sample_index: dict[int, int] = {}
        prompt_index: dict[int, tuple[int, int, int]] = {}
        max_pages = max(len(r.req.pages) for r in rows)
        table = torch.zeros(len(rows), max_pages, dtype=torch.int32)
        for b, row in enumerate(rows):
            req, start, end = row.req, row.start, row.end
            base = len(ids)
            ids.extend(req.tokens[start:end])
            pos = range(start, end)
            positions.extend(pos)
            pages = req.pages
            slots.extend(pages[p // ps] * ps + p % ps for p in pos)
            qo_indptr.append(len(ids))
            kv_lens.append(end)
            table[b, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
            # Input logprob of prompt token t comes from the logits at position t - 1.
            first = max(start, req.next_input_logprob - 1, 0)
            last = min(end, req.prompt_len - 1)
            if req.next_input_logprob < req.prompt_len and first < last:
                prompt_index[b] = (len(logits_idx), first, last - first)
                logits_idx.extend(base + p - start for p in range(first, last))
            if row.sample:
                sample_index[b] = len(logits_idx)
                logits_idx.append(base + end - 1 - start)
        dev = self.device
        meta = AttentionMetadata(
            qo_indptr=torch.tensor(qo_indptr, dtype=torch.int32, device=dev),
            kv_lens=torch.tensor(kv_lens, dtype=torch.int32, device=dev),
            page_table=table.to(dev),
            page_size=ps,
            max_q_len=max(qo_indptr[i + 1] - qo_indptr[i] for i in range(len(rows))),
            max_kv_len=max(kv_lens),
            qo_indptr_host=qo_indptr,
            kv_lens_host=kv_lens,
        )
        batch = ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            attn=meta,
            logits_indices=torch.tensor(logits_idx, dtype=torch.int64, device=dev),
        )
        return batch, sample_index, prompt_index

    def forward(self, rows: list[RowChunk]) -> StepLogits:
        if self.graphs is not None and self._graphable(rows):
            return self._forward_graph(rows)
        batch, sample_index, prompt_index = self.build(rows)
        return StepLogits(self.model.forward(batch, self.pool.layers), sample_index, prompt_index)

    def _graphable(self, rows: list[RowChunk]) -> bool:
        """Pure decode steps (one token a row, every row sampling) replay a captured graph."""
        if not all(r.sample and r.end - r.start == 1 for r in rows):
            return False
        return self.graphs.can_run(len(rows), max(r.end for r in rows))

    def _forward_graph(self, rows: list[RowChunk]) -> StepLogits:
        ps = self.pool.page_size
        tokens = [r.req.tokens[r.start] for r in rows]
        positions = [r.start for r in rows]
        slots = [r.req.pages[r.start // ps] * ps + r.start % ps for r in rows]
        logits = self.graphs.run(tokens, positions, slots, [r.req.pages for r in rows])
        return StepLogits(logits, {b: b for b in range(len(rows))}, {})

    @property
    def multi_steps(self) -> int:
        return self.graphs.steps if self.graphs is not None else 1

    @property
    def samples_on_device(self) -> bool:
        """Multi-step graphs can sample (not only take the argmax) without the host."""
        return self.graphs is not None and self.graphs.samples_on_device

    def forward_multi(
        self,
        rows: list[RowChunk],
        budgets: list[int],
        stop_on_eos: list[bool],
        sampling: RowSampling | None = None,
        generator: torch.Generator | None = None,
    ) -> list[list[int]] | None:
        """`multi_steps` tokens a row from one multi-step graph (greedy unless `sampling` says
        otherwise); None when the batch does not fit the graphs (the caller then takes a single step)."""
        if self.graphs is None or not self.graphs.can_run(
            len(rows), max(r.end for r in rows) + self.multi_steps
        ):
            return None
        ps = self.pool.page_size
        tokens = [r.req.tokens[r.start] for r in rows]
        positions = [r.start for r in rows]
        slots = [r.req.pages[r.start // ps] * ps + r.start % ps for r in rows]
        return self.graphs.run_multi(
            tokens, positions, slots, [r.req.pages for r in rows], budgets, stop_on_eos, sampling, generator
        )

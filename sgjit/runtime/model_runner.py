"""Turns a scheduled batch into a step (`HostBatch`: flat token ids, positions, KV slots, pages; or
`DecodeRows` for the decode-graph path) and runs the model on it. Inputs go to the device without
waiting for it (`HostBatch.to_device`), and placeholder ids of tokens still on the device are
resolved there (`TokenFutures`), so a step can be built and launched while the previous one runs."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from sgjit.runtime.cuda_graph import DecodeGraphs
from sgjit.runtime.forward_batch import DecodeRows, HostBatch, MultiStep
from sgjit.runtime.futures import TokenFutures
from sgjit.runtime.kv_pool import PagedKVPool
from sgjit.runtime.model.deepseek_v4.cache import DeepseekV4KVPool
from sgjit.runtime.model.deepseek_v4.model import DeepseekV4Model
from sgjit.runtime.model.llama import LlamaModel
from sgjit.runtime.parallel.step import StepChannel, StepKind
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
    """Runs scheduled rows on the model. Each step reaches the device through one of three methods
    (`run_batch`, `run_decode`, `run_multi`); under tensor parallelism rank 0's runner first sends the
    step to the other ranks (`channel`), whose runners then call the same method with it. Placeholder
    ids (overlap scheduling) never reach the other ranks: the overlap is off with tp > 1
    (`RuntimeConfig.use_overlap`), since only rank 0 samples and holds the tokens they name."""

    def __init__(
        self,
        model: LlamaModel | DeepseekV4Model,
        pool: PagedKVPool | DeepseekV4KVPool,
        futures: TokenFutures,
        graphs: DecodeGraphs | None = None,
        channel: StepChannel | None = None,
    ) -> None:
        self.model = model
        self.pool = pool
        self.device = model.device
        self.futures = futures
        self.graphs = graphs
        self.channel = channel
        self._cpu = self.device.type == "cpu"
        self._compute_seconds = 0.0

    def build(
        self, rows: list[RowChunk]
    ) -> tuple[HostBatch, dict[int, int], dict[int, tuple[int, int, int]]]:
        ps = self.pool.page_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        qo_indptr = [0]
        kv_lens: list[int] = []
        logits_idx: list[int] = []
        sample_index: dict[int, int] = {}
        prompt_index: dict[int, tuple[int, int, int]] = {}
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
            # Input logprob of prompt token t comes from the logits at position t - 1.
            first = max(start, req.next_input_logprob - 1, 0)
            last = min(end, req.prompt_len - 1)
            if req.next_input_logprob < req.prompt_len and first < last:
                prompt_index[b] = (len(logits_idx), first, last - first)
                logits_idx.extend(base + p - start for p in range(first, last))
            if row.sample:
                sample_index[b] = len(logits_idx)
                logits_idx.append(base + end - 1 - start)
        batch = HostBatch(ids, positions, slots, qo_indptr, kv_lens, [r.req.pages for r in rows], logits_idx)
        return batch, sample_index, prompt_index

    def forward(self, rows: list[RowChunk]) -> StepLogits:
        if self.graphs is not None and self._graphable(rows):
            return self._forward_graph(rows)
        batch, sample_index, prompt_index = self.build(rows)
        return StepLogits(self.run_batch(batch), sample_index, prompt_index)

    @property
    def cpu_compute_seconds(self) -> float:
        """Time the model has computed on the CPU, where the host is the device: what the engine's
        host-time counters leave out there (on a GPU the host only queues the work; this stays 0)."""
        return self._compute_seconds + (self.graphs.compute_seconds if self.graphs is not None else 0.0)

    @property
    def capture_seconds(self) -> float:
        return self.graphs.capture_seconds if self.graphs is not None else 0.0

    def _graphable(self, rows: list[RowChunk]) -> bool:
        """Pure decode steps (one token a row, every row sampling) replay a captured graph."""
        if not all(r.sample and r.end - r.start == 1 for r in rows):
            return False
        return self.graphs.can_run(len(rows), max(r.end for r in rows))

    def _decode_rows(self, rows: list[RowChunk]) -> DecodeRows:
        ps = self.pool.page_size
        return DecodeRows(
            tokens=[r.req.tokens[r.start] for r in rows],
            positions=[r.start for r in rows],
            slots=[r.req.pages[r.start // ps] * ps + r.start % ps for r in rows],
            page_rows=[r.req.pages for r in rows],
        )

    def _forward_graph(self, rows: list[RowChunk]) -> StepLogits:
        logits = self.run_decode(self._decode_rows(rows))
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
    ) -> torch.Tensor | None:
        """Queue `multi_steps` tokens a row from one multi-step graph (greedy unless `sampling` says
        otherwise): the device tensor [steps, rows] they will be in (the futures' cells); None when
        the batch does not fit the graphs (the caller then takes a single step)."""
        if self.graphs is None or not self.graphs.can_run(
            len(rows), max(r.end for r in rows) + self.multi_steps
        ):
            return None
        return self.run_multi(self._decode_rows(rows), MultiStep(budgets, stop_on_eos, sampling), generator)

    # ----- the device steps: every rank of a tensor-parallel runtime runs each of these together -----
    def run_batch(self, batch: HostBatch) -> torch.Tensor:
        """Logits of one forward pass over `batch`."""
        with self._on_every_rank(StepKind.FORWARD, batch):
            fb = batch.to_device(self.device, self.pool.page_size)
            if min(batch.input_ids) < 0:  # tokens the step in flight is drawing
                fb.input_ids = self.futures.resolve(fb.input_ids)
            t = time.perf_counter()
            logits = self.model.forward(fb, self.pool.layers)
            if self._cpu:
                self._compute_seconds += time.perf_counter() - t
            return logits

    def run_decode(self, rows: DecodeRows) -> torch.Tensor:
        """Logits of one step on the decode-graph path."""
        with self._on_every_rank(StepKind.DECODE, rows):
            return self.graphs.run(rows.tokens, rows.positions, rows.slots, rows.page_rows)

    def run_multi(
        self, rows: DecodeRows, multi: MultiStep, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Queue one multi-step launch: the device tensor [steps, rows] its tokens will be in."""
        with self._on_every_rank(StepKind.DECODE_MULTI, rows, multi):
            return self.graphs.run_multi(
                rows.tokens, rows.positions, rows.slots, rows.page_rows, multi.budgets, multi.stop_on_eos,
                multi.sampling, generator,
            )  # fmt: skip

    def _on_every_rank(self, kind: StepKind, *step: object) -> AbstractContextManager[None]:
        return nullcontext() if self.channel is None else self.channel.lead(kind, *step)

    def close(self) -> None:
        """Tell the other ranks to stop (on the engine thread, after its last step)."""
        if self.channel is not None:
            self.channel.stop()

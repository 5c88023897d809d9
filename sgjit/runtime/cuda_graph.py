"""Decode steps captured as CUDA graphs, one per (batch-size bucket, context bucket), shared by every
request and plan of a runtime. A replay costs one launch instead of ~15 per layer, which is what
decides small-model and small-batch decode speed on a GPU.

Inputs live in static buffers; a step copies its rows in (padding up to the bucket with rows that
read and write only the scratch page), replays, and reads the logits out of a static buffer. The
context bucket is the static upper bound the attention op sizes its grid by; actual lengths are read
on the device from `kv_lens`, so one graph serves every context up to its bucket. Where the op's
launch does not depend on that bound (`decode_launch`; large batches), the bucket is the whole
context, so one graph a batch bucket serves them all, and `warm` can capture every one of them up
front (`sgjit serve` does), leaving no capture for a request to wait for.

Nothing here waits for the device: input ids that are still placeholders (tokens of the launch in
flight) are resolved inside the graph, multi-step tokens stay in the `TokenFutures` cells for the
caller to read back, and the pinned host twins of the inputs alternate between two sets, so a
launch can be loaded while the one before still reads its inputs."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from sgjit.kernels import reference
from sgjit.kernels.ops import AttentionMetadata, DecodeAhead, SamplingTensors
from sgjit.runtime.forward_batch import ForwardBatch
from sgjit.runtime.futures import TokenFutures
from sgjit.runtime.kv_pool import SCRATCH_PAGE, PagedKVPool
from sgjit.runtime.model.llama import LlamaModel
from sgjit.runtime.sampler import RowSampling
from sgjit.runtime.transfer import CornerCopy

log = logging.getLogger(__name__)

MIN_CONTEXT_BUCKET = 512
_NO_PAGES: list[int] = []  # a padding row's pages (never appended to)


def batch_buckets(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8 to 64, then steps of 16 up to `max_bs`."""
    sizes = [1, 2, 4, 8, *range(16, 65, 8), *range(80, max_bs + 16, 16)]
    return sorted({min(s, max_bs) for s in sizes})


@dataclass(slots=True)
class _HostTwins:
    """Pinned host copies of the static inputs, so a step's inputs go over in a few copies. Loads
    write them through numpy views made once (`.numpy()` costs microseconds a call)."""

    scalars: torch.Tensor
    fscalars: torch.Tensor
    table: torch.Tensor  # int32 [max_bs, pages]: a load sends its [bs, used width] corner
    # Row i of `table` holds the first `table_lens[i]` pages of the list `table_pages[i]`, then the
    # scratch page. A request's page list only grows while it runs (Request.pages), so a load
    # writes only the pages a row gained since these twins last held it (one every page_size
    # tokens): refilling every row was most of a load's host time at large batches.
    table_pages: list[list[int]] = field(init=False)
    table_lens: list[int] = field(init=False)
    scalars_np: np.ndarray = field(init=False)
    fscalars_np: np.ndarray = field(init=False)
    table_np: np.ndarray = field(init=False)
    # The copies a load queues into the device buffers: scalars, fscalars, table (`_buffers_for` sets
    # them once both sides exist)
    sends: tuple[CornerCopy, CornerCopy, CornerCopy] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.table_pages, self.table_lens = [_NO_PAGES] * self.table.shape[0], [0] * self.table.shape[0]
        self.scalars_np, self.fscalars_np = self.scalars.numpy(), self.fscalars.numpy()
        self.table_np = self.table.numpy()

    def fill_table(self, page_rows: list[list[int]], bs: int) -> None:
        """Rows [0, n) of `table` to `page_rows` (cut to its width), rows [n, bs) to the scratch page."""
        t = self.table_np
        cols = t.shape[1]
        held, lens = self.table_pages, self.table_lens
        n = len(page_rows)
        for i in range(bs):
            pages = page_rows[i] if i < n else _NO_PAGES
            k, old = min(len(pages), cols), lens[i]
            if held[i] is not pages or old > k:  # another list: the whole row
                t[i, :k] = pages if k == len(pages) else pages[:k]
                if old > k:
                    t[i, k:old] = SCRATCH_PAGE
            elif old < k:  # the list this row held, grown since: its new pages
                t[i, old:k] = pages[old:k]
            held[i], lens[i] = pages, k


@dataclass(slots=True)
class _Buffers:
    """Static inputs for one context bucket, sized for the largest batch bucket."""

    # int64 [9, max_bs]: token, position, slot, kv length, budget, top_k, seed, step, and (multi-step)
    # whether the row ends at EOS (not ignore_eos)
    scalars: torch.Tensor
    fscalars: torch.Tensor  # float32 [3, max_bs]: temperature, top_p, min_p (multi-step sampling)
    draws: torch.Tensor  # int64 [steps]: Philox key of unseeded rows, one a step
    kv_lens: torch.Tensor  # int32 [max_bs] (ops take int32 lengths): the graph converts scalars[3]
    qo_indptr: torch.Tensor
    page_table: torch.Tensor
    rows: torch.Tensor  # arange, the logits indices
    # Two sets used in turn: a launch's copies may still be queued behind the launch before it when
    # the next one is loaded; the set after next is free once the launch before it was read back.
    host: tuple[_HostTwins, _HostTwins]

    @property
    def input_ids(self) -> torch.Tensor:
        return self.scalars[0]

    @property
    def positions(self) -> torch.Tensor:
        return self.scalars[1]

    @property
    def slots(self) -> torch.Tensor:
        return self.scalars[2]

    @property
    def budgets(self) -> torch.Tensor:
        return self.scalars[4]

    def sampling(self, bs: int, k: int, host: RowSampling | None, greedy: bool = False) -> SamplingTensors:
        """Step k's sampling parameters as views of the static buffers (the graph reads them on
        replay); the host lists serve the reference op of eager (capture=False) runs. `greedy`: the
        graph decodes every row greedily (the sampler's argmax)."""
        seeds = host.seeds if host is not None else [-1] * bs
        steps = [s + k for s in host.steps] if host is not None else [k] * bs
        return SamplingTensors(
            temperature=self.fscalars[0, :bs], top_p=self.fscalars[1, :bs], top_k=self.scalars[5, :bs],
            min_p=self.fscalars[2, :bs], seeds=self.scalars[6, :bs], steps=self.scalars[7, :bs],
            all_greedy=greedy, seeds_host=seeds, steps_host=steps, draw=self.draws[k : k + 1],
        )  # fmt: skip


class DecodeGraphs:
    def __init__(
        self,
        model: LlamaModel,
        pool: PagedKVPool,
        futures: TokenFutures,
        max_bs: int,
        max_context: int,
        steps: int = 1,
        eos_token_ids: tuple[int, ...] = (),
        capture: bool = True,
    ) -> None:
        """`capture=False` runs the very same padded, bucketed steps without graphs: the eager
        reference that graph replay must match bit for bit (and, on the CPU, the bucketed path the
        engine's host time is measured on). `futures` holds at least `steps` x `max_bs` tokens."""
        self.model = model
        self.capture = capture
        self.pool = pool
        self.futures = futures
        self.device = model.device
        self.buckets = batch_buckets(max_bs)
        self.max_bs = self.buckets[-1]
        self.max_context = max_context
        self.logits = torch.empty(
            self.max_bs, model.config.vocab_size, dtype=torch.float32, device=self.device
        )
        self.steps = steps
        # Sampled (non-greedy) multi-step graphs need a sampling op that reads every parameter from
        # device memory; the reference op reads host lists, which a replay cannot change.
        self.samples_on_device = not capture or model.ops.sample is not reference.sample
        self._host_sampling: RowSampling | None = None
        self.out_tokens = futures.tokens[:steps, : self.max_bs]
        self._parity = 0  # which host twins the next load fills
        self.eos = torch.tensor(eos_token_ids or (-1,), dtype=torch.int64, device=self.device)
        self.mempool = torch.cuda.graph_pool_handle() if capture else None
        self._graphs: dict[tuple[int, int, int, bool], torch.cuda.CUDAGraph] = {}
        self._buffers: dict[int, _Buffers] = {}
        self._whole_context: dict[tuple[int, int], int] = {}  # (bs, bucket) -> the bound its graph uses
        self.capture_seconds = 0.0
        self.compute_seconds = 0.0  # eager steps on the CPU: the model's compute (see ModelRunner)

    # ----- shapes -----
    def batch_bucket(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def context_bucket(self, max_kv_len: int, bs: int) -> int:
        """The context bound of the graph that serves `bs` rows of at most `max_kv_len` keys: a power
        of two from 512, or the runtime's whole context wherever the attention op launches the same
        grid for both (large batches), so one graph a batch bucket serves every context there.
        Without the op's say (the reference attention sizes its work by the bound) the power of two."""
        ctx = MIN_CONTEXT_BUCKET
        while ctx < max_kv_len:
            ctx *= 2
        ctx = min(ctx, self.max_context)
        key = (bs, ctx)
        if key not in self._whole_context:  # asked once: this runs on every launch
            launch = getattr(self.model.ops.attention, "decode_launch", None)
            same = launch is not None and launch(bs, ctx) == launch(bs, self.max_context)
            self._whole_context[key] = self.max_context if same else ctx
        return self._whole_context[key]

    def can_run(self, num_rows: int, max_kv_len: int) -> bool:
        return num_rows <= self.max_bs and max_kv_len <= self.max_context

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    # ----- capture -----
    def _buffers_for(self, ctx: int) -> _Buffers:
        if ctx not in self._buffers:
            n, dev = self.max_bs, self.device
            pages = self.pool.pages_for(ctx)
            pinned = dict(pin_memory=dev.type == "cuda")
            scalars = torch.zeros(9, n, dtype=torch.int64, device=dev)
            fscalars = torch.zeros(3, n, dtype=torch.float32, device=dev)
            page_table = torch.full((n, pages), SCRATCH_PAGE, dtype=torch.int32, device=dev)

            def twins() -> _HostTwins:
                host = _HostTwins(
                    scalars=torch.zeros(9, n, dtype=torch.int64, **pinned),
                    fscalars=torch.zeros(3, n, dtype=torch.float32, **pinned),
                    table=torch.full((n, pages), SCRATCH_PAGE, dtype=torch.int32, **pinned),
                )
                host.sends = (
                    CornerCopy(scalars, host.scalars), CornerCopy(fscalars, host.fscalars),
                    CornerCopy(page_table, host.table),
                )  # fmt: skip
                return host

            self._buffers[ctx] = _Buffers(
                scalars=scalars,
                fscalars=fscalars,
                draws=torch.zeros(self.steps, dtype=torch.int64, device=dev),
                kv_lens=torch.ones(n, dtype=torch.int32, device=dev),
                qo_indptr=torch.arange(n + 1, dtype=torch.int32, device=dev),
                page_table=page_table,
                rows=torch.arange(n, dtype=torch.int64, device=dev),
                host=(twins(), twins()),
            )
            self._park(self._buffers[ctx])
        return self._buffers[ctx]

    def _batch(self, bs: int, ctx: int) -> ForwardBatch:
        b = self._buffers_for(ctx)
        meta = AttentionMetadata(
            qo_indptr=b.qo_indptr[: bs + 1], kv_lens=b.kv_lens[:bs], page_table=b.page_table[:bs],
            page_size=self.pool.page_size, max_q_len=1, max_kv_len=ctx,
            qo_indptr_host=[], kv_lens_host=[],  # NOTE: empty in graphs; decode ops read device lengths
        )  # fmt: skip
        return ForwardBatch(b.input_ids[:bs], b.positions[:bs], b.slots[:bs], meta, b.rows[:bs])

    def _decode_steps(
        self, batch: ForwardBatch, bs: int, ctx: int, steps: int, sampled: bool = False
    ) -> None:
        """What a graph holds: the input ids' placeholders resolved, then one step writing logits, or
        `steps` steps that pick each token on the device (the ops' sampler: argmax, or sampling when
        `sampled`), feed it back, advance positions, KV slots and sampling steps, and send rows that
        are done (EOS, out of budget) to the scratch page so they never write past the pages
        reserved for them."""
        layers = self.pool.layers
        b = self._buffers_for(ctx)
        b.kv_lens[:bs].copy_(b.scalars[3, :bs])
        batch.input_ids.copy_(self.futures.resolve(batch.input_ids))
        if steps == 1:
            self.logits[:bs].copy_(self.model.forward(batch, layers))
            return
        ps = self.pool.page_size
        state = DecodeAhead(
            input_ids=b.input_ids[:bs], positions=b.positions[:bs], slots=b.slots[:bs], kv_lens=b.kv_lens[:bs],
            page_table=b.page_table[:bs], budgets=b.budgets[:bs], stop_on_eos=b.scalars[8, :bs],
            done=torch.zeros(bs, dtype=torch.bool, device=self.device), eos=self.eos, page_size=ps,
            scratch_slot=SCRATCH_PAGE * ps,
        )  # fmt: skip
        for k in range(steps):
            logits = self.model.forward(batch, layers)
            nxt = self.model.ops.sample(
                logits, b.sampling(bs, k, self._host_sampling, greedy=not sampled), None
            )
            nxt = self.model.comm.from_leader(nxt)  # tensor parallel: every rank feeds back rank 0's tokens
            if sampled:
                b.scalars[7, :bs].add_(1)
            self.model.ops.advance_decode(state, nxt, k, self.out_tokens[k, :bs])

    def _capture(self, bs: int, ctx: int, steps: int, sampled: bool) -> torch.cuda.CUDAGraph:
        t0 = time.perf_counter()
        batch = self._batch(bs, ctx)
        b = self._buffers_for(ctx)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside capture: lazy inits, kernel compiles, workspaces
            # the tokens of a launch in flight, which the launch being captured reads as its inputs
            kept = self.futures.tokens.clone()
            for _ in range(2):
                self._park(b)  # NOTE: the buffers may hold live rows' slots; warm-up writes to scratch only
                self._decode_steps(batch, bs, ctx, steps, sampled)
            self.futures.tokens.copy_(kept)
        torch.cuda.current_stream().wait_stream(side)
        self._park(b)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            self._decode_steps(batch, bs, ctx, steps, sampled)
        torch.cuda.synchronize()
        self.capture_seconds += time.perf_counter() - t0
        log.debug(
            "captured decode graph bs=%d ctx=%d steps=%d%s in %.0f ms",
            bs,
            ctx,
            steps,
            " sampled" if sampled else "",
            (time.perf_counter() - t0) * 1000,
        )
        return graph

    def graph(self, bs: int, ctx: int, steps: int = 1, sampled: bool = False) -> torch.cuda.CUDAGraph:
        key = (bs, ctx, steps, sampled)
        if key not in self._graphs:
            self._graphs[key] = self._capture(bs, ctx, steps, sampled)
        return self._graphs[key]

    def _execute(self, bs: int, ctx: int, steps: int, sampled: bool = False) -> None:
        if self.capture:
            self.graph(bs, ctx, steps, sampled).replay()
            return
        t = time.perf_counter()
        self._decode_steps(self._batch(bs, ctx), bs, ctx, steps, sampled)
        if self.device.type == "cpu":
            self.compute_seconds += time.perf_counter() - t

    def warm(self, max_bs: int | None = None) -> None:
        """Capture the multi-step greedy graph (what pure decode launches replay) of every batch
        bucket up to `max_bs` for the shortest contexts, largest first so smaller graphs reuse the
        pool's memory. Where the attention launch does not depend on the context (large batches),
        that graph serves every context."""
        top = self.batch_bucket(min(max_bs or self.max_bs, self.max_bs))
        for bs in reversed([b for b in self.buckets if b <= top]):
            self.graph(bs, self.context_bucket(1, bs), self.steps)

    def _park(self, b: _Buffers) -> None:
        """Point every row of the buffers at the scratch page (position 0, context 1, no budget)."""
        b.scalars.zero_()
        b.slots.fill_(SCRATCH_PAGE * self.pool.page_size)
        b.scalars[3].fill_(1)
        b.kv_lens.fill_(1)
        b.page_table.fill_(SCRATCH_PAGE)

    # ----- replay -----
    def _load(
        self, bs: int, ctx: int, tokens, positions, slots, page_rows, budgets=None, stop_on_eos=None,
        sampling: RowSampling | None = None,
    ) -> None:  # fmt: skip
        """Rows into the static buffers through their pinned twins (padding rows read and write the
        scratch page), in two copies (three when sampling), each one driver call: the host time of a
        launch. They are queued without waiting; the twins filled here are filled again two loads
        later, when the engine has read back the launch before this one, whose inputs were copied
        before it ran."""
        n = len(tokens)
        b = self._buffers_for(ctx)
        host = b.host[self._parity]
        self._parity ^= 1
        send_scalars, send_fscalars, send_table = host.sends
        h = host.scalars_np
        if n < bs:  # padding rows
            h[:, n:bs] = 0
            h[2, n:bs] = SCRATCH_PAGE * self.pool.page_size
            h[3, n:bs] = 1
        # rows 0-4 in one numpy call: each assignment costs about a microsecond however few its rows
        h[:5, :n] = (
            tokens,
            positions,
            slots,
            [p + 1 for p in positions],
            budgets if budgets is not None else [1] * n,
        )
        if stop_on_eos is not None:
            h[8, :n] = stop_on_eos
        if sampling is not None:
            h[5, :n], h[6, :n], h[7, :n] = sampling.top_k, sampling.seeds, sampling.steps
            h[6, n:bs] = -1
            f = host.fscalars_np
            f[:, n:bs] = ((0.0,), (1.0,), (0.0,))  # padding rows: greedy
            f[0, :n], f[1, :n], f[2, :n] = sampling.temperature, sampling.top_p, sampling.min_p
            send_fscalars(3, bs)
        # Only the columns some row uses go over (a whole-context bound can be thousands of pages
        # wide); a row never reads past its own pages, which its kv length and reserved budget cover.
        width = min(max(map(len, page_rows)), b.page_table.shape[1])
        host.fill_table(page_rows, bs)
        send_scalars(9, bs)
        send_table(bs, width)

    def run(
        self, tokens: list[int], positions: list[int], slots: list[int], page_rows: list[list[int]]
    ) -> torch.Tensor:
        """Logits [n, vocab] for n decode rows: row i feeds `tokens[i]` at `positions[i]`, writes its KV
        at `slots[i]` and attends over its first positions[i] + 1 tokens through `page_rows[i]`."""
        bs = self.batch_bucket(len(tokens))
        ctx = self.context_bucket(max(positions) + 1, bs)
        if self.capture:
            self.graph(bs, ctx)  # capture before loading: capture parks the buffers
        self._load(bs, ctx, tokens, positions, slots, page_rows)
        self._execute(bs, ctx, 1)
        return self.logits[: len(tokens)]

    def run_multi(
        self,
        tokens: list[int],
        positions: list[int],
        slots: list[int],
        page_rows: list[list[int]],
        budgets: list[int],
        stop_on_eos: list[bool],
        sampling: RowSampling | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Queue `self.steps` tokens for every row: greedy, or drawn on the device with each row's
        `sampling` parameters (needs `samples_on_device`; seeded rows draw exactly what single steps
        draw, unseeded ones from keys taken from `generator`). Returns the device tensor [steps, n]
        they will be in (the futures' cells: read it back before the next launch overwrites it).
        Tokens a row draws after it is done (EOS or out of budget) are there too; the caller drops
        them."""
        n = len(tokens)
        bs = self.batch_bucket(n)
        ctx = self.context_bucket(max(positions) + self.steps, bs)
        sampled = sampling is not None and not sampling.all_greedy
        if sampled and not self.samples_on_device:
            raise RuntimeError("sampled multi-step decoding needs the on-device sampling op")
        if self.capture:
            self.graph(bs, ctx, self.steps, sampled)
        b = self._buffers_for(ctx)
        self._load(
            bs, ctx, tokens, positions, slots, page_rows, budgets, stop_on_eos, sampling if sampled else None
        )
        if sampled and min(sampling.seeds) < 0:
            b.draws.random_(0, 2**62, generator=generator)
        self._host_sampling = sampling if sampled else None
        self._execute(bs, ctx, self.steps, sampled)
        self._host_sampling = None
        return self.out_tokens[:, :n]

"""The engine loop: one thread that owns the model, the KV pool, the prefix cache and the scheduler.
Other threads talk to it only through its inbox (submit, abort, flush, release, queries), so none of
that state needs a lock."""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from sgjit.errors import RequestAbortedError, SgjitError, TensorParallelError
from sgjit.nvtx import nvtx_range
from sgjit.runtime.kv_pool import PagedKVPool
from sgjit.runtime.model_runner import ModelRunner, StepLogits
from sgjit.runtime.output import OutputProcessor
from sgjit.runtime.radix_cache import RadixCache
from sgjit.runtime.request import PrefixHandle, Request, Status
from sgjit.runtime.result import FinishReason
from sgjit.runtime.sampler import RowSampling, Sampler
from sgjit.runtime.scheduler import RowChunk, Scheduler
from sgjit.runtime.tokenizer import Tokenizer

log = logging.getLogger(__name__)

_live_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _stop_live_engines() -> None:
    # A daemon engine thread still inside torch when the interpreter tears down aborts the process
    # ("terminate called without an active exception"); stop them in order first.
    for engine in list(_live_engines):
        engine.shutdown()


@dataclass(slots=True)
class EngineParts:
    runner: ModelRunner
    scheduler: Scheduler
    sampler: Sampler
    tokenizer: Tokenizer
    eos_token_ids: tuple[int, ...]
    max_model_len: int


class Engine:
    """Starts the engine thread, which first runs `build` (loading the model there) and then loops.

    NOTE: all torch compute, the model load included, happens on this one thread. On CPU, torch's
    OpenMP pool belongs to the thread that first used it, and a second pool in another thread slows
    every parallel op of both (measured: 1.6x per decode step on a 2-core machine)."""

    def __init__(self, build: Callable[[], EngineParts]) -> None:
        self.counters = {
            "prompt_tokens_total": 0,
            "generation_tokens_total": 0,
            "requests_total": 0,
            "steps": 0,
            "multi_step_launches": 0,
            # host time of multi-step launches (schedule, load, replay, hand out tokens), without the
            # wait for the device: divided by launches x steps, the host cost of a decode step
            "multi_step_host_us": 0,
        }
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._by_id: dict[str, Request] = {}
        self.unfinished = 0  # submitted and not yet finished (read by any thread for admission control)
        self._count_lock = threading.Lock()
        self._stop = threading.Event()
        self._ready: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(build,), name="sgjit-engine", daemon=True)
        self._thread.start()
        self._ready.result()  # re-raises a load failure in the caller
        _live_engines.add(self)

    def _attach(self, parts: EngineParts) -> None:
        self.runner = parts.runner
        self.scheduler = parts.scheduler
        self.sampler = parts.sampler
        self.tokenizer = parts.tokenizer
        self.eos_token_ids = parts.eos_token_ids
        self.max_model_len = parts.max_model_len
        self.output = OutputProcessor(
            parts.tokenizer, parts.eos_token_ids, parts.max_model_len, parts.sampler.vocab_size
        )
        self.multi_step_off = False  # set when multi-step launches fail where single steps do not
        self.pool: PagedKVPool = parts.scheduler.pool
        self.cache: RadixCache = parts.scheduler.cache

    # ----- called from any thread -----
    def submit(self, req: Request) -> None:
        self.submit_batch([req])

    def submit_batch(self, reqs: list[Request]) -> None:
        """Requests handed over together reach the scheduler in the same step, so requests over one
        cached prefix (a select's choices) share a forward pass."""
        with self._count_lock:
            self.unfinished += len(reqs)
        self._inbox.put(("submit", reqs))

    def abort(self, rid: str) -> None:
        self._inbox.put(("abort", rid))

    def release(self, handle: PrefixHandle) -> None:
        self._inbox.put(("release", handle))

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the engine thread between steps and return its result."""
        fut: Future = Future()
        self._inbox.put(("call", (fn, fut)))
        return fut.result()

    def shutdown(self) -> None:
        _live_engines.discard(self)
        self._stop.set()
        self._inbox.put(("wake", None))
        self._thread.join(timeout=10)

    # ----- engine thread -----
    def _run(self, build: Callable[[], EngineParts]) -> None:
        torch.set_grad_enabled(False)
        try:
            self._attach(build())
        except BaseException as e:  # noqa: BLE001 - handed to the constructor's caller
            self._ready.set_exception(e)
            return
        self._ready.set_result(None)
        try:
            self._loop()
        finally:
            self.runner.close()  # tensor parallel: the other ranks leave their loops too

    def _loop(self) -> None:
        while not self._stop.is_set():
            block = not self.scheduler.has_work()
            self._drain(block)
            if self._stop.is_set():
                break
            if self.scheduler.has_work():
                self.step()

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(block=block)
        except queue.Empty:
            return
        while True:
            self._handle(*item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, arg: Any) -> None:
        if kind == "submit":
            for req in arg:
                self._by_id[req.rid] = req
                self.scheduler.add(req)
                self.counters["requests_total"] += 1
                self.counters["prompt_tokens_total"] += req.prompt_len
        elif kind == "abort":
            req = self._by_id.get(arg)
            if req is not None:
                self._finish(req, FinishReason.abort("aborted"), error=RequestAbortedError(f"{arg} aborted"))
        elif kind == "release":
            self.pool.allocator.decref(arg.pages)
            arg.pages = []
        elif kind == "call":
            fn, fut = arg
            try:
                fut.set_result(fn())
            except Exception as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

    def step(self) -> None:
        if self.runner.multi_steps > 1 and not self.multi_step_off and self._try_multi_step():
            return
        batch = self.scheduler.schedule()
        if batch is None:
            if self.scheduler.waiting and not self.scheduler.running:
                self._fail_unschedulable()
            else:
                time.sleep(0.001)
            return
        self.counters["steps"] += 1
        try:
            with nvtx_range(f"step rows={len(batch.rows)} tokens={batch.num_tokens}"):
                self._forward_and_process(batch.rows)
        except TensorParallelError as e:  # the group is gone (and logged): no rerun can succeed
            self._fail_rows(batch.rows, e)
        except Exception as e:  # noqa: BLE001 - one bad request must not stop the engine or its batch
            if len(batch.rows) == 1:
                log.exception("request %s failed in a forward step", batch.rows[0].req.rid)
                self._finish(batch.rows[0].req, FinishReason.abort(str(e)), error=e)
                return
            log.warning("a step of %d rows failed (%s); rerunning them one by one", len(batch.rows), e)
            self._isolate(batch.rows)

    def _forward_and_process(self, rows: list[RowChunk]) -> None:
        self._process(rows, self.runner.forward(rows))

    def _isolate(self, rows: list[RowChunk]) -> int:
        """Rerun a failed step's rows alone, so only the request that fails again ends (with its
        error) and the others advance. Safe to rerun: no token was appended before the failure
        (token-level errors are caught per request in `_process`), a row rewrites the same KV
        entries with the same values, and prompt logprobs already recorded are not asked again
        (`next_input_logprob`). Returns how many rows failed again."""
        failed = 0
        for row in rows:
            if row.req.status is Status.FINISHED:
                continue
            try:
                self._forward_and_process([row])
            except Exception as e:  # noqa: BLE001 - this request is the culprit
                log.exception("request %s failed in a forward step", row.req.rid)
                self._finish(row.req, FinishReason.abort(str(e)), error=e)
                failed += 1
        return failed

    def _multi_step_ok(self, req: Request) -> bool:
        """Rows the device can finish on its own between host syncs: greedy, or sampled where the
        sampling op runs on the device, and no host decision (stop string or regex, logit bias, grammar, penalty, logprobs,
        min-token block) needed between tokens."""
        p = req.params
        return (
            (p.is_greedy or self.runner.samples_on_device) and not p.needs_host_per_token and req.grammar is None and not req.return_logprob
            and not p.has_penalties and req.num_output >= p.min_new_tokens
        )  # fmt: skip

    def _budget(self, req: Request) -> int:
        remaining = min(req.params.max_new_tokens - req.num_output, self.max_model_len - len(req.tokens))
        return max(1, min(self.runner.multi_steps, remaining))

    def _try_multi_step(self) -> bool:
        running = self.scheduler.running
        if not running or self.scheduler.waiting or not all(self._multi_step_ok(r) for r in running):
            return False
        t0 = time.perf_counter()
        batch = self.scheduler.schedule_decode_ahead(self._budget)
        if batch is None:
            return False
        budgets = [self._budget(r.req) for r in batch.rows]
        stop_on_eos = [not r.req.params.ignore_eos for r in batch.rows]
        try:
            reqs = [r.req for r in batch.rows]
            # all greedy (the common case): the graph takes the argmax and needs no sampling rows
            sampling = None if all(r.params.is_greedy for r in reqs) else RowSampling.of(reqs)
            out = self.runner.forward_multi(
                batch.rows, budgets, stop_on_eos, sampling, self.sampler.generator
            )
        except TensorParallelError as e:
            self._fail_rows(batch.rows, e)
            return True
        except Exception as e:  # noqa: BLE001 - one bad batch must not stop the engine
            # No token was handed out: the rows rerun as single steps, where only a request that
            # fails again ends. If none does, the fault is the multi-step path's: it is turned off.
            log.warning(
                "multi-step decode of %d rows failed (%s); rerunning them one by one", len(batch.rows), e
            )
            if self._isolate(batch.rows) == 0:
                log.error("multi-step decode fails where single steps do not; turning it off", exc_info=e)
                self.multi_step_off = True
            return True
        if out is None:
            return False
        self.counters["steps"] += self.runner.multi_steps
        self.counters["multi_step_launches"] += 1
        now = time.monotonic()
        for row, toks, budget in zip(batch.rows, out, budgets):
            req = row.req
            for j, tok in enumerate(toks[:budget]):
                req.num_computed = row.start + j + 1  # the KV of step j's input token is in the pool now
                self._append_token(req, tok, now)
                if req.status is Status.FINISHED:
                    break
        host = time.perf_counter() - t0 - self.runner.graphs.last_wait_seconds
        self.counters["multi_step_host_us"] += int(host * 1e6)
        return True

    def _fail_rows(self, rows: list[RowChunk], error: Exception) -> None:
        for row in rows:
            self._finish(row.req, FinishReason.abort(str(error)), error=error)

    def _fail_unschedulable(self) -> None:
        req = self.scheduler.waiting.popleft()
        err = SgjitError(f"request {req.rid} needs more KV pages than the pool can ever free")
        self.scheduler.waiting.appendleft(req)
        self._finish(req, FinishReason.abort(str(err)), error=err)

    def _process(self, rows: list[RowChunk], out: StepLogits) -> None:
        for b, (first_row, first_pos, count) in out.prompt_index.items():
            self.output.record_input_logprobs(
                rows[b].req, out.logits[first_row : first_row + count], first_pos
            )
        sampled_rows = []
        for b, row in enumerate(rows):
            req = row.req
            req.num_computed = row.end
            if row.end - row.start > 1:  # a prefill chunk: its full pages serve requests waiting on them
                self.scheduler.cache_computed(req)
            if row.sample:
                sampled_rows.append(b)
            elif req.pending == 0 and not req.wants_tokens:
                self._finish(req, FinishReason.at_length(req.params.max_new_tokens))
        if not sampled_rows:
            return
        reqs = [rows[b].req for b in sampled_rows]
        logits = out.logits[[out.sample_index[b] for b in sampled_rows]]
        logits = self.sampler.process_logits(logits, reqs, self.eos_token_ids)
        tokens = self.sampler.sample(logits, reqs)
        self.output.record_output_logprobs(reqs, logits, tokens)
        now = time.monotonic()
        for req, tok in zip(reqs, tokens):
            try:
                self._append_token(req, tok, now)
            except Exception as e:  # noqa: BLE001 - e.g. a grammar failure ends only its request
                log.exception("request %s failed", req.rid)
                self._finish(req, FinishReason.abort(str(e)), error=e)

    def _append_token(self, req: Request, tok: int, now: float) -> None:
        self.counters["generation_tokens_total"] += 1
        if req.first_token_time is None:
            req.first_token_time = now
        finish = self.output.accept(req, tok)
        if finish is not None:
            self._finish(req, finish)
        else:
            self.output.stream(req)

    def _finish(self, req: Request, reason: FinishReason, error: Exception | None = None) -> None:
        if req.status is Status.FINISHED:
            return
        req.finish_reason = reason
        handle = None
        if req.hold_prefix and error is None:
            full = (req.num_computed // self.pool.page_size) * self.pool.page_size
            pages = req.pages[: full // self.pool.page_size]
            self.pool.allocator.incref(pages)
            handle = PrefixHandle(req.tokens[:full], pages)
        self.scheduler.release_handle(req)
        self.scheduler.remove(req)
        req.status = Status.FINISHED
        with self._count_lock:
            self.unfinished -= 1
        self._by_id.pop(req.rid, None)
        self.output.finish(req, error, handle)

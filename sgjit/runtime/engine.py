"""The engine loop: one thread that owns the model, the KV pool, the prefix cache and the scheduler.
Other threads talk to it only through its inbox (submit, abort, flush, release, queries), so none of
that state needs a lock.

A step is launched (`_launch`: schedule, build, queue the forward pass and the sampling) and later
completed (`_complete`: read the tokens back, decide what the ids decide, hand them to the output
thread). With overlap scheduling the next step is launched before the last one is completed: while
the device runs step N the host plans and queues step N+1, whose decode rows read step N's tokens
on the device (futures.py), and only then waits for step N. Rows whose next step needs their
previous token on the host — grammars, penalties — turn the overlap off while they run."""

from __future__ import annotations

import atexit
import logging
import queue
import sys
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
from sgjit.runtime.launch import InputLogprobs, Launch, LaunchFailed
from sgjit.runtime.logprobs import DeviceLogprobs, HostLogprobs
from sgjit.runtime.model_runner import ModelRunner
from sgjit.runtime.output import OutputProcessor, TokenUpdate
from sgjit.runtime.output_thread import OutputThread
from sgjit.runtime.radix_cache import RadixCache
from sgjit.runtime.request import PrefixHandle, Request, Status
from sgjit.runtime.result import FinishReason
from sgjit.runtime.sampler import RowSampling, Sampler
from sgjit.runtime.scheduler import RowChunk, ScheduledBatch, Scheduler
from sgjit.runtime.token_finish import first_finish
from sgjit.runtime.tokenizer import Tokenizer
from sgjit.runtime.transfer import PinnedBuffers, Readback, to_device
from sgjit.settings import env

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
    overlap: bool = False  # launch step N+1 before reading step N back (RuntimeConfig.overlap_schedule)


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
            # engine-thread time of multi-step launches (schedule, load, replay, read back, decide
            # finishes, queue the tokens for the output thread), without waits for the device or
            # graph captures: divided by launches x steps, the host cost of a decode step
            "multi_step_host_us": 0,
            "overlapped_launches": 0,  # launched while the step before was still on the device
        }
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._by_id: dict[str, Request] = {}
        self.unfinished = 0  # submitted and not yet finished (read by any thread for admission control)
        self._count_lock = threading.Lock()
        self._stop = threading.Event()
        self._ready: Future = Future()
        _shorten_gil_waits()
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
        self.overlap = parts.overlap
        self.output = OutputThread(OutputProcessor(parts.tokenizer), self._output_failed)
        # hand-out runs while the engine waits for the device (on a CPU the engine computes the step
        # itself, so holding would only delay the tokens a step)
        self.output.hold = self.overlap and self.runner.device.type != "cpu"
        self.multi_step_off = False  # set when multi-step launches fail where single steps do not
        self.pool: PagedKVPool = parts.scheduler.pool
        self.cache: RadixCache = parts.scheduler.cache
        self._inflight: Launch | None = None
        self._host_bound = 0  # unfinished requests whose sampling reads their tokens on the host
        self._multi_ok: set[Request] = set()  # unfinished requests known to pass `_multi_step_ok`
        self._pinned = PinnedBuffers()  # what launches read back into

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
        if hasattr(self, "output"):
            self.output.stop()

    def _output_failed(self, req: Request, error: Exception) -> None:
        """Output thread: handing out `req`'s tokens raised; the engine ends it with that error."""
        self._inbox.put(("fail", (req, error)))

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

    def _has_work(self) -> bool:
        return self._inflight is not None or self.scheduler.has_work()

    def _loop(self) -> None:
        while not self._stop.is_set():
            idle = not self._has_work()
            if idle:
                self.output.flush()
            self._drain(block=idle)
            if self._stop.is_set():
                break
            if self._has_work():
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
                p = req.params
                req.stop_ids = p.finishing_ids(self.eos_token_ids)
                self._host_bound += req.grammar is not None or p.has_penalties
                self._by_id[req.rid] = req
                self.scheduler.add(req)
                self.counters["requests_total"] += 1
                self.counters["prompt_tokens_total"] += req.prompt_len
        elif kind == "abort":
            req = self._by_id.get(arg)
            if req is not None:
                self._finish(req, FinishReason.abort("aborted"), error=RequestAbortedError(f"{arg} aborted"))
        elif kind == "fail":
            req, error = arg
            self._finish(req, FinishReason.abort(str(error)), error=error)
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
        """Launch the next step and complete the one before it: overlapped (launch, then complete the
        previous) when allowed, else in turn."""
        prev, self._inflight = self._inflight, None
        launch = None
        if prev is None or (self.overlap and self._host_bound == 0):
            launch = self._try_launch(prev)
            if launch is not None and prev is not None:
                self.counters["overlapped_launches"] += 1
        if prev is not None and not prev.completed:
            self._complete(prev)
        if launch is None:
            launch = self._try_launch(None) if prev is not None else None
            if launch is None:
                if prev is None:
                    self._idle()
                return
        if self.overlap:
            self._inflight = launch
        else:
            self._complete(launch)

    def _idle(self) -> None:
        """Nothing could be scheduled and nothing is in flight."""
        if self.scheduler.waiting and not self.scheduler.running:
            self._fail_unschedulable()
        else:
            self.output.flush()
            time.sleep(0.001)

    def _try_launch(self, prev: Launch | None) -> Launch | None:
        try:
            return self._launch()
        except LaunchFailed as f:
            if prev is not None and not prev.completed:
                self._complete(prev)  # the rows' inputs must be real tokens before they rerun
            self._recover(f)
            return None

    def _launch(self) -> Launch | None:
        if self.runner.multi_steps > 1 and not self.multi_step_off:
            launch = self._launch_multi()
            if launch is not None:
                return launch
        batch = self.scheduler.schedule()
        if batch is None:
            return None
        self.counters["steps"] += 1
        try:
            with nvtx_range(lambda: _step_name(batch)):
                return self._launch_rows(batch.rows)
        except Exception as e:  # noqa: BLE001 - one bad request must not stop the engine or its batch
            raise LaunchFailed(batch.rows, e, multi=False) from e

    def _recover(self, f: LaunchFailed) -> None:
        if isinstance(f.error, TensorParallelError):  # the group is gone (and logged): no rerun can succeed
            self._fail_rows(f.rows, f.error)
        elif f.multi:
            # No token was handed out: the rows rerun as single steps, where only a request that
            # fails again ends. If none does, the fault is the multi-step path's: it is turned off.
            log.warning(
                "multi-step decode of %d rows failed (%s); rerunning them one by one", len(f.rows), f.error
            )
            if self._isolate(f.rows) == 0:
                log.error(
                    "multi-step decode fails where single steps do not; turning it off", exc_info=f.error
                )
                self.multi_step_off = True
        elif len(f.rows) == 1:
            log.error("request %s failed in a forward step", f.rows[0].req.rid, exc_info=f.error)
            self._finish(f.rows[0].req, FinishReason.abort(str(f.error)), error=f.error)
        else:
            log.warning("a step of %d rows failed (%s); rerunning them one by one", len(f.rows), f.error)
            self._isolate(f.rows)

    def _isolate(self, rows: list[RowChunk]) -> int:
        """Rerun a failed launch's rows alone, so only the request that fails again ends (with its
        error) and the others advance. Safe to rerun: nothing of the failed launch was committed, a
        row rewrites the same KV entries with the same values, and prompt logprobs already recorded
        are not asked again (`next_input_logprob`). Returns how many rows failed again."""
        failed = 0
        for row in rows:
            if row.req.status is Status.FINISHED:
                continue
            try:
                launch = self._launch_rows([row])
            except Exception as e:  # noqa: BLE001 - this request is the culprit
                log.exception("request %s failed in a forward step", row.req.rid)
                self._finish(row.req, FinishReason.abort(str(e)), error=e)
                failed += 1
                continue
            self._complete(launch)
        return failed

    # ----- launching -----
    def _launch_rows(self, rows: list[RowChunk]) -> Launch:
        """Queue one step's forward pass, logprobs and sampling, then commit its bookkeeping: KV
        counts, prefix-cache entries, and a placeholder token for every row that samples."""
        t0 = time.perf_counter()
        compute0, capture0 = self.runner.cpu_compute_seconds, self.runner.capture_seconds
        out = self.runner.forward(rows)
        dev, vocab = out.logits.device, self.sampler.vocab_size
        launch = Launch(
            rows, [b for b, r in enumerate(rows) if r.sample], [], [], False, Readback([], self._pinned)
        )
        for b, (first_row, first_pos, count) in out.prompt_index.items():
            req = rows[b].req
            lps = torch.log_softmax(out.logits[first_row : first_row + count, :vocab], dim=-1)
            targets = to_device(req.tokens[first_pos + 1 : first_pos + 1 + count], torch.int64, dev)
            values = DeviceLogprobs.of(lps, targets, req.top_logprobs_num)
            launch.input_logprobs.append(InputLogprobs(b, first_pos, values, req.next_input_logprob == 0))
        tensors = []
        if launch.sampled:
            reqs = [rows[b].req for b in launch.sampled]
            idx = to_device([out.sample_index[b] for b in launch.sampled], torch.int64, dev)
            logits = self.sampler.process_logits(out.logits.index_select(0, idx), reqs, self.eos_token_ids)
            tokens = self.sampler.sample(logits, reqs)
            self.runner.futures.publish(tokens)
            tensors.append(tokens)
            want = [j for j, r in enumerate(reqs) if r.logprobs is not None]
            if want:
                lps = torch.log_softmax(logits.index_select(0, to_device(want, torch.int64, dev)), dim=-1)
                for i, j in enumerate(want):
                    launch.output_logprobs[j] = DeviceLogprobs.of(
                        lps[i : i + 1], tokens[j : j + 1], reqs[j].top_logprobs_num
                    )
        tensors += [t for lp in launch.input_logprobs for t in lp.values.tensors()]
        tensors += [t for lp in launch.output_logprobs.values() for t in lp.tensors()]
        launch.readback = Readback(tensors, self._pinned)
        # committed: nothing below raises
        for lp in launch.input_logprobs:
            req = rows[lp.row].req
            req.next_input_logprob = lp.first_pos + 1 + lp.values.chosen.shape[0]
        for row in rows:
            row.req.num_computed = row.end
            if row.end - row.start > 1:  # a prefill chunk: its full pages serve requests waiting on them
                self.scheduler.cache_computed(row.req)
        for i, b in enumerate(launch.sampled):
            req = rows[b].req
            launch.bases.append(len(req.tokens))
            launch.counts.append(1)
            req.tokens.append(self.runner.futures.placeholder(0, i))
        launch.host_seconds = self._host_time(t0, compute0, capture0)
        return launch

    def _multi_step_ok(self, req: Request) -> bool:
        """Rows the device can run on its own between host syncs: greedy, or sampled where the
        sampling op runs on the device, and nothing applied to the logits on the host (logit bias,
        grammar, penalty, logprobs, min-token block). Stop tokens and stop strings are checked when
        the launch is read back; tokens past them are trimmed."""
        p = req.params
        return (
            (p.is_greedy or self.runner.samples_on_device) and not p.logit_bias and req.grammar is None
            and not req.return_logprob and not p.has_penalties and req.num_output >= p.min_new_tokens
        )  # fmt: skip

    def _all_multi_step_ok(self, running: list[Request]) -> bool:
        """`_multi_step_ok` of every running row. A request that passes it passes until it finishes (its
        parameters stay, and the one condition that changes, the tokens it has drawn, only grows),
        so each is asked until it passes, not at every launch."""
        for req in running:
            if req not in self._multi_ok:
                if not self._multi_step_ok(req):
                    return False
                self._multi_ok.add(req)
        return True

    def _budget(self, req: Request) -> int:
        remaining = min(req.params.max_new_tokens - req.num_output, self.max_model_len - len(req.tokens))
        return max(1, min(self.runner.multi_steps, remaining))

    def _launch_multi(self) -> Launch | None:
        running = self.scheduler.running
        if not running or self.scheduler.waiting or not self._all_multi_step_ok(running):
            return None
        t0 = time.perf_counter()
        compute0, capture0 = self.runner.cpu_compute_seconds, self.runner.capture_seconds
        batch = self.scheduler.schedule_decode_ahead(self._budget)
        if batch is None:
            return None
        rows, budgets = batch.rows, batch.ahead  # each row's budget, as the scheduler reserved pages for it
        reqs = [r.req for r in rows]
        stop_on_eos = [not req.params.ignore_eos for req in reqs]
        try:
            # all greedy (the common case): the graph takes the argmax and needs no sampling rows
            sampling = None if all(req.params.is_greedy for req in reqs) else RowSampling.of(reqs)
            with nvtx_range(lambda: f"multi rows={len(rows)} steps={self.runner.multi_steps}"):
                out = self.runner.forward_multi(rows, budgets, stop_on_eos, sampling, self.sampler.generator)
        except Exception as e:  # noqa: BLE001 - one bad batch must not stop the engine
            raise LaunchFailed(rows, e, multi=True) from e
        if out is None:
            return None
        launch = Launch(rows, list(range(len(rows))), budgets, [], True, Readback([out], self._pinned))
        futures = self.runner.futures
        for i, (row, budget) in enumerate(zip(rows, budgets)):
            req = row.req
            launch.bases.append(len(req.tokens))
            req.tokens.extend(futures.placeholders(i, budget))
            req.num_computed = row.start + budget  # the KV of every input but the last token drawn
        self.counters["steps"] += self.runner.multi_steps
        self.counters["multi_step_launches"] += 1
        launch.host_seconds = self._host_time(t0, compute0, capture0)
        return launch

    def _host_time(self, t0: float, compute0: float, capture0: float) -> float:
        """Engine-thread time since `t0`, less what was the model computing on the CPU (there the
        host is the device) or a first launch's graph capture."""
        compute = self.runner.cpu_compute_seconds - compute0
        capture = self.runner.capture_seconds - capture0
        return time.perf_counter() - t0 - compute - capture

    # ----- completing -----
    def _complete(self, launch: Launch) -> None:
        """Read a launch's tokens back, put them in place of its placeholders, finish the rows that
        end (by id here; by a stop string once the output thread has looked), and hand the tokens
        to the output thread."""
        launch.completed = True
        self.output.flush()  # the launches before this one are handed out while it is waited for
        t0 = time.perf_counter()
        host = iter(launch.readback.wait())
        drawn: list[list[int]] = []  # each sampled row's tokens (a multi-step launch's: a column)
        if launch.sampled:
            tokens = next(host).tolist()
            drawn = [list(column) for column in zip(*tokens)] if launch.multi else [[t] for t in tokens]
        inputs = {
            lp.row: (lp.first_pos, HostLogprobs.read(lp.values, host), lp.with_first)
            for lp in launch.input_logprobs
        }
        outputs = {j: HostLogprobs.read(lp, host) for j, lp in launch.output_logprobs.items()}
        launch.readback.release()  # everything read back is now in Python values
        sampled = dict(zip(launch.sampled, range(len(launch.sampled))))
        generated = 0
        updates: list[TokenUpdate] = []
        ended: list[tuple[Request, FinishReason, Exception | None]] = []
        text_rows: list[tuple[Request, FinishReason | None]] = []
        now = time.monotonic()
        for b, row in enumerate(launch.rows):
            req = row.req
            if req.status is Status.FINISHED:
                continue
            j = sampled.get(b)
            if j is None:  # a prefill chunk that does not sample yet
                if b in inputs:
                    updates.append(TokenUpdate(req, [], input_logprobs=inputs[b]))
                if req.pending == 0 and not req.wants_tokens:
                    ended.append((req, FinishReason.at_length(req.params.max_new_tokens), None))
                continue
            base, count, got = launch.bases[j], launch.counts[j], drawn[j]
            if count < len(got):  # the row's budget ran out before the launch's last step
                got = got[:count]
            req.tokens[base : base + count] = got
            try:
                end, reason = first_finish(req, base, got, self.max_model_len)
            except Exception as e:  # noqa: BLE001 - e.g. a grammar failure ends only its request
                log.exception("request %s failed", req.rid)
                ended.append((req, FinishReason.abort(str(e)), e))
                continue
            if end is not None:
                got = got[: end + 1]
                self._trim(req, base + end)
            generated += len(got)
            if req.first_token_time is None:
                req.first_token_time = now
            updates.append(TokenUpdate(req, got, reason, inputs.get(b), outputs.get(j)))
            if req.has_text_stops:
                text_rows.append((req, reason))
            elif reason is not None:
                ended.append((req, reason, None))
        self.counters["generation_tokens_total"] += generated
        self.output.deliver(updates)
        waited = launch.readback.wait_seconds
        if text_rows:
            t = time.perf_counter()
            self.output.barrier()  # the output thread has looked for stop strings in these tokens
            waited += time.perf_counter() - t
            for req, reason in text_rows:
                if req.text_stop is not None:
                    index, reason = req.text_stop
                    self._trim(req, index)
                if reason is not None:
                    ended.append((req, reason, None))
        for req, reason, error in ended:
            self._finish(req, reason, error)
        launch.host_seconds += time.perf_counter() - t0 - waited
        if launch.multi:
            self.counters["multi_step_host_us"] += int(launch.host_seconds * 1e6)

    def _trim(self, req: Request, last: int) -> None:
        """The request ends with its token at index `last`: later ones (the rest of a multi-step
        launch, placeholders of the launch in flight) go, and the KV of `last` itself does not
        count as computed (as when a single step ends a request)."""
        del req.tokens[last + 1 :]
        req.num_computed = min(req.num_computed, last)

    def _fail_rows(self, rows: list[RowChunk], error: Exception) -> None:
        for row in rows:
            self._finish(row.req, FinishReason.abort(str(error)), error=error)

    def _fail_unschedulable(self) -> None:
        req = self.scheduler.waiting.popleft()
        err = SgjitError(f"request {req.rid} needs more KV pages than the pool can ever free")
        self.scheduler.waiting.appendleft(req)
        self._finish(req, FinishReason.abort(str(err)), error=err)

    def _finish(self, req: Request, reason: FinishReason, error: Exception | None = None) -> None:
        if req.status is Status.FINISHED:
            return
        # an abort while a launch is in flight: its placeholders are no tokens of the result
        while len(req.tokens) > req.prompt_len and req.tokens[-1] < 0:
            req.tokens.pop()
        req.num_computed = min(req.num_computed, len(req.tokens))
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
        self._host_bound -= req.grammar is not None or req.params.has_penalties
        self._multi_ok.discard(req)
        with self._count_lock:
            self.unfinished -= 1
        self._by_id.pop(req.rid, None)
        self.output.finish(req, error, handle)


def _shorten_gil_waits() -> None:
    """The process's GIL switch interval to SGJIT_SWITCH_INTERVAL_US (see sgjit.settings). The engine
    thread gives the GIL up at every launch and copy; with Python's 5 ms, each time another thread
    (HTTP streaming, the output thread) holds it, getting it back can take that long."""
    us = env().switch_interval_us
    if us > 0 and sys.getswitchinterval() > us / 1e6:
        sys.setswitchinterval(us / 1e6)


def _step_name(batch: ScheduledBatch) -> str:
    """An eager step's range name: its decode rows and prefill tokens (read by bench.trace_summary)."""
    sizes = [r.end - r.start for r in batch.rows]
    return f"step decode={sizes.count(1)} prefill={sum(n for n in sizes if n > 1)}"

"""`RuntimeBackend`: prompt programs on an in-process `Runtime`.

A program's sequence is a chain of engine requests. Each request holds its computed pages
(`hold_prefix`) and the next one releases that hold once it is admitted (`release_on_admit`), by
which time the radix cache has matched those pages into it: the program's KV stays resident between
steps without the engine knowing about programs."""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from sgjit.compiler.jit import PlanJit
from sgjit.errors import ProgramError, RequestAbortedError
from sgjit.lang.backend import GenOutput, GenStep, OnText, ProgramSequence
from sgjit.runtime.output import stream_meta_info
from sgjit.runtime.request import PrefixHandle, Request
from sgjit.runtime.result import LogprobEntry, RequestUpdate
from sgjit.runtime.runtime import Runtime
from sgjit.runtime.sampling_params import SamplingParams

if TYPE_CHECKING:
    from sgjit.compiler.compiled import CompiledPlan
    from sgjit.compiler.plan import GraphPlan
    from sgjit.lang.function import Function

log = logging.getLogger(__name__)


class RunAbort:
    """Stops one program run from another thread (the server's, when its client disconnects or the
    drain times out): the engine requests of its sequences that are running are aborted, and any
    step after that fails at once with `RequestAbortedError`, so the program ends without running on."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self.aborted = False

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            running = list(self._running)
        for rid in running:
            self._rt.abort(rid)

    def submit(self, req: Request, sink: Any) -> None:
        """`runtime.submit`, unless the run has been aborted."""
        with self._lock:
            if self.aborted:
                raise RequestAbortedError("the program run was aborted")
            self._running.add(req.rid)
        self._rt.submit(req, sink)
        if self.aborted:  # aborted between the check and the engine seeing the request
            self._rt.abort(req.rid)

    def finished(self, req: Request) -> None:
        with self._lock:
            self._running.discard(req.rid)


class RuntimeSequence:
    def __init__(
        self,
        runtime: Runtime,
        handle: PrefixHandle | None = None,
        protected: bool = False,
        abort: RunAbort | None = None,
    ) -> None:
        self._rt = runtime
        self._handle = handle  # pages of the last step, held for the next
        self._protected = protected  # a compiled plan's run: its steps are never preempted for others
        self._abort = abort

    def prefill(self, input_ids: list[int]) -> None:
        self.generate(GenStep(input_ids, SamplingParams(max_new_tokens=0)))

    def generate(self, step: GenStep, on_text: OnText | None = None) -> GenOutput:
        req = self._rt.make_request(
            step.input_ids, step.params, **step.logprob_options(), hold_prefix=True,
            release_on_admit=self._handle, protected=self._protected,
        )  # fmt: skip
        updates: queue.SimpleQueue[RequestUpdate] = queue.SimpleQueue()
        if self._abort is not None:
            self._abort.submit(req, updates.put)
        else:
            self._rt.submit(req, updates.put)
        self._handle = None  # the engine releases it when the request is admitted (or fails)
        streamed = sent = 0  # output tokens so far; of them, those whose logprobs went out with text
        while True:
            update = updates.get()
            streamed += len(update.token_ids)
            if update.text and on_text is not None:
                on_text(update.text, stream_meta_info(req, streamed, sent))
                sent = streamed
            if update.finished:
                break
        if self._abort is not None:
            self._abort.finished(req)
        if update.error is not None:
            raise update.error
        self._handle = update.handle
        assert update.result is not None
        return GenOutput(update.result.text, update.result.meta_info())

    def score(self, prompts: list[list[int]], starts: list[int]) -> list[list[LogprobEntry]]:
        if self._abort is not None and self._abort.aborted:  # scoring is one short prefill: not tracked
            raise RequestAbortedError("the program run was aborted")
        reqs = [
            self._rt.make_request(p, {"max_new_tokens": 0}, return_logprob=True, logprob_start_len=s)
            for p, s in zip(prompts, starts)
        ]
        results = self._rt.run_requests(reqs)
        return [r.logprobs.input_token_logprobs for r in results]  # type: ignore[union-attr]

    def fork(self) -> RuntimeSequence:
        handle = self._rt.share_prefix(self._handle) if self._handle is not None else None
        return RuntimeSequence(self._rt, handle, self._protected, self._abort)

    def close(self) -> None:
        if self._handle is not None:
            self._rt.release(self._handle)
            self._handle = None


class RuntimeBackend:
    """The backend of one `Runtime`; `RuntimeBackend.of(runtime)` gives the same object every time.
    It owns the runtime's plan JIT (when `plan_jit` is on) and refers to its runtime weakly, so a
    runtime nobody uses any more is freed with its backend."""

    _by_runtime: weakref.WeakKeyDictionary[Runtime, RuntimeBackend] = weakref.WeakKeyDictionary()
    _lock = threading.Lock()

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = weakref.ref(runtime)
        self._functions: dict[str, Function] = {}
        cfg = runtime.config
        self.jit = PlanJit(runtime, cfg.jit_cache_limit, cfg.jit_arg_budget) if cfg.use_plan_jit else None

    @property
    def runtime(self) -> Runtime:
        runtime = self._runtime()
        if runtime is None:
            raise ProgramError("the Runtime behind this backend no longer exists; pass a live sgjit.Runtime")
        return runtime

    @classmethod
    def of(cls, runtime: Runtime) -> RuntimeBackend:
        with cls._lock:
            backend = cls._by_runtime.get(runtime)
            if backend is None:
                backend = cls._by_runtime[runtime] = cls(runtime)
            return backend

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.runtime.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.runtime.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt
        )

    def unconditional_prefix(self) -> list[int]:
        tok = self.runtime.tokenizer
        return [tok.bos_token_id] if tok.bos_token_id is not None else [tok.eos_token_ids[0]]

    def open_sequence(self, protected: bool = False) -> ProgramSequence:
        return RuntimeSequence(self.runtime, protected=protected)

    def abortable(self, abort: RunAbort) -> AbortableBackend:
        """This backend for one run that `abort` can stop."""
        return AbortableBackend(self, abort)

    def compile(self, plan: GraphPlan) -> CompiledPlan | None:
        """The runtime's compiled plan (None when its JIT is off: the plan then runs uncompiled)."""
        return self.jit.compile(plan) if self.jit is not None else None

    def clear_jit_cache(self) -> int:
        """Drop every compiled plan (unpinning their prefixes); returns how many."""
        return self.jit.clear() if self.jit is not None else 0

    def flush_cache(self) -> int:
        return self.runtime.flush_cache()

    def get_server_info(self) -> dict[str, Any]:
        rt = self.runtime
        return {"model_path": str(rt.model_path), "device": str(rt.device), "max_model_len": rt.max_model_len,
                "config": asdict(rt.config), "stats": {**rt.stats(), **self.jit_counters()}}  # fmt: skip

    def jit_counters(self) -> dict[str, float]:
        """The JIT's counters (compiles, hits, evictions, ...); empty with the JIT off."""
        return self.jit.counters() if self.jit is not None else {}

    def register_function(self, function: Function) -> None:
        self._functions[function.name] = function

    def lookup_function(self, name: str) -> Function | None:
        return self._functions.get(name)

    def invalidate_plan(self, plan_hash: str) -> None:
        dropped = self.jit.invalidate(plan_hash) if self.jit is not None else 0
        log.debug("plan %s invalidated (%d compiled entries dropped)", plan_hash, dropped)


class AbortableBackend:
    """A `RuntimeBackend` whose sequences answer to one `RunAbort`; everything else is the backend's."""

    def __init__(self, backend: RuntimeBackend, abort: RunAbort) -> None:
        self._backend = backend
        self.run_abort = abort

    def open_sequence(self, protected: bool = False) -> ProgramSequence:
        return RuntimeSequence(self._backend.runtime, protected=protected, abort=self.run_abort)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

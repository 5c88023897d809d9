"""`Runtime`: the in-process backend. Loads a model, starts the engine thread, and offers SGLang's
`Engine.generate` signature plus `chat`, `stats` and `flush_cache`."""

from __future__ import annotations

import contextlib
import logging
import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sgjit.errors import ContextLengthError, InvalidRequestError, ServerBusyError, VocabularyError
from sgjit.runtime.assembly import assemble
from sgjit.runtime.config import RuntimeConfig
from sgjit.runtime.engine import Engine, EngineParts
from sgjit.runtime.parallel.launch import RankSet, start_ranks
from sgjit.runtime.profiling import TraceWindow
from sgjit.runtime.request import PrefixHandle, Request, new_request_id
from sgjit.runtime.result import GenerateResult, RequestUpdate
from sgjit.runtime.sampling_params import SamplingParams, samples_per_prompt
from sgjit.runtime.tokenizer import IncrementalDetokenizer

log = logging.getLogger(__name__)

# More characters than any real tokenizer packs into one token on average (BPE vocabularies of
# English text average ~4; the longest merges of whitespace or repeated symbols reach ~16-32 only as
# single tokens, never as a whole prompt's mean). A prompt over max_model_len times this many
# characters therefore cannot fit, and is refused without spending seconds tokenizing megabytes.
CHARS_PER_TOKEN_BOUND = 32


class Runtime:
    """A model served in this process. `Runtime()` loads the bundled SmolLM2-135M-Instruct on the GPU
    if there is one, else on the CPU."""

    def __init__(
        self, model: str | Path | None = None, device: str = "auto", dtype: str | None = None, **options: Any
    ):
        self.config = RuntimeConfig.from_kwargs(
            model=None if model is None else str(model), device=device, dtype=dtype, **options
        )
        t0 = time.perf_counter()
        self._ranks: RankSet | None = None  # tensor parallel: the other ranks, once started
        self.engine = Engine(self._build)
        self.load_seconds = time.perf_counter() - t0
        mc = self.model_config
        log.info(
            "loaded %s on %s (%s) in %.1f s; KV pool %d pages x %d tokens = %d tokens, context %d",
            mc.name, self.device, str(self.dtype).removeprefix("torch."), self.load_seconds,
            self.pool.allocator.num_usable, self.config.page_size, self.pool.capacity_tokens, self.max_model_len,
        )  # fmt: skip
        if self.config.cuda_graph_warmup:
            self.warm_graphs()

    def _build(self) -> EngineParts:
        """Load the model and build the engine's parts (runs on the engine thread); with tp > 1,
        start the other ranks first."""
        self._ranks = start_ranks(self.config)
        try:
            a = assemble(self.config, self._ranks.group if self._ranks else None)
        except BaseException:
            if self._ranks is not None:
                self._ranks.kill()
                self._ranks.group.close()
            raise
        self.device, self.dtype, self.model_config, self.model_path = (
            a.device,
            a.dtype,
            a.model_config,
            a.model_path,
        )
        self.tokenizer, self.pool, self.max_model_len = a.tokenizer, a.pool, a.max_model_len
        self.ops, self.kernel_set, self.grammars, self.model = a.ops, a.kernel_set, a.grammars, a.model
        return a.parts

    # ----- requests -----
    def make_request(
        self,
        input_ids: list[int],
        sampling_params: dict[str, Any] | SamplingParams | None = None,
        *,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        return_text_in_logprobs: bool = False,
        hold_prefix: bool = False,
        release_on_admit: PrefixHandle | None = None,
        protected: bool = False,
    ) -> Request:
        """Validate and build a request (not yet submitted). Raises `InvalidRequestError` subclasses."""
        params = SamplingParams.from_dict(sampling_params)
        ids = self._check_ids(input_ids)
        vocab = self.model_config.vocab_size
        if not isinstance(top_logprobs_num, int) or not 0 <= top_logprobs_num <= vocab:
            raise InvalidRequestError(
                f"top_logprobs_num must be an integer in [0, {vocab}] (the vocabulary size)",
                "top_logprobs_num",
            )
        if params.logit_bias and any(not 0 <= t < vocab for t in params.logit_bias):
            raise VocabularyError(
                f"logit_bias token ids must lie in the vocabulary [0, {vocab})", "logit_bias"
            )
        if any(not 0 <= t < vocab for t in params.stop_token_ids):
            raise VocabularyError(f"stop_token_ids must lie in the vocabulary [0, {vocab})", "stop_token_ids")
        if not isinstance(logprob_start_len, int) or logprob_start_len < -1:
            raise InvalidRequestError(
                "logprob_start_len must be -1 or a prompt position >= 0", "logprob_start_len"
            )
        req = Request(
            rid=new_request_id(),
            prompt_ids=ids,
            params=params,
            detokenizer=IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens),
            return_logprob=bool(return_logprob),
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs,
            hold_prefix=hold_prefix,
            release_on_admit=release_on_admit,
            protected=protected,
        )
        if params.grammar_key is not None:
            req.grammar = self.grammars.matcher(*params.grammar_key)
        return req

    def _check_ids(self, input_ids: Any) -> list[int]:
        if not isinstance(input_ids, (list, tuple)) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in input_ids
        ):
            raise InvalidRequestError("input_ids must be a list of integer token ids", "input_ids")
        ids = list(input_ids)
        if not ids:
            raise InvalidRequestError("the prompt is empty; give at least one token of text", "prompt")
        vocab = self.model_config.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise VocabularyError(f"token id {bad} is outside the vocabulary [0, {vocab})", "input_ids")
        if len(ids) >= self.max_model_len:
            raise ContextLengthError(
                f"the prompt has {len(ids)} tokens but this runtime's context is {self.max_model_len} tokens "
                "(and one is needed to generate); shorten the prompt",
                "prompt",
            )
        return ids

    def _check_room(self, req: Request, sampling_params: dict[str, Any] | None) -> None:
        """An explicit `max_new_tokens` past the context is refused (as SGLang and OpenAI do); the
        default one is cut to the room left, where the engine stops the request at length."""
        asked = (sampling_params or {}).get("max_new_tokens")
        room = self.max_model_len - req.prompt_len
        if asked is not None and req.params.max_new_tokens > room:
            raise ContextLengthError(
                f"max_new_tokens {req.params.max_new_tokens} does not fit: the prompt has {req.prompt_len} "
                f"tokens and the context is {self.max_model_len}, so at most {room} can be generated; "
                "lower max_new_tokens or shorten the prompt",
                "max_new_tokens",
            )

    def encode_prompt(self, prompt: Any) -> list[int]:
        if not isinstance(prompt, str):
            raise InvalidRequestError(f"prompt must be a string, got {type(prompt).__name__}", "prompt")
        self.check_prompt_chars(len(prompt))
        return self.tokenizer.encode(prompt)

    def check_prompt_chars(self, chars: int, param: str = "prompt") -> None:
        """The cheap bound checked before tokenizing: raises `ContextLengthError` for a text that
        cannot fit the context whatever the tokenizer makes of it."""
        limit = self.max_model_len * CHARS_PER_TOKEN_BOUND
        if chars > limit:
            raise ContextLengthError(
                f"the prompt has {chars} characters, more than this runtime's context of {self.max_model_len} "
                f"tokens can hold at any tokenization (limit {limit} characters); shorten the {param}",
                param,
            )

    def submit(self, req: Request, sink: Any) -> None:
        """Hand a request to the engine; `sink(update)` is then called on the engine's output thread
        with every update (it must not block on the engine). Raises `ServerBusyError` when the queue
        is full."""
        self.submit_batch([req], sink)

    def submit_batch(self, reqs: list[Request], sink: Any) -> None:
        """`submit` for several requests that reach the scheduler in the same step (requests over one
        cached prefix then share a forward pass)."""
        limit = self.config.max_running_requests + self.config.max_waiting_requests
        if self.engine.unfinished + len(reqs) > limit:
            raise ServerBusyError(
                f"{self.engine.unfinished} requests are queued or running (limit {limit}); retry later"
            )
        for req in reqs:
            req.sink = sink
        self.engine.submit_batch(reqs)

    def abort(self, rid: str) -> None:
        """Stop a request now and free its KV pages; its submitter gets a final update with an error."""
        self.engine.abort(rid)

    def run_request(self, req: Request) -> RequestUpdate:
        """Submit and wait for the final update."""
        done: queue.SimpleQueue[RequestUpdate] = queue.SimpleQueue()
        self.submit(req, lambda u: done.put(u) if u.finished else None)
        return done.get()

    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        stream: bool = False,
        return_text_in_logprobs: bool = False,
    ) -> dict[str, Any] | list[dict[str, Any]] | Iterator[dict[str, Any]]:
        """SGLang's `Engine.generate`: one prompt (or token list) -> one result dict, a list -> a list."""
        reqs, batched = self.make_requests(
            prompt,
            sampling_params,
            input_ids,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs,
        )
        if stream:
            if batched:
                raise InvalidRequestError("stream=True takes one prompt, not a list", "stream")
            return self._stream(reqs[0])
        results = [r.to_dict() for r in self.run_requests(reqs)]
        return results if batched else results[0]

    def make_requests(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        **logprob_options: Any,
    ) -> tuple[list[Request], bool]:
        """The requests `generate` would run for these arguments, validated and not yet submitted,
        and whether the call was a batch (`n` > 1 samples of one prompt make one, as in SGLang). The HTTP server builds `/generate` requests here too, so
        both front doors accept and reject exactly the same inputs."""
        if (prompt is None) == (input_ids is None):
            raise InvalidRequestError("give exactly one of prompt or input_ids", "prompt")
        batched = isinstance(prompt, list) or (
            isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
        )
        if batched:
            items = prompt if prompt is not None else input_ids
            id_lists = [self.encode_prompt(p) for p in items] if prompt is not None else list(items)
        else:
            id_lists = [self.encode_prompt(prompt) if prompt is not None else input_ids]
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(id_lists)
        if len(params) != len(id_lists):
            raise InvalidRequestError(
                "sampling_params list must match the number of prompts", "sampling_params"
            )
        reqs = []
        for ids, sp in zip(id_lists, params):
            n = samples_per_prompt(sp)
            reqs += [self.make_request(ids, sp, **logprob_options) for _ in range(n)]
            self._check_room(reqs[-1], sp)
        return reqs, batched or len(reqs) > len(id_lists)

    def run_requests(self, reqs: list[Request]) -> list[GenerateResult]:
        """Submit requests together and wait for all; their results in order (raises the first error)."""
        done: queue.SimpleQueue[RequestUpdate] = queue.SimpleQueue()
        self.submit_batch(reqs, lambda u: done.put(u) if u.finished else None)
        by_id = {}
        for _ in reqs:
            u = done.get()
            by_id[u.rid] = u
        out = []
        for r in reqs:
            u = by_id[r.rid]
            if u.error is not None:
                raise u.error
            assert u.result is not None
            out.append(u.result)
        return out

    def _stream(self, req: Request) -> Iterator[dict[str, Any]]:
        updates: queue.SimpleQueue[RequestUpdate] = queue.SimpleQueue()
        self.submit(req, updates.put)
        try:
            while True:
                u = updates.get()
                if u.error is not None:
                    raise u.error
                if u.finished:
                    yield {
                        "text": u.text,
                        "output_ids": u.token_ids,
                        "meta_info": u.result.meta_info(),
                        "finished": True,
                    }
                    return
                yield {"text": u.text, "output_ids": u.token_ids, "finished": False}
        finally:
            if req.finish_reason is None:
                self.engine.abort(req.rid)

    def chat(
        self, messages: list[dict[str, Any]], sampling_params: dict[str, Any] | None = None, **kwargs: Any
    ):
        """`generate` on the messages rendered with the model's chat template."""
        ids = self.tokenizer.encode_chat(messages, add_generation_prompt=True)
        return self.generate(input_ids=ids, sampling_params=sampling_params, **kwargs)

    # ----- state -----
    def stats(self) -> dict[str, Any]:
        def read() -> dict[str, Any]:
            s = self.engine.scheduler
            return {
                "kv_pages_total": self.pool.allocator.num_usable,
                "kv_pages_free": self.pool.allocator.num_free,
                "kv_pages_evictable": self.engine.cache.evictable_pages(),
                "running": len(s.running),
                "waiting": len(s.waiting),
                "prefix_cache_hit_tokens": s.prefix_hit_tokens,
                "prefix_cache_nodes": self.engine.cache.num_nodes,
                **self.engine.counters,
                # time the output thread spent handing tokens out (detokenize, stop strings, sinks)
                "output_us": int(self.engine.output.busy_seconds * 1e6),
                **self._graph_stats(),
            }

        return self.engine.call(read)

    def warm_graphs(self) -> int:
        """Capture the decode graph of every batch bucket up to --max-running-requests now, so no
        request waits for a capture later (one takes ~0.1-0.5 s). Returns how many were captured.
        Not with tensor parallelism: the other ranks capture a graph only when rank 0's step message
        tells them to (each holds collectives), so there graphs are still captured when first needed."""
        graphs = self.engine.runner.graphs
        if graphs is None or not graphs.capture:
            return 0
        if self.config.tp > 1:
            log.info("decode graphs are captured when first needed with tp > 1 (no start-up warm-up)")
            return 0
        before, t0 = graphs.num_graphs, time.perf_counter()
        self.engine.call(lambda: graphs.warm(self.config.max_running_requests))
        captured = graphs.num_graphs - before
        log.info("captured %d decode graphs in %.1f s", captured, time.perf_counter() - t0)
        return captured

    def _graph_stats(self) -> dict[str, Any]:
        graphs = self.engine.runner.graphs
        if graphs is None or not graphs.capture:
            return {}
        return {"cuda_graphs": graphs.num_graphs, "cuda_graph_capture_s": round(graphs.capture_seconds, 3)}

    def graph_summary(self) -> str:
        graphs = self.engine.runner.graphs
        if graphs is None:
            return ""
        mode = "captured" if graphs.capture else "eager (CUDA graphs off)"
        return (
            f"{mode}; batch buckets {graphs.buckets}; context buckets powers of two from 512 to "
            f"{graphs.max_context} (one bucket where the attention launch does not depend on it); "
            f"{graphs.steps} tokens per multi-step launch; {graphs.num_graphs} captured so far"
        )

    def flush_cache(self) -> int:
        """Drop every prefix-cache entry that is neither pinned nor in use; returns pages freed."""
        return self.engine.call(self.engine.cache.flush)

    def start_profile(self, out_dir: str | Path, name: str | None = None) -> None:
        """Open a torch.profiler window over the engine's work (one at a time)."""
        if getattr(self, "_trace", None) is not None:
            raise InvalidRequestError("a profile is already being recorded; stop it first", "profile")
        window = TraceWindow(Path(out_dir), name or time.strftime("sgjit-%Y%m%d-%H%M%S"))
        self.engine.call(window.start)
        self._trace = window

    def stop_profile(self) -> Path:
        """Close the window and write its Chrome trace; returns the file."""
        window, self._trace = getattr(self, "_trace", None), None
        if window is None:
            raise InvalidRequestError("no profile is being recorded; start one first", "profile")
        return self.engine.call(window.stop)

    @contextlib.contextmanager
    def profile(self, out_dir: str | Path, name: str | None = None) -> Iterator[None]:
        """`with rt.profile("traces"): ...` records the engine's work inside the block."""
        self.start_profile(out_dir, name)
        try:
            yield
        finally:
            self.stop_profile()

    def release(self, handle: PrefixHandle) -> None:
        self.engine.release(handle)

    def share_prefix(self, handle: PrefixHandle) -> PrefixHandle:
        """A second handle on the same pages, with its own reference: a program that forks gives each
        branch one, so the shared prefix stays resident until every branch has moved on."""
        pages = list(handle.pages)
        self.engine.call(lambda: self.pool.allocator.incref(pages))
        return PrefixHandle(list(handle.token_ids), pages)

    @property
    def endpoint(self) -> Runtime:
        """SGLang's `Runtime.endpoint` (the backend programs run on): in process, the runtime itself;
        `sgjit.set_default_backend` and `backend=` take it as they take the runtime."""
        return self

    def get_model_name(self) -> str:
        """The model's path, as SGLang's backends report it."""
        return str(self.model_path)

    def shutdown(self) -> None:
        self.engine.shutdown()
        if self._ranks is not None:
            self._ranks.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

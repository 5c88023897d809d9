"""`@sgjit.function`: a prompt program, and how it runs.

`run()` traces the function once (lazily) and, when it is static, runs its `GraphPlan` through the
plan executor; otherwise it runs the Python function itself on the same executors (interpreted).
`jit=True` demands the plan (an untraceable program raises `TraceError`), `jit=False` always
interprets, the default picks the plan where it can."""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from tqdm import tqdm

from sgjit.compiler.plan import GraphPlan
from sgjit.errors import ProgramError, TraceError
from sgjit.lang.backend import Backend
from sgjit.lang.default_backend import resolve_backend
from sgjit.lang.defaults import RunDefaults
from sgjit.lang.run import start_run
from sgjit.lang.state import ProgramState
from sgjit.lang.trace import trace_program

log = logging.getLogger(__name__)


class Function:
    def __init__(self, func: Callable[..., Any], jit: bool | None = None) -> None:
        if jit not in (None, True, False):
            raise ProgramError(f"jit must be True, False or None, got {jit!r}")
        functools.update_wrapper(self, func)
        self.func = func
        self.jit = jit
        self.name: str = func.__name__
        self.signature = inspect.signature(func)
        if not self.signature.parameters:
            raise ProgramError(
                f"{self.name}() must take the program state as its first parameter: def {self.name}(s, ...)"
            )
        self.backends: weakref.WeakSet[Backend] = (
            weakref.WeakSet()
        )  # where it ran (reload_function invalidates there)
        self._trace_lock = threading.Lock()
        self._traced = False
        self._plan: GraphPlan | None = None
        self._trace_error: TraceError | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Inside another program (`other(s, ...)`) run on the caller's state; otherwise `run()`."""
        if args and isinstance(args[0], ProgramState):
            return self.func(*args, **kwargs)
        return self.run(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<sgjit.function {self.name} jit={self.jit}>"

    def explain(self, backend: Any = None, **example_kwargs: Any) -> str:
        """The plan, compiled for the backend: kernels chosen, graph buckets, memory reservation."""
        plan = self.trace(**example_kwargs)
        target = resolve_backend(backend)
        compile_plan = getattr(target, "compile", None)
        compiled = compile_plan(plan) if compile_plan is not None else None
        if compiled is None:
            return plan.dump() + "\n\n(the backend's JIT is off: the plan runs uncompiled)"
        return compiled.explain()

    # ----- tracing -----
    def trace(self, **example_kwargs: Any) -> GraphPlan:
        """The program as a `GraphPlan`; raises `TraceError` (file:line) if it is not static."""
        return trace_program(self.func, self.name, example_kwargs)

    def plan(self) -> GraphPlan | None:
        """The cached plan, or None if the program cannot be traced (with jit=True: raises)."""
        with self._trace_lock:
            if not self._traced:
                try:
                    self._plan = self.trace()
                except TraceError as e:
                    log.debug("%s runs interpreted: %s", self.name, e)
                    self._trace_error = e
                self._traced = True
        if self._trace_error is not None and self.jit:
            raise self._trace_error
        return self._plan

    def _plan_for(self, bound: inspect.BoundArguments) -> tuple[GraphPlan, dict[str, str]] | None:
        if self.jit is False:
            return None
        plan = self.plan()
        if plan is None:
            return None
        values = {name: bound.arguments[name] for name in plan.text_args()}
        not_text = sorted(k for k, v in values.items() if not isinstance(v, str))
        if not not_text:
            return plan, values
        if self.jit:
            raise ProgramError(
                f"{self.name}(): argument {not_text[0]!r} is a {type(values[not_text[0]]).__name__}, but the "
                "traced plan inserts it as text; pass a str, or use jit=None/False to run it interpreted"
            )
        return None

    # ----- running -----
    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> inspect.BoundArguments:
        try:
            bound = self.signature.bind(None, *args, **kwargs)
        except TypeError as e:
            params = list(self.signature.parameters)[1:]
            raise ProgramError(f"{self.name}(): {e}; its parameters are {params}") from e
        bound.apply_defaults()
        return bound

    def run(self, *args: Any, stream: bool = False, backend: Any = None, **kwargs: Any) -> ProgramState:
        """Run the program once and return its state. Keywords that name `RunDefaults` fields
        (max_new_tokens, stop, stop_token_ids, temperature, top_p, top_k, min_p, frequency_penalty,
        presence_penalty, ignore_eos, return_logprob, top_logprobs_num) are defaults for every gen;
        the rest are the program's arguments. With `stream=True` it returns at once; read the text
        as it comes with `state.text_iter()`."""
        defaults, program_kwargs = RunDefaults.split(kwargs, frozenset(self.signature.parameters))
        return self._start(self._bind(args, program_kwargs), defaults, resolve_backend(backend), stream)

    def run_batch(
        self,
        batch_kwargs: Iterable[dict[str, Any]],
        *,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        backend: Any = None,
        **defaults: Any,
    ) -> list[ProgramState]:
        """Run the program once per argument dict, concurrently (their requests batch in the engine);
        the states come back in order. Raises the first error once all have finished."""
        run_defaults, unknown = RunDefaults.split(defaults)
        if unknown:
            raise ProgramError(
                f"run_batch() got unknown keyword(s) {sorted(unknown)}; program arguments go in the batch list"
            )
        target = resolve_backend(backend)
        calls = []
        for i, kwargs in enumerate(batch_kwargs):
            if not isinstance(kwargs, dict):
                raise ProgramError(
                    f"run_batch() item {i} must be a dict of arguments, got {type(kwargs).__name__}"
                )
            calls.append(self._bind((), kwargs))
        if not calls:
            return []
        if num_threads == "auto":
            workers = min(len(calls), max(64, 16 * (os.cpu_count() or 1)))
        elif isinstance(num_threads, int) and not isinstance(num_threads, bool) and num_threads >= 1:
            workers = num_threads
        else:
            raise ProgramError(f"num_threads must be 'auto' or an integer >= 1, got {num_threads!r}")
        with ThreadPoolExecutor(workers, thread_name_prefix="sgjit-batch") as pool:
            futures = [pool.submit(self._start, bound, run_defaults, target, False) for bound in calls]
            with tqdm(total=len(futures), disable=not progress_bar, desc=self.name) as bar:
                for _ in as_completed(futures):
                    bar.update(1)
        return [f.result() for f in futures]

    def _start(
        self, bound: inspect.BoundArguments, defaults: RunDefaults, backend: Backend, stream: bool
    ) -> ProgramState:
        backend.register_function(self)
        self.backends.add(backend)
        chosen = self._plan_for(bound)
        if chosen is not None:
            remote = getattr(backend, "run_plan", None)
            if remote is not None and not stream:  # a server runs the whole plan, registered once by hash
                return remote(chosen[0], chosen[1], defaults)
            return start_run(backend, defaults, stream, chosen[0], chosen[1], name=self.name)

        def body(state: ProgramState) -> Any:
            return self.func(state, *bound.args[1:], **bound.kwargs)

        return start_run(backend, defaults, stream, body=body, name=self.name)


def function(
    func: Callable[..., Any] | None = None,
    *,
    jit: bool | None = None,
    num_api_spec_tokens: int | None = None,
    **unknown: Any,
) -> Any:
    """Decorate a prompt program (`@sgjit.function` or `@sgjit.function(jit=True)`).
    `num_api_spec_tokens` is SGLang's speculative-execution budget for API backends that take one
    call per program (OpenAI-style); sgjit's backends run each gen on a resident sequence, so it is
    accepted and changes nothing."""
    if unknown:
        raise ProgramError(
            f"sgjit.function() got unknown keyword argument(s) {sorted(unknown)}; it takes jit and num_api_spec_tokens"
        )
    if num_api_spec_tokens is not None and (
        isinstance(num_api_spec_tokens, bool)
        or not isinstance(num_api_spec_tokens, int)
        or num_api_spec_tokens < 0
    ):
        raise ProgramError(f"num_api_spec_tokens must be an integer >= 0, got {num_api_spec_tokens!r}")
    if func is None:
        return lambda f: Function(f, jit=jit)
    if not callable(func):
        raise ProgramError(f"@sgjit.function decorates a function, not a {type(func).__name__}")
    return Function(func, jit=jit)

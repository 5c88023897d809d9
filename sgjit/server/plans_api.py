"""Plan routes: `POST /plans` registers a GraphPlan (its JSON) and compiles it when the JIT is on;
`POST /plans/{hash}/run` runs it with arguments (a batch allowed; SSE when streaming);
`DELETE /plans/{hash}`; `POST /jit/clear`. `sgjit.RuntimeEndpoint` is the client of these routes:
it registers a traced program once and then runs it by hash."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from sgjit.compiler.plan import GraphPlan
from sgjit.errors import ProgramError
from sgjit.lang.defaults import RunDefaults
from sgjit.lang.run import start_run
from sgjit.lang.runtime_backend import RunAbort, RuntimeBackend
from sgjit.lang.state import ProgramState
from sgjit.runtime.runtime import Runtime
from sgjit.server.bridge import wait_for_disconnect
from sgjit.server.errors import ApiError, ClientDisconnected
from sgjit.server.json_route import OffLoopJSONRoute
from sgjit.server.native_api import json_bytes
from sgjit.server.openapi_doc import NOT_FOUND, TOO_LARGE, WORK_ERRORS, json_or_sse
from sgjit.server.protocol import PlanRegisterRequest, PlanRunRequest
from sgjit.server.sse import DONE, sse, with_error_event
from sgjit.server.state import ServerState, accepting_runtime, server_state

router = APIRouter(tags=["plans"], route_class=OffLoopJSONRoute)


def _plan(request: Request, plan_hash: str) -> GraphPlan:
    plan = server_state(request).plans.get(plan_hash)
    if plan is None:
        raise ApiError(404, f"no plan {plan_hash!r} is registered here; POST it to /plans first", param="plan_hash",
                       code="plan_not_found")  # fmt: skip
    return plan


def state_result(plan: GraphPlan, state: ProgramState) -> dict[str, Any]:
    variables = state.variables()
    return {
        "plan_hash": plan.plan_hash,
        "text": state.text(),
        "variables": variables,
        "meta_info": {n: state.get_meta_info(n) for n in variables},
        "messages": state.messages(),
    }


def _bind(plan: GraphPlan, args: dict[str, Any]) -> dict[str, str]:
    needed = plan.text_args()
    missing = [a for a in needed if a not in args]
    if missing:
        raise ProgramError(f"plan {plan.name} needs arguments {needed}; missing {missing}")
    bad = [a for a in needed if not isinstance(args[a], str)]
    if bad:
        raise ProgramError(f"plan arguments are text; {bad[0]!r} is a {type(args[bad[0]]).__name__}")
    return {a: args[a] for a in needed}


def _defaults(values: dict[str, Any]) -> RunDefaults:
    defaults, unknown = RunDefaults.split(values)
    if unknown:
        raise ProgramError(f"unknown run defaults {sorted(unknown)}; known: {sorted(RunDefaults.names())}")
    return defaults


@router.post("/plans", response_class=Response, responses=TOO_LARGE)
async def register_plan(
    body: PlanRegisterRequest, request: Request, rt: Runtime = Depends(accepting_runtime)
) -> Response:
    text = body.plan if isinstance(body.plan, str) else json.dumps(body.plan)
    plan = GraphPlan.from_json(text)
    server_state(request).plans[plan.plan_hash] = plan
    compile_ms, compiled = 0.0, False
    backend = RuntimeBackend.of(rt)
    if backend.jit is not None:
        t = time.perf_counter()
        await run_in_threadpool(backend.compile, plan)
        compile_ms, compiled = (time.perf_counter() - t) * 1000, True
    return Response(json_bytes({"plan_hash": plan.plan_hash, "name": plan.name, "compiled": compiled,
                                "compile_ms": compile_ms}), media_type="application/json")  # fmt: skip


@router.post(
    "/plans/{plan_hash}/run",
    response_class=Response,
    responses={
        **json_or_sse(None, "text piece, then the final result"),
        **NOT_FOUND,
        **WORK_ERRORS,
        **TOO_LARGE,
    },
)
async def run_registered_plan(
    plan_hash: str, body: PlanRunRequest, request: Request, rt: Runtime = Depends(accepting_runtime)
) -> Response:
    """Runs start on their own driver threads (as a streaming run does) and are awaited on the event
    loop, so a long run holds no worker of the shared pool that every route's tokenizing needs."""
    plan = _plan(request, plan_hash)
    defaults = _defaults(body.defaults)
    batch = body.args if isinstance(body.args, list) else [body.args]
    bound = [_bind(plan, a) for a in batch]
    if body.stream and len(bound) != 1:
        raise ProgramError("stream a single run: give args as one object, not a list")
    runs = PlanRuns(server_state(request), RuntimeBackend.of(rt))
    try:
        # on a worker thread only to start: compiling a plan the JIT has not cached yet takes a while
        states = await run_in_threadpool(runs.start, plan, defaults, bound)
    except BaseException:
        runs.close()
        raise
    if body.stream:
        return PlanRunResponse(plan_events(plan, states[0]), runs)
    try:
        await runs.finished(request)
        results = [state_result(plan, s) for s in states]  # finished: reading them does not block
    finally:
        runs.close()
    return Response(
        json_bytes(results if isinstance(body.args, list) else results[0]), media_type="application/json"
    )


class PlanRuns:
    """The program runs behind one HTTP call, in the server's set of work in flight (the drain waits
    for them and aborts them at its deadline); closing it aborts whatever still runs."""

    def __init__(self, state: ServerState, backend: RuntimeBackend) -> None:
        self.state = state
        self.control = RunAbort(backend.runtime)
        self.backend = backend.abortable(self.control)
        self.states: list[ProgramState] = []
        self._closed = False
        state.groups.add(self)

    def start(
        self, plan: GraphPlan, defaults: RunDefaults, bound: list[dict[str, str]]
    ) -> list[ProgramState]:
        """Started together, their requests batch in the engine."""
        for values in bound:
            self.states.append(start_run(self.backend, defaults, True, plan, values, None, plan.name))
        return self.states

    async def finished(self, http: Request) -> None:
        """Returns once every run has ended; raises `ClientDisconnected` if the client leaves first."""
        loop = asyncio.get_running_loop()
        waits = []
        for st in self.states:
            done = loop.create_future()
            st.run_handle().add_done_callback(lambda d=done: loop.call_soon_threadsafe(_resolve, d))
            waits.append(done)
        watch = asyncio.ensure_future(wait_for_disconnect(http))
        pending = set(waits)
        try:
            while pending and not watch.done():
                await asyncio.wait({*pending, watch}, return_when=asyncio.FIRST_COMPLETED)
                pending = {w for w in waits if not w.done()}
        finally:
            watch.cancel()
        if pending:
            for w in pending:
                w.cancel()
            raise ClientDisconnected()

    def abort(self) -> None:
        self.control.abort()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.state.groups.discard(self)
        self.abort()


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


async def plan_events(plan: GraphPlan, state: ProgramState) -> AsyncIterator[bytes]:
    """The run's text pieces, then its result. A thread of this stream's own (not the shared pool)
    waits on the run's event log and hands each piece to the loop."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def pump() -> None:
        try:
            for piece in state.text_iter():
                loop.call_soon_threadsafe(queue.put_nowait, ("text", piece))
            loop.call_soon_threadsafe(queue.put_nowait, ("end", None))
        except BaseException as e:  # noqa: BLE001 - raised on the loop, where the stream ends with it
            loop.call_soon_threadsafe(queue.put_nowait, ("error", e))

    threading.Thread(target=pump, name=f"sgjit-stream-{plan.name}", daemon=True).start()
    while True:
        kind, value = await queue.get()
        if kind == "error":
            raise value
        if kind == "end":
            break
        yield sse(json.dumps({"text": value}))
    yield sse(json_bytes(state_result(plan, state)))  # the pump saw the log close: the run has ended
    yield DONE


class PlanRunResponse(StreamingResponse):
    """A streamed run whose `PlanRuns` is closed however the response ends, so a client that goes
    away stops the program."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], runs: PlanRuns) -> None:
        super().__init__(with_error_event(events), headers={"Cache-Control": "no-cache"})
        self.runs = runs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.runs.close()


@router.delete("/plans/{plan_hash}", responses=NOT_FOUND)
async def delete_plan(plan_hash: str, request: Request) -> dict[str, Any]:
    _plan(request, plan_hash)
    state = server_state(request)
    del state.plans[plan_hash]
    jit = RuntimeBackend.of(state.loaded()).jit
    dropped = jit.invalidate(plan_hash) if jit is not None else 0
    return {"plan_hash": plan_hash, "deleted": True, "compiled_entries_dropped": dropped}


@router.post("/jit/clear")
async def clear_jit(request: Request) -> dict[str, Any]:
    backend = RuntimeBackend.of(server_state(request).loaded())
    return {"cleared": await run_in_threadpool(backend.clear_jit_cache)}

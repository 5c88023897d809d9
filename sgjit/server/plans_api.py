"""Plan routes: `POST /plans` registers a GraphPlan (its JSON) and compiles it when the JIT is on;
`POST /plans/{hash}/run` runs it with arguments (a batch allowed; SSE when streaming);
`DELETE /plans/{hash}`; `POST /jit/clear`. `sgjit.RuntimeEndpoint` is the client of these routes:
it registers a traced program once and then runs it by hash."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from sgjit.compiler.plan import GraphPlan
from sgjit.errors import ProgramError
from sgjit.lang.defaults import RunDefaults
from sgjit.lang.run import start_run
from sgjit.lang.runtime_backend import RuntimeBackend
from sgjit.lang.state import ProgramState
from sgjit.runtime.runtime import Runtime
from sgjit.server.errors import ApiError
from sgjit.server.native_api import json_bytes
from sgjit.server.openapi_doc import NOT_FOUND, TOO_LARGE, WORK_ERRORS, json_or_sse
from sgjit.server.protocol import PlanRegisterRequest, PlanRunRequest
from sgjit.server.sse import DONE, sse, with_error_event
from sgjit.server.state import accepting_runtime, server_state

router = APIRouter(tags=["plans"])


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
    plan = _plan(request, plan_hash)
    defaults = _defaults(body.defaults)
    batch = body.args if isinstance(body.args, list) else [body.args]
    bound = [_bind(plan, a) for a in batch]
    backend = RuntimeBackend.of(rt)
    if body.stream:
        if len(bound) != 1:
            raise ProgramError("stream a single run: give args as one object, not a list")
        state = await run_in_threadpool(start_run, backend, defaults, True, plan, bound[0], None, plan.name)

        async def events():
            async for piece in iterate_in_threadpool(state.text_iter()):
                yield sse(json.dumps({"text": piece}))
            yield sse(json_bytes(await run_in_threadpool(state_result, plan, state)))
            yield DONE

        return StreamingResponse(with_error_event(events()), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})  # fmt: skip

    def run_all() -> list[dict[str, Any]]:
        states = [start_run(backend, defaults, True, plan, values, None, plan.name) for values in bound]
        return [state_result(plan, s) for s in states]  # started together: their requests batch

    results = await run_in_threadpool(run_all)
    return Response(
        json_bytes(results if isinstance(body.args, list) else results[0]), media_type="application/json"
    )


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

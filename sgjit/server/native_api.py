"""SGLang's native routes: `/generate` and the operational ones (/health, /health_generate,
/get_model_info, /get_server_info, /flush_cache, /metrics)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic_core import to_json
from starlette.concurrency import run_in_threadpool

from sgjit.errors import InvalidRequestError
from sgjit.runtime.output import stream_meta_info
from sgjit.runtime.runtime import Runtime
from sgjit.server.bridge import RequestGroup
from sgjit.server.errors import unavailable
from sgjit.server.info import model_info, server_info
from sgjit.server.json_route import OffLoopJSONRoute
from sgjit.server.limits import check_generate_n, check_requests
from sgjit.server.openapi_doc import TOO_LARGE, WORK_ERRORS, json_or_sse, text_response
from sgjit.server.protocol import GenerateRequest, GenerateResult
from sgjit.server.sse import DONE, SSEResponse, sse
from sgjit.server.state import Phase, accepting_runtime, server_state

router = APIRouter(tags=["native"], route_class=OffLoopJSONRoute)

HEALTH_GENERATE_TIMEOUT_S = 30.0


def json_bytes(value: Any) -> bytes:
    """JSON of engine results: tuples become arrays, and a -inf logprob (a token a grammar ruled
    out) becomes null rather than the invalid JSON `-Infinity`."""
    return to_json(value, inf_nan_mode="null")


@router.post(
    "/generate",
    response_class=Response,
    responses={
        **json_or_sse(GenerateResult, "GenerateResult so far", or_list=True),
        **WORK_ERRORS,
        **TOO_LARGE,
    },
)
async def generate(
    body: GenerateRequest, request: Request, rt: Runtime = Depends(accepting_runtime)
) -> Response:
    for field in ("image_data", "video_data", "audio_data"):
        if getattr(body, field) is not None:
            raise InvalidRequestError(
                f"{field}: this server's model is text-only and cannot read {field.split('_')[0]} input; "
                "send text (describe the media), or use a vision-language model server",
                field,
            )
    args = server_state(request).args
    check_generate_n(args, body.sampling_params)
    reqs, batched = await run_in_threadpool(
        rt.make_requests,
        body.text,
        body.sampling_params,
        body.input_ids,
        return_logprob=body.return_logprob,
        logprob_start_len=body.logprob_start_len,
        top_logprobs_num=body.top_logprobs_num,
        return_text_in_logprobs=body.return_text_in_logprobs,
    )
    check_requests(args, reqs, "top_logprobs_num")
    group = RequestGroup(server_state(request), reqs).submit()
    if body.stream:
        return SSEResponse(generate_events(group, batched), group)
    async with group:
        results = [r.to_dict() for r in await group.results(request)]
    return Response(json_bytes(results if batched else results[0]), media_type="application/json")


async def generate_events(group: RequestGroup, batched: bool) -> AsyncIterator[bytes]:
    """SGLang's stream: each event holds the text and token ids so far and the meta info; logprobs
    of output tokens come incrementally (the tokens since the previous event) with
    `output_token_logprobs_length` counting them all, as SGLang's frontend reads them. The last
    event carries the whole meta info (prompt logprobs included)."""
    texts = [""] * len(group.reqs)
    ids: list[list[int]] = [[] for _ in group.reqs]
    sent = [0] * len(group.reqs)  # output logprob entries streamed so far
    async for i, u in group.updates():
        req = group.reqs[i]
        texts[i] += u.text
        ids[i] += u.token_ids
        meta = stream_meta_info(req, len(ids[i]), sent[i])
        sent[i] = len(ids[i])
        if u.finished:
            assert u.result is not None
            meta = {**u.result.meta_info(), **{k: v for k, v in meta.items() if k.startswith("output_")}}
        chunk: dict[str, Any] = {"text": texts[i], "output_ids": ids[i], "meta_info": meta}
        if batched:
            chunk["index"] = i
        yield sse(json_bytes(chunk))
    yield DONE


@router.post("/concate_and_append_request")
async def concate_and_append_request(request: Request) -> dict[str, Any]:
    """What SGLang's frontend calls after `forks.join("concate_and_append")`: copy the branches' KV
    into the parent's sequence. Answered as done without copying: the parent's next request sends
    the joined text, whose prefix the radix cache matches and whose remainder it computes."""
    server_state(request).accepting()
    return {"success": True}


@router.get("/health")
async def health(request: Request) -> dict[str, str]:
    """200 once the model has loaded and warmed up; 503 while starting or draining."""
    phase = server_state(request).phase
    if phase is not Phase.READY:
        raise unavailable(f"the server is {phase.value}", phase.value)
    return {"status": "ok"}


@router.get("/health_generate")
async def health_generate(request: Request, rt: Runtime = Depends(accepting_runtime)) -> dict[str, Any]:
    """Runs a 1-token generation through the engine: proves the engine loop is alive, not just HTTP."""
    req = await run_in_threadpool(rt.make_request, rt.encode_prompt("ping"), {"max_new_tokens": 1})
    try:
        async with RequestGroup(server_state(request), [req], observe=False).submit() as group:
            (result,) = await asyncio.wait_for(group.results(request), HEALTH_GENERATE_TIMEOUT_S)
    except asyncio.TimeoutError as e:
        raise unavailable(
            f"the engine did not answer within {HEALTH_GENERATE_TIMEOUT_S:.0f} s", "engine_stalled"
        ) from e
    return {"status": "ok", "output_ids": result.output_ids}


@router.get("/get_model_info")
@router.get("/model_info")
async def get_model_info(request: Request) -> dict[str, Any]:
    return model_info(server_state(request))


@router.get("/get_server_info")
@router.get("/server_info")
def get_server_info(request: Request) -> dict[str, Any]:
    """Sync routes like this one run on a worker thread: they wait for the engine thread."""
    return server_info(server_state(request))


@router.api_route("/flush_cache", methods=["GET", "POST"])
def flush_cache(request: Request) -> dict[str, int]:
    """Drop every prefix-cache entry no running request uses."""
    return {"pages_freed": server_state(request).loaded().flush_cache()}


@router.get(
    "/metrics", response_class=Response, responses=text_response("text/plain", "Prometheus text format")
)
def metrics(request: Request) -> Response:
    return Response(server_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)

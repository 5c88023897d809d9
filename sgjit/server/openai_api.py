"""OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from sgjit.runtime.result import GenerateResult
from sgjit.runtime.runtime import Runtime
from sgjit.server.bridge import RequestGroup
from sgjit.server.errors import ApiError
from sgjit.server.json_route import OffLoopJSONRoute
from sgjit.server.limits import check_n, check_requests
from sgjit.server.openai_output import chat_response, completion_response
from sgjit.server.openai_params import Job, chat_job, completion_job
from sgjit.server.openai_stream import ChatChunks, CompletionChunks, openai_events
from sgjit.server.openapi_doc import NOT_FOUND, TOO_LARGE, WORK_ERRORS, json_or_sse
from sgjit.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    OpenAISampling,
)
from sgjit.server.reasoning import default_parser
from sgjit.server.sse import SSEResponse
from sgjit.server.state import ServerState, accepting_runtime, server_state

router = APIRouter(prefix="/v1", tags=["openai"], route_class=OffLoopJSONRoute)


@router.get("/models")
async def list_models(request: Request) -> ModelList:
    state = server_state(request)
    rt = state.loaded()
    card = ModelCard(
        id=state.model_name,
        created=int(state.started_at),
        root=str(rt.model_path),
        max_model_len=rt.max_model_len,
    )
    return ModelList(data=[card])


@router.get("/models/{model_id:path}", responses=NOT_FOUND)
async def get_model(model_id: str, request: Request) -> ModelCard:
    state = server_state(request)
    listed = await list_models(request)
    if model_id != state.model_name:
        raise ApiError(
            404, f"the model {model_id!r} does not exist; this server serves {state.model_name!r}",
            param="model", code="model_not_found",
        )  # fmt: skip
    return listed.data[0]


def reasoning_parser(state: ServerState, rt: Runtime) -> str | None:
    """The configured parser, or with `auto` the one the chat template implies (None: off)."""
    choice = state.args.reasoning_parser
    if choice == "none":
        return None
    if choice == "auto":
        template = rt.tokenizer.chat_template
        return default_parser(template.source if template is not None else None)
    return choice


@router.post(
    "/chat/completions",
    response_class=Response,
    responses={
        **json_or_sse(ChatCompletionResponse, "ChatCompletionChunk"),
        **NOT_FOUND,
        **WORK_ERRORS,
        **TOO_LARGE,
    },
)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, rt: Runtime = Depends(accepting_runtime)
) -> Response:
    state = server_state(request)
    parser = reasoning_parser(state, rt)
    return await _respond(
        request, body, lambda: chat_job(rt, body, state.args.max_new_tokens_default, state.args.tool_call_parser),
        lambda job, model, usage: ChatChunks(model, usage, parser, len(job.reqs), job.tools),
        lambda job, results, model: chat_response(job, results, model, body.logprobs, parser),
    )  # fmt: skip


@router.post(
    "/completions",
    response_class=Response,
    responses={
        **json_or_sse(CompletionResponse, "CompletionResponse chunk"),
        **NOT_FOUND,
        **WORK_ERRORS,
        **TOO_LARGE,
    },
)
async def completions(
    body: CompletionRequest, request: Request, rt: Runtime = Depends(accepting_runtime)
) -> Response:
    return await _respond(
        request, body, lambda: completion_job(rt, body, server_state(request).args.max_new_tokens_default),
        lambda job, model, usage: CompletionChunks(model, usage, len(job.reqs), job),
        lambda job, results, model: completion_response(job, results, model, body.logprobs is not None),
    )  # fmt: skip


def _check_model(state: ServerState, body: OpenAISampling) -> str:
    name = state.model_name
    if body.model not in (None, "", name):
        raise ApiError(
            404, f"the model {body.model!r} does not exist; this server serves {name!r}", param="model",
            code="model_not_found",
        )  # fmt: skip
    return name


async def _respond(
    request: Request,
    body: OpenAISampling,
    make_job: Callable[[], Job],
    stream_chunks: Callable[[Job, str, bool], ChatChunks | CompletionChunks],
    full_response: Callable[[Job, list[GenerateResult], str], BaseModel],
) -> Response:
    """Check the model, build the job (on a worker thread: templating and tokenizing), then stream
    the choices as OpenAI chunks or answer once all have finished."""
    state = server_state(request)
    model = _check_model(state, body)
    check_n(state.args, body.n)
    job = await run_in_threadpool(make_job)
    check_requests(
        state.args, job.reqs, "top_logprobs" if isinstance(body, ChatCompletionRequest) else "logprobs"
    )
    group = await _start(state, job, request)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return SSEResponse(openai_events(group, job, stream_chunks(job, model, include_usage)), group)
    async with group:
        results = await group.results(request)
    return Response(full_response(job, results, model).model_dump_json(), media_type="application/json")


async def _start(state: ServerState, job: Job, request: Request) -> RequestGroup:
    """Run the shared prefills (n > 1), then submit the choices. Raises before any byte is sent,
    so a full queue is still a 503 for a streaming request."""
    group = RequestGroup(state, job.reqs)
    if job.prefills:
        async with RequestGroup(state, job.prefills, observe=False).submit() as prefill:
            job.prefill_cached = [r.cached_tokens for r in await prefill.results(request)]
    return group.submit()

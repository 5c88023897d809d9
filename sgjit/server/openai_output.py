"""Engine results -> OpenAI's response objects: finish reasons, usage, and logprobs in the chat
and text-completion layouts."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence

from sgjit.runtime.result import GenerateResult, LogprobEntry
from sgjit.server.openai_params import Job
from sgjit.server.openai_tools import ToolSetup
from sgjit.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionResponse,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    PromptTokensDetails,
    TokenLogprob,
    ToolCall,
    ToolCallFunction,
    TopLogprob,
    Usage,
)
from sgjit.server.reasoning import ReasoningSplitter
from sgjit.server.tool_formats import ParsedCall

MIN_LOGPROB = -9999.0  # stands in for -inf (a token the grammar ruled out), which JSON cannot carry


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def finish_reason(result: GenerateResult, made_calls: bool = False) -> str:
    """OpenAI's finish reason for an engine result: `stop` (EOS, a stop string or token, or the
    grammar's end), `tool_calls` (so, with calls in the answer) or `length` (max_tokens or the
    context ran out)."""
    if result.finish_reason.type == "length":
        return "length"
    return "tool_calls" if made_calls else "stop"


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_calls(calls: Sequence[ParsedCall]) -> list[ToolCall]:
    return [
        ToolCall(id=new_call_id(), function=ToolCallFunction(name=c.name, arguments=c.arguments))
        for c in calls
    ]


def usage(job: Job, results: Sequence[GenerateResult]) -> Usage:
    """Prompts count once however many choices they have; cached tokens are those each prompt
    found in the prefix cache (with n > 1, what its shared prefill found)."""
    completion = sum(r.completion_tokens for r in results)
    prompt = sum(job.prompt_lens)
    if job.n > 1:
        cached = sum(job.prefill_cached)
    else:
        cached = sum(r.cached_tokens for r in results)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
    )


def _logprob(value: float | None) -> float:
    return MIN_LOGPROB if value is None or math.isinf(value) or math.isnan(value) else max(value, MIN_LOGPROB)


def _top(entry: LogprobEntry) -> TopLogprob:
    text = entry[2] or ""
    return TopLogprob(token=text, logprob=_logprob(entry[0]), bytes=list(text.encode()))


def chat_logprobs(
    entries: Sequence[LogprobEntry], tops: Sequence[Sequence[LogprobEntry]] | None
) -> ChatLogprobs:
    content = []
    for k, entry in enumerate(entries):
        top = _top(entry)
        alternatives = [_top(t) for t in tops[k]] if tops else []
        content.append(TokenLogprob(**top.model_dump(), top_logprobs=alternatives))
    return ChatLogprobs(content=content)


def completion_logprobs(
    entries: Sequence[LogprobEntry],
    tops: Sequence[Sequence[LogprobEntry] | None] | None,
    text_offset: int,
    prompt: bool = False,
) -> CompletionLogprobs:
    """`prompt`: the entries are an echoed prompt's, whose first token has no logprob (nothing
    precedes it), shown as null as OpenAI does."""
    out = CompletionLogprobs(top_logprobs=[] if tops else None)
    for k, (lp, _, text) in enumerate(entries):
        out.tokens.append(text or "")
        out.token_logprobs.append(None if prompt and lp is None else _logprob(lp))
        out.text_offset.append(text_offset)
        text_offset += len(text or "")
        if tops:
            top = tops[k]
            out.top_logprobs.append(None if top is None else {t[2] or "": _logprob(t[0]) for t in top})  # type: ignore[union-attr]
    return out


def echoed_logprobs(result: GenerateResult, top: bool) -> CompletionLogprobs:
    """The prompt's logprobs (an echoed choice's first part), offsets from 0."""
    lp = result.logprobs
    if lp is None:
        return CompletionLogprobs(top_logprobs=[] if top else None)
    return completion_logprobs(
        lp.input_token_logprobs, lp.input_top_logprobs if top else None, 0, prompt=True
    )


def joined(a: CompletionLogprobs, b: CompletionLogprobs) -> CompletionLogprobs:
    tops = (
        None
        if a.top_logprobs is None and b.top_logprobs is None
        else [*(a.top_logprobs or []), *(b.top_logprobs or [])]
    )
    return CompletionLogprobs(
        tokens=a.tokens + b.tokens, token_logprobs=a.token_logprobs + b.token_logprobs,
        top_logprobs=tops, text_offset=a.text_offset + b.text_offset,
    )  # fmt: skip


def _result_logprobs(result: GenerateResult) -> tuple[list[LogprobEntry], list[list[LogprobEntry]] | None]:
    lp = result.logprobs
    if lp is None:
        return [], None
    return lp.output_token_logprobs, lp.output_top_logprobs or None


def chat_response(
    job: Job, results: list[GenerateResult], model: str, logprobs: bool, reasoning_parser: str | None = None
) -> ChatCompletionResponse:
    choices = []
    for i, r in enumerate(results):
        message = _message(r.text, reasoning_parser, job.tools)
        choices.append(
            ChatChoice(index=i, message=message, finish_reason=finish_reason(r, bool(message.tool_calls)),
                       logprobs=chat_logprobs(*_result_logprobs(r)) if logprobs else None)
        )  # fmt: skip
    return ChatCompletionResponse(
        id=new_id("chatcmpl"), created=now(), model=model, choices=choices, usage=usage(job, results)
    )


def _message(text: str, reasoning_parser: str | None, tools: ToolSetup | None) -> AssistantMessage:
    """The answer's reasoning (with a reasoning parser), then its tool calls (with tools), then its content."""
    reasoning = None
    if reasoning_parser is not None:
        reasoning, text = ReasoningSplitter.named(reasoning_parser).split(text)
    content, calls = tools.read(text) if tools else (text, [])
    return AssistantMessage(
        content=content, reasoning_content=reasoning, tool_calls=tool_calls(calls) if calls else None
    )


def completion_response(
    job: Job, results: list[GenerateResult], model: str, logprobs: bool
) -> CompletionResponse:
    choices = []
    for i, r in enumerate(results):
        prompt = job.echo[i // job.n] if job.echo is not None else ""
        lp = None
        if logprobs:
            lp = completion_logprobs(*_result_logprobs(r), len(prompt))
            if job.echo is not None:
                lp = joined(echoed_logprobs(r, lp.top_logprobs is not None), lp)
        choices.append(
            CompletionChoice(index=i, text=prompt + r.text, finish_reason=finish_reason(r), logprobs=lp)
        )
    return CompletionResponse(
        id=new_id("cmpl"), created=now(), model=model, choices=choices, usage=usage(job, results)
    )

"""OpenAI's streaming format: per choice a role delta first (chat), then content deltas, then a
chunk with its finish reason; then, when `stream_options.include_usage` is set, a chunk with
`choices: []` and the usage (every other chunk then carries `"usage": null`); then `[DONE]`."""

from __future__ import annotations

from collections.abc import AsyncIterator

from sgjit.runtime.request import Request
from sgjit.runtime.result import GenerateResult, LogprobEntry
from sgjit.server.bridge import RequestGroup
from sgjit.server.openai_output import (
    chat_logprobs,
    completion_logprobs,
    finish_reason,
    new_id,
    now,
    tool_calls,
    usage,
)
from sgjit.server.openai_params import Job
from sgjit.server.openai_tools import ToolSetup
from sgjit.server.protocol import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    CompletionChoice,
    CompletionResponse,
    DeltaToolCall,
    Usage,
)
from sgjit.server.reasoning import ReasoningSplitter
from sgjit.server.sse import DONE, sse
from sgjit.server.tool_formats import ParsedCall, ToolCallStream

Logprobs = tuple[list[LogprobEntry], list[list[LogprobEntry]] | None]


class ChatChunks:
    """Each choice's text goes first through its `ReasoningSplitter` (with a reasoning parser:
    `reasoning_content` deltas), then, with tools, its content through a `ToolCallStream`: content
    deltas as usual, and each tool call as one `tool_calls` delta once it is whole."""

    def __init__(
        self,
        model: str,
        include_usage: bool,
        reasoning_parser: str | None = None,
        num_choices: int = 1,
        tools: ToolSetup | None = None,
    ) -> None:
        self.id, self.created, self.model = new_id("chatcmpl"), now(), model
        self.include_usage = include_usage
        self.exclude = None if include_usage else {"usage"}
        self.splitters = (
            [ReasoningSplitter.named(reasoning_parser) for _ in range(num_choices)]
            if reasoning_parser
            else None
        )
        self.tools = (
            [ToolCallStream(tools.fmt, tools.eos_texts) for _ in range(num_choices)] if tools else None
        )

    def first(self, i: int, req: Request) -> bytes | None:
        return None

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None) -> bytes:
        chunk = ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )
        return sse(chunk.model_dump_json(exclude=self.exclude))

    def opening(self, i: int) -> bytes | None:
        return self._chunk([ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))])

    def delta(self, i: int, text: str, logprobs: Logprobs | None) -> bytes:
        lp = chat_logprobs(*logprobs) if logprobs else None
        reasoning, content = self.splitters[i].feed(text) if self.splitters else ("", text)
        return self._emit(i, reasoning, content, lp, final=False)

    def finish(self, i: int, result: GenerateResult) -> bytes:
        reasoning, content = self.splitters[i].flush() if self.splitters else ("", "")
        out = self._emit(i, reasoning, content, None, final=True)
        made_calls = self.tools is not None and self.tools[i].made_calls
        reason = finish_reason(result, made_calls)
        return out + self._chunk([ChatChunkChoice(index=i, delta=ChatDelta(), finish_reason=reason)])

    def _emit(self, i: int, reasoning: str, content: str, lp: ChatLogprobs | None, final: bool) -> bytes:
        calls: list[ParsedCall] = []
        if self.tools is not None:
            stream = self.tools[i]
            c, calls = stream.feed(content)
            if final:
                rest, more = stream.finish()
                c, calls = c + rest, calls + more
            content = c
        out = b""
        if content or reasoning or lp:
            delta = ChatDelta(
                content=content if content or not reasoning else None, reasoning_content=reasoning or None
            )
            out += self._chunk([ChatChunkChoice(index=i, delta=delta, logprobs=lp)])
        if calls:
            assert self.tools is not None
            first = self.tools[i].calls_sent - len(calls)
            deltas = [DeltaToolCall(index=first + k, id=call.id, function=call.function)
                      for k, call in enumerate(tool_calls(calls))]  # fmt: skip
            out += self._chunk([ChatChunkChoice(index=i, delta=ChatDelta(tool_calls=deltas))])
        return out

    def usage(self, usage: Usage) -> bytes:
        return self._chunk([], usage)


class CompletionChunks:
    def __init__(self, model: str, include_usage: bool, num_choices: int, job: Job | None = None) -> None:
        self.id, self.created, self.model = new_id("cmpl"), now(), model
        self.include_usage = include_usage
        self.exclude = None if include_usage else {"usage"}
        self.text_offset = [0] * num_choices
        self.job = job

    def first(self, i: int, req: Request) -> bytes | None:
        """With echo, the prompt (and its logprobs) as the choice's first chunk; by a choice's first
        update the engine has prefilled the prompt, so its logprobs are there."""
        if self.job is None or self.job.echo is None:
            return None
        text = self.job.echo[i // self.job.n]
        self.text_offset[i] = len(text)
        lp = None
        if req.logprobs is not None:
            lp = completion_logprobs(
                req.logprobs.input_token_logprobs,
                req.logprobs.input_top_logprobs if req.top_logprobs_num else None,
                0,
                prompt=True,
            )
        return self._chunk([CompletionChoice(index=i, text=text, logprobs=lp)])

    def _chunk(self, choices: list[CompletionChoice], usage: Usage | None = None) -> bytes:
        chunk = CompletionResponse(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )
        return sse(chunk.model_dump_json(exclude=self.exclude))

    def opening(self, i: int) -> bytes | None:
        return None

    def delta(self, i: int, text: str, logprobs: Logprobs | None) -> bytes:
        lp = completion_logprobs(*logprobs, self.text_offset[i]) if logprobs else None
        self.text_offset[i] += len(text)
        return self._chunk([CompletionChoice(index=i, text=text, logprobs=lp)])

    def finish(self, i: int, result: GenerateResult) -> bytes:
        return self._chunk([CompletionChoice(index=i, text="", finish_reason=finish_reason(result))])

    def usage(self, usage: Usage) -> bytes:
        return self._chunk([], usage)


async def openai_events(
    group: RequestGroup, job: Job, chunks: ChatChunks | CompletionChunks
) -> AsyncIterator[bytes]:
    for i in range(len(group.reqs)):
        if (opening := chunks.opening(i)) is not None:
            yield opening
    sent = [0] * len(group.reqs)  # tokens of each choice streamed so far
    results: list[GenerateResult | None] = [None] * len(group.reqs)
    started = [False] * len(group.reqs)
    async for i, u in group.updates():
        logprobs = None
        req = group.reqs[i]
        if not started[i]:
            started[i] = True
            if (first := chunks.first(i, req)) is not None:
                yield first
        if req.logprobs is not None and u.token_ids:
            # NOTE: read from the engine's request: its logprob lists only grow, and the entries of
            # these tokens were appended before the update was emitted.
            span = slice(sent[i], sent[i] + len(u.token_ids))
            tops = req.logprobs.output_top_logprobs[span] if req.top_logprobs_num else None
            logprobs = (req.logprobs.output_token_logprobs[span], tops)
        sent[i] += len(u.token_ids)
        if u.text or logprobs:
            yield chunks.delta(i, u.text, logprobs)
        if u.finished:
            assert u.result is not None
            results[i] = u.result
            yield chunks.finish(i, u.result)
    if chunks.include_usage:
        yield chunks.usage(usage(job, [r for r in results if r is not None]))
    yield DONE

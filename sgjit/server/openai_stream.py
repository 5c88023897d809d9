"""OpenAI's streaming format: per choice a role delta first (chat), then content deltas, then a
chunk with its finish reason; then, when `stream_options.include_usage` is set, a chunk with
`choices: []` and the usage (every other chunk then carries `"usage": null`); then `[DONE]`."""

from __future__ import annotations

from collections.abc import AsyncIterator

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
    CompletionChoice,
    CompletionResponse,
    DeltaToolCall,
    Usage,
)
from sgjit.server.sse import DONE, sse
from sgjit.server.tool_formats import ParsedCall, ToolCallStream

Logprobs = tuple[list[LogprobEntry], list[list[LogprobEntry]] | None]


class ChatChunks:
    """With tools, each choice's text goes through a `ToolCallStream`: content deltas as usual,
    and each tool call as one `tool_calls` delta once it is whole."""

    def __init__(
        self, model: str, include_usage: bool, tools: ToolSetup | None = None, num_choices: int = 1
    ) -> None:
        self.id, self.created, self.model = new_id("chatcmpl"), now(), model
        self.include_usage = include_usage
        self.exclude = None if include_usage else {"usage"}
        self.tools = [ToolCallStream(tools.fmt) for _ in range(num_choices)] if tools else None
        self.eos_texts = tools.eos_texts if tools else ()

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None) -> bytes:
        chunk = ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )
        return sse(chunk.model_dump_json(exclude=self.exclude))

    def opening(self, i: int) -> bytes | None:
        return self._chunk([ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))])

    def delta(self, i: int, text: str, logprobs: Logprobs | None) -> bytes:
        lp = chat_logprobs(*logprobs) if logprobs else None
        if self.tools is None:
            return self._chunk([ChatChunkChoice(index=i, delta=ChatDelta(content=text), logprobs=lp)])
        content, calls = self.tools[i].feed(text)
        out = b""
        if content or lp:
            out += self._chunk([ChatChunkChoice(index=i, delta=ChatDelta(content=content), logprobs=lp)])
        return out + self._calls(i, calls)

    def finish(self, i: int, result: GenerateResult) -> bytes:
        out, made_calls = b"", False
        if self.tools is not None:
            stream = self.tools[i]
            for eos in self.eos_texts:  # special tokens are kept in the text: drop EOS before reading it
                if stream.text.endswith(eos):
                    stream.text = stream.text.removesuffix(eos)
            content, calls = stream.finish()
            if content:
                out += self._chunk([ChatChunkChoice(index=i, delta=ChatDelta(content=content))])
            out += self._calls(i, calls)
            made_calls = stream.made_calls
        reason = finish_reason(result, made_calls)
        return out + self._chunk([ChatChunkChoice(index=i, delta=ChatDelta(), finish_reason=reason)])

    def _calls(self, i: int, calls: list[ParsedCall]) -> bytes:
        if not calls:
            return b""
        assert self.tools is not None
        first = self.tools[i].calls_sent - len(calls)
        deltas = [DeltaToolCall(index=first + k, id=call.id, function=call.function)
                  for k, call in enumerate(tool_calls(calls))]  # fmt: skip
        return self._chunk([ChatChunkChoice(index=i, delta=ChatDelta(tool_calls=deltas))])

    def usage(self, usage: Usage) -> bytes:
        return self._chunk([], usage)


class CompletionChunks:
    def __init__(self, model: str, include_usage: bool, num_choices: int) -> None:
        self.id, self.created, self.model = new_id("cmpl"), now(), model
        self.include_usage = include_usage
        self.exclude = None if include_usage else {"usage"}
        self.text_offset = [0] * num_choices

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
    async for i, u in group.updates():
        logprobs = None
        req = group.reqs[i]
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

"""What leaves the engine, as typed values: `RequestUpdate` (new text and tokens, and on finish the
`GenerateResult`). The SGLang-shaped dicts (`{"text", "output_ids", "meta_info"}`) are built from
these once, by `GenerateResult.to_dict`, where a result leaves sgjit (the runtime's `generate`, the
server, the DSL's meta info); nothing inside reads a result back by key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sgjit.runtime.request import PrefixHandle

# (logprob, token id, token text when asked for); the logprob is None for a prompt's first token
LogprobEntry = tuple[float | None, int, str | None]


@dataclass(frozen=True, slots=True)
class FinishReason:
    """Why a sequence ended: "stop" (EOS, a stop token or string, the grammar's end), "length"
    (max_new_tokens or the context) or "abort" (aborted or failed)."""

    type: str
    matched: int | str | None = None  # stop: the token id or stop string (None: the grammar ended)
    length: int | None = None  # length: the limit that was reached
    message: str | None = None  # abort: what happened

    @classmethod
    def stop(cls, matched: int | str | None) -> FinishReason:
        return cls("stop", matched=matched)

    @classmethod
    def at_length(cls, length: int) -> FinishReason:
        return cls("length", length=length)

    @classmethod
    def abort(cls, message: str) -> FinishReason:
        return cls("abort", message=message)

    def to_dict(self) -> dict[str, Any]:
        """SGLang's finish_reason object."""
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        return {"type": "abort", "message": self.message}


@dataclass(slots=True)
class Logprobs:
    """Logprobs a request asked for: of the prompt from `logprob_start_len` on, of every output
    token, and the `top_logprobs_num` best alternatives at each position when asked."""

    input_token_logprobs: list[LogprobEntry] = field(default_factory=list)
    input_top_logprobs: list[list[LogprobEntry] | None] = field(default_factory=list)
    output_token_logprobs: list[LogprobEntry] = field(default_factory=list)
    output_top_logprobs: list[list[LogprobEntry]] = field(default_factory=list)


@dataclass(slots=True)
class GenerateResult:
    rid: str
    text: str  # the output text, a matched stop string trimmed (unless no_stop_trim)
    output_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens that came from the prefix cache
    finish_reason: FinishReason
    e2e_latency: float
    logprobs: Logprobs | None = None  # set when the request asked for logprobs

    def meta_info(self) -> dict[str, Any]:
        """SGLang's meta_info."""
        meta: dict[str, Any] = {
            "id": self.rid,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason.to_dict(),
            "e2e_latency": self.e2e_latency,
        }
        if self.logprobs is not None:
            meta["input_token_logprobs"] = self.logprobs.input_token_logprobs
            meta["output_token_logprobs"] = self.logprobs.output_token_logprobs
            meta["input_top_logprobs"] = self.logprobs.input_top_logprobs
            meta["output_top_logprobs"] = self.logprobs.output_top_logprobs
        return meta

    def to_dict(self) -> dict[str, Any]:
        """SGLang's result: `{"text", "output_ids", "meta_info"}`."""
        return {"text": self.text, "output_ids": self.output_ids, "meta_info": self.meta_info()}


@dataclass(slots=True)
class RequestUpdate:
    """What a request reports to its submitter: new text and every output token since the last
    update (tokens whose text is still held back ride with the next update), and on finish the
    result (or the error that ended it) and, for a request that holds its prefix, the handle."""

    rid: str
    text: str
    token_ids: list[int]
    finished: bool = False
    result: GenerateResult | None = None
    error: Exception | None = None
    handle: PrefixHandle | None = None

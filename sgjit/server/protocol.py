"""Pydantic models of what goes over the wire: SGLang's `/generate` and OpenAI's chat and text
completions, streaming chunks included. Requests accept and ignore fields they do not know, as
OpenAI's API does; value checks that `SamplingParams` already makes are left to it, so a limit
lives in one place."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_serializer

from sgjit.runtime.sampling_params import KNOBS, OPENAI_KEYS

MAX_N = 128  # choices per request: enough for best-of sampling, small enough to refuse abuse
MAX_CHAT_TOP_LOGPROBS = 20  # OpenAI's limits
MAX_COMPLETION_LOGPROBS = 5


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


# ----- /generate -----
class GenerateRequest(Lenient):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    rid: str | list[str] | None = None  # SGLang's client-chosen request id: accepted, sgjit names its own
    # multimodal inputs: refused (the models served are text-only), never silently dropped
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None


class GenerateResult(BaseModel):
    """One result, as `Runtime.generate` returns it; streamed chunks carry the text and token ids
    so far (SGLang's format: a client prints `text[len(previous):]`)."""

    text: str
    output_ids: list[int]
    meta_info: dict[str, Any]
    index: int | None = None  # position in a batch, on streamed chunks


# ----- OpenAI: requests -----
class TextPart(Lenient):
    type: str
    text: str | None = None


class ChatMessage(Lenient):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None


class StreamOptions(Lenient):
    include_usage: bool = False


class JsonSchemaSpec(Lenient):
    schema_: dict[str, Any] | None = Field(None, alias="schema")


class ResponseFormat(Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # vLLM's / SGLang's json_object + schema


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: one constraint. Other keys are kept (not dropped) so the server
    can refuse them by name."""

    model_config = ConfigDict(extra="allow")
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1)
    grammar: str | None = None
    json_object: bool | None = None


# The sampling fields of OpenAI requests (OpenAI's own and the extras SGLang and vLLM accept), one
# per `SamplingParams` knob offered there; None leaves sgjit's default.
OpenAISamplingFields = create_model(
    "OpenAISamplingFields",
    __base__=Lenient,
    **{name: (KNOBS[key].accepts | None, None) for name, key in OPENAI_KEYS.items()},
)


class OpenAISampling(OpenAISamplingFields):  # type: ignore[misc, valid-type]
    """Fields chat and text completions share."""

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Structured output: at most one of these (and of the regex / json_schema / ebnf extras)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(None, min_length=1)
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None  # accepted: the backend is always llguidance
    guided_whitespace_pattern: str | None = None  # refused: llguidance has no such knob

    def sampling_fields(self) -> dict[str, Any]:
        """The sampling fields the request set, under `SamplingParams` names."""
        return {key: v for name, key in OPENAI_KEYS.items() if (v := getattr(self, name)) is not None}


class ChatCompletionRequest(OpenAISampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_CHAT_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    # OpenAI fields that would change the output and are not supported: refused by name
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None


class CompletionRequest(OpenAISampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)  # 0 with echo scores the prompt
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


# ----- OpenAI: responses -----
class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    reasoning_content: str | None = None  # the thinking block, with a reasoning parser on


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None

    @model_serializer
    def _set_fields_only(self) -> dict[str, str]:
        """OpenAI's deltas carry only what changed: `{"role": ...}` first, then `{"content": ...}`
        (or `{"reasoning_content": ...}`), and `{}` on the chunk that finishes a choice."""
        pairs = (
            ("role", self.role),
            ("content", self.content),
            ("reasoning_content", self.reasoning_content),
        )
        return {k: v for k, v in pairs if v is not None}


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)  # None: an echoed prompt's first token
    top_logprobs: list[dict[str, float] | None] | None = None
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "sgjit"
    root: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ----- plans (JIT) -----
class PlanRegisterRequest(Lenient):
    plan: dict[str, Any] | str  # GraphPlan.to_json(), as a string or parsed


class PlanRunRequest(Lenient):
    args: dict[str, str] | list[dict[str, str]]  # one run, or a batch of runs
    defaults: dict[str, Any] = {}  # run defaults for every gen: max_new_tokens, temperature, stop, ...
    stream: bool = False


class ProfileRequest(Lenient):
    name: str | None = None

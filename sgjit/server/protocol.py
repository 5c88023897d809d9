"""Pydantic models of what goes over the wire: SGLang's `/generate` and OpenAI's chat and text
completions, streaming chunks included. Requests accept and ignore fields they do not know, as
OpenAI's API does; value checks that `SamplingParams` already makes are left to it, so a limit
lives in one place."""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from annotated_types import Interval
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictInt,
    WithJsonSchema,
    create_model,
    model_serializer,
)

from sgjit.runtime.sampling_params import KNOBS, OPENAI_KEYS

MAX_CHAT_TOP_LOGPROBS = 20  # OpenAI's limits
MAX_COMPLETION_LOGPROBS = 5


def _whole_number(value: Any) -> Any:
    """JSON Schema's integer: 3.0 is one (the document cannot say otherwise), true and "3" are not."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


JsonInt = Annotated[StrictInt, BeforeValidator(_whole_number)]
# A batch (a list of prompts, of per-prompt params) of none would be answered with nothing at all.
Batch = Annotated[list[str], Field(min_length=1)]

# A field read only to refuse it with a clear message: any value parses, the document says null.
Refused = Annotated[
    Any, WithJsonSchema({"type": "null", "description": "not supported: any other value is refused (400)"})
]


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


def _strict(tp: Any) -> Any:
    """`tp` with every scalar in it strict (pydantic cannot make a whole union strict at once)."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        return Union[tuple(_strict(a) for a in args)]  # noqa: UP007 - built from a tuple
    if origin is list:
        return list[_strict(args[0])]  # type: ignore[misc]
    if origin is dict:
        return dict[args[0], _strict(args[1])]  # type: ignore[misc]
    if tp is int:
        return JsonInt
    return Annotated[tp, Strict()] if tp in (float, bool, str) else tp


def _bounded(key: str) -> Any:
    """A knob's strict type, with its range (`Knob.range`) stated where it has one."""
    knob = KNOBS[key]
    if knob.range is None:
        return _strict(knob.accepts)
    bounds = Interval(**knob.range.schema_bounds())
    if knob.accepts is int:  # the bounds on the integer itself, inside the 3.0 -> 3 step
        return Annotated[StrictInt, bounds, BeforeValidator(_whole_number)]
    return Annotated[_strict(knob.accepts), bounds]


# What /generate's `sampling_params` may hold, for the document only: the route passes the dict to
# `SamplingParams.from_dict`, whose messages name the known keys. Every knob, under its own name.
GenerateSamplingParams = create_model(
    "GenerateSamplingParams",
    __config__=ConfigDict(extra="forbid"),
    n=(Annotated[StrictInt, Interval(ge=1), BeforeValidator(_whole_number)] | None, None),
    **{key: (_bounded(key) | None, None) for key in KNOBS},
)
SamplingParamsDict = Annotated[dict[str, Any], WithJsonSchema(GenerateSamplingParams.model_json_schema())]


# ----- /generate -----
class GenerateRequest(Lenient):
    text: str | Batch | None = None
    # token ids must be JSON integers: lax mode would take true, 1.0 or "7" as ids
    input_ids: list[StrictInt] | list[list[StrictInt]] | None = None  # ids: 1.0 is not one
    sampling_params: SamplingParamsDict | Annotated[list[SamplingParamsDict], Field(min_length=1)] | None = (
        None
    )
    return_logprob: bool = False
    logprob_start_len: JsonInt = Field(-1, ge=-1)  # -1: no prompt logprobs
    top_logprobs_num: JsonInt = Field(0, ge=0)  # the cap is the server's --max-top-logprobs
    return_text_in_logprobs: bool = False
    stream: bool = False
    rid: str | list[str] | None = None  # SGLang's client-chosen request id: accepted, sgjit names its own
    # multimodal inputs: refused (the models served are text-only), never silently dropped
    image_data: Refused = None
    video_data: Refused = None
    audio_data: Refused = None


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


class FunctionCall(Lenient):
    name: str
    arguments: str | dict[str, Any] = "{}"  # OpenAI sends a JSON string; some clients an object


class MessageToolCall(Lenient):
    """A call an earlier assistant turn made, as the client sends it back."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # assistant
    tool_call_id: str | None = None  # tool: the call this is the result of


class FunctionDef(Lenient):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")  # OpenAI's rule for function names
    description: str | None = None
    parameters: dict[str, Any] | None = None  # JSON schema of the arguments; none: any object
    strict: bool | None = None


class ToolDef(Lenient):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Lenient):
    name: str


class NamedToolChoice(Lenient):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(Lenient):
    include_usage: bool = False


class JsonSchemaSpec(Lenient):
    schema_: dict[str, Any] | None = Field(None, alias="schema")


class TextFormat(Lenient):
    type: Literal["text"]


class JsonObjectFormat(Lenient):
    type: Literal["json_object"]
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # vLLM's / SGLang's json_object + schema


class JsonSchemaFormat(Lenient):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


FORMAT_TAGS = frozenset({"text", "json_object", "json_schema"})
# One model per `type`, so the document states that json_schema needs its `json_schema` object.
ResponseFormat = Annotated[Union[TextFormat, JsonObjectFormat, JsonSchemaFormat], Field(discriminator="type")]  # noqa: UP007


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: one constraint. Other keys are kept (not dropped) so the server
    can refuse them by name; the document says they are not allowed."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": False})
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1)
    grammar: str | None = None
    json_object: bool | None = None


# The sampling fields of OpenAI requests (OpenAI's own and the extras SGLang and vLLM accept), one
# per `SamplingParams` knob offered there; None leaves sgjit's default. Strict: "0.5" is not a
# temperature nor true a top_k (`SamplingParams` refuses those on /generate too).
OpenAISamplingFields = create_model(
    "OpenAISamplingFields",
    __base__=Lenient,
    **{name: (_bounded(key) | None, None) for name, key in OPENAI_KEYS.items()},
)


class OpenAISampling(OpenAISamplingFields):  # type: ignore[misc, valid-type]
    """Fields chat and text completions share."""

    model: str | None = None
    n: JsonInt = Field(1, ge=1)  # the cap is the server's --max-n (sgjit.server.limits)
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
    guided_whitespace_pattern: Refused = None  # refused: llguidance has no such knob

    def sampling_fields(self) -> dict[str, Any]:
        """The sampling fields the request set, under `SamplingParams` names."""
        return {key: v for name, key in OPENAI_KEYS.items() if (v := getattr(self, name)) is not None}


class ChatCompletionRequest(OpenAISampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_CHAT_TOP_LOGPROBS)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # OpenAI fields that would change the output and are not supported: refused by name
    audio: Refused = None
    modalities: Annotated[
        list[str] | None,
        WithJsonSchema({"type": ["array", "null"], "items": {"type": "string", "enum": ["text"]}}),
    ] = None
    prediction: Refused = None
    web_search_options: Refused = None


class CompletionRequest(OpenAISampling):
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: int | None = Field(16, ge=0)  # 0 with echo scores the prompt
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, description="accepted only equal to n (or 1)")


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


class ToolCallFunction(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None  # the thinking block, with a reasoning parser on
    tool_calls: list[ToolCall] | None = None


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


class DeltaToolCall(BaseModel):
    index: int  # the call's position among this choice's calls
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatDelta(BaseModel):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler: Any) -> dict[str, Any]:
        """OpenAI's deltas carry only what changed: `{"role": ...}` first, then `{"content": ...}`,
        `{"reasoning_content": ...}` or `{"tool_calls": [...]}`, and `{}` on the chunk that finishes
        a choice."""
        return {k: v for k, v in handler(self).items() if v is not None}


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

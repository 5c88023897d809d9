"""OpenAI requests -> engine requests: chat messages onto the model's template, OpenAI's sampling
fields onto `SamplingParams` keys, `n` choices per prompt. Runs in a worker thread (templating,
tokenizing and grammar compilation must not stall the event loop).

Default `max_tokens`: a chat request without one may generate the rest of the context
(`max_model_len - prompt_len`, as vLLM does) but at most `sgjit serve --max-new-tokens-default`
tokens (0: no cap), so a forgotten `max_tokens` cannot keep a slow device busy for minutes. Text
completions keep OpenAI's default of 16. A `max_tokens` that does not fit in the context with the
prompt is a 400 `context_length_exceeded`, never silently shortened."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sgjit.errors import ConflictingParamsError, ContextLengthError, InvalidRequestError
from sgjit.runtime.request import Request
from sgjit.server.fim import fim_prompt
from sgjit.server.openai_constraints import check_unsupported_chat_fields, output_constraint
from sgjit.server.openai_tools import ToolSetup, render_inputs, tool_constraint, tool_setup
from sgjit.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    MessageToolCall,
    OpenAISampling,
)

if TYPE_CHECKING:
    from sgjit.runtime.runtime import Runtime


@dataclass(slots=True)
class Job:
    """The engine requests of one OpenAI call: choice `p * n + j` is the j-th sample of prompt p.
    With n > 1 each prompt is first prefilled once (`prefills`) so its n samples share its KV pages
    through the prefix cache instead of computing the prompt n times."""

    reqs: list[Request]
    prefills: list[Request]
    prompt_lens: list[int]
    n: int
    prefill_cached: list[int] = field(default_factory=list)  # per prompt, once the prefills ran
    tools: ToolSetup | None = None  # chat with tools: the answers are read for tool calls
    echo: list[str] | None = None  # per prompt, its text, when the choices start with it (echo)


def chat_job(
    rt: Runtime, body: ChatCompletionRequest, default_cap: int = 0, tool_call_parser: str = "auto"
) -> Job:
    """`default_cap`: the most tokens a request without max_tokens may generate (0: no cap)."""
    if body.top_logprobs and not body.logprobs:
        raise ConflictingParamsError("top_logprobs needs logprobs: true", "top_logprobs")
    check_unsupported_chat_fields(body)
    tools = tool_setup(body, rt.tokenizer, tool_call_parser)
    plain = template_messages(body.messages)
    rt.check_prompt_chars(sum(len(m["content"]) for m in plain), "messages")  # before templating
    messages, template_vars = render_inputs(plain, body, rt.tokenizer, offer_tools=body.tool_choice != "none")
    ids = rt.tokenizer.encode_chat(messages, add_generation_prompt=True, **template_vars)
    max_tokens = body.max_completion_tokens or body.max_tokens
    constraint = output_constraint(body)
    if forced := tool_constraint(tools, rt.tokenizer):
        if constraint:
            raise InvalidRequestError(
                f"tool_choice {body.tool_choice!r} constrains the answer to a tool call, and so does "
                "response_format / regex / json_schema; give one",
                "tool_choice",
            )
        constraint = forced
    if tools is not None and tools.fmt.special_markers:
        constraint = {**constraint, "skip_special_tokens": False}  # the calls' markers are special tokens
    job = _job(
        rt,
        body,
        [ids],
        max_tokens,
        constraint,
        default_cap,
        return_logprob=body.logprobs,
        top_logprobs_num=body.top_logprobs or 0,
    )
    job.tools = tools
    return job


def completion_job(rt: Runtime, body: CompletionRequest, default_cap: int = 0) -> Job:
    """With `echo`, each choice starts with its prompt (and with logprobs, the prompt's logprobs,
    which the engine computes from `logprob_start_len` 0); `suffix` makes a fill-in-the-middle
    prompt from the model's FIM tokens."""
    if body.best_of not in (None, 1, body.n):
        raise ConflictingParamsError(
            "best_of other than n is not supported by this server; leave it out or set it to n", "best_of"
        )
    prompts = _prompt_list(body.prompt)
    if not prompts:
        raise InvalidRequestError("prompt is an empty list; give at least one prompt", "prompt")
    if body.suffix is not None:
        if body.echo:
            raise ConflictingParamsError("echo and suffix cannot be combined; leave one out", "echo")
        if not all(isinstance(p, str) for p in prompts):
            raise ConflictingParamsError("suffix needs the prompt as text, not token ids", "suffix")
        id_lists = [fim_prompt(rt.tokenizer, p, body.suffix) for p in prompts]  # type: ignore[arg-type]
    else:
        id_lists = [rt.encode_prompt(p) if isinstance(p, str) else p for p in prompts]
    if body.max_tokens == 0 and not body.echo:
        raise ConflictingParamsError("max_tokens 0 needs echo: true (it scores the prompt)", "max_tokens")
    job = _job(
        rt,
        body,
        id_lists,
        body.max_tokens,
        output_constraint(body),
        default_cap,
        return_logprob=body.logprobs is not None,
        top_logprobs_num=body.logprobs or 0,
        logprob_start_len=0 if body.echo else -1,
    )
    if body.echo:
        job.echo = [p if isinstance(p, str) else rt.tokenizer.decode(p) for p in prompts]
    return job


def _prompt_list(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]  # type: ignore[list-item]
    return list(prompt)  # type: ignore[arg-type]


def _job(
    rt: Runtime,
    body: OpenAISampling,
    id_lists: list[list[int]],
    max_tokens: int | None,
    constraint: dict[str, Any],
    default_cap: int,
    *,
    return_logprob: bool,
    top_logprobs_num: int,
    logprob_start_len: int = -1,
) -> Job:
    reqs, prefills = [], []
    for ids in id_lists:
        base = sampling_params(
            body, new_tokens(rt.max_model_len, len(ids), max_tokens, default_cap), constraint
        )
        for j in range(body.n):
            params = {**base, "seed": base["seed"] + j} if "seed" in base else base
            reqs.append(
                rt.make_request(
                    ids,
                    params,
                    return_logprob=return_logprob,
                    top_logprobs_num=top_logprobs_num,
                    return_text_in_logprobs=return_logprob,
                    logprob_start_len=logprob_start_len if return_logprob else -1,
                )
            )
        if body.n > 1:
            prefills.append(rt.make_request(ids, {"max_new_tokens": 0}))
    return Job(reqs, prefills, [r.prompt_len for r in reqs[:: body.n]], body.n)


def sampling_params(body: OpenAISampling, max_new_tokens: int, constraint: dict[str, Any]) -> dict[str, Any]:
    """`SamplingParams` keys for an OpenAI request (fields left out keep sgjit's defaults)."""
    return {**body.sampling_fields(), "max_new_tokens": max_new_tokens, **constraint}


def new_tokens(max_model_len: int, prompt_len: int, max_tokens: int | None, default_cap: int) -> int:
    """How many tokens a request may generate (the policy in this module's docstring)."""
    room = max_model_len - prompt_len
    if room < 1:
        return 1  # the prompt alone is too long: make_request says so
    if max_tokens is None:
        return min(room, default_cap) if default_cap > 0 else room
    if max_tokens > room:
        raise ContextLengthError(
            f"max_tokens {max_tokens} does not fit: the prompt has {prompt_len} tokens and the context is "
            f"{max_model_len}, so at most {room} can be generated; lower max_tokens or shorten the prompt",
            "max_tokens",
        )
    return max_tokens


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as chat templates take them (Hugging Face's layout): string content (text parts
    joined by newlines), OpenAI's `developer` role as `system`, earlier tool calls with their
    arguments as objects, tool results with the id of their call."""
    out = []
    for i, m in enumerate(messages):
        if m.content is None:
            if not (m.role == "assistant" and m.tool_calls):
                raise InvalidRequestError(
                    f"a {m.role} message needs content (only an assistant message with tool_calls may omit it)",
                    f"messages.{i}.content",
                )
            content = ""
        elif isinstance(m.content, str):
            content = m.content
        else:
            for j, part in enumerate(m.content):
                if part.type != "text" or part.text is None:
                    raise InvalidRequestError(
                        f"content part type {part.type!r} is not supported; this server takes text parts only",
                        f"messages.{i}.content.{j}",
                    )
            content = "\n".join(part.text for part in m.content)  # type: ignore[misc]
        message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content}
        if m.tool_calls:
            message["tool_calls"] = [
                _template_call(c, f"messages.{i}.tool_calls.{j}") for j, c in enumerate(m.tool_calls)
            ]
        if m.role == "tool":
            message["tool_call_id"] = m.tool_call_id or ""
        if m.name is not None:
            message["name"] = m.name
        out.append(message)
    return out


def _template_call(call: MessageToolCall, param: str) -> dict[str, Any]:
    args = call.function.arguments
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise InvalidRequestError(
                f"the arguments of this tool call are not JSON ({e})", f"{param}.function.arguments"
            ) from e
    return {
        "id": call.id or "",
        "type": "function",
        "function": {"name": call.function.name, "arguments": args},
    }

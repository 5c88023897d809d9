"""Tool calling through the real `openai` client on the bundled model (SmolLM2-135M, whose plain
ChatML template has no tools section, so sgjit's Hermes prompt is used): forced calls are valid for
the function's schema, streamed calls equal the whole answer's, a conversation with calls and
results renders, and requests that cannot be honoured get a 400 that says why."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from sgjit.server.openai_params import chat_job
from sgjit.server.protocol import ChatCompletionRequest

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": ADD}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}


def create(client, **kwargs):
    args = {"model": "smollm2-135m", "messages": ASK, "tools": TOOLS, "temperature": 0, "max_tokens": 40}
    return client.chat.completions.create(**{**args, **kwargs})


def test_a_named_tool_choice_returns_a_valid_call_of_that_function(client):
    out = create(client, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = out.choices[0]
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    assert choice.message.content is None
    assert choice.finish_reason == "tool_calls"


def test_required_returns_a_call_of_one_of_the_tools(client):
    out = create(client, tool_choice="required", parallel_tool_calls=False)
    (call,) = out.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_a_streamed_call_equals_the_whole_answer(client):
    named = {"type": "function", "function": {"name": "add"}}
    whole = create(client, tool_choice=named).choices[0].message.tool_calls[0]
    calls: dict[int, dict[str, str]] = {}
    reasons = []
    for chunk in create(client, tool_choice=named, stream=True):
        for choice in chunk.choices:
            reasons.append(choice.finish_reason)
            assert not choice.delta.content, "a forced call's text leaked into content"
            for d in choice.delta.tool_calls or []:
                acc = calls.setdefault(d.index, {"name": "", "arguments": ""})
                acc["name"] += d.function.name or ""
                acc["arguments"] += d.function.arguments or ""
    assert calls == {0: {"name": "add", "arguments": whole.function.arguments}}
    assert reasons[-1] == "tool_calls"


def test_tool_choice_none_answers_in_text_without_the_tools_in_the_prompt(client, runtime):
    out = create(client, tool_choice="none", max_tokens=8)
    assert out.choices[0].message.tool_calls is None and out.choices[0].finish_reason in ("stop", "length")
    body = ChatCompletionRequest(messages=ASK, tools=TOOLS, tool_choice="none")
    prompt = runtime.tokenizer.decode(chat_job(runtime, body).reqs[0].prompt_ids)
    assert "get_weather" not in prompt


def test_auto_offers_the_tools_in_the_system_prompt(runtime):
    body = ChatCompletionRequest(messages=ASK, tools=TOOLS)
    prompt = runtime.tokenizer.decode(chat_job(runtime, body).reqs[0].prompt_ids)
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt and "<tool_call>" in prompt


def test_a_conversation_with_calls_and_results_renders_them(client, runtime):
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    ]  # fmt: skip
    out = create(client, messages=messages, max_tokens=8)
    assert out.choices[0].message.content
    body = ChatCompletionRequest(messages=messages, tools=TOOLS)
    prompt = runtime.tokenizer.decode(chat_job(runtime, body).reqs[0].prompt_ids)
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'
        in prompt
    )
    assert "<tool_response>\n18 degrees, sunny\n</tool_response>" in prompt


def test_a_template_with_a_tools_section_gets_the_tools_and_hf_messages(runtime):
    from sgjit.runtime.tokenizer import Tokenizer

    template = (
        "{% for t in tools or [] %}TOOL {{ t.function.name }}\n{% endfor %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}"
        "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments.city }}{% endfor %}\n"
        "{% endfor %}"
    )
    base = runtime.tokenizer
    tok = Tokenizer(
        base.backend,
        bos_token_id=None,
        eos_token_ids=base.eos_token_ids,
        add_bos=False,
        chat_template=template,
    )
    from sgjit.server.openai_params import template_messages
    from sgjit.server.openai_tools import render_inputs

    messages = [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}]  # fmt: skip
    body = ChatCompletionRequest(messages=messages, tools=TOOLS)
    msgs, extra = render_inputs(template_messages(body.messages), body, tok, offer_tools=True)
    text = tok.apply_chat_template(msgs, add_generation_prompt=False, **extra)
    assert text.startswith("TOOL get_weather\nTOOL add\n") and "CALL get_weather Oslo" in text


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
        ({"messages": [{"role": "user"}]}, "messages.0.content"),
        ({"messages": [*ASK, {"role": "tool", "tool_call_id": "x"}]}, "messages.1.content"),
        ({"messages": [*ASK, {"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{oops"}}]}]},
         "messages.1.tool_calls.0.function.arguments"),
    ],
)  # fmt: skip
def test_requests_that_cannot_be_honoured_get_a_400(client, change, param):
    args = {k: v for k, v in change.items() if v is not None}
    if change.get("tools", ...) is None:
        args["tools"] = openai.omit
    with pytest.raises(openai.BadRequestError) as e:
        create(client, **args)
    assert e.value.body["param"] == param, e.value.body

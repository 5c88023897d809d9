"""Tool-call formats without a model: reading calls out of finished and streamed text for each
family, the format chosen from a template, and the forcing grammars accepted by llguidance with the
bundled tokenizer (special-token markers included)."""

from __future__ import annotations

import json

import pytest

from sgjit.errors import InvalidRequestError
from sgjit.runtime.grammar import GrammarCompiler
from sgjit.server.tool_formats import FORMATS, ParsedCall, ToolCallStream, ToolSpec, split_calls, tool_format

WEATHER = ParsedCall("get_weather", json.dumps({"city": "Paris"}))
ADD = ParsedCall("add", json.dumps({"a": 1, "b": 2}))

# The same two calls, after "Let me check.", as each family writes them.
TEXTS = {
    "hermes": 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
    "mistral": 'Let me check.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
    '{"name": "add", "arguments": {"a": 1, "b": 2}}]',
    "deepseek_v3": "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n'
    '{"a": 1, "b": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
}


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_calls_are_read_out_of_the_text(name):
    content, calls = split_calls(FORMATS[name], TEXTS[name])
    assert content == "Let me check."
    assert calls == [WEATHER, ADD]


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_a_stream_fed_one_character_at_a_time_reads_the_same(name):
    stream, content, calls = ToolCallStream(FORMATS[name]), "", []
    for ch in TEXTS[name]:
        c, new = stream.feed(ch)
        content += c
        calls += new
        assert "<" not in content and "[" not in content, "a marker's beginning leaked into content"
    c, new = stream.finish()
    assert (content + c, calls + new) == ("Let me check.", [WEATHER, ADD])
    assert stream.made_calls


def test_a_stream_hands_out_each_call_as_soon_as_it_is_whole():
    stream = ToolCallStream(FORMATS["hermes"])
    first, second = TEXTS["hermes"].split('\n<tool_call>\n{"name": "add"')
    assert stream.feed(first)[1] == [WEATHER]
    assert stream.feed('\n<tool_call>\n{"name": "add"' + second)[1] == [ADD]


def test_llama3_json_calls_are_the_whole_answer():
    fmt = FORMATS["llama3_json"]
    text = '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "add", "parameters": {"a": 1, "b": 2}}'
    assert split_calls(fmt, text) == ("", [WEATHER, ADD])
    assert split_calls(fmt, "<|python_tag|>" + text)[1] == [WEATHER, ADD]
    prose = 'The JSON {"name": "x"} is an example.'
    assert split_calls(fmt, prose) == (prose, [])  # a brace inside prose is not a call


def test_mistral_newer_layout():
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}'
    assert split_calls(FORMATS["mistral"], text) == ("", [WEATHER, ADD])


def test_deepseek_v31_layout():
    text = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    assert split_calls(FORMATS["deepseek_v3"], text) == ("", [WEATHER])


@pytest.mark.parametrize(
    "text",
    [
        "No tools needed: 2 + 2 = 4.",
        "<tool_call>\n{not json}\n</tool_call>",  # unreadable: kept as content, nothing lost
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
    ],
)
def test_text_without_a_readable_call_is_all_content(text):
    assert split_calls(FORMATS["hermes"], text) == (text, [])
    stream = ToolCallStream(FORMATS["hermes"])
    out = stream.feed(text)[0] + stream.finish()[0]
    assert out == text and not stream.made_calls


def test_a_call_cut_off_by_the_token_limit_is_read_when_its_json_is_whole():
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}'
    assert split_calls(FORMATS["hermes"], text) == ("", [ADD])


def test_arguments_written_as_a_json_string_are_normalised():
    text = '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>'
    assert split_calls(FORMATS["hermes"], text)[1] == [ADD]


@pytest.mark.parametrize(
    ("template", "want"),
    [
        ("{{ '[TOOL_CALLS]' }}", "mistral"),
        ("<｜tool▁calls▁begin｜>", "deepseek_v3"),
        ("{% if tools %}<tool_call>{% endif %}", "hermes"),
        ("<|python_tag|>", "llama3_json"),
        ("<|im_start|>{{ message['content'] }}", "hermes"),  # no tools section: sgjit's hermes prompt
        (None, "hermes"),
    ],
)
def test_auto_picks_the_format_the_template_writes(template, want):
    assert tool_format("auto", template).name == want


def test_parser_names_and_aliases():
    assert tool_format("qwen25", None).name == "hermes"
    assert tool_format("llama3", None).name == "llama3_json"
    with pytest.raises(InvalidRequestError, match="unknown tool-call parser"):
        tool_format("pythonic-ish", None)


SPECS = [
    ToolSpec(
        "get_weather", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    ),
    ToolSpec("add", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}),
]


@pytest.fixture(scope="module")
def grammars(runtime):
    tok = runtime.tokenizer
    return GrammarCompiler(tok, runtime.model_config.vocab_size, tok.eos_token_ids)


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("special", [False, True])
def test_forcing_grammars_are_valid_lark(grammars, runtime, name, parallel, special):
    """Each format's grammar compiles in llguidance, with markers as text and as special tokens."""
    im_end = runtime.tokenizer.backend.token_to_id("<|im_end|>")
    ref = (lambda m: f"<[{im_end}]>") if special else json.dumps
    lark = FORMATS[name].grammar(SPECS, parallel, ref)
    grammars.grammar("ebnf", lark)  # raises GrammarError when llguidance rejects it

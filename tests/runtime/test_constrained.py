"""Constrained decoding through llguidance: every sample obeys its regex, schema or choice list."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from sgjit import errors

from conftest import assert_no_leaked_pages

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}


def test_json_schema_samples_validate(runtime):
    prompt = runtime.tokenizer.encode_chat([{"role": "user", "content": "Describe a user account as JSON."}])
    params = [
        {"json_schema": json.dumps(SCHEMA), "temperature": 1.0, "max_new_tokens": 96, "seed": i}
        for i in range(20)
    ]
    outs = runtime.generate(input_ids=[prompt] * 20, sampling_params=params)
    for o in outs:
        assert o["meta_info"]["finish_reason"]["type"] == "stop", o
        jsonschema.validate(json.loads(o["text"]), SCHEMA)
    assert len({o["text"] for o in outs}) > 1  # really sampled
    assert_no_leaked_pages(runtime)


def test_regex_samples_fullmatch(runtime):
    pattern = r"[A-Z][a-z]{2,8} [0-9]{1,3}(\.[0-9])?"
    outs = runtime.generate(
        ["Give a name and a number:"] * 20,
        [{"regex": pattern, "temperature": 1.0, "max_new_tokens": 24, "seed": i} for i in range(20)],
    )
    for o in outs:
        assert re.fullmatch(pattern, o["text"]), o["text"]


def test_choices_return_one_of_them(runtime):
    choices = ["red", "green", "blue", "a colour I cannot name"]
    outs = runtime.generate(
        ["My favourite colour is "] * 10,
        [{"choices": choices, "temperature": 1.0, "seed": i} for i in range(10)],
    )
    assert all(o["text"] in choices for o in outs)


def test_dict_schema_is_accepted(runtime):
    out = runtime.generate(
        "JSON:",
        {
            "json_schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
            "temperature": 0.0,
            "max_new_tokens": 32,
        },
    )
    assert isinstance(json.loads(out["text"])["ok"], bool)


@pytest.mark.parametrize(
    "params",
    [
        {"regex": "([a-z"},
        {"json_schema": '{"type": "nonsense"}'},
        {"regex": "a", "json_schema": "{}"},
        {"choices": []},
    ],
)
def test_invalid_constraints_fail_before_running(runtime, params):
    before = runtime.stats()["requests_total"]
    with pytest.raises(errors.InvalidRequestError):
        runtime.generate("x", params)
    assert runtime.stats()["requests_total"] == before

"""A mixture-of-experts model behind the server: a tiny random Qwen3-MoE directory served in
process (chat, the same chat streamed, a JSON-schema answer), and `sgjit serve --model <dir>` as a
process answering a chat request."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from tiny_hf import MOE_ARCHS, save_tiny_hf

import sgjit

from conftest import assert_no_leaked_pages
from server_harness import LiveServer, ServeProcess

MESSAGES = [{"role": "user", "content": "Name a colour."}]
MODEL = "qwen3_moe"


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory, runtime):
    path = tmp_path_factory.mktemp("served") / MODEL
    cls, extra = MOE_ARCHS[MODEL]
    save_tiny_hf(path, cls, runtime.tokenizer.backend, **extra)
    return path


@pytest.fixture(scope="module")
def moe_runtime(moe_dir):
    rt = sgjit.Runtime(str(moe_dir), device="cpu", max_total_tokens=2048, seed=0)
    yield rt
    rt.shutdown()


@pytest.fixture(scope="module")
def server(moe_runtime):
    srv = LiveServer(moe_runtime)
    yield srv
    srv.stop()


def test_chat_and_its_stream_agree(client, moe_runtime):
    assert [m.id for m in client.models.list().data] == [MODEL]
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0)
    choice = out.choices[0]
    want = moe_runtime.chat(MESSAGES, {"max_new_tokens": 12, "temperature": 0})
    assert choice.message.content == want["text"] and out.usage.completion_tokens == 12
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason == "length"
    assert_no_leaked_pages(moe_runtime)


def test_json_schema_answer(client):
    schema = {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "green", "blue"]}, "bright": {"type": "boolean"}},
        "required": ["colour", "bright"],
        "additionalProperties": False,
        # random weights would pick whitespace forever where JSON allows it: llguidance's compact form
        "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
    }
    out = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "colour", "schema": schema}},
    )
    jsonschema.validate(json.loads(out.choices[0].message.content), schema)
    assert out.choices[0].finish_reason == "stop"


def test_serve_process_with_a_moe_directory(moe_dir):
    serve = ServeProcess(
        "--model", str(moe_dir), "--device", "cpu", "--port", "0", "--max-total-tokens", "1024"
    )
    try:
        ready = serve.wait_for(r"sgjit ready at (http://127\.0\.0\.1:\d+)")
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 6, "temperature": 0}
        r = httpx.post(ready.group(1) + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 6
        info = httpx.get(ready.group(1) + "/get_model_info", timeout=30).json()
        assert info["architecture"] == MODEL and info["active_params"] < info["num_params"]
    finally:
        serve.kill()

"""DeepSeek-V4 behind the server: the tiny random V4 directory (tiny_deepseek_v4.py) served in
process (a chat answer and the same answer streamed, a JSON-schema answer, a regex-constrained one
on the native API), and `sgjit serve --model <dir>` as a process answering a chat request."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest
from tiny_deepseek_v4 import save_tiny_v4

import sgjit

from conftest import assert_no_leaked_pages
from server_harness import LiveServer, ServeProcess

MESSAGES = [{"role": "user", "content": "Name a colour."}]
MODEL = "tiny-v4"


@pytest.fixture(scope="module")
def v4_dir(tmp_path_factory, runtime):
    path = tmp_path_factory.mktemp("served") / MODEL
    backend = runtime.tokenizer.backend
    save_tiny_v4(path, backend.get_vocab_size(), backend)
    return path


@pytest.fixture(scope="module")
def v4_runtime(v4_dir):
    rt = sgjit.Runtime(str(v4_dir), device="cpu", max_total_tokens=2048, chunked_prefill_size=32, seed=0)
    yield rt
    rt.shutdown()


@pytest.fixture(scope="module")
def server(v4_runtime):
    srv = LiveServer(v4_runtime)
    yield srv
    srv.stop()


def test_chat_and_its_stream_agree(client, v4_runtime):
    assert [m.id for m in client.models.list().data] == [MODEL]
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0)
    choice = out.choices[0]
    want = v4_runtime.chat(MESSAGES, {"max_new_tokens": 12, "temperature": 0})
    assert choice.message.content == want["text"] and out.usage.completion_tokens == 12
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason == "length"
    assert_no_leaked_pages(v4_runtime)


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


def test_regex_on_the_native_api(http):
    body = {
        "text": "The year is",
        "sampling_params": {"max_new_tokens": 8, "temperature": 0, "regex": r" [0-9]{4}"},
    }
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    assert re.fullmatch(r" [0-9]{4}", r.json()["text"])


def test_serve_process_with_a_deepseek_v4_directory(v4_dir):
    serve = ServeProcess(
        "--model", str(v4_dir), "--device", "cpu", "--port", "0", "--max-total-tokens", "1024"
    )
    try:
        ready = serve.wait_for(r"sgjit ready at (http://127\.0\.0\.1:\d+)")
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 6, "temperature": 0}
        r = httpx.post(ready.group(1) + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 6
        info = httpx.get(ready.group(1) + "/get_model_info", timeout=30).json()
        assert info["architecture"] == "deepseek_v4"
    finally:
        serve.kill()

"""Model families beyond the dense Llama one behind the server: a tiny random Qwen3-MoE directory and
the tiny random DeepSeek-V4 one (tiny_deepseek_v4.py), each served in process (a chat answer and the
same answer streamed, a JSON-schema answer, a regex-constrained one on the native API), and
`sgjit serve --model <dir>` as a process answering a chat request."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import jsonschema
import pytest
from tiny_deepseek_v4 import save_tiny_v4
from tiny_hf import MOE_ARCHS, save_tiny_hf

import sgjit

from conftest import assert_no_leaked_pages
from server_harness import LiveServer, ServeProcess

MESSAGES = [{"role": "user", "content": "Name a colour."}]


@dataclass(frozen=True)
class Family:
    model: str  # the directory's name, which the server reports as the model id
    architecture: str
    sparse: bool  # a MoE: fewer active parameters than stored ones
    runtime_args: dict = field(default_factory=dict)


FAMILIES = {
    "qwen3_moe": Family("qwen3_moe", "qwen3_moe", sparse=True),
    # small prefill chunks: the compressed caches' chunk boundaries are exercised
    "deepseek_v4": Family("tiny-v4", "deepseek_v4", sparse=True, runtime_args={"chunked_prefill_size": 32}),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request) -> Family:
    return FAMILIES[request.param]


@pytest.fixture(scope="module")
def model_dir(family, tmp_path_factory, runtime) -> Path:
    path = tmp_path_factory.mktemp("served") / family.model
    backend = runtime.tokenizer.backend
    if family.architecture == "deepseek_v4":
        save_tiny_v4(path, backend.get_vocab_size(), backend)
    else:
        cls, extra = MOE_ARCHS[family.architecture]
        save_tiny_hf(path, cls, backend, **extra)
    return path


@pytest.fixture(scope="module")
def family_runtime(family, model_dir):
    rt = sgjit.Runtime(str(model_dir), device="cpu", max_total_tokens=2048, seed=0, **family.runtime_args)
    yield rt
    rt.shutdown()


@pytest.fixture(scope="module")
def server(family_runtime):
    srv = LiveServer(family_runtime)
    yield srv
    srv.stop()


def test_chat_and_its_stream_agree(client, family, family_runtime):
    model = family.model
    assert [m.id for m in client.models.list().data] == [model]
    out = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12, temperature=0)
    choice = out.choices[0]
    want = family_runtime.chat(MESSAGES, {"max_new_tokens": 12, "temperature": 0})
    assert choice.message.content == want["text"] and out.usage.completion_tokens == 12
    stream = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=12, temperature=0, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason == "length"
    assert_no_leaked_pages(family_runtime)


def test_json_schema_answer(client, family):
    schema = {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "green", "blue"]}, "bright": {"type": "boolean"}},
        "required": ["colour", "bright"],
        "additionalProperties": False,
        # random weights would pick whitespace forever where JSON allows it: llguidance's compact form
        "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
    }
    out = client.chat.completions.create(
        model=family.model,
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


def test_serve_process_with_the_directory(family, model_dir):
    serve = ServeProcess(
        "--model", str(model_dir), "--device", "cpu", "--port", "0", "--max-total-tokens", "1024"
    )
    try:
        ready = serve.wait_for(r"sgjit ready at (http://127\.0\.0\.1:\d+)")
        body = {"model": family.model, "messages": MESSAGES, "max_tokens": 6, "temperature": 0}
        r = httpx.post(ready.group(1) + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 6
        info = httpx.get(ready.group(1) + "/get_model_info", timeout=30).json()
        assert info["architecture"] == family.architecture
        if family.sparse:
            assert info["active_params"] < info["num_params"]
    finally:
        serve.kill()

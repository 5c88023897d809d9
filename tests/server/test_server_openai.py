"""The OpenAI API through the real `openai` client against a real uvicorn server on the bundled
model: chat and completions, streamed and not, n > 1, JSON-schema output, usage, logprobs, API key,
and 32 concurrent streams."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest

from conftest import assert_no_leaked_pages
from server_harness import LiveServer

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi"}]


def greedy_chat(runtime, messages, max_tokens):
    return runtime.chat(messages, {"max_new_tokens": max_tokens, "temperature": 0})


def test_chat_matches_the_runtime(client, runtime):
    want = greedy_chat(runtime, MESSAGES, 8)
    out = client.chat.completions.create(model="smollm2-135m", messages=MESSAGES, max_tokens=8, temperature=0)
    choice = out.choices[0]
    assert out.object == "chat.completion" and out.model == "smollm2-135m"
    assert choice.message.role == "assistant" and choice.message.content == want["text"]
    assert choice.finish_reason == (
        "length" if want["meta_info"]["finish_reason"]["type"] == "length" else "stop"
    )
    assert out.usage.prompt_tokens == want["meta_info"]["prompt_tokens"]
    assert out.usage.completion_tokens == want["meta_info"]["completion_tokens"]
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    assert out.usage.prompt_tokens_details.cached_tokens >= 16  # the runtime call above cached the prompt


def test_chat_text_parts_and_max_completion_tokens(client, runtime):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": "hi"}]}]
    out = client.chat.completions.create(
        model="smollm2-135m", messages=parts, max_completion_tokens=3, max_tokens=50, temperature=0
    )
    assert (
        out.choices[0].message.content
        == greedy_chat(runtime, [{"role": "user", "content": "Say\nhi"}], 3)["text"]
    )
    assert out.usage.completion_tokens == 3 and out.choices[0].finish_reason == "length"


def test_chat_stream_with_usage(client, runtime):
    stream = client.chat.completions.create(
        model="smollm2-135m",
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    content = [c for c in chunks[1:] if c.choices and c.choices[0].delta.content]
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert all(c.usage is None for c in chunks[:-1])
    want = greedy_chat(runtime, MESSAGES, 8)
    assert "".join(c.choices[0].delta.content for c in content) == want["text"]
    assert chunks[-1].usage.prompt_tokens == want["meta_info"]["prompt_tokens"]


def test_chat_stream_bytes_follow_openai_exactly(server, runtime):
    body = {
        "model": "smollm2-135m",
        "messages": MESSAGES,
        "max_tokens": 6,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with (
        httpx.Client(base_url=server.url, timeout=60) as c,
        c.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_raw())
    events = raw.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    assert all(e.startswith(b"data: ") and b"\n" not in e for e in events[:-1])
    chunks = [json.loads(e[len(b"data: ") :]) for e in events[:-2]]
    assert {(c["id"], c["created"], c["model"], c["object"]) for c in chunks} == {
        (chunks[0]["id"], chunks[0]["created"], "smollm2-135m", "chat.completion.chunk")
    }
    assert all(set(c) == {"id", "object", "created", "model", "choices", "usage"} for c in chunks)
    first, *content, finish, usage = chunks
    assert first["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert content and all(
        c["choices"][0]["delta"].keys() == {"content"} and c["choices"][0]["finish_reason"] is None
        for c in content
    )
    assert finish["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}]
    assert all(c["usage"] is None for c in chunks[:-1])
    want = greedy_chat(runtime, MESSAGES, 6)
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == want["text"]
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": want["meta_info"]["prompt_tokens"],
        "completion_tokens": 6,
        "total_tokens": want["meta_info"]["prompt_tokens"] + 6,
        "prompt_tokens_details": {"cached_tokens": usage["usage"]["prompt_tokens_details"]["cached_tokens"]},
    }


def test_chat_n2_shares_the_prompt(client, runtime):
    runtime.flush_cache()
    hits_before = runtime.stats()["prefix_cache_hit_tokens"]
    out = client.chat.completions.create(
        model="smollm2-135m", messages=MESSAGES, max_tokens=6, temperature=1.0, seed=7, n=2
    )
    assert [c.index for c in out.choices] == [0, 1]
    assert all(c.message.content for c in out.choices)
    assert 2 <= out.usage.completion_tokens <= 12
    assert out.usage.prompt_tokens_details.cached_tokens == 0  # the prompt was computed once, by the prefill
    full_pages = 16 * ((out.usage.prompt_tokens - 1) // 16)
    # ...and both choices found its full pages in the prefix cache
    assert runtime.stats()["prefix_cache_hit_tokens"] - hits_before >= 2 * full_pages > 0
    again = client.chat.completions.create(
        model="smollm2-135m", messages=MESSAGES, max_tokens=6, temperature=1.0, seed=7, n=2
    )
    assert again.usage.prompt_tokens_details.cached_tokens == full_pages
    assert [c.message.content for c in again.choices] == [c.message.content for c in out.choices]  # seeded


def test_chat_stream_n2(client):
    stream = client.chat.completions.create(
        model="smollm2-135m", messages=MESSAGES, max_tokens=4, temperature=0.7, seed=3, n=2, stream=True
    )
    by_choice: dict[int, list] = {0: [], 1: []}
    for chunk in stream:
        for choice in chunk.choices:
            by_choice[choice.index].append(choice)
    for choices in by_choice.values():
        assert choices[0].delta.role == "assistant"
        assert choices[-1].finish_reason is not None
        assert all(c.finish_reason is None for c in choices[:-1])


def test_json_schema_response_format_validates(client):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    out = client.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": "Give me a person as JSON with a name and an age."}],
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
    )
    value = json.loads(out.choices[0].message.content)
    jsonschema.validate(value, schema)
    assert out.choices[0].finish_reason == "stop"


def test_chat_logprobs(client):
    out = client.chat.completions.create(
        model="smollm2-135m", messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    content = out.choices[0].logprobs.content
    assert len(content) == 4 and "".join(t.token for t in content) == out.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token  # greedy: the chosen token is the most likely one
        assert bytes(t.bytes).decode() == t.token
    stream = client.chat.completions.create(
        model="smollm2-135m", messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True, stream=True
    )
    streamed = [
        t for c in stream if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content
    ]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [
        (t.token, round(t.logprob, 4)) for t in content
    ]


def test_completions(client, runtime):
    out = client.completions.create(model="smollm2-135m", prompt="1, 2, 3,", max_tokens=6, temperature=0)
    want = runtime.generate("1, 2, 3,", {"max_new_tokens": 6, "temperature": 0})
    assert out.object == "text_completion" and out.choices[0].text == want["text"]
    assert out.usage.completion_tokens == want["meta_info"]["completion_tokens"]
    batch = client.completions.create(
        model="smollm2-135m", prompt=["1, 2, 3,", "a, b, c,"], max_tokens=3, temperature=0, n=2, logprobs=2
    )
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.choices[0].text == batch.choices[1].text  # greedy samples of one prompt agree
    lp = batch.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert lp.text_offset == [0, len(lp.tokens[0]), len(lp.tokens[0]) + len(lp.tokens[1])]
    seeded = client.completions.create(
        model="smollm2-135m", prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=1, n=2,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert seeded.choices[0].text != seeded.choices[1].text  # each choice draws from its own seed
    ids = runtime.tokenizer.encode("1, 2, 3,")
    by_ids = client.completions.create(model="smollm2-135m", prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == want["text"]


def test_completions_stream(client, runtime):
    stream = client.completions.create(
        model="smollm2-135m",
        prompt="1, 2, 3,",
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == runtime.generate("1, 2, 3,", {"max_new_tokens": 6, "temperature": 0})["text"]
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_models(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == ["smollm2-135m"]
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=1)
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"


def test_bad_request_surfaces_as_openai_error(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2-135m", messages=MESSAGES, max_tokens=2, temperature=-1)
    assert e.value.body["param"] == "temperature" and e.value.body["type"] == "invalid_request_error"


def test_api_key(runtime):
    srv = LiveServer(runtime, api_key="s3cret", served_model_name="tiny")
    try:
        bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as e:
            bad.models.list()
        assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
        with srv.client() as http:
            assert http.get("/health").status_code == 200  # stays open
            assert http.get("/get_model_info").status_code == 401  # no header at all
            assert http.post("/generate", json={"text": "hi"}).status_code == 401
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret", max_retries=0)
        assert [m.id for m in good.models.list().data] == ["tiny"]
        out = good.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, temperature=0)
        assert out.model == "tiny" and out.usage.completion_tokens == 2
    finally:
        srv.stop()


def test_32_concurrent_streams(server, runtime):
    prompts = [f"Count from {k}:" for k in range(4)]
    want = {
        p: runtime.generate(p, {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True})["text"]
        for p in prompts
    }

    async def one(client: openai.AsyncOpenAI, prompt: str) -> tuple[str, str, list]:
        stream = await client.completions.create(
            model="smollm2-135m",
            prompt=prompt,
            max_tokens=8,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        return prompt, "".join(c.choices[0].text for c in chunks if c.choices), chunks

    async def all_of_them():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
            return await asyncio.gather(*(one(client, prompts[k % 4]) for k in range(32)))

    results = asyncio.run(all_of_them())
    assert len(results) == 32
    for prompt, text, chunks in results:
        assert text == want[prompt]
        assert chunks[-1].usage.completion_tokens == 8 and chunks[-2].choices[0].finish_reason == "length"
    assert_no_leaked_pages(runtime)

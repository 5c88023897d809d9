"""No input makes the server answer 500 or die: every bad request gets its 4xx (or 503) and
OpenAI's error JSON, and /health is still 200 afterwards."""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import assert_no_leaked_pages

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HI = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return {"messages": HI, "max_tokens": 2, **fields}


def sampling(**params):
    return {"text": "hi", "sampling_params": {"max_new_tokens": 2, **params}}


# (path, JSON body, status, the error's param or None to skip that check)
BAD_JSON_BODIES = [
    ("/generate", {"text": 5}, 400, "text"),
    ("/generate", {}, 400, "prompt"),
    ("/generate", {"input_ids": []}, 400, "prompt"),
    ("/generate", {"text": []}, 400, "text"),  # an empty batch, once answered 200 with nothing
    ("/generate", {"input_ids": [[]]}, 400, "prompt"),
    ("/generate", {"text": ["a"], "sampling_params": []}, 400, "sampling_params"),
    ("/generate", {"input_ids": [-1]}, 400, "input_ids"),
    ("/generate", {"input_ids": [10**12]}, 400, "input_ids"),
    ("/generate", sampling(max_new_tokens=-1), 400, "max_new_tokens"),
    ("/generate", sampling(temperature="hot"), 400, "temperature"),
    ("/generate", sampling(top_k=10**12), 400, "top_k"),
    ("/generate", sampling(seed=2**70), 400, "seed"),
    ("/generate", sampling(stop_token_ids=[10**9]), 400, "stop_token_ids"),
    ("/generate", sampling(regex="("), 400, "regex"),
    ("/generate", sampling(json_schema={"type": 5}), 400, "json_schema"),
    ("/generate", sampling(bogus=1), 400, "bogus"),
    ("/generate", {"text": "hi", "top_logprobs_num": 10**9, "return_logprob": True}, 400, "top_logprobs_num"),
    ("/generate", {"text": "hi " * 9000}, 400, "prompt"),
    ("/generate", {"text": "\ud800"}, 400, "prompt"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": "hi"}, 400, "messages"),
    (CHAT, {"max_tokens": 2}, 400, "messages"),
    (CHAT, chat(messages=[{"role": "function", "content": "x"}]), 400, "messages.0.role"),
    (
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        400,
        "messages.0.content.0",
    ),
    (CHAT, chat(messages=[{"role": "user", "content": "\ud800"}]), 400, "prompt"),
    (CHAT, chat(max_tokens=0), 400, "max_tokens"),
    (CHAT, chat(max_tokens=-5), 400, "max_tokens"),
    (CHAT, chat(temperature=-1), 400, "temperature"),
    (CHAT, chat(top_p=7), 400, "top_p"),
    (CHAT, chat(n=0), 400, "n"),
    (CHAT, chat(n=10**9), 400, "n"),
    (CHAT, chat(n="many"), 400, "n"),
    (CHAT, chat(stop=[""]), 400, "stop"),
    (CHAT, chat(seed=2**64), 400, "seed"),
    (CHAT, chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    (CHAT, chat(response_format={"type": "bogus"}), 400, "response_format.type"),
    (CHAT, chat(response_format={"type": "json_schema"}), 400, "response_format.json_schema"),
    (CHAT, chat(guided_choice=["a"], guided_regex="a"), 400, "guided_choice"),
    (CHAT, chat(logit_bias={"\u00b2": 1}), 400, "logit_bias"),  # a unicode digit is not a token id
    (
        CHAT,
        chat(response_format={"type": "json_schema", "json_schema": {"schema": {"type": 5}}}),
        400,
        "json_schema",
    ),
    (CHAT, chat(regex="["), 400, "regex"),
    (CHAT, chat(stream="yes please"), 400, "stream"),
    (CHAT, chat(stream=True, frequency_penalty=9), 400, "frequency_penalty"),
    (
        CHAT,
        chat(
            tools=[{"type": "function", "function": {"name": "f"}}],
            tool_choice={"type": "function", "function": {"name": "g"}},
        ),
        400,
        "tool_choice.function.name",
    ),
    (CHAT, chat(model="gpt-4o"), 404, "model"),
    (COMPLETIONS, {"prompt": []}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [[]]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": ""}, 400, "prompt"),
    (COMPLETIONS, {"prompt": None}, 400, None),
    (COMPLETIONS, {"prompt": "hi", "echo": True, "suffix": "x"}, 400, "echo"),
    (COMPLETIONS, {"prompt": "hi", "logprobs": 6}, 400, "logprobs"),
    (COMPLETIONS, {"prompt": [[1, 2]] * 100, "n": 128}, 400, "n"),  # more sequences than the server holds
]

BAD_RAW_BODIES = [
    (CHAT, b"{not json"),
    (CHAT, b""),
    ("/generate", b"\xff\xfe\xfa"),
    ("/generate", b'{"text": "\xff"}'),
    ("/generate", b"[" * 100_000),
    ("/generate", b"null"),
    ("/generate", b'{"text": "hi", "sampling_params": {"temperature": NaN}}'),
    (CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}'),
]


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


@pytest.mark.parametrize("path,body,status,param", BAD_JSON_BODIES, ids=lambda v: str(v)[:40])
def test_bad_json_body(http, path, body, status, param):
    # sent as bytes: the JSON may carry what httpx would refuse to encode (a lone surrogate)
    response = http.post(
        path, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    error = assert_openai_error(response, status)
    if param is not None:
        assert error["param"] == param, error


@pytest.mark.parametrize("path,raw", BAD_RAW_BODIES, ids=lambda v: str(v)[:30])
def test_bad_raw_body(http, path, raw):
    assert_openai_error(http.post(path, content=raw, headers={"content-type": "application/json"}), 400)


def test_unknown_fields_are_ignored(http):
    body = chat(temperature=0, some_future_field={"x": 1}, user="u", parallel_tool_calls=False)
    body["messages"] = [{"role": "user", "content": "hi", "unknown": 1}]
    assert http.post(CHAT, json=body).status_code == 200
    assert (
        http.post(
            "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}, "rid": "x"}
        ).status_code
        == 200
    )


def test_routes_and_methods(http):
    assert_openai_error(http.get("/no/such/route"), 404)
    assert_openai_error(http.get("/generate"), 405)


def test_max_tokens_beyond_the_context_is_refused(http):
    out = http.post(CHAT, json=chat(max_tokens=10**20, regex="(yes|no)"))  # OpenAI and vLLM answer 400 too
    error = assert_openai_error(out, 400)
    assert error["param"] == "max_tokens" and error["code"] == "context_length_exceeded"


def test_full_queue_is_503_with_retry_after(server, runtime, monkeypatch):
    monkeypatch.setattr(runtime.config, "max_running_requests", 1)
    monkeypatch.setattr(runtime.config, "max_waiting_requests", 0)
    long = {
        "text": "Go on and on.",
        "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True},
        "stream": True,
    }
    with server.client() as c, c.stream("POST", "/generate", json=long) as r:
        lines = r.iter_lines()  # kept: a dropped iterator closes the connection, aborting the request
        next(lines)  # the engine holds the one allowed request now
        busy = c.post(CHAT, json=chat(stream=True))
        error = assert_openai_error(busy, 503)
        assert busy.headers["retry-after"] == "1" and error["code"] == "server_busy"
    monkeypatch.undo()
    assert_no_leaked_pages(runtime)


def test_health_survives_all_of_it(http, runtime):
    assert http.get("/health").status_code == 200
    ok = http.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}})
    assert ok.status_code == 200
    assert_no_leaked_pages(runtime)

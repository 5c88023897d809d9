"""Bad input and resource caps (issue 18, part B): every bad body gets a 4xx with OpenAI's error JSON
on /generate and both OpenAI routes alike, the per-request caps name their flag, and the server
still answers a good request after each refusal."""

from __future__ import annotations

import argparse
import json

import httpx
import pytest

from sgjit.errors import InvalidRequestError
from sgjit.server.args import ServerArgs, add_serve_arguments, server_args_from

from conftest import assert_no_leaked_pages
from server_harness import LiveServer

GENERATE, COMPLETIONS, CHAT = "/generate", "/v1/completions", "/v1/chat/completions"
ROUTES = (GENERATE, COMPLETIONS, CHAT)
VOCAB = 49152  # the bundled SmolLM2's
# SGLang's sampling_params names -> the OpenAI requests' names, where they differ
OPENAI_NAME = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}


def body_for(route: str, **params) -> dict:
    """A request for one short generation on `route` with these sampling parameters."""
    if route == GENERATE:
        return {"text": "hi", "sampling_params": {"max_new_tokens": 1, **params}}
    fields = {"max_tokens": 1, **{OPENAI_NAME.get(k, k): v for k, v in params.items()}}
    if route == COMPLETIONS:
        return {"prompt": "hi", **fields}
    return {"messages": [{"role": "user", "content": "hi"}], **fields}


# (sampling parameter, bad value): each sent on all three routes
BAD_SAMPLING = [
    ("temperature", -1),
    ("temperature", "hot"),
    ("temperature", "0.5"),  # a numeric string: pydantic's lax mode took it on the OpenAI routes
    ("temperature", True),
    ("temperature", 10**400),  # a float spelt as a 400-digit integer
    ("top_p", 0),
    ("top_p", 1.5),
    ("top_p", -0.1),
    ("top_k", -2),
    ("top_k", 10**12),
    ("top_k", 1.5),
    ("top_k", "5"),
    ("top_k", True),
    ("min_p", 2),
    ("frequency_penalty", 9),
    ("presence_penalty", -9),
    ("repetition_penalty", 0),
    ("max_new_tokens", -1),
    ("min_new_tokens", -1),
    ("seed", -1),
    ("seed", 2**70),
    ("stop", ""),
    ("stop", [5]),
    ("stop", ["a\x00b"]),
    ("stop", ["\ud800"]),
    ("stop_regex", ["("]),
    ("stop_token_ids", [-1]),
    ("stop_token_ids", [VOCAB]),
    ("stop_token_ids", [True]),
    ("stop_token_ids", ["5"]),
    ("regex", "("),
    ("regex", "a\x00"),
    ("regex", "\udc80+"),
    ("json_schema", {"type": 5}),
    ("json_schema", "{not json"),
    ("json_schema", {"type": "string", "pattern": "\ud800"}),
    ("json_schema", {"type": "string", "const": "a\x00"}),
    ("logit_bias", {"abc": 1}),
    ("logit_bias", {"5": 1000}),
    ("logit_bias", {str(VOCAB): 1}),
    ("n", 0),
    ("n", 10**9),
    ("n", "many"),
    ("n", True),
]
GRAMMAR_CASES = {("regex", "("), ("json_schema", "{'type': 5}")}


# (route, body, param or None): bad prompts, each for the route whose field it is
BAD_PROMPTS = [
    (GENERATE, {"text": "a\x00b"}, "prompt"),
    (GENERATE, {"text": "ok \ud800"}, "prompt"),
    (GENERATE, {"input_ids": [True, 1]}, "input_ids"),
    (GENERATE, {"input_ids": [1.0, 2]}, "input_ids"),
    (GENERATE, {"input_ids": ["7"]}, "input_ids"),
    (GENERATE, {"input_ids": [[1], ["7"]]}, "input_ids"),
    (GENERATE, {"input_ids": [-1]}, "input_ids"),
    (GENERATE, {"input_ids": [VOCAB]}, "input_ids"),
    (GENERATE, {"input_ids": [10**40]}, "input_ids"),
    (COMPLETIONS, {"prompt": [True, 1]}, "prompt"),
    (COMPLETIONS, {"prompt": [1, "7"]}, "prompt"),
    (COMPLETIONS, {"prompt": [[1, 2.5]]}, "prompt"),
    (COMPLETIONS, {"prompt": [-1]}, "input_ids"),
    (COMPLETIONS, {"prompt": [[5, VOCAB]]}, "input_ids"),
    (COMPLETIONS, {"prompt": "a\x00b"}, "prompt"),
    (COMPLETIONS, {"prompt": ["ok", "\udfff"]}, "prompt"),
    (CHAT, {"messages": [{"role": "user", "content": "a\x00b"}]}, "prompt"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]}, "prompt"),
    (
        CHAT,
        {"messages": [{"role": "system", "content": "\x00"}, {"role": "user", "content": "hi"}]},
        "prompt",
    ),
]


def post_raw(http: httpx.Client, route: str, raw: bytes) -> httpx.Response:
    return http.post(route, content=raw, headers={"content-type": "application/json"})


def post(http: httpx.Client, route: str, body: dict) -> httpx.Response:
    # as bytes: the JSON may carry what httpx would refuse to encode (a lone surrogate)
    return post_raw(http, route, json.dumps(body).encode())


def assert_openai_error(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["message"] and error["type"] == "invalid_request_error", error
    return error


@pytest.fixture(scope="module", autouse=True)
def still_serving_afterwards(http, runtime):
    """After every refusal above, each route still serves a good request and no KV page leaked."""
    yield
    for route in ROUTES:
        ok = post(http, route, body_for(route, temperature=0))
        assert ok.status_code == 200, ok.text
    assert_no_leaked_pages(runtime)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("key,value", BAD_SAMPLING, ids=lambda v: repr(v)[:24])
def test_bad_sampling_value_is_400_on_every_api(http, route, key, value):
    error = assert_openai_error(post(http, route, body_for(route, **{key: value})))
    assert error["param"] is not None and error["param"].split(".")[0] in (key, OPENAI_NAME.get(key))
    if (key, str(value)) in GRAMMAR_CASES:
        assert error["code"] == "invalid_grammar", error


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    "key,literal", [("temperature", "NaN"), ("top_p", "Infinity"), ("top_k", "-Infinity")]
)
def test_non_finite_json_numbers_are_400(http, route, key, literal):
    """Python's JSON parser (FastAPI's) reads NaN and Infinity, which JSON itself does not have."""
    raw = json.dumps(body_for(route, **{key: "@"})).replace('"@"', literal).encode()
    error = assert_openai_error(post_raw(http, route, raw))
    assert error["param"] == key


@pytest.mark.parametrize("route,body,param", BAD_PROMPTS, ids=lambda v: repr(v)[:40])
def test_bad_prompt_is_400(http, route, body, param):
    if route != GENERATE:
        body = {"max_tokens": 1, **body}
    error = assert_openai_error(post(http, route, body))
    assert error["param"].split(".")[0] == param, error


def test_out_of_vocab_ids_name_the_id_and_the_vocab_size(http):
    for route, body in ((GENERATE, {"input_ids": [1, VOCAB + 7]}), (COMPLETIONS, {"prompt": [1, -3]})):
        message = assert_openai_error(post(http, route, body))["message"]
        bad = VOCAB + 7 if route == GENERATE else -3
        assert f"token id {bad}" in message and str(VOCAB) in message, message


def test_nul_message_says_where(http):
    message = assert_openai_error(post(http, GENERATE, {"text": "abc\x00"}))["message"]
    assert "NUL" in message and "character 3" in message, message


# ----- resource caps -----
LIMITS = {
    "max_top_logprobs": 3,
    "max_n": 2,
    "max_stop_strings": 2,
    "max_stop_length": 8,
    "max_stop_token_ids": 2,
}


@pytest.fixture(scope="module")
def capped(runtime):
    srv = LiveServer(runtime, **LIMITS)
    with srv.client() as c:
        yield c
    srv.stop()


def top_logprobs_body(route: str, k: int) -> dict:
    if route == GENERATE:
        return {**body_for(route), "return_logprob": True, "top_logprobs_num": k}
    if route == COMPLETIONS:
        return {**body_for(route), "logprobs": k}
    return {**body_for(route), "logprobs": True, "top_logprobs": k}


# (flag, body builder at a value, the cap); one over the cap is refused, the cap itself served
CAPS = [
    ("--max-top-logprobs", top_logprobs_body, 3),
    ("--max-n", lambda route, k: body_for(route, n=k), 2),
    ("--max-n", lambda route, k: body_for(route, n=float(k)), 2),  # 3.0 is 3: capped, not let through
    ("--max-stop-strings", lambda route, k: body_for(route, stop=[f"s{i}" for i in range(k)]), 2),
    ("--max-stop-strings", lambda route, k: body_for(route, stop_regex=[f"x{i}+" for i in range(k)]), 2),
    ("--max-stop-length", lambda route, k: body_for(route, stop="z" * k), 8),
    ("--max-stop-length", lambda route, k: body_for(route, stop=["ok", "z" * k]), 8),
    ("--max-stop-token-ids", lambda route, k: body_for(route, stop_token_ids=list(range(5, 5 + k))), 2),
]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("flag,make,cap", CAPS, ids=lambda v: v if isinstance(v, str) else "")
def test_caps_refuse_above_and_serve_at_the_limit(capped, route, flag, make, cap):
    error = assert_openai_error(post(capped, route, make(route, cap + 1)))
    assert flag in error["message"] and error["code"] == "invalid_value", error
    ok = post(capped, route, make(route, cap))
    assert ok.status_code == 200, ok.text


def test_default_top_logprobs_cap_refuses_the_whole_vocabulary(http, runtime):
    """49152 top logprobs per token answered 181 MB and stalled every other client for seconds."""
    error = assert_openai_error(post(http, GENERATE, top_logprobs_body(GENERATE, VOCAB)))
    assert "--max-top-logprobs" in error["message"] and error["param"] == "top_logprobs_num"
    assert post(http, GENERATE, top_logprobs_body(GENERATE, 20)).status_code == 200
    assert_openai_error(post(http, GENERATE, top_logprobs_body(GENERATE, 21)))
    assert_openai_error(post(http, GENERATE, body_for(GENERATE, stop=[f"s{i}" for i in range(17)])))
    assert_openai_error(post(http, CHAT, body_for(CHAT, n=129)))
    assert_no_leaked_pages(runtime)


def test_limits_are_in_server_info(capped, http):
    assert capped.get("/get_server_info").json()["request_limits"] == LIMITS
    defaults = http.get("/get_server_info").json()
    assert defaults["request_limits"] == ServerArgs().limits()
    assert defaults["server_args"]["max_top_logprobs"] == 20


def test_limit_flags_reach_server_args():
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in LIMITS.items()]
    assert server_args_from(p.parse_args(argv)).limits() == LIMITS
    assert server_args_from(p.parse_args([])).limits() == ServerArgs().limits()
    for bad in ({"max_n": 129}, {"max_n": 0}, {"max_top_logprobs": -1}, {"max_stop_length": 0}):
        with pytest.raises(InvalidRequestError, match="--max-"):
            ServerArgs(**bad)


def test_serve_captures_decode_graphs_at_start_by_default():
    """`sgjit serve` warms its decode graphs while loading unless told not to; an in-process Runtime
    does not (RuntimeConfig's default)."""
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    assert server_args_from(p.parse_args([])).runtime.cuda_graph_warmup is True
    assert server_args_from(p.parse_args(["--no-cuda-graph-warmup"])).runtime.cuda_graph_warmup is False
    assert ServerArgs().runtime.cuda_graph_warmup is False

"""The rest of the OpenAI surface through the real `openai` SDK on the bundled model: echo (prompt
logprobs, max_tokens 0, streaming), suffix (FIM), the default max_tokens policy, reasoning_content,
structured output from every spelling (and refusals), parse(), GET /v1/models/{id}."""

from __future__ import annotations

import json
import re

import openai
import pydantic
import pytest
import tokenizers

from sgjit.runtime.tokenizer.tokenizer import Tokenizer
from sgjit.server.fim import fim_prompt, fim_tokens
from sgjit.server.openai_params import new_tokens
from sgjit.server.reasoning import ReasoningSplitter, default_parser

from server_harness import LiveServer

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server(runtime):
    srv = LiveServer(runtime, reasoning_parser="qwen3", max_new_tokens_default=4)
    yield srv
    srv.stop()


def bad_request(fn):
    with pytest.raises(openai.BadRequestError) as e:
        fn()
    return e.value.body


# ----- echo -----
def test_echo_with_logprobs_puts_the_prompt_first(client, runtime):
    out = client.completions.create(
        model="smollm2-135m", prompt=PROMPT, max_tokens=2, temperature=0, echo=True, logprobs=1
    )
    c = out.choices[0]
    plain = client.completions.create(model="smollm2-135m", prompt=PROMPT, max_tokens=2, temperature=0)
    assert c.text == PROMPT + plain.choices[0].text
    n_prompt = len(runtime.encode_prompt(PROMPT))
    lp = c.logprobs
    assert len(lp.tokens) == n_prompt + 2 and "".join(lp.tokens) == c.text
    assert lp.token_logprobs[0] is None and all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    assert lp.top_logprobs[0] is None and len(lp.top_logprobs[1]) >= 1
    offsets = [0]
    for tok in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(tok))
    assert lp.text_offset == offsets


def test_echo_max_tokens_zero_scores_the_prompt(client, runtime):
    out = client.completions.create(model="smollm2-135m", prompt=PROMPT, max_tokens=0, echo=True, logprobs=0)
    c = out.choices[0]
    assert c.text == PROMPT and out.usage.completion_tokens == 0
    assert len(c.logprobs.tokens) == len(runtime.encode_prompt(PROMPT))
    body = bad_request(lambda: client.completions.create(model="smollm2-135m", prompt=PROMPT, max_tokens=0))
    assert body["param"] == "max_tokens"


def test_streamed_echo_sends_the_prompt_first(client):
    chunks = list(
        client.completions.create(
            model="smollm2-135m", prompt=PROMPT, max_tokens=3, temperature=0, echo=True, stream=True
        )
    )
    assert chunks[0].choices[0].text == PROMPT
    whole = client.completions.create(
        model="smollm2-135m", prompt=PROMPT, max_tokens=3, temperature=0, echo=True
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text


# ----- suffix (FIM) -----
def test_suffix_is_refused_on_a_model_without_fim_tokens(client):
    body = bad_request(
        lambda: client.completions.create(model="smollm2-135m", prompt="def f(", suffix="    return x")
    )
    assert body["param"] == "suffix" and "fill-in-the-middle" in body["message"]


def tiny_tokenizer(specials):
    vocab = {w: i for i, w in enumerate(["<unk>", "a", "b", *specials])}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return Tokenizer(backend, bos_token_id=None, eos_token_ids=[0], add_bos=False, chat_template=None)


@pytest.mark.parametrize(
    "specials,style",
    [(["<fim_prefix>", "<fim_suffix>", "<fim_middle>"], "starcoder"),
     (["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"], "qwen")],
)  # fmt: skip
def test_fim_prompt_from_the_vocabulary(specials, style):
    tok = tiny_tokenizer(specials)
    assert fim_tokens(tok).style == style
    assert fim_prompt(tok, "a", "b") == [3, 1, 4, 2, 5]  # prefix-suffix-middle order
    assert fim_tokens(tiny_tokenizer(specials[:2])) is None


# ----- max_tokens policy -----
def test_default_max_tokens_cap_and_context_overflow(client, runtime):
    msgs = [{"role": "user", "content": "Tell me a long story"}]
    out = client.chat.completions.create(model="smollm2-135m", messages=msgs, temperature=0)
    assert out.usage.completion_tokens <= 4  # the server's --max-new-tokens-default
    body = bad_request(
        lambda: client.chat.completions.create(
            model="smollm2-135m", messages=msgs, max_tokens=runtime.max_model_len
        )
    )
    assert body["code"] == "context_length_exceeded" and body["param"] == "max_tokens"
    assert new_tokens(100, 40, None, 0) == 60 and new_tokens(100, 40, None, 8) == 8
    assert new_tokens(100, 40, 60, 8) == 60


# ----- reasoning -----
THINK = "<think>[a-z ]{1,20}</think>[a-z ]{1,20}"


def test_reasoning_content_split(client):
    msgs = [{"role": "user", "content": "Think, then answer"}]
    out = client.chat.completions.create(
        model="smollm2-135m", messages=msgs, max_tokens=60, temperature=0, extra_body={"regex": THINK}
    )
    m = out.choices[0].message
    assert m.reasoning_content and re.fullmatch("[a-z ]{1,20}", m.reasoning_content)
    assert m.content is not None and "<think>" not in m.content and "</think>" not in m.content
    stream = client.chat.completions.create(
        model="smollm2-135m", messages=msgs, max_tokens=60, temperature=0, extra_body={"regex": THINK},
        stream=True,
    )  # fmt: skip
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == m.reasoning_content
    assert "".join(d.content or "" for d in deltas) == m.content


def test_splitter_holds_partial_tags():
    s = ReasoningSplitter.named("qwen3")
    parts = [s.feed(ch) for ch in "<think>ab</think>cd"] + [s.flush()]
    assert "".join(r for r, _ in parts) == "ab" and "".join(c for _, c in parts) == "cd"
    assert ReasoningSplitter.named("deepseek-r1").split("ab</think>cd") == ("ab", "cd")
    assert ReasoningSplitter.named("qwen3").split("plain") == (None, "plain")
    assert default_parser("{{'<think>\\n'}}</think>") == "deepseek-r1" and default_parser("x") is None


# ----- structured output -----
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(
    "extra,check",
    [
        ({"response_format": {"type": "json_object", "schema": SCHEMA}}, lambda t: "a" in json.loads(t)),
        ({"guided_json": SCHEMA}, lambda t: "a" in json.loads(t)),
        ({"guided_choice": ["yes", "no"]}, lambda t: t in ("yes", "no")),
        ({"structured_outputs": {"regex": "[0-9]{3}"}}, lambda t: re.fullmatch("[0-9]{3}", t)),
        ({"structured_outputs": {"grammar": 'start: "x" "y"'}}, lambda t: t == "xy"),
    ],
)
def test_structured_output_spellings_on_completions(client, extra, check):
    out = client.completions.create(
        model="smollm2-135m", prompt="Answer:", max_tokens=30, temperature=0, extra_body=extra
    )
    assert check(out.choices[0].text), out.choices[0].text


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"guided_regex": "a+", "guided_choice": ["b"]}, "guided_choice"),
        ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
        ({"guided_grammar": 'root ::= "x"'}, "guided_grammar"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ],
)
def test_unhonourable_requests_are_refused(client, extra, param):
    body = bad_request(
        lambda: client.chat.completions.create(
            model="smollm2-135m", messages=[{"role": "user", "content": "hi"}], max_tokens=2, extra_body=extra
        )
    )
    assert body["param"] == param, body


class Answer(pydantic.BaseModel):
    city: str


def test_sdk_parse_returns_the_model(client):
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    out = parse(
        model="smollm2-135m", messages=[{"role": "user", "content": "Capital of France as JSON"}],
        response_format=Answer, max_tokens=40, temperature=0,
    )  # fmt: skip
    assert isinstance(out.choices[0].message.parsed, Answer)


# ----- models -----
def test_retrieve_model(client):
    assert client.models.retrieve("smollm2-135m").id == "smollm2-135m"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4")
    assert e.value.body["code"] == "model_not_found"


# ----- metrics -----
def test_vllm_metric_series(client, server):
    from prometheus_client.parser import text_string_to_metric_families

    client.completions.create(
        model="smollm2-135m", prompt=PROMPT, max_tokens=3, temperature=0, extra_body={"ignore_eos": True}
    )
    with server.client() as http:
        text = http.get("/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    model = (("model_name", "smollm2-135m"),)

    def value(name, **labels):
        return samples[(name, tuple(sorted({**dict(model), **labels}.items())))]

    assert value("vllm:prompt_tokens_total") > 0 and value("vllm:generation_tokens_total") >= 3
    assert value("vllm:request_success_total", finished_reason="length") >= 1
    assert value("vllm:num_requests_running") == 0 and value("vllm:num_requests_waiting") == 0
    assert 0 <= value("vllm:kv_cache_usage_perc") == value("vllm:gpu_cache_usage_perc") <= 1
    for hist in ("time_to_first_token", "e2e_request_latency"):
        assert value(f"vllm:{hist}_seconds_count") >= 1
    for hist in ("inter_token_latency", "time_per_output_token"):
        assert value(f"vllm:{hist}_seconds_count") >= 2
    assert ("sgjit_time_to_first_token_seconds_count", ()) in samples  # sgjit's own series stay

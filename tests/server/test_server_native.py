"""SGLang's native routes over real HTTP: /generate equals `Runtime.generate`, SSE framing byte by
byte, disconnects free KV pages, an error mid-stream ends the stream cleanly, and the operational
routes (/health*, info, /flush_cache, /metrics)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from conftest import GREEDY, assert_no_leaked_pages
from server_harness import LiveServer, sse_events, wait_idle

VOLATILE_META = {"id", "e2e_latency", "cached_tokens"}


def comparable(result: dict) -> dict:
    """A result as JSON carries it (tuples as lists), without the fields that differ run to run."""
    result = json.loads(json.dumps(result))
    return {**result, "meta_info": {k: v for k, v in result["meta_info"].items() if k not in VOLATILE_META}}


def test_generate_equals_runtime_generate(http, runtime):
    request = {
        "text": "The capital of France is",
        "sampling_params": {**GREEDY, "max_new_tokens": 4, "stop": ["\n"]},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 2,
        "return_text_in_logprobs": True,
    }
    got = http.post("/generate", json=request)
    assert got.status_code == 200 and got.headers["content-type"] == "application/json"
    want = runtime.generate(
        request["text"],
        request["sampling_params"],
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=2,
        return_text_in_logprobs=True,
    )
    assert comparable(got.json()) == comparable(want)


def test_generate_batch_and_input_ids(http, runtime):
    ids = [runtime.tokenizer.encode("Hello"), runtime.tokenizer.encode("1, 2,")]
    params = [{**GREEDY, "max_new_tokens": 3}, {**GREEDY, "max_new_tokens": 2}]
    got = http.post("/generate", json={"input_ids": ids, "sampling_params": params}).json()
    want = runtime.generate(input_ids=ids, sampling_params=params)
    assert [comparable(g) for g in got] == [comparable(w) for w in want]


def test_generate_stream_framing_byte_by_byte(server, runtime):
    request = {"text": "One, two,", "sampling_params": {**GREEDY, "max_new_tokens": 5}, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60) as c, c.stream("POST", "/generate", json=request) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_raw())
    assert raw.endswith(b"data: [DONE]\n\n")
    events = raw.split(b"\n\n")
    assert events[-1] == b""  # every event, the last included, ends with a blank line
    for event in events[:-1]:
        assert event.startswith(b"data: ") and b"\n" not in event
    payloads = [json.loads(e[len(b"data: ") :]) for e in events[:-2]]
    want = runtime.generate(request["text"], request["sampling_params"])
    texts = [p["text"] for p in payloads]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # SGLang's cumulative text
    assert all(p["meta_info"]["finish_reason"] is None for p in payloads[:-1])
    assert comparable(payloads[-1]) == comparable(want)
    assert payloads[-2]["output_ids"] == want["output_ids"][: len(payloads[-2]["output_ids"])]


def test_generate_stream_batch_is_indexed(http, runtime):
    request = {
        "text": ["Hello", "Bonjour"],
        "sampling_params": {**GREEDY, "max_new_tokens": 3},
        "stream": True,
    }
    with http.stream("POST", "/generate", json=request) as r:
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    finals = {e["index"]: e for e in events[:-1] if e["meta_info"]["finish_reason"] is not None}
    want = runtime.generate(request["text"], request["sampling_params"])
    assert [comparable(finals[i]) for i in (0, 1)] == [
        {**comparable(w), "index": i} for i, w in enumerate(want)
    ]


def test_disconnect_mid_stream_frees_kv_pages(server, runtime):
    runtime.flush_cache()
    before = wait_idle(runtime)
    start = before["kv_pages_free"]
    request = {
        "text": "Write a long story about a dragon.",
        "sampling_params": {**GREEDY, "max_new_tokens": 2000, "ignore_eos": True},
        "stream": True,
    }
    with httpx.Client(base_url=server.url, timeout=60) as c, c.stream("POST", "/generate", json=request) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first.removeprefix("data: "))["meta_info"]["finish_reason"] is None
        assert runtime.stats()["running"] == 1
    # the client is gone: the server aborts the request and its pages come back
    s = wait_idle(runtime)
    assert s["running"] == 0 and s["waiting"] == 0
    runtime.flush_cache()
    assert runtime.stats()["kv_pages_free"] == start
    assert s["generation_tokens_total"] - before["generation_tokens_total"] < 2000  # stopped, not finished


def test_disconnect_while_waiting_for_a_full_result_aborts(server, runtime):
    request = {
        "text": "Tell me everything.",
        "sampling_params": {**GREEDY, "max_new_tokens": 2000, "ignore_eos": True},
    }
    with httpx.Client(base_url=server.url, timeout=1.0) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/generate", json=request)
    t0 = time.monotonic()
    s = wait_idle(runtime)
    assert s["running"] == 0 and time.monotonic() - t0 < 20
    assert_no_leaked_pages(runtime)


def test_error_after_the_stream_started_is_an_sse_event(server, runtime, monkeypatch):
    """An engine failure mid-stream (here: the request aborted under it) ends the stream with an
    error event and [DONE], never a broken connection."""
    real_submit = runtime.submit

    def submit_then_abort_after_first_token(req, sink):
        def sink_that_aborts(update):
            sink(update)
            if update.token_ids and not update.finished:
                runtime.abort(req.rid)

        real_submit(req, sink_that_aborts)

    monkeypatch.setattr(runtime, "submit", submit_then_abort_after_first_token)
    request = {
        "model": "smollm2-135m",
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": 50,
        "stream": True,
    }
    with (
        httpx.Client(base_url=server.url, timeout=60) as c,
        c.stream("POST", "/v1/chat/completions", json=request) as r,
    ):
        assert r.status_code == 200
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "request_aborted"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    monkeypatch.undo()
    assert_no_leaked_pages(runtime)


def test_health_and_health_generate(http):
    assert http.get("/health").json() == {"status": "ok"}
    out = http.get("/health_generate")
    assert out.status_code == 200 and len(out.json()["output_ids"]) == 1


def test_health_is_503_while_starting_and_draining(runtime):
    srv = LiveServer(runtime)
    try:
        with srv.client() as c:
            srv.state.runtime, srv.state.phase = None, srv.state.phase.STARTING
            r = c.get("/health")
            assert r.status_code == 503 and r.json()["error"]["code"] == "starting"
            assert c.post("/generate", json={"text": "hi"}).status_code == 503
            srv.state.set_ready(runtime)
            assert c.get("/health").status_code == 200
            srv.state.begin_drain()
            r = c.get("/health")
            assert r.status_code == 503 and r.json()["error"]["code"] == "draining"
            refused = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert c.get("/get_model_info").status_code == 200  # reading still works while draining
    finally:
        srv.stop()


def test_model_and_server_info(http, runtime):
    info = http.get("/get_model_info").json()
    assert info["model_path"] == str(runtime.model_path) and info["max_model_len"] == runtime.max_model_len
    assert info["vocab_size"] == runtime.model_config.vocab_size and info["is_generation"] is True
    server = http.get("/get_server_info").json()
    assert server["arch"] == "cpu" and server["jit"]["enabled"] is False
    assert server["server_args"]["api_key"] is None and server["server_args"]["port"] == 0
    assert server["ops"]["linear"].startswith("sgjit.kernels.") and server["kernel_set"] is None
    assert server["device_profile"]["kind"] == "cpu" and len(server["arch_hash"]) == 16
    assert server["stats"]["kv_pages_total"] == runtime.stats()["kv_pages_total"]


def test_flush_cache(http, runtime):
    http.post(
        "/generate",
        json={
            "text": "A sentence long enough to fill a page of the prefix cache. " * 3,
            "sampling_params": {"max_new_tokens": 1},
        },
    )
    assert runtime.stats()["kv_pages_evictable"] > 0
    assert http.post("/flush_cache").json()["pages_freed"] > 0
    assert runtime.stats()["kv_pages_evictable"] == 0


def test_metrics_carry_jit_counters_once_the_runtime_reports_them(http, runtime, monkeypatch):
    assert "sgjit_jit_compiles" not in http.get("/metrics").text
    real_stats = runtime.stats
    monkeypatch.setattr(runtime, "stats", lambda: {**real_stats(), "jit_compiles": 3, "jit_cache_hits": 7})
    text = http.get("/metrics").text
    assert "sgjit_jit_compiles 3.0" in text and "sgjit_jit_cache_hits 7.0" in text
    jit = http.get("/get_server_info").json()["jit"]
    assert jit["compiles"] == 3 and jit["cache_hits"] == 7


def test_metrics(http):
    http.post("/generate", json={"text": "Hi there", "sampling_params": {"max_new_tokens": 3}})
    text = http.get("/metrics").text

    def value(name: str) -> float:
        line = next(line for line in text.splitlines() if line.startswith(name + " "))
        return float(line.split()[1])

    assert value("sgjit_prompt_tokens_total") > 0 and value("sgjit_generation_tokens_total") >= 3
    assert value("sgjit_time_to_first_token_seconds_count") >= 1
    assert value("sgjit_inter_token_latency_seconds_count") >= 2
    assert value("sgjit_e2e_request_latency_seconds_count") >= 1
    assert value("sgjit_num_requests_running") == 0 and value("sgjit_num_requests_waiting") == 0
    assert 0.0 <= value("sgjit_kv_cache_usage_ratio") <= 1.0
    assert 0.0 <= value("sgjit_prefix_cache_hit_rate") <= 1.0

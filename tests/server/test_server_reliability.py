"""Fault behaviour of `sgjit serve` found by the security review (docs/reliability.md): body and
prompt limits, idle and half-sent connections, plan runs that hold no pool thread and stop when
their client leaves, profile names confined to --profile-dir, 500s that keep the connection, SSE
line breaks, the drain's second signal, and what the API key protects."""

from __future__ import annotations

import json
import signal
import socket
import statistics
import threading
import time

import httpx
import pytest

import sgjit
from sgjit.server import json_route, native_api
from sgjit.server.app import create_app
from sgjit.server.args import ServerArgs
from sgjit.server.auth import key_matches
from sgjit.server.launch import DrainingServer, uvicorn_config
from sgjit.server.sse import sse

from conftest import assert_no_leaked_pages
from server_harness import LiveServer, sse_events, wait_idle


@pytest.fixture
def live(runtime):
    servers: list[LiveServer] = []

    def start(**args) -> LiveServer:
        servers.append(LiveServer(runtime, **args))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def _health_ms(client: httpx.Client) -> float:
    t = time.perf_counter()
    assert client.get("/health").status_code == 200
    return (time.perf_counter() - t) * 1000


# ----- 1. body size and prompt length -----
def test_body_over_the_limit_gets_413_by_length_and_by_chunks(live):
    srv = live(max_request_bytes=64 * 1024)
    big = json.dumps({"text": "x" * 70_000}).encode()
    with srv.client() as c:
        r = c.post("/generate", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        chunked = c.post("/generate", content=iter([big[:40_000], big[40_000:]]))  # no Content-Length
        assert chunked.status_code == 413 and "--max-request-bytes" in chunked.json()["error"]["message"]
        ok = c.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 1}})
        assert ok.status_code == 200


def test_overlong_prompt_is_refused_before_tokenizing(live, runtime, monkeypatch):
    def no_tokenizing(*a, **k):
        raise AssertionError("tokenized a prompt that cannot fit")

    srv = live()
    chars = runtime.max_model_len * 32 + 1
    monkeypatch.setattr(runtime.tokenizer, "encode", no_tokenizing)
    monkeypatch.setattr(runtime.tokenizer, "encode_chat", no_tokenizing)  # nor templated
    half = "a" * (chars // 2 + 1)  # each message fits alone; together they cannot
    with srv.client() as c:
        for path, body, param in [
            ("/generate", {"text": "a" * chars}, "prompt"),
            ("/v1/completions", {"prompt": "a" * chars}, "prompt"),
            (
                "/v1/chat/completions",
                {"messages": [{"role": "system", "content": half}, {"role": "user", "content": half}]},
                "messages",
            ),
        ]:
            r = c.post(path, json=body)
            error = r.json()["error"]
            assert r.status_code == 400 and error["code"] == "context_length_exceeded", path
            assert error["param"] == param, path


def test_large_json_bodies_are_parsed_off_the_event_loop(live, monkeypatch):
    """A body over OFF_LOOP_BYTES is parsed on a worker thread, and answered as a small one would
    be: valid JSON reaches the route, invalid JSON gets the usual 400."""
    threads: list[str] = []
    parse = json_route._parse
    monkeypatch.setattr(
        json_route, "_parse", lambda body: (threads.append(threading.current_thread().name), parse(body))[1]
    )
    srv = live()
    pad = " " * (json_route.OFF_LOOP_BYTES + 1)  # whitespace: a large body with a short prompt
    body = '{"text": "Hi", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}' + pad
    with srv.client() as c:
        ok = c.post("/generate", content=body, headers={"content-type": "application/json"})
        bad = c.post(
            "/generate", content=body[: -len(pad)] + "}" + pad, headers={"content-type": "application/json"}
        )
        small = c.post(
            "/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        )
    assert ok.status_code == 200 and ok.json()["text"] == small.json()["text"]
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    assert len(threads) == 2 and all(name != srv.thread.name for name in threads), threads


def test_health_stays_fast_during_a_flood_of_huge_prompts(live):
    """20 MB prompts (over the 16 MiB default: refused by their length) and 15 MB ones (read and
    parsed, then refused by the character bound) while /health is probed."""
    srv = live()
    stop = threading.Event()
    codes: list[int] = []

    def flood(size: int) -> None:
        body = json.dumps({"text": "a" * size}).encode()
        with srv.client() as c:
            while not stop.is_set():
                try:
                    codes.append(c.post("/generate", content=body).status_code)
                except httpx.TransportError:  # the server may close while a refused body is still being sent
                    codes.append(413)

    threads = [threading.Thread(target=flood, args=(n,)) for n in (20_000_000, 20_000_000, 15_000_000)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        with srv.client() as c:
            probes = []
            for _ in range(20):
                probes.append(_health_ms(c))
                time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert set(codes) <= {400, 413} and 413 in codes and 400 in codes
    print(f"/health during the flood: median {statistics.median(probes):.1f} ms, max {max(probes):.1f} ms")
    assert statistics.median(probes) < 500, probes  # the requirement is 100 ms; x5 for a shared CI machine


# ----- 2. connections -----
def test_idle_and_half_sent_connections_are_closed_and_health_stays_up(live):
    srv = live(header_timeout=1.0)
    port = int(srv.url.rsplit(":", 1)[1])
    socks = []
    for i in range(400):
        s = socket.create_connection(("127.0.0.1", port))
        if i % 2:
            s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-")  # a request head never finished
        socks.append(s)
    try:
        with srv.client() as c:
            assert _health_ms(c) < 2000
        deadline = time.monotonic() + 20
        for s in socks:
            s.settimeout(max(deadline - time.monotonic(), 0.01))
            assert s.recv(1) == b""  # closed by the server (a timeout here would raise)
        with srv.client() as c:
            assert c.get("/health").status_code == 200
    finally:
        for s in socks:
            s.close()


def test_connections_over_the_cap_are_closed_at_once(live):
    srv = live(max_connections=20, header_timeout=30.0)
    port = int(srv.url.rsplit(":", 1)[1])
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
    try:
        time.sleep(0.2)  # let the server accept them
        extra = socket.create_connection(("127.0.0.1", port))
        extra.settimeout(10)
        with pytest.raises((ConnectionResetError, ConnectionAbortedError)):
            if extra.recv(1) == b"":
                raise ConnectionResetError
        assert len(srv.server.server_state.connections) == 20
    finally:
        for s in socks:
            s.close()
    deadline = time.monotonic() + 10
    while srv.server.server_state.connections and time.monotonic() < deadline:
        time.sleep(0.02)
    with srv.client() as c:
        assert c.get("/health").status_code == 200


# ----- 3. plan runs -----
@sgjit.function
def ramble(s, topic):
    s += "Tell me about " + topic + "."
    s += sgjit.gen(
        "talk", max_tokens=1500, ignore_eos=True, temperature=0
    )  # far longer than the client waits


def test_plan_runs_are_in_flight_and_stop_when_the_client_leaves(live, runtime):
    srv = live()
    plan = ramble.trace()
    with srv.client() as c:
        assert c.post("/plans", json={"plan": plan.to_json()}).status_code == 200
    url = f"{srv.url}/plans/{plan.plan_hash}/run"
    outcomes: list[str] = []

    def run_and_leave() -> None:
        try:  # the client gives up long before 1500 tokens: its run must be aborted
            httpx.post(url, json={"args": {"topic": "rivers"}}, timeout=httpx.Timeout(60, read=15))
            outcomes.append("finished")
        except httpx.ReadTimeout:
            outcomes.append("left")

    runs = [threading.Thread(target=run_and_leave) for _ in range(45)]  # more than the pool's 40 threads
    for t in runs:
        t.start()
    deadline = time.monotonic() + 30
    while len(srv.state.groups) < 45 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(srv.state.groups) == 45  # every run counts for the drain
    # Other clients are still served beside 45 decoding runs: no pool thread is held, and the runs'
    # promised (not yet used) KV pages are lent to unprotected requests.
    t = time.monotonic()
    one = httpx.post(
        f"{srv.url}/generate",
        json={"text": "Hi", "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
        timeout=6,
    )
    waited = time.monotonic() - t
    chat = httpx.post(
        f"{srv.url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
        timeout=6,
    )
    print(f"beside 45 plan runs: 1-token /generate {waited:.2f} s, chat {chat.elapsed.total_seconds():.2f} s")
    assert one.status_code == 200 and chat.status_code == 200
    assert not outcomes and len(srv.state.groups) == 45  # answered while every run still decoded
    for t in runs:
        t.join()
    assert outcomes == ["left"] * 45
    assert wait_idle(runtime, timeout=10)["running"] == 0  # aborted, not generating on for minutes
    deadline = time.monotonic() + 5
    while srv.state.groups and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not srv.state.groups
    assert_no_leaked_pages(runtime)


# ----- 4. profile names -----
def test_profile_names_stay_inside_the_profile_dir(live, tmp_path):
    srv = live(profile_dir=str(tmp_path / "traces"))
    with srv.client() as c:
        for name in ("../x", "/tmp/x", "a/b", ".hidden", "", "x" * 200, "..\\x"):
            r = c.post("/start_profile", json={"name": name})
            assert r.status_code == 400 and r.json()["error"]["param"] == "name", name
        assert c.post("/start_profile", json={"name": "run-1.a"}).status_code == 200
        assert c.post("/stop_profile").json()["trace"] == str(tmp_path / "traces" / "run-1.a.trace.json")
    assert not (tmp_path / "x.trace.json").exists()


# ----- 5. 500s -----
def test_unexpected_error_is_a_bare_500_and_the_connection_stays_usable(live, monkeypatch):
    def broken(state):
        raise RuntimeError("secret /opt/weights/path")

    monkeypatch.setattr(native_api, "model_info", broken)
    srv = live()
    with srv.client() as c:
        r = c.get("/get_model_info")
        assert r.status_code == 500
        error = r.json()["error"]
        assert "secret" not in r.text and "RuntimeError" not in r.text
        assert error["type"] == "server_error" and r.headers["x-request-id"] in error["message"]
        first = r.extensions["network_stream"].get_extra_info("client_addr")
        ok = c.get("/health")
        assert ok.status_code == 200
        assert ok.extensions["network_stream"].get_extra_info("client_addr") == first  # same connection


# ----- 6. SSE line breaks -----
@sgjit.function
def echo(s, topic):
    s += "Say: " + topic
    s += sgjit.gen("said", max_tokens=2, temperature=0)


def test_sse_escapes_unicode_line_breaks():
    event = sse(json.dumps({"text": "a\u2028b\u2029c\x85d"}, ensure_ascii=False))
    assert event.count(b"\n") == 2 and "\u2028".encode() not in event
    assert json.loads(event.decode().removeprefix("data: ").strip())["text"] == "a\u2028b\u2029c\x85d"


def test_streamed_text_with_line_breaks_survives_iter_lines(live):
    srv = live()
    plan = echo.trace()
    topic = "one\u2028two\u2029three\x85four"
    with srv.client() as c:
        c.post("/plans", json={"plan": plan.to_json()})
        body = {"args": {"topic": topic}, "stream": True}
        with c.stream("POST", f"/plans/{plan.plan_hash}/run", json=body) as s:
            events = sse_events(s.iter_lines())
    assert events[-1] == "[DONE]" and topic in events[-2]["text"]


# ----- 7. drain -----
def test_a_second_sigterm_stops_at_once(runtime):
    args = ServerArgs(runtime=runtime.config, port=0)
    assert args.drain_timeout < 10  # inside a container runtime's grace period
    app = create_app(args, runtime)
    server = DrainingServer(uvicorn_config(app, args), app.state.sgjit)
    server.handle_exit(signal.SIGTERM, None)
    assert server.drain_deadline is not None and not server.force_exit
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit and server.force_exit


# ----- 8. API key -----
def test_api_key_guards_every_route_but_health(live):
    srv = live(api_key="s3cret")
    with srv.client() as c:
        assert c.get("/health").status_code == 200
        for method, path in [("GET", "/metrics"), ("GET", "/openapi.json"), ("GET", "/docs"),
                             ("GET", "/get_server_info"), ("POST", "/flush_cache"), ("GET", "/tokenizer"),
                             ("POST", "/plans"), ("GET", "/no-such-route")]:  # fmt: skip
            r = c.request(method, path)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
        # refused before the body is read: an unauthenticated client cannot make the server parse it
        big = c.post("/generate", content=b"x" * (17 * 1024 * 1024))
        assert big.status_code == 401
        authed = c.get("/metrics", headers={"Authorization": "Bearer s3cret"})
        assert authed.status_code == 200


def test_key_comparison_ignores_length_differences():
    assert key_matches("s3cret", "s3cret")
    assert (
        not key_matches("s3cre", "s3cret")
        and not key_matches("s3crett", "s3cret")
        and not key_matches("", "k")
    )

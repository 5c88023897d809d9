"""Plan routes and the `RuntimeEndpoint` client: a DSL program run through HTTP equals the in-process
run; plan registration, run by hash, streaming, reload, delete, JIT clear; profiling windows."""

from __future__ import annotations

import json
import textwrap

import pytest

import sgjit
from sgjit.lang.runtime_backend import RuntimeBackend

from server_harness import LiveServer, sse_events


@sgjit.function
def qa(s, question):
    s += sgjit.system("Answer briefly.")
    s += sgjit.user(question)
    s += sgjit.assistant(sgjit.gen("answer", max_tokens=10, temperature=0))


@sgjit.function
def pick(s, item):
    s += "Is " + item + " a fruit or a vegetable? It is a "
    s += sgjit.select("kind", choices=["fruit", "vegetable"])


@sgjit.function(jit=False)
def interpreted(s, topic):
    s += "One word about " + topic + ":"
    s += sgjit.gen("word", max_tokens=4, temperature=0)
    if len(s["word"]) > 0:  # control flow on a generated value: runs interpreted
        s += " and" + sgjit.gen("more", max_tokens=3, temperature=0)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    rt = sgjit.Runtime(device="cpu", enable_jit=True, max_total_tokens=8192, seed=0)
    server = LiveServer(rt, profile_dir=str(tmp_path_factory.mktemp("traces")))
    yield rt, server
    server.stop()
    rt.shutdown()


def test_endpoint_runs_equal_in_process_runs(served):
    rt, server = served
    ep = sgjit.RuntimeEndpoint(server.url)
    try:
        for fn, kwargs in [
            (qa, {"question": "What is the capital of France?"}),
            (pick, {"item": "an apple"}),
            (interpreted, {"topic": "rain"}),
        ]:
            remote = fn.run(backend=ep, **kwargs)
            local = fn.run(backend=rt, **kwargs)
            assert remote.text() == local.text(), fn.name
            assert remote.variables() == local.variables()
        assert qa.plan().plan_hash in server.state.plans  # traced programs went through /plans
        assert interpreted.plan() is None
        streamed = "".join(interpreted.run(topic="rain", backend=ep, stream=True).text_iter())
        assert streamed == interpreted.run(topic="rain", backend=rt).text()
    finally:
        ep.close()


def test_plan_routes(served):
    rt, server = served
    plan = pick.trace()
    with server.client() as c:
        r = c.post("/plans", json={"plan": plan.to_json()})
        assert r.status_code == 200 and r.json()["plan_hash"] == plan.plan_hash and r.json()["compiled"]
        one = c.post(f"/plans/{plan.plan_hash}/run", json={"args": {"item": "a carrot"}}).json()
        assert one["variables"]["kind"] in ("fruit", "vegetable") and one["text"].endswith(
            one["variables"]["kind"]
        )
        batch = c.post(
            f"/plans/{plan.plan_hash}/run", json={"args": [{"item": "a pear"}, {"item": "a leek"}]}
        ).json()
        assert [b["plan_hash"] for b in batch] == [plan.plan_hash] * 2
        assert c.post("/plans/0123456789abcdef/run", json={"args": {}}).status_code == 404  # unknown plan
        c.post("/plans", json={"plan": json.loads(qa.trace().to_json())})
        with c.stream(
            "POST", f"/plans/{qa.trace().plan_hash}/run", json={"args": {"question": "Hi"}, "stream": True}
        ) as s:
            events = sse_events(s.iter_lines())
        assert events[-1] == "[DONE]" and "variables" in events[-2]
        assert "".join(e["text"] for e in events[:-2]) == events[-2]["text"]
        assert (
            c.post(f"/plans/{plan.plan_hash}/run", json={"args": {}}).status_code == 400
        )  # missing argument
        assert c.post("/plans", json={"plan": "{not json"}).status_code == 400
        assert c.delete(f"/plans/{plan.plan_hash}").json()["deleted"]
        assert c.delete(f"/plans/{plan.plan_hash}").status_code == 404
        compiles = RuntimeBackend.of(rt).jit_counters()["jit_compiles"]
        assert f"sgjit_jit_compiles {float(compiles)}" in c.get("/metrics").text  # the real counters
        assert c.post("/jit/clear").json()["cleared"] >= 1
        assert c.get("/health").status_code == 200


def test_reload_through_the_endpoint_replaces_the_plan(served, tmp_path, monkeypatch):
    _, server = served
    mod = tmp_path / "ep_prog_mod.py"
    mod.write_text(
        textwrap.dedent("""
        import sgjit

        @sgjit.function
        def motto(s, team):
            s += "The motto of team " + team + " is:"
            s += sgjit.gen("m", max_tokens=4, temperature=0)
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import ep_prog_mod

    ep = sgjit.RuntimeEndpoint(server.url)
    try:
        ep_prog_mod.motto.run(team="blue", backend=ep)
        old = ep_prog_mod.motto.plan().plan_hash
        assert old in server.state.plans
        mod.write_text(mod.read_text().replace("The motto", "The song"))
        new = sgjit.reload_function(ep_prog_mod.motto, backend=ep)
        assert old not in server.state.plans  # deleted on the server
        assert "song" in new.run(team="blue", backend=ep).text()
        assert new.plan().plan_hash in server.state.plans
        assert sgjit.clear_jit_cache(ep) >= 1
    finally:
        ep.close()


def test_profile_window_writes_a_trace(served):
    _, server = served
    with server.client() as c:
        assert c.post("/start_profile", json={"name": "window"}).status_code == 200
        c.post("/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 3}})
        path = c.post("/stop_profile").json()["trace"]
    assert json.loads(open(path).read())["traceEvents"]

"""What SGLang frontend code uses besides the programs themselves, on sgjit after `import sgjit as
sgl`: fork item assignment, variable assignment, errors, global_config, flush_cache /
get_server_info, gen's positional order, Runtime.endpoint, and the primitives sgjit refuses."""

from __future__ import annotations

import asyncio

import pytest

import sgjit as sgl
from sgjit.errors import ProgramError, SgjitError

from server_harness import LiveServer


@sgl.function
def tips(s, topic):
    s += "Two tips for " + topic + ":\n"
    forks = s.fork(2)
    for i in range(2):
        forks[i] += f"Tip {i + 1}:"  # SGLang's `forks[i] += ...` (item assignment after +=)
        forks[i] += sgl.gen("tip", max_tokens=6, stop="\n", temperature=0)
    forks.join()


def test_fork_item_assignment_and_gather(runtime):
    state = tips.run(topic="sleep", backend=runtime)
    assert isinstance(state["tip"], list) and len(state["tip"]) == 2
    assert all(isinstance(t, str) and "\n" not in t for t in state["tip"])


def test_a_fork_cannot_be_replaced(runtime):
    @sgl.function
    def bad(s):
        s += "x"
        forks = s.fork(2)
        forks[0] = forks[1]

    with pytest.raises(ProgramError, match="extended"):
        bad.run(backend=runtime).sync()


def test_state_assignment_error_and_async_iteration(runtime):
    @sgl.function
    def count(s):
        s += "1, 2, 3," + sgl.gen("n", dtype=int, max_tokens=4, temperature=0)

    state = count.run(backend=runtime)
    state["n"] = int(state["n"])  # SGLang's programs parse values back into the state
    assert isinstance(state["n"], int) and state.error() is None

    async def pieces():
        streamed = count.run(backend=runtime, stream=True)
        return [p async for p in streamed.text_async_iter("n", return_meta_data=True)]

    chunks = asyncio.run(pieces())
    assert chunks and all(isinstance(t, str) and "completion_tokens" in m for t, m in chunks)


def test_gen_takes_sglangs_positional_order():
    """gen(name, max_tokens, min_tokens, n, stop, ...) as in SGLang."""

    @sgl.function
    def prog(s):
        s += sgl.gen("x", 7, 2, 1, "\n")

    (node,) = prog.trace().nodes
    assert (node.max_tokens, node.min_tokens, node.stop) == (7, 2, ("\n",))


def test_dtype_int_is_sglangs_regex_bounded_with_its_stops():
    @sgl.function
    def prog(s):
        s += sgl.gen_int("x") + sgl.gen("y", dtype="float")

    x, y = prog.trace().nodes
    assert x.regex == r"[-+]?[0-9]{1,19}[ \n]*" and x.stop == (" ", "\n") and y.stop == (" ", "\n")


def test_n_other_than_one_is_refused(runtime):
    @sgl.function
    def prog(s):
        s += "a" + sgl.gen("x", n=2)

    with pytest.raises(ProgramError, match="fork"):
        prog.run(backend=runtime)
    with pytest.raises(ProgramError, match="n=3"):
        tips.run(topic="x", n=3, backend=runtime)


def test_image_and_video_say_the_model_is_text_only(runtime):
    @sgl.function(num_api_spec_tokens=64)  # accepted: a budget for API backends, nothing to do here
    def prog(s):
        s += sgl.user(sgl.image("cat.png") + "What is this?")

    with pytest.raises(SgjitError, match="text-only"):
        prog.run(backend=runtime)
    with pytest.raises(SgjitError, match="text-only"):
        sgl.video("clip.mp4", 8)


def test_global_config_flush_cache_and_server_info(runtime):
    sgl.set_default_backend(runtime)
    assert sgl.global_config.default_backend is runtime
    assert runtime.endpoint is runtime and runtime.get_model_name().endswith(".gguf")
    tips.run(topic="tea")
    assert sgl.flush_cache() >= 0
    info = sgl.get_server_info()
    assert info["model_path"] == runtime.get_model_name() and "kv_pages_free" in info["stats"]


def test_the_endpoint_flushes_and_reports(runtime):
    server = LiveServer(runtime)
    try:
        ep = sgl.RuntimeEndpoint(server.url)
        assert sgl.flush_cache(ep) >= 0
        assert sgl.get_server_info(ep)["max_model_len"] == runtime.max_model_len
        ep.close()
    finally:
        server.stop()


def test_openai_routes_honour_stop_token_ids_and_failed_requests_are_logged(runtime, caplog):
    server = LiveServer(runtime)
    try:
        with server.client() as c:
            free = c.post("/v1/completions", json={"prompt": "1, 2, 3,", "max_tokens": 8, "temperature": 0})
            first = free.json()["choices"][0]["text"]
            tok = runtime.tokenizer.encode(first, add_special_tokens=False)[0]
            body = {"prompt": "1, 2, 3,", "max_tokens": 8, "temperature": 0, "stop_token_ids": [tok]}
            stopped = c.post("/v1/completions", json=body).json()["choices"][0]
            assert stopped["finish_reason"] == "stop" and stopped["text"] in (
                first[:0],
                runtime.tokenizer.decode([tok]),
            )
            with caplog.at_level("INFO", logger="sgjit.server.errors"):
                bad = c.post("/generate", json={"text": "x", "sampling_params": {"temperature": -1}})
            assert bad.status_code == 400
        assert any(
            "/generate -> 400" in r.getMessage() and "temperature" in r.getMessage() for r in caplog.records
        )
    finally:
        server.stop()

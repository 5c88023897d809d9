"""SGLang's own test programs (`sglang/test/test_programs.py`, unchanged) run on sgjit two ways:
in process with `sglang` bound to sgjit (what `import sgjit as sgl` promises), and through SGLang's
own frontend and `RuntimeEndpoint` against a real sgjit server (what "change one URL" promises).
Skipped when the `sglang` package is not installed (`pip install --no-deps sglang` plus the
`compat` extra; CI installs both).

SGLang's tests assert answers a 7B model gives. The bundled 135M model answers some of them wrong;
those programs (QUALITY) must still run to the end, and their structure is checked instead from the
states they returned: variables present, types parse, stops and constraints obeyed."""

from __future__ import annotations

import json
import re
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sglang_frontend import load_test_programs, sglang_dir

import sgjit

from server_harness import LiveServer

pytestmark = pytest.mark.skipif(
    sglang_dir() is None, reason="sglang is not installed (pip install --no-deps sglang)"
)

# program -> its structural check over the states its runs returned
Check = Callable[[list[Any]], None]


def _answers_stop_at_newline(states: list[Any]) -> None:
    runs = [
        s for entry in states for s in (entry if isinstance(entry, list) else [entry])
    ]  # run_batch: a list
    assert runs and all(isinstance(s["answer"], str) and "\n" not in s["answer"] for s in runs)


def _ints(states: list[Any]) -> None:
    (state,) = states
    assert int(state["hours"]) >= 0 and int(state["days"]) >= 0  # parse as integers: the regex held


def _react(states: list[Any]) -> None:
    (state,) = states
    text = state.text()
    assert re.findall(r"Action \d: (\w+)", text) and all(
        a in ("Search", "Finish") for a in re.findall(r"Action \d: (\w+)", text)
    )
    assert isinstance(state["answer"], str)


def _tool_use(states: list[Any]) -> None:
    (state,) = states
    assert isinstance(state["expression"], str) and ")" not in state["expression"]


QUALITY: dict[str, Check] = {
    "test_few_shot_qa": _answers_stop_at_newline,  # asserts Washington, Tokyo, London, Beijing
    "test_decode_int": _ints,  # asserts 24 hours and 365 days
    "test_react": _react,  # asserts the answer names Finland or the United States
    "test_tool_use": _tool_use,  # asserts the model's expression evaluates to 257 * 983
}
PASS = ["test_mt_bench", "test_select", "test_decode_json", "test_expert_answer", "test_regex", "test_dtype_gen",
        "test_parallel_encoding", "test_stream_logprobs", "test_gen_min_new_tokens"]  # fmt: skip
SLOW = ["test_decode_json_regex", "test_parallel_decoding", "test_stream"]  # minutes of CPU decoding each
# Programs for SGLang's OpenAI-style backends: token_usage and is_chat_model exist only there.
NOT_FOR_RUNTIME_BACKENDS = {"test_completion_speculative", "test_chat_completion_speculative"}
CHECK_ANSWER_OFF = {"test_select", "test_expert_answer", "test_parallel_encoding"}  # their own switch


class Tokenizer:
    """What `test_gen_min_new_tokens` asks of `get_tokenizer(model_path)`: the served tokenizer."""

    def __init__(self, rt: sgjit.Runtime) -> None:
        self.rt = rt

    def encode(self, text: str) -> list[int]:
        return self.rt.tokenizer.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def server(runtime) -> Iterator[LiveServer]:
    srv = LiveServer(runtime)
    yield srv
    srv.stop()


def _run(module: types.ModuleType, name: str) -> AssertionError | None:
    """Run one of SGLang's tests; its AssertionError (an answer it did not like), if any."""
    fn = getattr(module, name)
    kwargs = {"check_answer": False} if name in CHECK_ANSWER_OFF else {}
    try:
        fn(**kwargs)
    except AssertionError as e:
        return e
    return None


def _recorder(monkeypatch, cls: type, record: list[Any]) -> None:
    """Keep every state `cls.run` / `run_batch` returns."""
    for method in ("run", "run_batch"):
        original = getattr(cls, method)

        def wrapped(self, *args, _original=original, **kwargs):
            out = _original(self, *args, **kwargs)
            record.append(out)
            return out

        monkeypatch.setattr(cls, method, wrapped)


def _in_process(monkeypatch, runtime) -> types.ModuleType:
    sgjit.set_default_backend(runtime)
    return load_test_programs(sgjit, lambda path: Tokenizer(runtime), _Modules(monkeypatch))


def _through_sglang(monkeypatch, runtime, server: LiveServer) -> types.ModuleType:
    from sglang_frontend import frontend

    sgl = frontend()
    # SGLang's tests run on `sgl.Runtime`, whose `.endpoint` is the RuntimeEndpoint; this stands in
    # for that launcher (the server is sgjit's).
    sgl.set_default_backend(types.SimpleNamespace(endpoint=sgl.RuntimeEndpoint(server.url)))
    return load_test_programs(sgl, lambda path: Tokenizer(runtime), _Modules(monkeypatch))


class _Modules(dict):
    """sys.modules entries set through monkeypatch, so the test leaves sys.modules as it found it."""

    def __init__(self, monkeypatch) -> None:
        super().__init__()
        self.monkeypatch = monkeypatch

    def __contains__(self, name: object) -> bool:
        return name in sys.modules

    def update(self, other: dict[str, Any]) -> None:  # type: ignore[override]
        for k, v in other.items():
            self.monkeypatch.setitem(sys.modules, k, v)

    def __setitem__(self, name: str, value: Any) -> None:
        self.update({name: value})


def _check(name: str, error: AssertionError | None, record: list[Any]) -> None:
    if name in QUALITY:
        QUALITY[name](record)  # ran to the end; its answers may be those of a 135M model
    else:
        assert error is None, f"{name}: {error}"


@pytest.mark.parametrize("name", [*PASS, *QUALITY, *(pytest.param(n, marks=pytest.mark.slow) for n in SLOW)])
def test_in_process(name, runtime, monkeypatch):
    record: list[Any] = []
    _recorder(monkeypatch, sgjit.Function, record)
    module = _in_process(monkeypatch, runtime)
    _check(name, _run(module, name), record)


@pytest.mark.parametrize("name", [*PASS, *QUALITY, *(pytest.param(n, marks=pytest.mark.slow) for n in SLOW)])
def test_through_sglang_frontend(name, runtime, server, monkeypatch):
    module = _through_sglang(monkeypatch, runtime, server)
    from sglang.lang.ir import SglFunction

    record: list[Any] = []
    _recorder(monkeypatch, SglFunction, record)
    _check(name, _run(module, name), record)


def test_image_programs_fail_clearly_in_process(runtime, monkeypatch):
    """`sgl.image` exists, and on sgjit's text-only models the program fails with a message."""
    module = _in_process(monkeypatch, runtime)
    with pytest.raises(sgjit.SgjitError, match="text-only"):
        module.test_image_qa()


def test_image_data_is_refused_by_the_server(server):
    """An image SGLang's frontend would attach reaches /generate as image_data: a 400 that says why."""
    with server.client() as c:
        r = c.post(
            "/generate",
            json={"text": "Describe", "image_data": "aGVsbG8=", "sampling_params": {"max_new_tokens": 1}},
        )
    assert r.status_code == 400 and "text-only" in r.json()["error"]["message"]


def test_the_frontends_sampling_keys_are_accepted(server):
    """Exactly what SGLang's RuntimeEndpoint sends for a gen, streamed and not."""
    sp = {"skip_special_tokens": True, "spaces_between_special_tokens": True, "max_new_tokens": 4, "min_new_tokens": 0,
          "n": 1, "stop": [], "stop_token_ids": [], "stop_regex": None, "temperature": 0, "top_p": 1.0, "top_k": -1,
          "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "ignore_eos": False, "regex": None,
          "json_schema": None}  # fmt: skip
    with server.client() as c:
        r = c.post("/generate", json={"text": "The sky is", "sampling_params": sp, "return_logprob": True})
        assert r.status_code == 200, r.text
        meta = r.json()["meta_info"]
        assert meta["finish_reason"]["type"] == "length" and len(meta["output_token_logprobs"]) == 4
        with c.stream("POST", "/generate", json={"text": "The sky is", "sampling_params": sp, "stream": True,
                                                  "return_logprob": True}) as s:  # fmt: skip
            chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    total = 0
    for chunk in chunks:  # logprobs come incrementally, with their running count
        total += len(chunk["meta_info"]["output_token_logprobs"])
        assert (
            chunk["meta_info"]["output_token_logprobs_length"]
            == total
            == chunk["meta_info"]["completion_tokens"]
        )
    assert total == 4

"""The HTTP server over a tensor-parallel runtime (two CPU processes, a tiny model), through the
test harness: the native and OpenAI routes answer as the runtime does in process, and once a rank
has died every request gets a 503 that says the server must be restarted, not a hang or a 500."""

from __future__ import annotations

import os
import signal

import pytest

import sgjit

from conftest import tp_rank_pids
from server_harness import LiveServer
from tiny_gguf import write_tiny_gguf

PARAMS = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    return str(write_tiny_gguf(tmp_path_factory.mktemp("tp") / "tiny.gguf"))


def test_routes_answer_then_a_dead_rank_gives_503(tiny_path):
    rt = sgjit.Runtime(tiny_path, device="cpu", max_total_tokens=512, tp=2)
    srv = LiveServer(rt)
    try:
        want = rt.generate(["hello", "tiny world"], PARAMS)  # in process (tests/runtime: = one process)
        with srv.client() as c:
            got = c.post("/generate", json={"text": ["hello", "tiny world"], "sampling_params": PARAMS})
            assert [g["output_ids"] for g in got.json()] == [w["output_ids"] for w in want]
            done = c.post(
                "/v1/completions",
                json={"prompt": "hello", "max_tokens": 6, "temperature": 0, "ignore_eos": True},
            )
            assert done.status_code == 200 and done.json()["choices"][0]["text"] == want[0]["text"]
            assert c.get("/get_server_info").json()["server_args"]["runtime"]["tp"] == 2
            (rank1,) = tp_rank_pids()
            os.kill(rank1, signal.SIGKILL)
            for _ in range(2):
                r = c.post("/v1/completions", json={"prompt": "hello", "max_tokens": 3})
                assert r.status_code == 503 and r.json()["error"]["code"] == "tensor_parallel_failed", r.text
            assert c.get("/health_generate").status_code == 503
    finally:
        srv.stop()
        rt.shutdown()
    assert not tp_rank_pids()

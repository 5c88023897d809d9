"""`sgjit serve` as a user runs it: flags and their errors, then a real process that binds, answers
503 while loading, logs one ready line, and on SIGTERM drains a running stream and exits 0; and the
drain's time limit, in-process."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from sgjit.cli import main as cli_main

from conftest import assert_no_leaked_pages, wait_ended
from server_harness import LiveServer, ServeProcess, wait_idle

FLAGS = [
    "--model", "--enable-jit", "--host", "--port", "--device", "--dtype", "--tp", "--mem-fraction-static",
    "--max-model-len", "--max-running-requests", "--chunked-prefill-size", "--jit-cache-limit",
    "--kv-cache-dtype", "--served-model-name", "--api-key", "--log-level",
]  # fmt: skip


def test_serve_help_describes_every_flag(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["serve", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in FLAGS:
        assert re.search(rf"^\s+{flag}\b.*\n?\s*\S", out, re.M), flag
    assert cli_main(["--help"]) == 0 and "serve" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--tp", "0"], "runtime option tp=0 must be an integer >= 1"),
        (["--mem-fraction-static", "1.5"], "mem_fraction_static"),
        (["--model", "/no/such/model.gguf", "--port", "0"], "no model found"),
    ],
)
def test_serve_rejects_bad_flags_before_loading(capsys, argv, message):
    assert cli_main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err


def test_serve_refuses_a_busy_port(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert cli_main(["serve", "--port", str(taken.getsockname()[1])]) == 2
    assert "cannot listen on 127.0.0.1" in capsys.readouterr().err


def test_serve_exits_1_when_the_model_does_not_load(tmp_path, caplog):
    bad = tmp_path / "broken.gguf"
    bad.write_text("not a model")
    assert cli_main(["serve", "--model", str(bad), "--port", "0", "--device", "cpu"]) == 1
    assert "could not load the model" in caplog.text and "not a GGUF file" in caplog.text


def test_serve_process_start_ready_line_and_sigterm_drain():
    serve = ServeProcess(
        "--device", "cpu", "--port", "0", "--max-total-tokens", "2048", "--served-model-name", "tiny",
        "--drain-timeout", "120",
    )  # fmt: skip
    try:
        url = serve.wait_for(r"(http://127\.0\.0\.1:\d+)/health answers 503").group(1)
        starting = httpx.get(url + "/health")
        assert starting.status_code == 503 and starting.json()["error"]["code"] == "starting"
        ready = serve.wait_for(r"sgjit ready at ").string
        for part in (url, "model tiny", "device cpu", "arch cpu", "JIT off", "KV cache 2048 tokens"):
            assert part in ready, ready
        assert sum("sgjit ready" in line for line in serve.log) == 1
        assert httpx.get(url + "/health").status_code == 200

        events: list[str] = []
        body = {
            "model": "tiny",
            "prompt": "Once upon a time",
            "max_tokens": 24,
            "stream": True,
            "ignore_eos": True,
        }

        def stream() -> None:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
                events.extend(line for line in r.iter_lines() if line)

        client = threading.Thread(target=stream)
        client.start()
        while len(events) < 2:
            time.sleep(0.01)
        serve.proc.send_signal(signal.SIGTERM)
        serve.wait_for(r"SIGTERM: draining 1 request")
        draining = httpx.get(url + "/health")
        assert draining.status_code == 503 and draining.json()["error"]["code"] == "draining"
        client.join(timeout=120)
        assert events[-1] == "data: [DONE]"
        chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert serve.proc.wait(timeout=60) == 0
    finally:
        serve.kill()


def test_serve_tp2_process_answers_like_one_process_and_leaves_nothing_behind(dense_runtime):
    """`sgjit serve --tp 2` on a CPU: two processes (gloo), the bundled model split over them."""
    serve = ServeProcess("--device", "cpu", "--tp", "2", "--port", "0", "--max-total-tokens", "1024")
    try:
        rank1 = int(serve.wait_for(r"ranks 1\.\.1 are pids \[(\d+)\]").group(1))
        ready = serve.wait_for(r"sgjit ready at (http://\S+)")
        assert "device cpu float32 x tp 2" in ready.string, ready.string
        prompts = ["The capital of France is", "def fibonacci(n):"]
        params = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
        body = {"text": prompts, "sampling_params": params}
        got = httpx.post(ready.group(1) + "/generate", json=body, timeout=120)
        assert got.status_code == 200, got.text
        want = dense_runtime.generate(prompts, params)
        assert [g["output_ids"] for g in got.json()] == [w["output_ids"] for w in want]
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(timeout=60) == 0
        assert wait_ended(rank1)  # rank 1 leaves its loop on rank 0's STOP
    finally:
        serve.kill()


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[-1].split()[1]) == pid:
                out.append(int(d.name))
        except OSError:
            continue
    return out


def test_serve_under_torchrun_serves_from_rank_0(dense_runtime):
    """torchrun starts both ranks (RANK / WORLD_SIZE / MASTER_* set): rank 0 serves HTTP, rank 1 follows."""
    serve = ServeProcess(
        "--device", "cpu", "--tp", "2", "--port", "0", "--max-total-tokens", "1024",
        launcher=("-m", "torch.distributed.run", "--nproc-per-node", "2"),
    )  # fmt: skip
    try:
        ready = serve.wait_for(r"sgjit ready at (http://\S+)")
        assert "x tp 2" in ready.string and sum("sgjit ready" in line for line in serve.log) == 1
        ranks = _children(serve.proc.pid)
        assert len(ranks) == 2
        params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
        got = httpx.post(
            ready.group(1) + "/generate", json={"text": "Hello there", "sampling_params": params}
        )
        assert got.json()["output_ids"] == dense_runtime.generate("Hello there", params)["output_ids"]
        serve.proc.send_signal(signal.SIGTERM)  # torchrun passes it on to both ranks
        serve.proc.wait(timeout=60)
        assert all(wait_ended(r) for r in ranks)
    finally:
        serve.kill()


def test_drain_timeout_aborts_what_is_still_running(runtime):
    srv = LiveServer(runtime, drain_timeout=0.5)
    body = {"text": "Go on.", "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}, "stream": True}
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c, c.stream("POST", "/generate", json=body) as r:
            lines = r.iter_lines()
            next(lines)
            srv.server.handle_exit(signal.SIGTERM, None)
            rest = [line for line in lines if line]  # the server ends the stream when the drain time is up
        srv.thread.join(timeout=30)
        assert not srv.thread.is_alive()
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2].removeprefix("data: "))["error"]["code"] == "request_aborted"
    finally:
        srv.stop()
    assert wait_idle(runtime)["running"] == 0
    assert_no_leaked_pages(runtime)

"""A real uvicorn server for tests: the app over a given runtime, served by `sgjit serve`'s own
server class on a free port, on a thread of the test process (so a test can look inside the
runtime while clients talk HTTP to it)."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from sgjit.server.app import create_app
from sgjit.server.args import ServerArgs
from sgjit.server.launch import DrainingServer, bind_socket, uvicorn_config
from sgjit.server.state import ServerState


class LiveServer:
    def __init__(self, runtime, **server_args: Any) -> None:
        self.runtime = runtime
        args = ServerArgs(runtime=runtime.config, port=0, **server_args)
        self.app = create_app(args, runtime)
        sock = bind_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = DrainingServer(uvicorn_config(self.app, args), self.state)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.01)

    @property
    def state(self) -> ServerState:
        return self.app.state.sgjit

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120, **kwargs)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def sse_events(lines: Iterator[str]) -> list[Any]:
    """The JSON payloads of an SSE stream, with the final `[DONE]` as the string "[DONE]"."""
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def wait_idle(runtime, timeout: float = 30.0) -> dict[str, Any]:
    """Stats once nothing is running or waiting (aborts are processed asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        s = runtime.stats()
        if (s["running"] == 0 and s["waiting"] == 0) or time.monotonic() > deadline:
            return s
        time.sleep(0.02)


class ServeProcess:
    """`sgjit serve` as a user starts it: a child process of this repository's code, its log
    (stderr) read line by line so a test can wait for a line."""

    def __init__(self, *args: str, launcher: tuple[str, ...] = ()) -> None:
        """`launcher`: a module that starts `sgjit.cli` itself, e.g. ("-m", "torch.distributed.run", ...)."""
        repo = Path(__file__).resolve().parents[1]
        self.proc = subprocess.Popen(
            [sys.executable, *launcher, "-m", "sgjit.cli", "serve", *args], cwd=repo, stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONPATH": str(repo)},
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_for(self, pattern: str, timeout: float = 180) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                continue
            self.log.append(line)
            if m := re.search(pattern, line):
                return m
        raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(self.log)}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

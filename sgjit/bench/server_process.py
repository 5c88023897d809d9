"""`sgjit serve` as a child process, the way users run it, for the benchmarks that measure a server."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Sequence


def start_server(
    model: str | None, device: str, max_total_tokens: int, extra: Sequence[str] = ()
) -> tuple[subprocess.Popen, str]:
    """Start `sgjit serve` on a free port and wait for its ready line; returns the process and its URL.
    `extra`: more `serve` flags."""
    flags = ["--device", device, "--max-total-tokens", str(max_total_tokens), *extra]
    return launch_server(flags + (["--model", model] if model else []))


def launch_server(flags: Sequence[str]) -> tuple[subprocess.Popen, str]:
    """`sgjit serve --port 0 FLAGS`, once it is ready: the process and its URL."""
    cmd = [sys.executable, "-m", "sgjit.cli", "serve", "--port", "0", *flags]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"sgjit ready at (\S+)", line):
            threading.Thread(target=_discard, args=(proc.stderr,), daemon=True).start()
            return proc, m.group(1)
    raise RuntimeError(f"sgjit serve exited with status {proc.wait()} before it was ready")


def _discard(stream) -> None:
    """Keep reading the server's log so it never blocks on a full pipe."""
    for _ in stream:
        pass

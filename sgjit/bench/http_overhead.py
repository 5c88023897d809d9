"""`python -m sgjit.bench.http_overhead`: what the HTTP server adds to a request. p50/p99 latency of
a 1-token generation through `/generate` against `Runtime.generate` in-process, and of a whole
streamed chat through the OpenAI client against `Runtime.chat(stream=True)`.

Method: the server is a separate `sgjit serve` process (as users run it) with the same model and
settings as the in-process runtime; both are idle while the other is measured, and the two paths
alternate request by request, so a machine whose speed drifts penalises both alike. Overhead is the
difference of the medians."""

from __future__ import annotations

import argparse
import logging
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from sgjit.bench.report import environment, markdown_table, write_json

log = logging.getLogger(__name__)

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colours."}]


def start_server(model: str | None, device: str, max_total_tokens: int) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "sgjit.cli", "serve", "--port", "0", "--device", device,
           "--max-total-tokens", str(max_total_tokens)] + (["--model", model] if model else [])  # fmt: skip
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


def interleaved(paths: dict[str, Callable[[], Any]], n: int, warmup: int) -> dict[str, list[float]]:
    for fn in paths.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(n):
        for name, fn in paths.items():
            t = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t)
    return samples


def summary(case: str, samples: dict[str, list[float]], base: str) -> list[dict[str, Any]]:
    def pct(xs: list[float], q: int) -> float:
        return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] * 1000

    base_p50 = pct(samples[base], 50)
    return [
        {
            "case": case,
            "path": name,
            "samples": len(xs),
            "p50_ms": pct(xs, 50),
            "p99_ms": pct(xs, 99),
            "p50_overhead_ms": None if name == base else pct(xs, 50) - base_p50,
        }
        for name, xs in samples.items()
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(
        prog="python -m sgjit.bench.http_overhead", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--model", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--requests", type=int, default=200, help="measured 1-token requests per path")
    p.add_argument("--chats", type=int, default=30, help="measured streamed chats per path")
    p.add_argument("--chat-tokens", type=int, default=32)
    p.add_argument("--max-total-tokens", type=int, default=4096)
    p.add_argument("--out", default=None, help="write the result as JSON here")
    args = p.parse_args(argv)

    import openai

    from sgjit.runtime.runtime import Runtime

    proc, url = start_server(args.model, args.device, args.max_total_tokens)
    try:
        rt = Runtime(args.model, device=args.device, max_total_tokens=args.max_total_tokens)
        one = {"max_new_tokens": 1, "temperature": 0}
        chat = {"max_new_tokens": args.chat_tokens, "temperature": 0, "ignore_eos": True}
        with (
            httpx.Client(base_url=url, timeout=120) as http,
            openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as client,
        ):
            model = client.models.list().data[0].id

            def http_one() -> None:
                r = http.post("/generate", json={"text": PROMPT, "sampling_params": one})
                r.raise_for_status()

            def http_chat() -> None:
                stream = client.chat.completions.create(
                    model=model,
                    messages=CHAT,
                    max_tokens=args.chat_tokens,
                    temperature=0,
                    stream=True,
                    extra_body={"ignore_eos": True},
                )
                assert sum(bool(c.choices and c.choices[0].delta.content) for c in stream) > 0

            rows = summary(
                "1-token /generate",
                interleaved(
                    {
                        "in-process Runtime.generate": lambda: rt.generate(PROMPT, one),
                        "HTTP /generate": http_one,
                    },
                    args.requests,
                    warmup=5,
                ),
                "in-process Runtime.generate",
            )
            rows += summary(
                f"streamed chat, {args.chat_tokens} tokens",
                interleaved(
                    {
                        "in-process Runtime.chat(stream=True)": lambda: list(
                            rt.chat(CHAT, chat, stream=True)
                        ),
                        "HTTP /v1/chat/completions (openai client)": http_chat,
                    },
                    args.chats,
                    warmup=2,
                ),
                "in-process Runtime.chat(stream=True)",
            )
        rt.shutdown()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    result = {
        "benchmark": "http_overhead",
        "device": args.device,
        "model": args.model or "smollm2-135m",
        "environment": environment(),
        "rows": rows,
    }
    print(markdown_table(rows, ["case", "path", "samples", "p50_ms", "p99_ms", "p50_overhead_ms"]))
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()

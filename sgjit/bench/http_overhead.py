"""`python -m sgjit.bench.http_overhead`: what the HTTP server adds to a request. p50/p99 latency of
a 1-token generation through `/generate` against `Runtime.generate` in-process, and of a whole
streamed chat through the OpenAI client against `Runtime.chat(stream=True)`.

Method: the server is a separate `sgjit serve` process (as users run it) with the same model and
settings as the in-process runtime; each is idle while the other is measured, and the two paths
alternate in blocks of requests, so a machine whose speed drifts penalises both alike. Overhead is
the difference of the medians; as that difference is small next to a CPU forward pass and its
jitter, each row also gives the median time spent outside the engine (client latency minus the
engine's own `e2e_latency` for the request), where the comparison is not swamped by the forward."""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import httpx

from sgjit.bench.report import environment, markdown_table, write_json
from sgjit.bench.server_process import start_server

log = logging.getLogger(__name__)

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colours."}]


def interleaved(
    paths: dict[str, Callable[[], float | None]], n: int, block: int
) -> dict[str, list[tuple[float, float | None]]]:
    """`n` timed calls per path, taken in alternating blocks of `block` calls; each block starts
    with an untimed call. A path returns the engine's own time for the request (its
    `meta_info.e2e_latency`) when it has it, so the time spent outside the engine is known too.

    NOTE: alternating call by call costs both paths ~10 ms on a 2-core CPU (measured): switching
    between the two processes' thread pools and caches each time."""
    samples: dict[str, list[tuple[float, float | None]]] = {k: [] for k in paths}
    while any(len(xs) < n for xs in samples.values()):
        for name, fn in paths.items():
            fn()
            for _ in range(min(block, n - len(samples[name]))):
                t = time.perf_counter()
                engine = fn()
                total = time.perf_counter() - t
                samples[name].append((total, None if engine is None else total - engine))
    return samples


def summary(
    case: str, samples: dict[str, list[tuple[float, float | None]]], base: str
) -> list[dict[str, Any]]:
    def pct(xs: list[float], q: int) -> float:
        return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] * 1000

    base_p50 = pct([t for t, _ in samples[base]], 50)
    rows = []
    for name, pairs in samples.items():
        totals = [t for t, _ in pairs]
        outside = [o for _, o in pairs if o is not None]
        rows.append(
            {
                "case": case,
                "path": name,
                "samples": len(pairs),
                "p50_ms": pct(totals, 50),
                "p99_ms": pct(totals, 99),
                "p50_overhead_ms": None if name == base else pct(totals, 50) - base_p50,
                "p50_outside_engine_ms": pct(outside, 50) if outside else None,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(
        prog="python -m sgjit.bench.http_overhead", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--model", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--requests", type=int, default=200, help="measured 1-token requests per path")
    p.add_argument("--chats", type=int, default=30, help="measured streamed chats per path")
    p.add_argument("--chat-tokens", type=int, default=32)
    p.add_argument("--block", type=int, default=20, help="requests per path before switching paths")
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

            def in_process_one() -> float:
                return rt.generate(PROMPT, one)["meta_info"]["e2e_latency"]

            def http_one() -> float:
                r = http.post("/generate", json={"text": PROMPT, "sampling_params": one})
                r.raise_for_status()
                return r.json()["meta_info"]["e2e_latency"]

            def in_process_chat() -> float:
                return list(rt.chat(CHAT, chat, stream=True))[-1]["meta_info"]["e2e_latency"]

            def http_chat() -> None:  # OpenAI's stream carries no engine timing
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
                        "in-process Runtime.generate": in_process_one,
                        "HTTP /generate": http_one,
                    },
                    args.requests,
                    args.block,
                ),
                "in-process Runtime.generate",
            )
            rows += summary(
                f"streamed chat, {args.chat_tokens} tokens",
                interleaved(
                    {
                        "in-process Runtime.chat(stream=True)": in_process_chat,
                        "HTTP /v1/chat/completions (openai client)": http_chat,
                    },
                    args.chats,
                    max(args.block // 4, 1),
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
    columns = ["case", "path", "samples", "p50_ms", "p99_ms", "p50_overhead_ms", "p50_outside_engine_ms"]
    print(markdown_table(rows, columns))
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()

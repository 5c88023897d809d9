"""`python -m sgjit.bench.soak`: a long mixed load against `sgjit serve`, and the checks that must
hold after it. Clients each loop over a mix of requests until the time is up:

- `stream`: a streamed greedy `/v1/completions`, whose text must equal the same request's text
  answered alone before the load (`greedy_mismatches`);
- `whole`: the same, not streamed;
- `chat`: a streamed sampled chat completion (seeded), read to the end;
- `disconnect`: a streamed chat completion the client drops after a few chunks;
- `generate`: SGLang's non-streamed `/generate`, sampled;
- `flush`: `POST /flush_cache`.

A sampler reads the server's RSS (from /proc, so the server must run on this machine), its free
KV pages and the latency of `/health` every `--sample-every` seconds. After the load the server
is left to go idle and its prefix cache is flushed: `leaked_pages` is the free-page count before
the load minus the count then, and the RSS growth is measured from the end of the warm-up (the
first `--warmup` seconds) to the end. Any answer that is not a 200, any error event and any
broken connection the client did not cause is an error. The server is started here (`--model`,
`--model-shape`, `--device`) unless `--url` and `--pid` name a running one."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from sgjit.bench.report import add_model_args, add_output_args, environment, finish, model_arg, write_json
from sgjit.bench.server_process import start_server

log = logging.getLogger(__name__)

KINDS = {"stream": 40, "whole": 15, "chat": 15, "disconnect": 15, "generate": 13, "flush": 2}
TOPICS = ["a lighthouse", "the river", "a small robot", "winter", "an old map", "the market", "a violin",
          "the desert", "a train at night", "bees", "a forgotten key", "the tide"]  # fmt: skip
COLUMNS = [
    "clients", "duration_s", "requests", "errors", "greedy_checked", "greedy_mismatches", "pages_start",
    "pages_end", "leaked_pages", "rss_start_mb", "rss_warm_mb", "rss_end_mb", "rss_growth_after_warmup_mb",
    "health_p50_ms", "health_max_ms", "output_tok_s",
]  # fmt: skip


@dataclass
class Tally:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    errors: list[str] = field(default_factory=list)
    greedy_checked: int = 0
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    output_tokens: int = 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sgjit.bench.soak", description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-total-tokens", type=int, default=16384)
    p.add_argument("--server-arg", action="append", default=[], help="one more `sgjit serve` flag (repeat)")
    p.add_argument("--url", default=None, help="a running server instead (needs --pid)")
    p.add_argument("--pid", type=int, default=None, help="that server's process id, for its RSS")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--warmup", type=float, default=120.0, help="seconds after which RSS should stay flat")
    p.add_argument("--sample-every", type=float, default=10.0)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="4 clients for 10 s, for tests")
    add_output_args(p)
    return p


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


async def stats(client: httpx.AsyncClient) -> dict[str, Any]:
    r = await client.get("/get_server_info")
    r.raise_for_status()
    return r.json()["stats"]


async def sse_chunks(resp: httpx.Response):
    async for line in resp.aiter_lines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                return
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"error event: {chunk['error']}")
            yield chunk


async def completion(
    client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int, stream: bool
) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if not stream:
        r = await client.post("/v1/completions", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        return r.json()["choices"][0]["text"]
    parts: list[str] = []
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
        async for chunk in sse_chunks(resp):
            parts += [c["text"] for c in chunk["choices"]]
    return "".join(parts)


async def chat(
    client: httpx.AsyncClient, model: str, prompt: str, args, rng: random.Random, drop: bool
) -> int:
    """Streams a sampled chat answer; with `drop`, closes the connection after 1-4 chunks. Returns
    the chunks read."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": args.max_tokens,
            "temperature": 0.8, "seed": rng.randrange(1 << 30), "stream": True}  # fmt: skip
    keep = rng.randint(1, 4) if drop else None
    n = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
        async for _ in sse_chunks(resp):
            n += 1
            if keep is not None and n >= keep:
                break  # leaving the block closes the connection mid-stream
    return n


async def one(
    kind: str, client, model: str, prompts: list[str], refs: list[str], args, rng, tally: Tally
) -> None:
    i = rng.randrange(len(prompts))
    if kind in ("stream", "whole"):
        text = await completion(client, model, prompts[i], args.max_tokens, stream=kind == "stream")
        tally.greedy_checked += 1
        tally.output_tokens += args.max_tokens  # about: a greedy answer may stop early
        if text != refs[i]:
            tally.mismatches.append({"prompt": i, "alone": refs[i], "under_load": text})
    elif kind in ("chat", "disconnect"):
        tally.output_tokens += await chat(client, model, prompts[i], args, rng, drop=kind == "disconnect")
    elif kind == "generate":
        params = {"max_new_tokens": args.max_tokens, "temperature": 0.7, "seed": rng.randrange(1 << 30)}
        r = await client.post("/generate", json={"text": prompts[i], "sampling_params": params})
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        tally.output_tokens += r.json()["meta_info"]["completion_tokens"]
    else:
        r = await client.post("/flush_cache")
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")


async def client_loop(
    cid: int, url: str, model: str, prompts, refs, args, deadline: float, tally: Tally
) -> None:
    rng = random.Random(args.seed * 1000 + cid)
    kinds, weights = list(KINDS), list(KINDS.values())
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        while time.monotonic() < deadline:
            kind = rng.choices(kinds, weights)[0]
            tally.counts[kind] += 1
            try:
                await one(kind, client, model, prompts, refs, args, rng, tally)
            except Exception as e:  # noqa: BLE001 - every failure is counted, the load goes on
                tally.errors.append(f"{kind}: {type(e).__name__}: {e}"[:300])


async def sampler(client, pid: int, t0: float, deadline: float, every: float, samples: list) -> None:
    while True:
        t = time.perf_counter()
        healthy = (await client.get("/health")).status_code == 200
        health_ms = (time.perf_counter() - t) * 1000
        s = await stats(client)
        samples.append({"t": time.monotonic() - t0, "rss_mb": rss_mb(pid), "free_pages": s["kv_pages_free"],
                        "running": s["running"], "waiting": s["waiting"], "health_ms": health_ms,
                        "health_ok": healthy})  # fmt: skip
        if time.monotonic() >= deadline:
            return
        await asyncio.sleep(min(every, max(0.0, deadline - time.monotonic())))


async def settle(client: httpx.AsyncClient, timeout: float = 120.0) -> dict[str, Any]:
    """Stats once nothing runs or waits, after a flush of the prefix cache."""
    end = time.monotonic() + timeout
    while (s := await stats(client))["running"] or s["waiting"]:
        if time.monotonic() > end:
            raise RuntimeError(f"the server did not go idle within {timeout:.0f} s: {s}")
        await asyncio.sleep(0.2)
    (await client.post("/flush_cache")).raise_for_status()
    return await stats(client)


async def soak(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    prompts = [f"Write two sentences about {TOPICS[i % len(TOPICS)]} (story {i}, mood {rng.choice(['calm', 'grim', 'odd'])}):"
               for i in range(args.prompts)]  # fmt: skip
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        refs = [await completion(client, model, p, args.max_tokens, stream=False) for p in prompts]
        start = await settle(client)
        rss_start = rss_mb(pid)
        tally, samples = Tally(), []
        t0 = time.monotonic()
        deadline = t0 + args.duration
        loops = [
            client_loop(c, url, model, prompts, refs, args, deadline, tally) for c in range(args.clients)
        ]
        partial = {"prompts": prompts, "samples": samples, "note": "partial: the load is still running"}
        writer = asyncio.create_task(_write_partial(args.out, partial))
        await asyncio.gather(sampler(client, pid, t0, deadline, args.sample_every, samples), *loops)
        writer.cancel()
        elapsed = time.monotonic() - t0
        end = await settle(client)
    rss_end = rss_mb(pid)
    warm = [s["rss_mb"] for s in samples if s["t"] >= args.warmup] or [samples[-1]["rss_mb"]]
    health = [s["health_ms"] for s in samples]
    row = {
        "clients": args.clients, "duration_s": round(elapsed, 1), "requests": sum(tally.counts.values()),
        "errors": len(tally.errors) + sum(not s["health_ok"] for s in samples),
        "greedy_checked": tally.greedy_checked, "greedy_mismatches": len(tally.mismatches),
        "pages_start": start["kv_pages_free"], "pages_end": end["kv_pages_free"],
        "leaked_pages": start["kv_pages_free"] - end["kv_pages_free"], "rss_start_mb": round(rss_start, 1),
        "rss_warm_mb": round(warm[0], 1), "rss_end_mb": round(rss_end, 1),
        "rss_growth_after_warmup_mb": round(rss_end - warm[0], 1),
        "rss_max_after_warmup_mb": round(max(warm), 1),
        "health_p50_ms": statistics.median(health), "health_max_ms": max(health),
        "output_tok_s": tally.output_tokens / elapsed,
    }  # fmt: skip
    return {"row": row, "counts": tally.counts, "errors": tally.errors[:50], "mismatches": tally.mismatches[:10],
            "samples": samples, "prompts": prompts}  # fmt: skip


async def _write_partial(out: str | None, partial: dict[str, Any]) -> None:
    """Rewrite --out every 30 s while the load runs, so a run cut short still leaves its timeline."""
    while out:
        await asyncio.sleep(30)
        write_json(out, partial)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.smoke:
        args.clients, args.duration, args.warmup, args.sample_every, args.max_tokens = 4, 10.0, 3.0, 1.0, 8
    proc = None
    if args.url:
        if args.pid is None:
            raise SystemExit("--url needs --pid (the server's process id, for its RSS)")
        url, pid = args.url, args.pid
    else:
        proc, url = start_server(model_arg(args), args.device, args.max_total_tokens, args.server_arg)
        pid = proc.pid
    try:
        out = asyncio.run(soak(url, pid, args))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
    result = {"benchmark": "soak", "model": model_arg(args) or "smollm2-135m", "device": args.device,
              "server_args": args.server_arg, "environment": environment(), "rows": [out["row"]], **out}  # fmt: skip
    log.info("requests by kind: %s", out["counts"])
    return finish(args, result, [out["row"]], COLUMNS)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    main()

"""`python -m sgjit.bench.serving --url http://127.0.0.1:30000`: an asyncio load generator against any
OpenAI-compatible server (sgjit or another runtime), like SGLang's bench_serving. Streams
`/v1/completions` with synthetic prompts (workload.py: fixed, random, ShareGPT-like or shared-prefix
lengths) at a request rate (Poisson arrivals) or a fixed maximum concurrency, and reports TTFT,
TPOT, inter-token latency and end-to-end percentiles, output tok/s and errors.

Several `--request-rate`s make a sweep: the same requests at each rate, one row each (an sgjit
server's prefix cache is flushed in between), drawn as throughput / TTFT / TPOT curves by `--plot`.
`--launch FLAGS` starts `sgjit serve FLAGS` for the run instead of `--url`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from sgjit.bench.report import add_output_args, environment, finish
from sgjit.bench.timing import percentiles

log = logging.getLogger(__name__)

COLUMNS = [
    "request_rate", "requests", "completed", "errors", "max_concurrency", "output_tok_s", "decode_roofline_tok_s",
    "pct_of_roofline", "roofline_with_prefill_tok_s", "pct_of_roofline_with_prefill", "ttft_p50_ms",
    "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms", "e2e_p50_ms", "e2e_p99_ms",
]  # fmt: skip


@dataclass(slots=True)
class RequestRecord:
    ok: bool = False
    error: str = ""
    start: float = 0.0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sgjit.bench.serving", description=__doc__.split("\n\n")[0])
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="server base URL, e.g. http://127.0.0.1:30000")
    target.add_argument(
        "--launch", metavar="FLAGS", help="start `sgjit serve --port 0 FLAGS` for the run and stop it after "
        "(e.g. --launch='--model random:llama3-8b --enable-jit')",
    )  # fmt: skip
    p.add_argument(
        "--model", default=None, help="model name to send (default: the server's first /v1/models entry)"
    )
    p.add_argument("--api-key", default=None)
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--workload", default="fixed", choices=["fixed", "random", "sharegpt", "shared-prefix"])
    p.add_argument("--prefix-len", type=int, default=2048, help="shared-prefix: tokens of each system prompt")
    p.add_argument("--num-prefixes", type=int, default=4, help="shared-prefix: how many system prompts")
    p.add_argument("--scale", type=float, default=1.0, help="sharegpt: lengths times this (quick runs)")
    p.add_argument(
        "--request-rate", type=float, nargs="+", default=[float("inf")],
        help="requests/s (Poisson); inf = all at once; several values: a sweep, one row each",
    )  # fmt: skip
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    add_output_args(p)
    return p


async def one_request(client, url: str, headers: dict, payload: dict, rec: RequestRecord) -> None:
    rec.start = time.perf_counter()
    last = rec.start
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=payload, headers=headers) as resp:
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    rec.error = str(chunk["error"])
                    return
                if chunk.get("usage"):
                    rec.output_tokens = chunk["usage"].get("completion_tokens", rec.output_tokens)
                    rec.prompt_tokens = chunk["usage"].get("prompt_tokens", 0)
                if any(c.get("text") for c in chunk.get("choices", [])):
                    now = time.perf_counter()
                    if rec.ttft == 0.0:
                        rec.ttft = now - rec.start
                    else:
                        rec.itl.append(now - last)
                    last = now
        rec.e2e = time.perf_counter() - rec.start
        rec.ok = True
    except Exception as e:  # noqa: BLE001 - a failed request is a counted error, not a crash
        rec.error = f"{type(e).__name__}: {e}"


def decode_roofline(
    info: dict[str, Any], bandwidth_gbps: float, batch: int, context: float, shared: float = 0.0
) -> float:
    """Output tok/s the memory bandwidth allows for `batch` rows decoding at `context` tokens each of
    their own, plus `shared` tokens of KV that every row reads (shared prefixes' pages, read from
    DRAM once a step at best): every step streams the weights once and the KV."""
    step_bytes = info["weight_bytes"] + (batch * context + shared) * info["kv_bytes_per_token"]
    return batch * bandwidth_gbps * 1e9 / step_bytes


async def server_roofline(
    client, url: str, headers: dict, args: argparse.Namespace, input_len: float, output_len: float
) -> dict[str, Any]:
    """For an sgjit server on this machine: its model's sizes (`/get_model_info`), the ceilings of its
    device measured here, and the decode roofline at the benchmark's concurrency for requests of
    these mean lengths. In the shared-prefix workload the system prompts count once: their KV once a
    step, their prefill once a prompt (what a prefix cache can skip). Other servers: {}."""
    import torch

    from sgjit.bench.ceilings import measure

    resp = await client.get(f"{url}/get_model_info", headers=headers)
    info = resp.json() if resp.status_code == 200 else {}
    if "weight_bytes" not in info:
        return {}
    device = torch.device(info["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        return {}
    ceilings = measure(device)
    batch = min(args.max_concurrency or args.num_prompts, args.num_prompts)
    own, shared, prefill_len = input_len + output_len / 2, 0.0, input_len
    if args.workload == "shared-prefix":  # the system prompts: KV in pages the rows share, cached prefill
        own -= args.prefix_len
        shared = min(args.num_prefixes, batch) * args.prefix_len
        prefill_len -= args.prefix_len * max(0.0, 1 - args.num_prefixes / args.num_prompts)
    roof = decode_roofline(info, ceilings.bandwidth_gbps, batch, own, shared)
    out = {"ceilings": ceilings.as_dict(), "decode_roofline_tok_s": roof, "roofline_batch": batch}
    if ceilings.gemm_tflops:
        # The whole run's bound: every prompt token's GEMM FLOPs at the GEMM peak, plus the decode
        # steps at the bandwidth bound (output tok/s counts the prefill time too).
        prefill_s = 2 * info["active_params"] * prefill_len / (ceilings.gemm_tflops * 1e12)
        out["roofline_tok_s"] = output_len / (prefill_s + output_len / roof)
    return out


async def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    import httpx

    from sgjit.bench.workload import synthetic_requests

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    reqs = synthetic_requests(
        args.workload, args.num_prompts, args.input_len, args.output_len, 30000, args.seed,
        scale=args.scale, prefix_len=args.prefix_len, num_prefixes=args.num_prefixes,
    )  # fmt: skip
    mean_in = sum(len(r.input_ids) for r in reqs) / len(reqs)
    mean_out = sum(r.output_len for r in reqs) / len(reqs)
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(None), limits=httpx.Limits(max_connections=None)
    ) as client:
        model = args.model or (await client.get(f"{url}/v1/models", headers=headers)).json()["data"][0]["id"]
        roofline = await server_roofline(client, url, headers, args, mean_in, mean_out)
        rows, errors = [], set()
        for i, rate in enumerate(args.request_rate):
            if i:  # each rate from a cold prefix cache (sgjit; other servers keep theirs)
                await client.post(f"{url}/flush_cache", headers=headers)
            records, elapsed = await run_rate(client, url, headers, model, reqs, rate, args)
            rows.append({"workload": args.workload, "mean_input_len": mean_in, "mean_output_len": mean_out,
                         **summarize(records, elapsed, rate, args, roofline)})  # fmt: skip
            errors |= {r.error for r in records if not r.ok}
    return {"benchmark": "serving", "url": url, "model": model, "environment": environment(),
            "ceilings": roofline.get("ceilings"), "rows": rows, "error_samples": sorted(errors)[:5]}  # fmt: skip


async def run_rate(
    client, url: str, headers: dict, model: str, reqs, rate: float, args
) -> tuple[list[RequestRecord], float]:
    """Every request once, arriving at `rate` per second (Poisson), at most --max-concurrency at once;
    the records and the seconds it all took."""
    records = [RequestRecord() for _ in reqs]
    gate = asyncio.Semaphore(args.max_concurrency or len(reqs))
    rng = random.Random(args.seed)

    async def send(i: int) -> None:
        r = reqs[i]
        payload = {"model": model, "prompt": r.input_ids, "max_tokens": r.output_len, "temperature": 0.0,
                   "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        async with gate:
            await one_request(client, url, headers, payload, records[i])

    t0 = time.perf_counter()
    tasks = []
    for i in range(len(reqs)):
        tasks.append(asyncio.create_task(send(i)))
        if rate != float("inf"):
            await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)
    return records, time.perf_counter() - t0


def summarize(
    records: list[RequestRecord], elapsed: float, rate: float, args, roofline: dict[str, Any]
) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    ms = lambda d: {k: v * 1000 for k, v in d.items()}  # noqa: E731
    row = {
        "requests": len(records), "completed": len(ok), "errors": len(records) - len(ok),
        "max_concurrency": args.max_concurrency, "request_rate": rate,
        "seconds": elapsed, "output_tok_s": out_tokens / elapsed, "requests_s": len(ok) / elapsed,
        **{f"ttft_{k}_ms": v for k, v in ms(percentiles([r.ttft for r in ok])).items()},
        **{f"tpot_{k}_ms": v for k, v in ms(percentiles(tpot)).items()},
        **{f"itl_{k}_ms": v for k, v in ms(percentiles([x for r in ok for x in r.itl])).items()},
        **{f"e2e_{k}_ms": v for k, v in ms(percentiles([r.e2e for r in ok])).items()},
    }  # fmt: skip
    if roofline:
        row["decode_roofline_tok_s"] = roofline["decode_roofline_tok_s"]
        row["pct_of_roofline"] = 100 * row["output_tok_s"] / roofline["decode_roofline_tok_s"]
        if "roofline_tok_s" in roofline:
            row["roofline_with_prefill_tok_s"] = roofline["roofline_tok_s"]
            row["pct_of_roofline_with_prefill"] = 100 * row["output_tok_s"] / roofline["roofline_tok_s"]
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.smoke:
        args.num_prompts, args.input_len, args.output_len = 8, 16, 8
        args.prefix_len, args.scale = 64, 0.03
        args.max_concurrency = args.max_concurrency or 4
    proc = None
    url = args.url
    if args.launch is not None:
        from sgjit.bench.server_process import launch_server

        proc, url = launch_server(shlex.split(args.launch))
    try:
        result = asyncio.run(run(args, url))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
    if args.launch is not None:
        result["server_flags"] = args.launch
    return finish(args, result, result["rows"], COLUMNS)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()

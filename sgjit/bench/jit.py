"""`python -m sgjit.bench.jit`: what the JIT costs and buys, for the code_complete example.

- cold compile (empty disk cache) and compile in a fresh process with the disk cache warm;
- a JIT cache hit (median of many lookups);
- program latency with the JIT on vs off, interleaved rounds, and the decode rate of one long
  generation with the JIT on vs off (CUDA graphs and kernels on a GPU; on a CPU the two differ only
  by the pinned prefix and prefix-token reuse)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sgjit
from sgjit.bench.report import add_model_args, add_output_args, environment, finish, model_arg
from sgjit.bench.timing import host_us_per_step
from sgjit.kernels.cpp import build as cpu_kernels
from sgjit.lang.runtime_backend import RuntimeBackend

log = logging.getLogger(__name__)

FRESH_PROCESS = """
import json, sys, time, sgjit
from sgjit.lang.runtime_backend import RuntimeBackend
sys.path.insert(0, {root!r})
from examples.code_complete import code_complete
rt = sgjit.Runtime({model!r}, device={device!r}, enable_jit=True, max_total_tokens={tokens})
t = time.perf_counter()
jit = RuntimeBackend.of(rt).jit
compiled = jit.compile(code_complete.plan())
print(json.dumps({{"compile_ms": (time.perf_counter() - t) * 1000, "disk_hits": jit.disk_hits}}))
rt.shutdown()
"""


def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m sgjit.bench.jit", description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--device", default="auto")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--max-total-tokens", type=int, default=32768, help="KV pool of each runtime")
    p.add_argument("--smoke", action="store_true")
    add_output_args(p)
    args = p.parse_args(argv)
    if args.smoke:
        args.repeat, args.decode_tokens = 1, 8
    sys.path.insert(0, repo_root())
    from examples.code_complete import code_complete

    cache_dir = tempfile.mkdtemp(prefix="sgjit-bench-jit-")
    cpu_kernels.seed_cache(Path(cache_dir))  # a fresh plan cache, not a rebuild of the C++ CPU kernels
    os.environ["SGJIT_CACHE_DIR"] = cache_dir
    pool = dict(max_total_tokens=args.max_total_tokens)  # two runtimes share the device
    on = sgjit.Runtime(model_arg(args), device=args.device, enable_jit=True, **pool)
    off = sgjit.Runtime(model_arg(args), device=args.device, **pool)
    try:
        plan = code_complete.plan()
        t = time.perf_counter()
        RuntimeBackend.of(on).jit.compile(plan)
        cold_ms = (time.perf_counter() - t) * 1000
        script = FRESH_PROCESS.format(
            root=repo_root(), model=model_arg(args), device=str(on.device), tokens=args.max_total_tokens
        )
        env = {**os.environ, "SGJIT_CACHE_DIR": cache_dir}
        fresh = json.loads(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                          check=True).stdout.strip().splitlines()[-1])  # fmt: skip
        hits = []
        for _ in range(2000):
            t = time.perf_counter()
            RuntimeBackend.of(on).jit.compile(plan)
            hits.append(time.perf_counter() - t)
        lat: dict[str, list[float]] = {"jit": [], "no_jit": []}
        for _ in range(args.repeat):
            for name, rt in (("jit", on), ("no_jit", off)):
                t = time.perf_counter()
                code_complete.run(prompt="def fib(n):", temperature=0, backend=rt)
                lat[name].append((time.perf_counter() - t) * 1000)
        decode, host_us = {}, {}
        for name, rt in (("jit", on), ("no_jit", off)):
            ids = rt.tokenizer.encode("Once upon a time")
            params = {"max_new_tokens": args.decode_tokens, "temperature": 0, "ignore_eos": True}
            rt.generate(input_ids=ids, sampling_params=params)
            before = rt.stats()
            t = time.perf_counter()
            rt.generate(input_ids=ids, sampling_params=params)
            decode[name] = args.decode_tokens / (time.perf_counter() - t)
            host_us[name] = host_us_per_step(rt, before)
    finally:
        on.shutdown()
        off.shutdown()
    row = {
        "cold_compile_ms": cold_ms,
        "fresh_process_compile_ms": fresh["compile_ms"],
        "fresh_process_disk_hit": bool(fresh["disk_hits"]),
        "cache_hit_us_p50": statistics.median(hits) * 1e6,
        "program_ms_jit": statistics.median(lat["jit"]),
        "program_ms_no_jit": statistics.median(lat["no_jit"]),
        "decode_tok_s_jit": decode["jit"],
        "decode_tok_s_no_jit": decode["no_jit"],
        "host_us_per_decode_step_jit": host_us["jit"],
    }
    result = {"benchmark": "jit", "device": str(on.device), "model": on.model_config.name,
              "environment": environment(), "rows": [row]}  # fmt: skip
    return finish(args, result, [row], list(row))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()

"""`python -m sgjit.bench.throughput`: offline throughput in-process, like SGLang's
bench_offline_throughput. N synthetic requests are submitted at once and served with continuous
batching (at most --max-concurrency running); reports output and total tok/s, the single-request
decode rate measured in the same run, their ratio, and the decode roofline at the batch size."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

from sgjit.bench import report
from sgjit.bench.ceilings import measure
from sgjit.bench.peers import weight_bytes_read
from sgjit.bench.report import add_model_args, add_output_args, finish, model_arg, profiled
from sgjit.bench.workload import synthetic_requests

log = logging.getLogger(__name__)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sgjit.bench.throughput", description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default=None)
    p.add_argument("--enable-jit", action="store_true")
    p.add_argument("--workload", default="random", choices=["fixed", "random", "sharegpt"])
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--max-concurrency", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    add_output_args(p)
    return p


def run_batch(rt, reqs) -> float:
    t = time.perf_counter()
    rt.generate(
        input_ids=[r.input_ids for r in reqs],
        sampling_params=[
            {"max_new_tokens": r.output_len, "temperature": 0, "ignore_eos": True} for r in reqs
        ],
    )
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.smoke:
        args.num_prompts, args.input_len, args.output_len, args.max_concurrency = 8, 16, 8, 4
    from sgjit.runtime.runtime import Runtime

    rt = Runtime(
        model_arg(args), device=args.device, dtype=args.dtype, enable_jit=args.enable_jit,
        max_running_requests=args.max_concurrency, enable_prefix_cache=False,
    )  # fmt: skip
    try:
        ceilings = rt.engine.call(lambda: measure(rt.device))
        vocab = rt.model_config.vocab_size
        reqs = synthetic_requests(
            args.workload, args.num_prompts, args.input_len, args.output_len, vocab, args.seed
        )
        single = synthetic_requests("fixed", 2, args.input_len, args.output_len, vocab, args.seed + 1)
        run_batch(rt, single[:1])  # warm-up
        # single-request decode rate: (N-1) tokens over (t_N - t_1)
        t1 = run_batch(rt, [type(single[0])(single[0].input_ids, 1)])
        tn = run_batch(rt, single[1:])
        single_decode = (args.output_len - 1) / max(tn - t1, 1e-9)
        run_batch(rt, reqs[: args.max_concurrency])  # warm-up of the batched shapes
        with profiled(rt, args.profile, "throughput"):
            elapsed = run_batch(rt, reqs)
    finally:
        rt.shutdown()
    out_tokens = sum(r.output_len for r in reqs)
    in_tokens = sum(len(r.input_ids) for r in reqs)
    weight_bytes = weight_bytes_read(rt.model, rows=args.max_concurrency)
    step_roof = ceilings.read_gbps * 1e9 / weight_bytes  # decode steps/s when weights dominate
    row = {
        "workload": args.workload,
        "requests": args.num_prompts,
        "max_concurrency": args.max_concurrency,
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
        "seconds": elapsed,
        "output_tok_s": out_tokens / elapsed,
        "total_tok_s": (in_tokens + out_tokens) / elapsed,
        "single_request_decode_tok_s": single_decode,
        "batch_vs_single": out_tokens / elapsed / single_decode,
        "decode_roofline_tok_s_at_concurrency": step_roof * args.max_concurrency,
    }
    result = {
        **report.header("throughput", rt),
        "jit": args.enable_jit,
        "ceilings": ceilings.as_dict(),
        "rows": [row],
    }
    print(f"ceilings: read {ceilings.read_gbps:.1f} GB/s on {ceilings.device}")
    return finish(args, result, [row], list(row))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()

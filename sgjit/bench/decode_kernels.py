"""`python -m sgjit.bench.decode_kernels`: where a decode step's device time goes, kernel by kernel. A
greedy generation of --output-len tokens a row at each --batch-size runs three times: once to warm
(compile, capture), once timed, once inside a profile window (`Runtime.profile`), whose trace
bench.trace_summary reads; each kernel's device time and launches are divided by the tokens a row,
so the prefill's kernels show amortised (a few µs a step) beside the decode step's. Prints the
decode rate and, per kernel, its µs and launches a step.

Inside CUDA graphs the profiler still sees every kernel. A kernel launched to overlap the one before
it (kernels/cuda/pdl.py) is timed from its start, so its wait for that kernel counts in its time:
take speed from the step's wall time, not from the kernels' sum. On the CPU there are no kernels:
the run's step ranges and decode rate only."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from sgjit.bench.report import add_model_args, model_arg
from sgjit.bench.trace_summary import summarize


def run_one(
    model: str | None, device: str, bs: int, input_len: int, output_len: int, top: int, **opts: Any
) -> dict[str, Any]:
    from sgjit.runtime.runtime import Runtime

    rt = Runtime(
        model, device=device, enable_jit=True, max_total_tokens=bs * (input_len + output_len + 32),
        enable_prefix_cache=False, **opts,
    )  # fmt: skip
    try:
        prompts = [[100 + i] * input_len for i in range(bs)]
        params = {"temperature": 0, "max_new_tokens": output_len, "ignore_eos": True}
        rt.generate(input_ids=prompts, sampling_params=params)  # warm: compile, capture
        t = time.perf_counter()
        rt.generate(input_ids=prompts, sampling_params={**params, "max_new_tokens": 1})
        first = time.perf_counter() - t
        t = time.perf_counter()
        rt.generate(input_ids=prompts, sampling_params=params)
        whole = time.perf_counter() - t
        with tempfile.TemporaryDirectory() as d:
            with rt.profile(d, "decode"):
                rt.generate(input_ids=prompts, sampling_params=params)
            summary = summarize(json.loads((Path(d) / "decode.trace.json").read_text()), top=top)
    finally:
        rt.shutdown()
    step_us = 1e6 * (whole - first) / max(output_len - 1, 1)
    return {
        "batch": bs, "decode_us_per_step": step_us, "decode_tok_s_per_seq": 1e6 / step_us,
        "gpu_busy_pct": summary["gpu_busy_pct"], "steps": summary["steps"],
        "kernels": [
            {"name": k["name"], "us_per_step": 1e3 * k["ms"] / output_len, "launches_per_step": k["launches"] / output_len}
            for k in summary["top_kernels"]
        ],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(
        prog="python -m sgjit.bench.decode_kernels", description=__doc__.split("\n\n")[0]
    )
    add_model_args(p)
    p.add_argument("--device", default="cuda")
    p.add_argument("--quantization", default=None, help="fp8: the layers' weights in FP8")
    p.add_argument("--batch-size", type=int, nargs="+", default=[1])
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=65)
    p.add_argument("--top", type=int, default=15, help="kernels listed")
    p.add_argument("--out", default=None, help="write the result as JSON here")
    args = p.parse_args(argv)
    opts = {"quantization": args.quantization} if args.quantization else {}
    result = {"benchmark": "decode_kernels", "model": model_arg(args), "device": args.device, "rows": []}
    for bs in args.batch_size:
        row = run_one(model_arg(args), args.device, bs, args.input_len, args.output_len, args.top, **opts)
        result["rows"].append(row)
        print(
            f"batch {bs}: decode {row['decode_us_per_step']:.1f} us a step "
            f"({row['decode_tok_s_per_seq']:.1f} tok/s a row), GPU busy {row['gpu_busy_pct']}% of the window"
        )
        # the window holds the prefill too: whether the decode launches themselves leave the GPU idle
        # is their kernels' device time against their span
        for s in row["steps"]:
            print(
                f"  {s['count']} {s['kind']} launches: kernels {s['gpu_ms_per_step']:.2f} ms, "
                f"span {s['span_ms_per_step']:.2f} ms, host {s['host_ms_per_step']:.2f} ms a launch"
            )
        for k in row["kernels"]:
            print(f"{k['us_per_step']:10.1f} us {k['launches_per_step']:6.1f}/step  {k['name']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()

"""`python -m sgjit.bench.latency`: one batch, prefill and decode speed of sgjit with the JIT on,
with it off, Hugging Face transformers `generate`, and plain torch with its decode step in one CUDA
graph (`torch-graph`, on sgjit's weights: torch_graph_peer.py), on the same model, device and dtype,
in one run, next to the rooflines measured at the start. `sgjit-megakernel` is the JIT with the
decode megakernel offered (SGJIT_UNVERIFIED_KERNELS=1 for its runtime); beside it `sgjit-jit` runs
its decode steps layer by layer, so one run compares the two.

Method, the same for every engine: prefill (= TTFT of the batch) is the wall time of a 1-token
generation; decode rate per sequence = (N - 1) / (time of an N-token generation - that); medians of
--repeat rounds taken in turn, engine by engine. `host_us_per_step`: the engine thread's time per
decode step inside multi-step launches, device waits (on the CPU: the model's own compute) left
out; `output_us_per_token`: the output thread's time per token handed out. On the CPU only
`sgjit-bucketed` (the GPU's bucketed multi-step decode path, run eagerly) has multi-step launches,
or every engine with SGJIT_EAGER_DECODE_GRAPHS=1."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from sgjit.bench import report
from sgjit.bench.ceilings import Ceilings, measure
from sgjit.bench.peers import load_transformers, sgjit_runner, transformers_runner, weight_bytes_read
from sgjit.bench.report import add_model_args, add_output_args, finish, model_arg, profiled
from sgjit.bench.timing import host_us_per_step, interleaved, output_us_per_token, synchronizer
from sgjit.bench.torch_graph_peer import torch_graph_runner
from sgjit.bench.workload import synthetic_requests

log = logging.getLogger(__name__)

COLUMNS = [
    "engine", "batch", "prefill_ms", "prefill_roofline_ms", "prefill_tok_s", "decode_tok_s_per_seq",
    "decode_tok_s_total", "decode_roofline_tok_s_per_seq", "decode_pct_of_roofline", "host_us_per_step",
    "output_us_per_token", "decode_vs_transformers", "prefill_vs_transformers", "decode_vs_torch_graph",
]  # fmt: skip
ENGINES = (
    "sgjit-jit", "sgjit", "transformers", "torch-graph", "sgjit-deterministic", "sgjit-fp8", "sgjit-jit-tp",
    "sgjit-megakernel", "sgjit-overlap", "sgjit-no-overlap", "sgjit-bucketed",
)  # fmt: skip
# the JIT with one setting changed
VARIANTS = {
    "sgjit-deterministic": {"deterministic": True},  # batch-invariant GEMMs and attention
    "sgjit-fp8": {"quantization": "fp8"},  # the layers' weights in FP8 (quantized at load)
    "sgjit-overlap": {"overlap_schedule": True},  # step N+1 launched while step N runs (off by default yet)
    "sgjit-no-overlap": {"overlap_schedule": False},  # each step read back before the next is launched
    "sgjit-bucketed": {"bucketed_decode": True},  # the GPU's decode path; on the CPU, run eagerly
}
DEFAULT_ENGINES = ("sgjit-jit", "sgjit", "transformers")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sgjit.bench.latency", description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default=None)
    p.add_argument("--batch-size", type=int, nargs="+", default=[1])
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--engines", nargs="+", default=list(DEFAULT_ENGINES), choices=ENGINES)
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks of the sgjit-jit-tp engine")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    add_output_args(p)
    return p


def rooflines(rt, ceilings: Ceilings, bs: int, input_len: int, output_len: int) -> tuple[float, float]:
    """(prefill seconds, decode tok/s per sequence) the hardware allows for this batch: a decode
    step reads the weights as this runtime holds them (bf16, FP8, ...; of an MoE layer, the experts
    the batch routes to) and the KV; prefill counts the FLOPs of the weights a token computes with
    (an MoE model's active ones) at the bf16 GEMM peak. With tensor parallelism: one GPU's share
    (rank 0's weights and KV heads, 1/tp of the FLOPs), at one GPU's ceilings."""
    mc = rt.model_config
    share = rt.model.config if rt.config.tp > 1 else mc  # rank 0's heads
    elem = torch.empty(0, dtype=rt.dtype).element_size()
    weights = weight_bytes_read(rt.model, rows=bs)
    ctx = input_len + output_len / 2
    kv_bytes = bs * ctx * 2 * mc.num_layers * share.kv_size * elem
    decode_step = (weights + kv_bytes) / (ceilings.bandwidth_gbps * 1e9)
    flops = 2 * mc.active_params() * bs * input_len + 2 * mc.num_layers * mc.q_size * bs * input_len**2
    flops /= rt.config.tp
    peak = (ceilings.gemm_tflops or 0.0) * 1e12
    prefill = flops / peak if peak else float("nan")
    return prefill, 1.0 / decode_step


@contextmanager
def _env(**settings: str) -> Iterator[None]:
    """SGJIT_ settings for what is built inside (a runtime selects its kernels as it loads)."""
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.smoke:
        args.batch_size, args.input_len, args.output_len, args.repeat = [1, 2], 8, 4, 1
    from sgjit.runtime.runtime import Runtime

    model = model_arg(args)
    need = max(args.batch_size) * (args.input_len + args.output_len + 32)
    opts = dict(device=args.device, dtype=args.dtype, max_total_tokens=need, enable_prefix_cache=False)
    runtimes = {"sgjit": Runtime(model, **opts)}
    if "sgjit-jit" in args.engines:
        # beside the megakernel engine, the JIT's decode runs layer by layer (the comparison it is for)
        layered = "sgjit-megakernel" in args.engines and os.environ.get("SGJIT_KERNELS", "auto") == "auto"
        with _env(**({"SGJIT_KERNELS": "decode_megakernel=reference"} if layered else {})):
            runtimes["sgjit-jit"] = Runtime(model, enable_jit=True, **opts)
    if "sgjit-megakernel" in args.engines:
        with _env(SGJIT_UNVERIFIED_KERNELS="1"):
            runtimes["sgjit-megakernel"] = Runtime(model, enable_jit=True, **opts)
    for name, change in VARIANTS.items():
        if name in args.engines:
            runtimes[name] = Runtime(model, enable_jit=True, **opts, **change)
    if "sgjit-jit-tp" in args.engines:  # the JIT over --tp ranks (its roofline: one GPU's share)
        runtimes["sgjit-jit-tp"] = Runtime(model, enable_jit=True, tp=args.tp, **opts)
    base = runtimes["sgjit"]
    try:
        ceilings = base.engine.call(lambda: measure(base.device))
        hf = base.engine.call(lambda: load_transformers(base)) if "transformers" in args.engines else None
        sync = synchronizer(base.device)
        rows = []
        for bs in args.batch_size:
            batch = [r.input_ids for r in synthetic_requests("fixed", bs, args.input_len, 1, 32000, seed=bs)]
            runners = {name: sgjit_runner(runtimes[name], batch) for name in args.engines if name in runtimes}
            if hf is not None:
                runners["transformers"] = transformers_runner(base, hf, batch)
            if "torch-graph" in args.engines:
                runners["torch-graph"] = torch_graph_runner(base, batch, args.input_len + args.output_len + 8)
            before = {name: rt.stats() for name, rt in runtimes.items()}
            with profiled(base, args.profile, f"latency-b{bs}"):
                times = interleaved(runners, args.output_len, args.repeat, sync)
            host_us = {name: host_us_per_step(rt, before[name]) for name, rt in runtimes.items()}
            output_us = {name: output_us_per_token(rt, before[name]) for name, rt in runtimes.items()}
            for name, (t1, tn) in times.items():
                prefill_roof, decode_roof = rooflines(
                    runtimes.get(name, base), ceilings, bs, args.input_len, args.output_len
                )
                per_seq = (args.output_len - 1) / max(tn - t1, 1e-9)
                rows.append({
                    "engine": name, "batch": bs, "input_len": args.input_len, "output_len": args.output_len,
                    "prefill_ms": t1 * 1000, "prefill_tok_s": bs * args.input_len / t1,
                    "prefill_roofline_ms": prefill_roof * 1000,
                    "decode_tok_s_per_seq": per_seq, "decode_tok_s_total": per_seq * bs,
                    "decode_roofline_tok_s_per_seq": decode_roof, "decode_pct_of_roofline": 100 * per_seq / decode_roof,
                    "host_us_per_step": host_us.get(name), "output_us_per_token": output_us.get(name),
                })  # fmt: skip
            peer = next((r for r in rows if r["batch"] == bs and r["engine"] == "transformers"), None)
            graph_peer = next((r for r in rows if r["batch"] == bs and r["engine"] == "torch-graph"), None)
            for r in rows:
                if peer is not None and r["batch"] == bs and r is not peer:
                    r["decode_vs_transformers"] = r["decode_tok_s_per_seq"] / peer["decode_tok_s_per_seq"]
                    r["prefill_vs_transformers"] = peer["prefill_ms"] / r["prefill_ms"]
                if graph_peer is not None and r["batch"] == bs and r is not graph_peer:
                    r["decode_vs_torch_graph"] = (
                        r["decode_tok_s_per_seq"] / graph_peer["decode_tok_s_per_seq"]
                    )
    finally:
        for rt in runtimes.values():
            rt.shutdown()
    result = {**report.header("latency", base), "ceilings": ceilings.as_dict(), "rows": rows}
    print(
        f"ceilings: {ceilings.bandwidth_gbps:.0f} GB/s, GEMM {ceilings.gemm_tflops or float('nan'):.0f} TFLOP/s on {ceilings.device}"
    )
    return finish(args, result, rows, COLUMNS)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()

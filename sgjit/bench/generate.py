"""`python -m sgjit.bench.generate`: prompt and decode speed of one request on the bundled model (or
--model), sgjit next to its peers on the same prompt in the same run (`--engines`: Hugging Face
transformers' `generate`, same device and dtype; llama-cpp-python on the same GGUF file, CPU), with
the memory-bandwidth roofline of decoding (sgjit's weight bytes as its ops hold them) measured at
the start.

Method, the same for both: prefill time = wall time of a 1-token generation; decode rate =
(N - 1) / (time of an N-token generation - time of the 1-token one). Medians over --repeat runs."""

from __future__ import annotations

import argparse
import logging
from typing import Any

import torch

from sgjit.bench import report
from sgjit.bench.ceilings import measure
from sgjit.bench.peers import (
    llama_cpp_runner,
    load_transformers,
    sgjit_runner,
    transformers_runner,
    weight_bytes_read,
)
from sgjit.bench.report import add_model_args, add_output_args, finish, model_arg, profiled
from sgjit.bench.timing import interleaved, synchronizer

log = logging.getLogger(__name__)

COLUMNS = [
    "engine", "prompt_tokens", "prefill_ms", "prefill_tok_s", "decode_tok_s", "decode_roofline_tok_s",
    "decode_pct_of_roofline", "decode_vs_transformers", "prefill_vs_transformers", "decode_vs_llama.cpp",
    "prefill_vs_llama.cpp",
]  # fmt: skip

PROMPT = (
    "You are a meticulous assistant. Summarise the following passage in three sentences.\n\n"
    "The Industrial Revolution began in Great Britain in the late eighteenth century and spread to "
    "continental Europe and North America. It marked a shift from hand production to machines, new "
    "chemical and iron production processes, the increasing use of steam power and water power, the "
    "development of machine tools and the rise of the mechanised factory system. Output greatly "
    "increased, and the result was an unprecedented rise in population and in the rate of population growth."
)


def row(name: str, n_prompt: int, new_tokens: int, t1: float, tn: float, roof: float) -> dict[str, Any]:
    if tn > t1:
        decode = (new_tokens - 1) / (tn - t1)
    else:  # a busy machine can make the 1-token run the slower one: no rate can be read from that
        log.warning(
            "%s: the %d-token runs took no longer than the 1-token runs (median %.3f s vs %.3f s), so its "
            "decode rate is not reported; the machine is too busy for this setting (raise --new-tokens "
            "or --repeat)", name, new_tokens, tn, t1,
        )  # fmt: skip
        decode = float("nan")
    return {
        "engine": name,
        "prompt_tokens": n_prompt,
        "prefill_ms": t1 * 1000,
        "prefill_tok_s": n_prompt / t1,
        "decode_tok_s": decode,
        "decode_roofline_tok_s": roof,
        "decode_pct_of_roofline": 100 * decode / roof,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m sgjit.bench.generate", description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--dtype", default=None, help="compute dtype for both engines (default fp32 on CPU, bf16 on GPU)"
    )
    p.add_argument(
        "--quantization", default="auto", choices=("auto", "gguf", "fp8", "none"),
        help="sgjit's weights: auto = packed GGUF blocks on the CPU (C++ kernels), as the runtime's default; "
        "none = dequantized at load; gguf = packed or an error; fp8 = FP8 layer weights (GPU)",
    )  # fmt: skip
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument(
        "--num-threads", type=int, default=None, help="CPU threads for every engine (default: torch's choice)"
    )
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--no-transformers", action="store_true", help="skip the transformers peer")
    p.add_argument(
        "--engines", nargs="+", default=None, choices=("sgjit", "transformers", "llama.cpp"),
        help="engines to run (default: sgjit transformers)",
    )  # fmt: skip
    add_output_args(p)
    args = p.parse_args(argv)

    from sgjit.runtime.runtime import Runtime

    rt = Runtime(
        model_arg(args), device=args.device, dtype=args.dtype, enable_prefix_cache=False,
        quantization=args.quantization, num_threads=args.num_threads,
    )  # fmt: skip
    ceilings = rt.engine.call(lambda: measure(rt.device))  # on the engine thread: one OpenMP pool
    weight_bytes = weight_bytes_read(rt.model)
    roof = ceilings.bandwidth_gbps * 1e9 / weight_bytes
    ids = rt.tokenizer.encode(PROMPT)
    engines = args.engines or (["sgjit"] if args.no_transformers else ["sgjit", "transformers"])
    runners = {"sgjit": sgjit_runner(rt, [ids])}
    if "transformers" in engines:
        hf = rt.engine.call(lambda: load_transformers(rt))
        runners["transformers"] = transformers_runner(rt, hf, [ids])
    if "llama.cpp" in engines:
        runners["llama.cpp"] = llama_cpp_runner(rt, ids, args.num_threads or torch.get_num_threads())
    with profiled(rt, args.profile, "generate"):
        times = interleaved(runners, args.new_tokens, args.repeat, synchronizer(rt.device))
    rt.shutdown()
    rows = [row(name, len(ids), args.new_tokens, t1, tn, roof) for name, (t1, tn) in times.items()]
    for peer in rows[1:]:
        for what in ("decode", "prefill"):
            rows[0][f"{what}_vs_{peer['engine']}"] = rows[0][f"{what}_tok_s"] / peer[f"{what}_tok_s"]
    result = {
        **report.header("generate", rt),
        "new_tokens": args.new_tokens,
        "weight_bytes": weight_bytes,
        "ceilings": ceilings.as_dict(),
        "rows": rows,
    }
    print(
        f"ceilings: read {ceilings.read_gbps:.1f} GB/s, copy {ceilings.copy_gbps:.1f} GB/s on {ceilings.device}; "
        f"decode roofline {roof:.1f} tok/s ({weight_bytes / 1e6:.0f} MB of weights per token)"
    )
    return finish(args, result, rows, COLUMNS)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()

"""`python -m sgjit.generate "prompt"`: a one-shot completion on the bundled model (or --model), with
load time and prompt / decode speed on stderr."""

from __future__ import annotations

import argparse
import sys
import time

from sgjit.errors import SgjitError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sgjit.generate", description="Generate a completion for one prompt."
    )
    p.add_argument("prompt", help="the prompt text")
    p.add_argument(
        "--model",
        default=None,
        help="bundled name, .gguf file or Hugging Face directory (default smollm2-135m)",
    )
    p.add_argument(
        "--chat", action="store_true", help="wrap the prompt as a user message in the model's chat template"
    )
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--dtype", default=None, help="float32, bfloat16 or float16 (default: bf16 on GPU, fp32 on CPU)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from sgjit.runtime.runtime import Runtime

    try:
        rt = Runtime(args.model, device=args.device, dtype=args.dtype)
        params = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
        t0 = time.perf_counter()
        first = None
        pieces = []
        if args.chat:
            stream = rt.chat([{"role": "user", "content": args.prompt}], params, stream=True)
        else:
            stream = rt.generate(args.prompt, params, stream=True)
        for chunk in stream:
            if first is None:
                first = time.perf_counter()
            pieces.append(chunk["text"])
            sys.stdout.write(chunk["text"])
            sys.stdout.flush()
        end = time.perf_counter()
        meta = chunk["meta_info"]
        rt.shutdown()
    except SgjitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write("\n")
    n_out, n_in = meta["completion_tokens"], meta["prompt_tokens"]
    ttft = (first or end) - t0
    decode = (n_out - 1) / (end - first) if first and n_out > 1 and end > first else float("nan")
    print(
        f"[sgjit] load {rt.load_seconds:.2f} s | prompt {n_in} tok, {n_in / ttft:.0f} tok/s (TTFT {ttft * 1000:.0f} ms) | "
        f"decode {n_out} tok, {decode:.1f} tok/s | {rt.device} {str(rt.dtype).removeprefix('torch.')}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

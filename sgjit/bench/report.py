"""Benchmark output: a markdown table on stdout and the whole result as JSON."""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch


def environment() -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def header(benchmark: str, rt: Any) -> dict[str, Any]:
    """What every in-process benchmark's result starts with: its name, the model, device and dtype,
    and the environment it ran in."""
    threads = rt.config.num_threads or torch.get_num_threads()  # the engine thread's pool
    env = environment() | {"cpu_threads": threads}
    return {"benchmark": benchmark, "model": rt.model_config.name, "device": str(rt.device),
            "dtype": str(rt.dtype).removeprefix("torch."), "environment": env}  # fmt: skip


def markdown_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_json(path: str | Path | None, result: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(result, indent=2, default=str))


def add_output_args(p) -> None:
    """--out / --plot / --profile, the same for every benchmark."""
    p.add_argument("--out", default=None, help="write the whole result as JSON here")
    p.add_argument("--plot", default=None, metavar="DIR", help="write PNG charts here (needs matplotlib)")
    p.add_argument(
        "--profile", default=None, metavar="DIR", help="write a torch.profiler trace of the measured part"
    )


def profiled(rt, out_dir: str | None, name: str):
    """A profiler window over the engine's work when --profile is given."""
    import contextlib

    return rt.profile(out_dir, name) if out_dir else contextlib.nullcontext()


def finish(args, result: dict[str, Any], rows: list[dict[str, Any]], columns: list[str]) -> dict[str, Any]:
    """Print `rows` as a markdown table of `columns`, write `--out` and `--plot`; returns the result."""
    print(markdown_table(rows, columns))
    write_json(args.out, result)
    if getattr(args, "plot", None):
        from sgjit.bench.plot import plot_result

        path = plot_result(result, args.plot)
        if path is not None:
            print(f"chart: {path}")
    return result


def add_model_args(p: argparse.ArgumentParser) -> None:
    """`--model` (a name or path) and `--model-shape` (random weights of a real shape); read back
    with `model_arg`."""
    p.add_argument("--model", default=None, help="model name or path (default: the bundled SmolLM2)")
    p.add_argument(
        "--model-shape",
        default=None,
        help="random weights of a real shape: llama3-8b, qwen2.5-7b, mistral-7b, ...",
    )


def model_arg(args: argparse.Namespace) -> str | None:
    return f"random:{args.model_shape}" if args.model_shape else args.model

"""Benchmark output: a markdown table on stdout and the whole result as JSON."""

from __future__ import annotations

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

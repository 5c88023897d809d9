"""`python -m sgjit.bench.trace_summary TRACE.json`: what a torch.profiler window of the engine spent
its time on. Reads the Chrome trace a profile window writes (`sgjit serve --profile-dir`,
`Runtime.profile`, `bench.latency --profile`) and reports:

- how busy the GPU was over the window: the union of kernel, copy and memset intervals;
- the kernels that took the most GPU time, by name;
- per kind of engine step (the ranges `sgjit.nvtx.nvtx_range` names: eager steps split into
  decode-only, mixed and prefill-only, and multi-step graph launches): how many, and per step the
  host time of the range, the GPU time of the kernels it launched, and the span from its first
  kernel's start to its last kernel's end.

A kernel belongs to the step whose host range contains the runtime call that launched it (matched by
the trace's correlation ids). The profiler slows the host side, so host times are upper bounds;
kernel times are the device's own."""

from __future__ import annotations

import argparse
import bisect
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
_STEP = re.compile(r"^step decode=(\d+) prefill=(\d+)$")
_MULTI = re.compile(r"^multi rows=(\d+) steps=(\d+)$")


@dataclass
class StepKind:
    count: int = 0
    host_us: float = 0.0
    gpu_us: float = 0.0
    span_us: float = 0.0
    tokens: int = 0  # decode rows + prefill tokens (a multi-step launch: rows x steps)

    def row(self, name: str) -> dict[str, Any]:
        n = max(self.count, 1)
        return {
            "kind": name,
            "count": self.count,
            "host_ms_per_step": round(self.host_us / n / 1e3, 3),
            "gpu_ms_per_step": round(self.gpu_us / n / 1e3, 3),
            "span_ms_per_step": round(self.span_us / n / 1e3, 3),
            "tokens_per_step": round(self.tokens / n, 1),
            "gpu_ms_total": round(self.gpu_us / 1e3, 2),
        }


@dataclass
class _Range:
    start: float
    end: float
    kind: str
    tokens: int
    tid: Any = None
    kernels: list[tuple[float, float]] = field(default_factory=list)


HOST_CATEGORIES = ("cpu_op", "python_function", "user_annotation", "cuda_runtime", "cuda_driver")


def host_self_times(events: list[dict[str, Any]], ranges: list[_Range], top: int) -> list[dict[str, Any]]:
    """Host events of the thread that ran `ranges`, inside them: own time (less nested events) per
    name, per range, the largest first. Without Python stacks in the trace, the steps' own Python
    shows as one line ("the step's own code")."""
    if not ranges:
        return []
    tid = ranges[0].tid
    starts = [r.start for r in ranges]
    inside = []
    for e in events:
        if e.get("cat") not in HOST_CATEGORIES or e.get("tid") != tid:
            continue
        i = bisect.bisect_right(starts, e["ts"]) - 1
        if i >= 0 and e["ts"] + e["dur"] <= ranges[i].end:
            if step_kind(e.get("name", "")) is not None:  # the step's own range: its time outside any op
                e = {**e, "name": "(the step's own code, outside recorded ops)"}
            inside.append(e)
    inside.sort(key=lambda e: (e["ts"], -e["dur"]))
    own: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    stack: list[list[Any]] = []  # [end, name, children's time]
    for e in inside:
        start, end = e["ts"], e["ts"] + e["dur"]
        while stack and stack[-1][0] <= start:
            stack.pop()
        if stack:
            stack[-1][2] += e["dur"]
        stack.append([end, e["name"], 0.0])
        own[e["name"]] += e["dur"]
        calls[e["name"]] += 1
        e["_entry"] = stack[-1]
    for e in inside:
        own[e["name"]] -= e.pop("_entry")[2]
    n = len(ranges)
    rows = sorted(own.items(), key=lambda kv: -kv[1])[:top]
    return [
        {
            "name": name[:120],
            "own_ms_per_step": round(us / n / 1e3, 3),
            "calls_per_step": round(calls[name] / n, 1),
        }
        for name, us in rows
    ]


def step_kind(name: str) -> tuple[str, int] | None:
    """('decode' | 'mixed' | 'prefill' | 'multi', tokens) for an engine range name, else None."""
    if m := _STEP.match(name):
        decode, prefill = int(m[1]), int(m[2])
        kind = "mixed" if decode and prefill else "decode" if decode else "prefill"
        return kind, decode + prefill
    if m := _MULTI.match(name):
        return "multi", int(m[1]) * int(m[2])
    return None


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by (start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def summarize(trace: dict[str, Any], top: int = 15, host_kind: str = "mixed") -> dict[str, Any]:
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    launches = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    ranges = []
    for e in events:
        if e.get("cat") == "user_annotation" and (kind := step_kind(e.get("name", ""))):
            ranges.append(_Range(e["ts"], e["ts"] + e["dur"], kind[0], kind[1], e.get("tid")))
    ranges.sort(key=lambda r: r.start)
    starts = [r.start for r in ranges]

    by_name: dict[str, float] = defaultdict(float)
    launches_by_name: dict[str, int] = defaultdict(int)
    intervals = []
    for e in gpu:
        start, end = e["ts"], e["ts"] + e["dur"]
        intervals.append((start, end))
        by_name[e.get("name", "?")] += e["dur"]
        launches_by_name[e.get("name", "?")] += 1
        launched = launches.get(e.get("args", {}).get("correlation"))
        if launched is not None and ranges:
            i = bisect.bisect_right(starts, launched) - 1
            if i >= 0 and ranges[i].start <= launched <= ranges[i].end:
                ranges[i].kernels.append((start, end))

    kinds: dict[str, StepKind] = defaultdict(StepKind)
    for r in ranges:
        k = kinds[r.kind]
        k.count += 1
        k.host_us += r.end - r.start
        k.tokens += r.tokens
        k.gpu_us += sum(end - start for start, end in r.kernels)
        if r.kernels:
            k.span_us += max(e for _, e in r.kernels) - min(s for s, _ in r.kernels)

    busy = union_us(intervals)
    if intervals:
        window = max(e for _, e in intervals) - min(s for s, _ in intervals)
    else:
        window = 0.0
    kernel_total = sum(by_name.values())
    return {
        "window_ms": round(window / 1e3, 2),
        "gpu_busy_ms": round(busy / 1e3, 2),
        "gpu_busy_pct": round(100 * busy / window, 1) if window else 0.0,
        "steps": [kinds[name].row(name) for name in ("multi", "decode", "mixed", "prefill") if name in kinds],
        "host_kind": host_kind,
        "host_top": host_self_times(events, [r for r in ranges if r.kind == host_kind], top),
        "top_kernels": [
            {
                "name": name[:120],
                "ms": round(us / 1e3, 3),
                "pct": round(100 * us / kernel_total, 1),
                "launches": launches_by_name[name],
            }  # fmt: skip
            for name, us in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
        ],
    }


def format_summary(s: dict[str, Any]) -> str:
    lines = [f"window {s['window_ms']} ms, GPU busy {s['gpu_busy_ms']} ms ({s['gpu_busy_pct']}%)", ""]
    lines.append("kind     count  host ms/step  GPU ms/step  span ms/step  tokens/step  GPU ms total")
    for r in s["steps"]:
        lines.append(
            f"{r['kind']:<8} {r['count']:>5}  {r['host_ms_per_step']:>12}  {r['gpu_ms_per_step']:>11}  "
            f"{r['span_ms_per_step']:>12}  {r['tokens_per_step']:>11}  {r['gpu_ms_total']:>12}"
        )
    if s["host_top"]:
        lines += ["", f"host time inside {s['host_kind']} steps, own ms a step (calls a step):"]
        for h in s["host_top"]:
            lines.append(f"{h['own_ms_per_step']:>10.3f} ms ({h['calls_per_step']:>7})  {h['name']}")
    lines += ["", "kernels by GPU time:"]
    for k in s["top_kernels"]:
        lines.append(f"{k['ms']:>10.2f} ms {k['pct']:>5.1f}%  {k['name']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(
        prog="python -m sgjit.bench.trace_summary", description=__doc__.split("\n")[0]
    )
    p.add_argument("trace", type=Path, help="a Chrome trace written by a profile window")
    p.add_argument("--top", type=int, default=15, help="kernels to list")
    p.add_argument(
        "--host-kind",
        default="mixed",
        choices=["multi", "decode", "mixed", "prefill"],
        help="the steps whose host time to break down",
    )
    p.add_argument("--out", type=Path, help="also write the summary as JSON here")
    args = p.parse_args(argv)
    summary = summarize(json.loads(args.trace.read_text()), args.top, args.host_kind)
    print(format_summary(summary))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()

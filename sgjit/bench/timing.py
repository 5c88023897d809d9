"""Timing helpers shared by the benchmarks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from tqdm import tqdm


def synchronizer(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def timed(fn: Callable[[int], Any], n: int, sync: Callable[[], None]) -> float:
    sync()
    t = time.perf_counter()
    fn(n)
    sync()
    return time.perf_counter() - t


def interleaved(
    runners: dict[str, Callable[[int], Any]], new_tokens: int, repeat: int, sync: Callable[[], None]
) -> dict[str, tuple[float, float]]:
    """Median wall time of a 1-token and of an N-token generation for each runner, measured in
    alternating rounds (A B A B ...) so a machine whose speed drifts penalises every engine alike."""
    for fn in runners.values():
        fn(new_tokens)  # warm-up: first-call costs (primitive creation, graph capture) stay out
    samples: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in runners}
    for _ in tqdm(range(repeat), desc="rounds", leave=False):
        for name, fn in runners.items():
            samples[name][0].append(timed(fn, 1, sync))
            samples[name][1].append(timed(fn, new_tokens, sync))
    return {k: (statistics.median(a), statistics.median(b)) for k, (a, b) in samples.items()}


def percentiles(values: list[float], ps: tuple[int, ...] = (50, 90, 99)) -> dict[str, float]:
    if not values:
        return {f"p{p}": float("nan") for p in ps}
    ordered = sorted(values)
    out = {}
    for p in ps:
        k = (len(ordered) - 1) * p / 100
        lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
        out[f"p{p}"] = ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)
    return out


def host_us_per_step(rt, before: dict[str, Any]) -> float | None:
    """Host time of a decode step inside multi-step launches since `before` (None: there were none)."""
    after = rt.stats()
    launches = after["multi_step_launches"] - before["multi_step_launches"]
    if not launches:
        return None
    return (after["multi_step_host_us"] - before["multi_step_host_us"]) / (launches * rt.config.multi_step)


def output_us_per_token(rt, before: dict[str, Any]) -> float | None:
    """Output-thread time per token handed out since `before` (None: no tokens)."""
    after = rt.stats()
    tokens = after["generation_tokens_total"] - before["generation_tokens_total"]
    if not tokens:
        return None
    return (after["output_us"] - before["output_us"]) / tokens

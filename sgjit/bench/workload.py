"""Synthetic request sets for the benchmarks (no dataset can be downloaded where sgjit is tested):
fixed lengths, uniform random lengths, or ShareGPT-like lengths (log-normal input and output
lengths with medians near those of ShareGPT conversations), all reproducible from a seed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class SyntheticRequest:
    input_ids: list[int]
    output_len: int


def lengths(kind: str, n: int, input_len: int, output_len: int, range_ratio: float, rng: np.random.Generator):
    if kind == "fixed":
        return np.full(n, input_len), np.full(n, output_len)
    if kind == "random":
        lo_in, lo_out = max(1, int(input_len * range_ratio)), max(1, int(output_len * range_ratio))
        return rng.integers(lo_in, input_len + 1, n), rng.integers(lo_out, output_len + 1, n)
    if kind == "sharegpt":
        # Medians ~ input_len and ~ output_len, long right tails, clipped to 4x the median.
        ins = np.clip(rng.lognormal(np.log(input_len), 0.8, n), 4, 4 * input_len).astype(int)
        outs = np.clip(rng.lognormal(np.log(output_len), 0.7, n), 2, 4 * output_len).astype(int)
        return ins, outs
    raise ValueError(f"unknown workload {kind!r} (fixed, random, sharegpt)")


def synthetic_requests(
    kind: str,
    n: int,
    input_len: int,
    output_len: int,
    vocab_size: int,
    seed: int = 0,
    range_ratio: float = 0.5,
) -> list[SyntheticRequest]:
    rng = np.random.default_rng(seed)
    ins, outs = lengths(kind, n, input_len, output_len, range_ratio, rng)
    low = min(1000, vocab_size // 2)  # skip the special tokens at the start of most vocabularies
    return [
        SyntheticRequest(rng.integers(low, vocab_size, int(i)).tolist(), int(o)) for i, o in zip(ins, outs)
    ]

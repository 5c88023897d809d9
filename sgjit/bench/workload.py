"""Synthetic request sets for the benchmarks (no dataset can be downloaded where sgjit is tested), all
reproducible from a seed:

- `fixed`: every prompt `input_len` tokens, every answer `output_len`.
- `random`: lengths uniform in [range_ratio x len, len].
- `sharegpt`: ShareGPT-like lengths from a log-normal fit (see `SHAREGPT`); `input_len` and
  `output_len` are not used, `scale` shrinks the lengths for quick runs.
- `shared-prefix`: `num_prefixes` long system prompts of `prefix_len` tokens, each request one of
  them (drawn at random) followed by its own `input_len` tokens, so most prompt tokens can come from
  the prefix cache.

Prompt tokens are drawn uniformly from the vocabulary above its first 1000 ids (most vocabularies
keep their special tokens there)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class SyntheticRequest:
    input_ids: list[int]
    output_len: int


@dataclass(frozen=True, slots=True)
class LengthFit:
    """Log-normal prompt and answer lengths with given means and coefficient of variation, pairs
    outside [min_len, max_input] / a total above max_total redrawn."""

    input_mean: float
    output_mean: float
    cv: float  # standard deviation / mean, of both
    min_len: int
    max_input: int
    max_total: int

    def draw(self, n: int, rng: np.random.Generator, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        sigma = math.sqrt(math.log(1 + self.cv**2))  # a log-normal's sigma for this cv
        lo = max(1, round(self.min_len * scale))
        ins: list[int] = []
        outs: list[int] = []
        while len(ins) < n:
            m = 2 * (n - len(ins))
            i = rng.lognormal(math.log(self.input_mean * scale) - sigma**2 / 2, sigma, m).round()
            o = rng.lognormal(math.log(self.output_mean * scale) - sigma**2 / 2, sigma, m).round()
            keep = (i >= lo) & (o >= lo) & (i <= self.max_input * scale) & (i + o <= self.max_total * scale)
            ins += i[keep].astype(int).tolist()
            outs += o[keep].astype(int).tolist()
        return np.array(ins[:n]), np.array(outs[:n])


# ShareGPT, as serving benchmarks use it. Means: 161.31 prompt and 337.99 answer tokens, the averages
# the vLLM paper gives for its ShareGPT workload (Kwon et al., "Efficient Memory Management for Large
# Language Model Serving with PagedAttention", SOSP 2023, section 6.1 and figure 11). Spread: no
# standard deviation of ShareGPT's lengths is published there; cv = 1.0 is an assumption, the
# spread the ShareChat paper reports for Alpaca's answers (64.51 +- 64.85 tokens; Yan et al. 2025,
# table 1). Bounds: the pruning of vLLM's and SGLang's benchmark scripts (prompt and answer at least
# 4 tokens, prompt at most 1024, both at most 2048). Redrawing the pruned pairs lowers the means a
# little (to about 156 / 323 tokens); the serving benchmark reports the means it drew.
SHAREGPT = LengthFit(input_mean=161.31, output_mean=337.99, cv=1.0, min_len=4, max_input=1024, max_total=2048)


def lengths(kind: str, n: int, input_len: int, output_len: int, range_ratio: float, rng: np.random.Generator,
            scale: float = 1.0):  # fmt: skip
    if kind in ("fixed", "shared-prefix"):
        return np.full(n, input_len), np.full(n, output_len)
    if kind == "random":
        lo_in, lo_out = max(1, int(input_len * range_ratio)), max(1, int(output_len * range_ratio))
        return rng.integers(lo_in, input_len + 1, n), rng.integers(lo_out, output_len + 1, n)
    if kind == "sharegpt":
        return SHAREGPT.draw(n, rng, scale)
    raise ValueError(f"unknown workload {kind!r} (fixed, random, sharegpt, shared-prefix)")


def synthetic_requests(
    kind: str,
    n: int,
    input_len: int,
    output_len: int,
    vocab_size: int,
    seed: int = 0,
    range_ratio: float = 0.5,
    *,
    scale: float = 1.0,
    prefix_len: int = 0,
    num_prefixes: int = 1,
) -> list[SyntheticRequest]:
    rng = np.random.default_rng(seed)
    ins, outs = lengths(kind, n, input_len, output_len, range_ratio, rng, scale)
    low = min(1000, vocab_size // 2)  # skip the special tokens at the start of most vocabularies
    if kind != "shared-prefix":
        return [
            SyntheticRequest(rng.integers(low, vocab_size, int(i)).tolist(), int(o))
            for i, o in zip(ins, outs)
        ]
    prefixes = [rng.integers(low, vocab_size, prefix_len).tolist() for _ in range(num_prefixes)]
    which = rng.integers(num_prefixes, size=n)
    return [
        SyntheticRequest(prefixes[w] + rng.integers(low, vocab_size, int(i)).tolist(), int(o))
        for w, i, o in zip(which, ins, outs)
    ]

"""Random GGUF quantization blocks of every format sgjit keeps packed, for the kernel tests."""

from __future__ import annotations

import numpy as np

from sgjit.kernels.quant import BLOCKS, QuantWeight, from_gguf

HEADER_SCALES = {"Q4_0": 1, "Q8_0": 1, "Q4_1": 2, "Q4_K": 2}  # fp16 values at the start of a block


def random_blocks(qtype: str, out: int, k: int, seed: int = 0) -> QuantWeight:
    """Random block bytes with small finite fp16 scales (random bytes could be inf or NaN there)."""
    rng = np.random.default_rng(seed)
    per, nbytes = BLOCKS[qtype]
    raw = rng.integers(0, 256, (out, k // per, nbytes), dtype=np.uint8)
    n = HEADER_SCALES[qtype]
    scales = (rng.standard_normal((out, k // per, n)) * 0.01).astype(np.float16)
    raw[..., : 2 * n] = scales.view(np.uint8).reshape(out, k // per, 2 * n)
    return from_gguf(qtype, raw.reshape(out, -1), (out, k))

"""Packed GGUF weights (sgjit/kernels/quant.py): every format's 4-bit parts rebuild the weight the
gguf package dequantizes, exactly; the int4 GEMM on them is within bf16 rounding of the dense
product; the loader's packed weights (Q/K rows unpermuted) dequantize to what it loads dense."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sgjit.errors import InvalidRequestError
from sgjit.kernels.quant import (
    BLOCKS,
    QuantWeight,
    four_bit,
    from_gguf,
    int4_available,
    linear_int4,
    pack_int4,
)

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


@pytest.mark.parametrize("qtype", sorted(BLOCKS))
def test_four_bit_parts_rebuild_the_weight(qtype):
    w = random_blocks(qtype, 48, 512)
    parts = four_bit(w)
    assert len(parts) == (2 if qtype == "Q8_0" else 1)
    rebuilt = sum((q.astype(np.float64) - 8) * np.repeat(s, 32, 1) + np.repeat(z, 32, 1) for q, s, z in parts)
    assert all(q.max() <= 15 for q, _, _ in parts)
    np.testing.assert_allclose(rebuilt, w.dequantize().double().numpy(), rtol=0, atol=1e-6)


@pytest.mark.skipif(not int4_available(), reason="torch lacks its CPU int4 GEMM")
@pytest.mark.parametrize("qtype", sorted(BLOCKS))
def test_int4_gemm_matches_the_dequantized_product(qtype):
    w = random_blocks(qtype, 192, 768, seed=1)
    x = torch.randn(5, 768)
    y = linear_int4(x, pack_int4(w), torch.ones(192))
    ref = x.double() @ w.dequantize().double().T + 1
    assert y.shape == (5, 192) and y.dtype == torch.float32
    assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < 1e-2  # bf16: ~2^-8 at worst


def test_rows_and_cat_keep_whole_blocks():
    a, b = random_blocks("Q4_1", 32, 64, seed=2), random_blocks("Q4_1", 16, 64, seed=3)
    both = QuantWeight.cat([a, b])
    assert torch.equal(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    order = np.arange(32)[::-1].copy()
    assert torch.equal(a.rows(order).dequantize(), a.dequantize()[torch.from_numpy(order)])
    with pytest.raises(ValueError):
        QuantWeight.cat([a, random_blocks("Q8_0", 16, 64)])


def test_loader_keeps_gemm_weights_packed_and_exact():
    from sgjit.runtime.loader import load_checkpoint

    packed, dense = load_checkpoint(None, keep_quantized=True), load_checkpoint(None)
    kinds = {type(w).__name__ for w in packed.weights.values()}
    assert kinds == {"QuantWeight", "Tensor"}
    for name, w in packed.weights.items():
        if isinstance(w, QuantWeight):
            assert name.endswith(("_proj.weight", "embed_tokens.weight"))
            assert torch.equal(w.dequantize(), dense.weights[name]), name  # q/k rows unpermuted alike
        else:
            assert w.dim() == 1  # norms stay dense


def test_packed_weights_need_the_cpu_in_float32():
    import sgjit

    with pytest.raises(InvalidRequestError, match="quantization 'gguf'"):
        sgjit.Runtime(device="cpu", dtype="bfloat16", quantization="gguf")
    with pytest.raises(InvalidRequestError, match="quantization"):
        sgjit.Runtime(device="cpu", quantization="int3")

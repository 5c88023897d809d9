"""Packed GGUF weights (sgjit/kernels/quant.py): every format's integers and float32 scales rebuild
the weight the gguf package dequantizes; the loader's packed weights (Q/K rows unpermuted)
dequantize to what it loads dense."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sgjit.kernels.quant import BLOCKS, GROUP, QuantWeight, decompose

from gguf_blocks import random_blocks


@pytest.mark.parametrize("qtype", sorted(BLOCKS))
def test_integers_and_scales_rebuild_the_weight(qtype):
    w = random_blocks(qtype, 48, 512)
    q, scale, low = decompose(w)
    assert q.shape == (48, 512) and scale.shape == (48, 512 // GROUP) and scale.dtype == np.float32
    if qtype == "Q8_0":
        assert q.dtype == np.int8 and low is None
        low = np.zeros_like(scale)
    else:
        assert q.dtype == np.uint8 and q.max() <= 15 and low.dtype == np.float32
    rebuilt = q.astype(np.float64) * np.repeat(scale, GROUP, 1) + np.repeat(low, GROUP, 1)
    np.testing.assert_allclose(rebuilt, w.dequantize().double().numpy(), rtol=1e-6, atol=1e-9)


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

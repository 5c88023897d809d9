"""FP8 weights on the CPU: per-channel quantization within e4m3's rounding, the checkpoint formats
(per-tensor, per-channel, DeepSeek block scales), the reference product the GPU kernels are checked
against, and the model's layers holding FP8 while embeddings and the LM head stay dense."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sgjit.kernels.fp8 import FP8, FP8_MAX, Fp8Weight, linear_reference, quantize_rows
from sgjit.kernels.reference import REFERENCE_OPS
from sgjit.runtime.model.llama import LlamaModel
from sgjit.runtime.model.presets import random_weights, shape_config

HALF_ULP = 2.0**-4  # e4m3 keeps 3 mantissa bits: round to nearest is within 2^-4 of the value
SUBNORMAL_STEP = 2.0**-9  # spacing below e4m3's smallest normal (2^-6)


def _weight(n: int = 48, k: int = 80, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.logspace(-3, 1, n)[:, None]  # rows of very different scale
    w[3] = 0.0
    return w


def test_per_channel_quantization_is_within_e4m3_rounding():
    w = _weight()
    q = Fp8Weight.quantize(w)
    assert q.data.dtype == FP8 and q.scale.dtype == torch.float32 and q.scale.shape == (w.shape[0],)
    live = w.abs().amax(1) > 0
    assert torch.equal(q.data.float().abs().amax(1)[live], torch.full((int(live.sum()),), FP8_MAX))
    err = (q.dequantize() - w).abs()
    bound = w.abs() * HALF_ULP + q.scale[:, None] * SUBNORMAL_STEP / 2 + 1e-12
    assert bool((err <= bound).all()), f"worst excess {(err - bound).max().item():.3e}"
    assert torch.isfinite(q.scale).all() and bool((q.dequantize()[3] == 0).all())  # a zero row stays zero


def test_checkpoint_scales_per_tensor_and_per_channel():
    w = _weight(16, 32)
    q = Fp8Weight.quantize(w)
    per_channel = Fp8Weight.from_scaled(q.data, q.scale[:, None])  # [N, 1], as compressed-tensors stores
    assert torch.equal(per_channel.dequantize(), q.dequantize())
    per_tensor = Fp8Weight.from_scaled(q.data, torch.tensor(0.5))
    assert torch.equal(per_tensor.dequantize(), q.data.float() * 0.5)
    with pytest.raises(ValueError, match="rows"):
        Fp8Weight.from_scaled(q.data, torch.ones(3))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        Fp8Weight.from_scaled(w, q.scale)


def test_block_scaled_weights_requantized_per_channel():
    """DeepSeek's layout: one scale per 32x32 block here (128x128 in its checkpoints), ragged at the
    edges. Rows whose blocks share one scale come through exactly; the others lose at most one more
    e4m3 rounding."""
    n, k, bn, bk = 70, 100, 32, 32
    g = torch.Generator().manual_seed(1)
    scale_inv = torch.rand(-(-n // bn), -(-k // bk), generator=g) + 0.1
    data = (torch.randn(n, k, generator=g) * 100).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    exact = data.float() * scale_inv.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    q = Fp8Weight.from_block_scaled(data, scale_inv, (bn, bk))
    err = (q.dequantize() - exact).abs()
    assert bool((err <= exact.abs() * HALF_ULP + q.scale[:, None] * SUBNORMAL_STEP + 1e-9).all())
    uniform = Fp8Weight.from_block_scaled(data, torch.full_like(scale_inv, 0.25), (bn, bk))
    assert torch.allclose(uniform.dequantize(), data.float() * 0.25, rtol=0, atol=0)


def test_reference_product_and_concatenation():
    w1, w2 = _weight(24, 64, 2), _weight(40, 64, 3)
    q = Fp8Weight.cat([Fp8Weight.quantize(w1), Fp8Weight.quantize(w2)])
    assert q.shape == (64, 64)
    g = torch.Generator().manual_seed(4)
    x, b = torch.randn(5, 64, generator=g), torch.randn(64, generator=g)
    # the two sum float32 products in different orders: each element within a few ulps of the sum of
    # its terms' magnitudes (rows of the weight span 1e-3..10, so a near-zero output of large terms
    # differs by more than any fixed tolerance)
    w = q.dequantize()
    bound = 1e-5 * (x.abs() @ w.abs().T + b.abs()) + 1e-7
    assert bool(((linear_reference(x, q, b) - F.linear(x, w, b)).abs() <= bound).all())
    torch.testing.assert_close(REFERENCE_OPS.linear(x, q, b), linear_reference(x, q, b))  # CPU: the same math
    xb = x.bfloat16()
    assert linear_reference(xb, q, None).dtype == torch.bfloat16


def test_per_token_activation_scales():
    x = torch.randn(6, 128) * torch.logspace(-2, 2, 6)[:, None]
    x[2] = 0
    data, scale = quantize_rows(x)
    assert data.dtype == FP8 and scale.shape == (6, 1)
    back = data.float() * scale
    assert bool(((back - x).abs() <= x.abs() * HALF_ULP + scale * SUBNORMAL_STEP + 1e-12).all())


def test_model_layers_hold_fp8_and_stay_close_to_dense():
    """A real shape's width (SmolLM2, 2 layers, random weights): FP8 layer weights, dense embedding and
    head, logits within FP8's weight error of the dense model."""
    cfg = shape_config("smollm2-135m", 2)
    weights = random_weights(cfg, seed=3, device="cpu", dtype=torch.float32)
    dense = LlamaModel(
        cfg, dict(weights), REFERENCE_OPS, torch.device("cpu"), torch.float32, max_positions=64
    )
    fp8 = LlamaModel(
        cfg,
        dict(weights),
        REFERENCE_OPS,
        torch.device("cpu"),
        torch.float32,
        max_positions=64,
        fp8_weights=True,
    )
    layer = fp8.layers[0]
    for w in (layer.qkv, layer.o_proj, layer.mlp.gate_up, layer.mlp.down):
        assert isinstance(w, Fp8Weight)
    assert isinstance(fp8.lm_head, torch.Tensor) and fp8.embed.dtype == torch.float32
    assert fp8.layers[0].qkv.shape == dense.layers[0].qkv.shape
    torch.testing.assert_close(
        fp8.layers[1].mlp.gate_up.dequantize(), dense.layers[1].mlp.gate_up, rtol=0.07, atol=1e-3
    )

"""The decode step as the fused ops (`OpTable.fused_rows`), on the torch reference ops, is the unfused
model bit for bit: each reference fused op is the composition of the unfused ops it replaces, and the
model's fused layer feeds them the same values (the residual added in the projections' epilogue is
the sum add_rmsnorm forms). Small real-width models in bf16 on the CPU, with random norm weights, a
q|k|v bias, Qwen3's per-head q/k norms and a partial rotary dimension."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from model_steps import Side, random_model_weights

from sgjit.kernels.reference import REFERENCE_OPS
from sgjit.runtime.model.config import RopeConfig
from sgjit.runtime.model.llama import LlamaModel
from sgjit.runtime.model.presets import shape_config

BASE = shape_config("smollm2-135m", 2)
CONFIGS = {
    "llama": BASE,
    "qkv_bias": replace(BASE, qkv_bias=True),
    "qk_norm": replace(BASE, qk_norm=True),
    "partial_rotary": replace(BASE, rope=RopeConfig(theta=10000.0, dim=32)),
}


def _weights(cfg) -> dict[str, torch.Tensor]:
    return random_model_weights(cfg, torch.device("cpu"), seed=5, norm_seed=6, norm_spread=0.3)


def _model(cfg, dtype: torch.dtype = torch.bfloat16) -> LlamaModel:
    weights = {k: v.to(dtype) for k, v in _weights(cfg).items()}
    return LlamaModel(cfg, weights, REFERENCE_OPS, torch.device("cpu"), dtype, max_positions=256)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fused_decode_is_the_unfused_model(name):
    model = _model(CONFIGS[name])
    unfused = Side(model, REFERENCE_OPS, rows=3, max_tokens=64)
    fused = Side(model, REFERENCE_OPS.with_overrides(fused_rows=4), rows=3, max_tokens=64)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in (5, 19, 2)]
    starts = [0, 0, 0]
    for side in (unfused, fused):  # a 26-token prefill: unfused on both sides
        side.step(seqs, starts)
    for _ in range(4):  # decode steps of 3 tokens: fused on one side
        starts = [len(s) for s in seqs]
        for s in seqs:
            s.append(int(torch.randint(0, model.config.vocab_size, (1,), generator=g)))
        a, b = unfused.step(seqs, starts), fused.step(seqs, starts)
        assert torch.equal(a, b)
    assert torch.equal(unfused.pool.k, fused.pool.k) and torch.equal(unfused.pool.v, fused.pool.v)


def test_teacher_forced_agreement_of_the_fused_and_unfused_reference():
    """The GPU tests' comparison helper (model_steps.teacher_forced) on the CPU: the fused reference
    decode is the unfused one bit for bit, so no greedy token differs and both carry the same bf16
    error against a float32 oracle of the same weights, which is above zero (the oracle is not a copy)."""
    from model_steps import teacher_forced

    model, oracle_model = _model(CONFIGS["llama"]), _model(CONFIGS["llama"], torch.float32)
    rows = 2
    fused = Side(model, REFERENCE_OPS.with_overrides(fused_rows=4), rows, max_tokens=48)
    unfused = Side(model, REFERENCE_OPS, rows, max_tokens=48)
    oracle = Side(oracle_model, REFERENCE_OPS, rows, max_tokens=48)
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in (7, 12)]
    for side in (fused, unfused, oracle):
        side.step(seqs, [0] * rows)
    got = teacher_forced(fused, unfused, oracle, seqs, steps=6)
    assert got.differ == 0 and got.margins == [] and got.err_candidate == got.err_baseline
    assert min(got.err_baseline) > 0
    got.assert_within_noise()

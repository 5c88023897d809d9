"""The `random:` MoE presets, scaled down to CPU size: the tensors `random_weights` draws are the
ones the model loads (no name left over or missing), `num_params` counts them exactly and
`active_params` leaves out the experts a token skips, and the decode roofline reads k of E experts
at one row and all of them at a large batch."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from sgjit.bench.peers import weight_bytes_read
from sgjit.kernels.reference import REFERENCE_OPS
from sgjit.runtime.model.llama import LlamaModel
from sgjit.runtime.model.mlp import DenseMLP
from sgjit.runtime.model.moe import SparseMoE
from sgjit.runtime.model.presets import random_weights, shape_config


def small(name: str):
    cfg = shape_config(name, num_layers=3)
    moe = replace(
        cfg.moe, intermediate_size=16, shared_intermediate_size=min(cfg.moe.shared_intermediate_size, 24)
    )
    moe = replace(
        moe, num_experts=min(moe.num_experts, 12), dense_layers=(1,) if name == "qwen3-30b-a3b" else ()
    )
    return replace(
        cfg, vocab_size=256, hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2, head_dim=8,
        rope=replace(cfg.rope, dim=8), moe=moe,
    )  # fmt: skip


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "mixtral-8x7b", "qwen1.5-moe-a2.7b"])
def test_preset_weights_load_and_are_counted(name):
    cfg = small(name)
    weights = random_weights(cfg)
    assert cfg.num_params() == sum(t.numel() for t in weights.values())
    model = LlamaModel(cfg, weights, REFERENCE_OPS, torch.device("cpu"), torch.float32)  # every name used
    kinds = [type(layer.mlp) for layer in model.layers]
    assert kinds == [SparseMoE if cfg.moe.is_sparse(i) else DenseMLP for i in range(3)]
    moe = cfg.moe
    expert_bytes = sum(4 * 3 * cfg.hidden_size * moe.intermediate_size for i in range(3) if moe.is_sparse(i))
    skipped = (moe.num_experts - moe.top_k) * expert_bytes
    assert cfg.num_params() - cfg.active_params() == skipped // 4
    all_read = weight_bytes_read(model, rows=10_000)
    assert weight_bytes_read(model, rows=1) == pytest.approx(all_read - skipped, abs=8)
    embed = 4 * cfg.vocab_size * cfg.hidden_size  # a row gather, not read whole
    assert all_read == pytest.approx(4 * cfg.num_params() - embed, abs=8)


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "mixtral-8x7b", "qwen1.5-moe-a2.7b"])
def test_benchmark_peer_builds_the_same_moe(name):
    """The transformers model benchmarks run beside a `random:` MoE shape has the same weights."""
    from transformers import AutoModelForCausalLM

    from sgjit.bench.peers import hf_config

    cfg = small(name)
    hf = AutoModelForCausalLM.from_config(hf_config(cfg))
    assert sum(p.numel() for p in hf.parameters()) == cfg.num_params()
    assert (
        type(hf).__name__
        == {"qwen3_moe": "Qwen3Moe", "mixtral": "Mixtral", "qwen2_moe": "Qwen2Moe"}[cfg.architecture]
        + "ForCausalLM"
    )

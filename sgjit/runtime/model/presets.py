"""Real model shapes with random weights, for benchmarks and GPU tests: speed does not depend on the
weight values, and no weights can be downloaded where sgjit is tested. Named `random:<shape>` as a
model (e.g. `Runtime("random:llama3-8b")`); the tokenizer is the bundled SmolLM2 one (its ids are
valid in every vocabulary here)."""

from __future__ import annotations

from dataclasses import replace

import torch

from sgjit.errors import ModelNotFoundError
from sgjit.runtime.model.config import ModelConfig, MoeConfig, RopeConfig
from sgjit.runtime.model.moe import sparse_layer_shapes

MODEL_SHAPES: dict[str, ModelConfig] = {
    "llama3-8b": ModelConfig(
        architecture="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
        rope=RopeConfig(theta=500000.0, dim=128, scaling_type="llama3", factor=8.0, low_freq_factor=1.0,
                        high_freq_factor=4.0, original_max_position=8192),
        max_position_embeddings=131072, tie_word_embeddings=False, name="random:llama3-8b",
    ),
    "qwen2.5-7b": ModelConfig(
        architecture="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
        num_heads=28, num_kv_heads=4, head_dim=128, rms_norm_eps=1e-6, rope=RopeConfig(theta=1000000.0, dim=128),
        max_position_embeddings=32768, tie_word_embeddings=False, qkv_bias=True, name="random:qwen2.5-7b",
    ),
    "qwen3-8b": ModelConfig(
        architecture="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36,
        num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6, rope=RopeConfig(theta=1000000.0, dim=128),
        max_position_embeddings=40960, tie_word_embeddings=False, qk_norm=True, name="random:qwen3-8b",
    ),
    "mistral-7b": ModelConfig(
        architecture="mistral", vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope=RopeConfig(theta=1000000.0, dim=128),
        max_position_embeddings=32768, tie_word_embeddings=False, name="random:mistral-7b",
    ),
    # MoE: 30.5B weights (61 GB bf16), 3.3B active a token
    "qwen3-30b-a3b": ModelConfig(
        architecture="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=48,
        num_heads=32, num_kv_heads=4, head_dim=128, rms_norm_eps=1e-6, rope=RopeConfig(theta=1000000.0, dim=128),
        max_position_embeddings=40960, tie_word_embeddings=False, qk_norm=True, name="random:qwen3-30b-a3b",
        moe=MoeConfig(num_experts=128, top_k=8, intermediate_size=768, norm_topk_prob=True),
    ),
    # 46.7B weights (93 GB bf16), 12.9B active
    "mixtral-8x7b": ModelConfig(
        architecture="mixtral", vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope=RopeConfig(theta=1000000.0, dim=128),
        max_position_embeddings=32768, tie_word_embeddings=False, name="random:mixtral-8x7b",
        moe=MoeConfig(num_experts=8, top_k=2, intermediate_size=14336, norm_topk_prob=True),
    ),
    # Qwen1.5-MoE-A2.7B: 14.3B weights (29 GB bf16), 2.7B active; a shared expert beside 60 routed
    "qwen1.5-moe-a2.7b": ModelConfig(
        architecture="qwen2_moe", vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_layers=24,
        num_heads=16, num_kv_heads=16, head_dim=128, rms_norm_eps=1e-6, rope=RopeConfig(theta=1000000.0, dim=128),
        max_position_embeddings=8192, tie_word_embeddings=False, qkv_bias=True, name="random:qwen1.5-moe-a2.7b",
        moe=MoeConfig(num_experts=60, top_k=4, intermediate_size=1408, norm_topk_prob=False,
                      shared_intermediate_size=5632),
    ),
    "smollm2-135m": ModelConfig(
        architecture="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
        num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, rope=RopeConfig(theta=100000.0, dim=64),
        max_position_embeddings=8192, tie_word_embeddings=True, name="random:smollm2-135m",
    ),
}  # fmt: skip

RANDOM_PREFIX = "random:"


def shape_config(name: str, num_layers: int | None = None) -> ModelConfig:
    """The config of shape `name` (without the `random:` prefix), optionally with fewer layers."""
    key = name.removeprefix(RANDOM_PREFIX)
    if key not in MODEL_SHAPES:
        raise ModelNotFoundError(f"unknown model shape {key!r}; known: {sorted(MODEL_SHAPES)}")
    cfg = MODEL_SHAPES[key]
    return replace(cfg, num_layers=num_layers) if num_layers else cfg


def random_weights(
    config: ModelConfig,
    seed: int = 0,
    std: float = 0.02,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Hugging Face-named tensors of `config`'s shape, normal(0, std), norms at 1, made on `device`
    in `dtype` (an 8B shape in bf16 is drawn on the GPU in a second, not on the host in minutes)."""
    g = torch.Generator(device=device).manual_seed(seed)
    h, i, q, kv = config.hidden_size, config.intermediate_size, config.q_size, config.kv_size

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * std).to(dtype)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, device=device, dtype=dtype)

    w = {"model.embed_tokens.weight": rnd(config.vocab_size, h), "model.norm.weight": ones(h)}
    if not config.tie_word_embeddings:
        w["lm_head.weight"] = rnd(config.vocab_size, h)
    for n in range(config.num_layers):
        p = f"model.layers.{n}."
        w |= {
            p + "input_layernorm.weight": ones(h),
            p + "post_attention_layernorm.weight": ones(h),
            p + "self_attn.q_proj.weight": rnd(q, h),
            p + "self_attn.k_proj.weight": rnd(kv, h),
            p + "self_attn.v_proj.weight": rnd(kv, h),
            p + "self_attn.o_proj.weight": rnd(h, q),
        }
        if config.moe is not None and config.moe.is_sparse(n):
            w |= {name: rnd(*shape) for name, shape in sparse_layer_shapes(config, n).items()}
        else:
            w |= {
                p + "mlp.gate_proj.weight": rnd(i, h),
                p + "mlp.up_proj.weight": rnd(i, h),
                p + "mlp.down_proj.weight": rnd(h, i),
            }
        if config.qkv_bias:
            w |= {p + f"self_attn.{x}_proj.bias": rnd(s) for x, s in (("q", q), ("k", kv), ("v", kv))}
        if config.qk_norm:
            w |= {
                p + "self_attn.q_norm.weight": ones(config.head_dim),
                p + "self_attn.k_norm.weight": ones(config.head_dim),
            }
    return w

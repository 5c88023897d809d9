"""A tiny random DeepSeek-V4 (V4-Flash's shape family, scaled down) saved by transformers as a
Hugging Face directory, for tests: every attention type (sliding, CSA with its indexer picking 3 of
the finished entries, HCA), hash-routed and top-k MoE layers, 4 hyper-connection streams, YaRN on
the compressed layers' RoPE, a SwiGLU clip that binds. Parameters transformers initialises to
constants (sinks, biases, the hash table, hyper-connection bases and scales) get random values too,
so nothing is tested at a trivial point. The indexer has 16 heads so that two entries rarely tie at
a score of exactly 0 (every head's ReLU at 0) on the top-k boundary: where they do, the choice is
torch.topk's tie order, which differs between transformers' own chunked and whole-prompt runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

TINY_V4: dict[str, Any] = dict(
    hidden_size=64, moe_intermediate_size=32, num_hidden_layers=5, num_attention_heads=4,
    num_key_value_heads=1, head_dim=32, q_lora_rank=32, partial_rotary_factor=0.25,
    layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                 "compressed_sparse_attention", "heavily_compressed_attention"],
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"],
    n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, hc_mult=4, hc_sinkhorn_iters=20,
    sliding_window=8, o_groups=2, o_lora_rank=16, index_n_heads=16, index_head_dim=16, index_topk=3,
    rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                     "beta_fast": 32, "beta_slow": 1},
    swiglu_limit=1.0, max_position_embeddings=256, initializer_range=0.2, bos_token_id=1, eos_token_id=2,
)  # fmt: skip


def save_tiny_v4(path: Path, vocab_size: int, tokenizer_backend=None, seed: int = 0, **overrides: Any):
    """The transformers model (eval mode, float32) whose directory is now at `path`, with the given
    tokenizer's files beside it when one is given."""
    import transformers

    cfg = transformers.DeepseekV4Config(vocab_size=vocab_size, **(TINY_V4 | overrides))
    torch.manual_seed(seed)
    model = transformers.DeepseekV4ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith("tid2eid"):
                t.copy_(torch.randint(0, cfg.n_routed_experts, t.shape, generator=g))
            elif t.dtype.is_floating_point and "inv_freq" not in name and (t.numel() == 1 or t.std() == 0):
                t.add_(torch.randn(t.shape, generator=g) * 0.3)
    model.save_pretrained(path)
    if tokenizer_backend is not None:
        tokenizer_backend.save(str(path / "tokenizer.json"))
        (path / "tokenizer_config.json").write_text(
            json.dumps({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False})
        )
    return model

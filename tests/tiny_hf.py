"""Write tiny random-weight Hugging Face model directories for tests: a transformers config class
with two small layers, saved by `save_pretrained` beside the bundled SmolLM2 tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


def save_tiny_hf(path: Path, config_class: str, tokenizer_backend, seed: int = 0, **extra: Any):
    """The transformers model (eval mode, float32) whose directory is now at `path`."""
    import transformers

    sizes: dict[str, Any] = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.3,
        bos_token_id=1,
        eos_token_id=2,
    )
    cfg = getattr(transformers, config_class)(
        vocab_size=tokenizer_backend.get_vocab_size(), **(sizes | extra)
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model.save_pretrained(path)
    tokenizer_backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False})
    )
    return model


# Tiny MoE models of each family, each with a feature of its family's config switched on: Qwen3-MoE
# renormalising the top-k and keeping a dense layer (`mlp_only_layers`), Qwen2-MoE's shared expert
# with every second layer sparse (`decoder_sparse_step`), Mixtral's always-renormalised top-2.
MOE_ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(
            num_hidden_layers=3, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            norm_topk_prob=True, mlp_only_layers=[1], head_dim=24,
        ),
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        dict(
            num_hidden_layers=4, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, decoder_sparse_step=2, tie_word_embeddings=True,
        ),
    ),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None)),
}  # fmt: skip

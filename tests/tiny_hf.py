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

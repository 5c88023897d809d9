"""Write tiny Llama GGUF files for tests: a byte-level vocabulary of 256 byte tokens plus ChatML
control tokens, and weights from a tiny transformers model, permuted as llama.cpp stores them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from sgjit.runtime.tokenizer.byte_level import byte_alphabet

CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_tokens() -> list[str]:
    """GPT-2's byte -> character map in byte order: the 256 tokens of a merge-free vocabulary."""
    return byte_alphabet()


def tiny_hf_llama(vocab: int, seed: int = 0):
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.3,
        tie_word_embeddings=False,
        bos_token_id=CONTROL_ID["<|im_start|>"],
        eos_token_id=CONTROL_ID["<|im_end|>"],
    )
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


CONTROL_ID = {t: 256 + i for i, t in enumerate(CONTROL)}


def _permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(
    path: Path, model=None, arch: str = "llama", qtype: str = "F32", raw_override: dict | None = None
) -> Path:
    """`qtype` applies to the 2-D weights; `raw_override` maps a GGUF tensor name to a GGML type
    name whose bytes are written raw (zeros), for tests of unsupported types."""
    import gguf

    tokens = byte_tokens() + CONTROL
    model = model or tiny_hf_llama(len(tokens))
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3] * len(CONTROL))
    w.add_token_merges([])
    w.add_bos_token_id(CONTROL_ID["<|im_start|>"])
    w.add_eos_token_id(CONTROL_ID["<|im_end|>"])
    w.add_add_bos_token(False)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    for i in range(cfg.num_hidden_layers):
        for k, v in layer.items():
            names[f"model.layers.{i}.{k}"] = f"blk.{i}.{v}"
    raw_override = raw_override or {}
    for hf_name, arr in sd.items():
        name = names[hf_name]
        if name.endswith("attn_q.weight"):
            arr = _permute(arr, cfg.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            arr = _permute(arr, cfg.num_key_value_heads)
        if name in raw_override:
            t = gguf.GGMLQuantizationType[raw_override[name]]
            block, nbytes = gguf.GGML_QUANT_SIZES[t]
            raw = np.zeros((arr.shape[0], arr.shape[1] // block * nbytes), dtype=np.uint8)
            w.add_tensor(name, raw, raw_dtype=t)
        elif arr.ndim == 2 and qtype != "F32":
            t = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(name, gguf.quants.quantize(arr, t), raw_dtype=t)
        else:
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

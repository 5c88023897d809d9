"""Tiny random-weight Llama-3, Qwen2, Qwen3 and Mistral models saved by transformers as Hugging Face
directories load through our loader and match transformers' log-probs and greedy tokens."""

from __future__ import annotations

import json

import pytest
import torch

import sgjit

ARCHS = {
    "llama3": (
        "LlamaConfig",
        dict(
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            tie_word_embeddings=False,
        ),
    ),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(head_dim=24, tie_word_embeddings=False)),
    "mistral": ("MistralConfig", dict(sliding_window=None)),
}


def make_model_dir(tmp_path, arch: str, tokenizer_backend) -> tuple:
    import transformers

    cls_name, extra = ARCHS[arch]
    cfg = getattr(transformers, cls_name)(
        vocab_size=tokenizer_backend.get_vocab_size(),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.3,
        bos_token_id=1,
        eos_token_id=2,
        **extra,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    path = tmp_path / arch
    model.save_pretrained(path)
    tokenizer_backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False})
    )
    return path, model


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_hf_directory_matches_transformers(tmp_path, runtime, arch):
    path, hf = make_model_dir(tmp_path, arch, runtime.tokenizer.backend)
    rt = sgjit.Runtime(str(path), device="cpu", max_total_tokens=1024)
    try:
        assert rt.model_config.architecture == {"llama3": "llama"}.get(arch, arch)
        ids = rt.tokenizer.encode("The quick brown fox jumps over the lazy dog, 12345 times!")
        out = rt.generate(
            input_ids=ids,
            sampling_params={"temperature": 0, "max_new_tokens": 12, "ignore_eos": True},
            return_logprob=True,
            logprob_start_len=0,
        )
        ours = torch.tensor([e[0] for e in out["meta_info"]["input_token_logprobs"][1:]])
        with torch.no_grad():
            lp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
            ref = lp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
            greedy = hf.generate(
                torch.tensor([ids]),
                max_new_tokens=12,
                do_sample=False,
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            )
        assert (ours - ref).abs().max().item() < 1e-3
        assert out["output_ids"] == greedy[0, len(ids) :].tolist()
    finally:
        rt.shutdown()

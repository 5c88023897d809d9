"""Tiny random-weight Llama-3, Qwen2, Qwen3 and Mistral models saved by transformers as Hugging Face
directories load through our loader and match transformers' log-probs and greedy tokens."""

from __future__ import annotations

import pytest
import torch
from tiny_hf import save_tiny_hf

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


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_hf_directory_matches_transformers(tmp_path, runtime, arch):
    cls_name, extra = ARCHS[arch]
    path = tmp_path / arch
    hf = save_tiny_hf(path, cls_name, runtime.tokenizer.backend, **extra)
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

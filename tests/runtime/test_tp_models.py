"""Tensor parallelism on tiny random models (two CPU processes against one): a vocabulary that does
not divide by the ranks (padded rows), one KV head for four query heads (replicated on both
ranks), Qwen2's q/k/v biases and Qwen3's per-head q/k norms; and a tp the heads cannot take, or an
MoE model (its experts are not split yet), is refused, leaving no process behind."""

from __future__ import annotations

import pytest
import torch
from tiny_hf import MOE_ARCHS, save_tiny_hf

import sgjit
from sgjit.errors import UnsupportedModelError

from conftest import assert_no_leaked_pages, tp_rank_pids
from tiny_gguf import tiny_hf_llama, write_tiny_gguf

TEXT = "The quick brown fox jumps over the lazy dog, 12345 times!"
GREEDY = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}


def tiny_mqa(vocab: int):
    hf = tiny_hf_llama(vocab)
    cfg = hf.config
    cfg.num_key_value_heads = 1
    import transformers

    torch.manual_seed(1)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def same_as_one_process(path: str, text: str = TEXT) -> None:
    kw = dict(device="cpu", max_total_tokens=512)
    one = sgjit.Runtime(path, **kw)
    try:
        ids = one.tokenizer.encode(text)
        ref = one.generate(
            input_ids=[ids, ids[:7]], sampling_params=GREEDY, return_logprob=True, logprob_start_len=0
        )
    finally:
        one.shutdown()
    two = sgjit.Runtime(path, tp=2, **kw)
    try:
        out = two.generate(
            input_ids=[ids, ids[:7]], sampling_params=GREEDY, return_logprob=True, logprob_start_len=0
        )
        for a, b in zip(ref, out):
            assert b["output_ids"] == a["output_ids"]
            for key in ("input_token_logprobs", "output_token_logprobs"):
                la = [e[0] for e in a["meta_info"][key] if e[0] is not None]
                lb = [e[0] for e in b["meta_info"][key] if e[0] is not None]
                assert torch.allclose(torch.tensor(la), torch.tensor(lb), atol=1e-4), key
        assert_no_leaked_pages(two)
    finally:
        two.shutdown()
    assert not tp_rank_pids()


@pytest.mark.parametrize("variant", ["odd-vocab", "mqa"])
def test_tiny_llama_matches_one_process(tmp_path, variant):
    model = tiny_mqa(259) if variant == "mqa" else None  # 256 bytes + 3 control tokens: 259 rows
    same_as_one_process(str(write_tiny_gguf(tmp_path / f"{variant}.gguf", model)))


@pytest.mark.parametrize(
    "config_class,extra",
    [("Qwen2Config", dict(tie_word_embeddings=True)), ("Qwen3Config", dict(head_dim=24))],
    ids=["qwen2-bias", "qwen3-qk-norm"],
)
def test_qwen_bias_and_qk_norm_match_one_process(tmp_path, runtime, config_class, extra):
    save_tiny_hf(tmp_path / "m", config_class, runtime.tokenizer.backend, **extra)
    same_as_one_process(str(tmp_path / "m"))


def test_an_moe_model_is_refused_with_tp(tmp_path, runtime):
    config_class, extra = MOE_ARCHS["mixtral"]
    save_tiny_hf(tmp_path / "moe", config_class, runtime.tokenizer.backend, **extra)
    with pytest.raises(UnsupportedModelError, match="mixture-of-experts layers, which are not split yet"):
        sgjit.Runtime(str(tmp_path / "moe"), device="cpu", max_total_tokens=512, tp=2)
    assert not tp_rank_pids()


def test_a_tp_the_heads_cannot_take_is_refused_and_leaves_no_process(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")  # 4 query / 2 KV heads
    with pytest.raises(UnsupportedModelError, match=r"tp=3 cannot split .* use one of tp=\[1, 2, 4\]"):
        sgjit.Runtime(str(path), device="cpu", max_total_tokens=512, tp=3)
    assert not tp_rank_pids()

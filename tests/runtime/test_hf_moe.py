"""Tiny random-weight Mixtral, Qwen2-MoE and Qwen3-MoE directories saved by transformers load
through our loader and match transformers in float32: the configs read right, the prompt's
log-probs (prefill) and every decode step's top log-probs through the engine — paged KV with small
pages, a second request reusing the first one's pages from the prefix cache, two rows decoding in
one batch — and `Runtime(<dir>)`'s greedy tokens equal to `generate`'s."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_hf import MOE_ARCHS, save_tiny_hf

import sgjit
from sgjit.runtime.model.config import ModelConfig
from sgjit.runtime.model.mlp import DenseMLP
from sgjit.runtime.model.moe import SparseMoE

from conftest import assert_no_leaked_pages

TOL = 1e-4  # nats; float32 on both sides, measured ~1e-5
PROMPT = "The quick brown fox jumps over the lazy dog, 12345 times! Then it slept."
FOLLOW_UP = " And in the morning the fox woke up hungry, so"


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory, runtime):
    """arch -> (directory, transformers model)."""
    root = tmp_path_factory.mktemp("moe")
    return {
        arch: (root / arch, save_tiny_hf(root / arch, cls, runtime.tokenizer.backend, **extra))
        for arch, (cls, extra) in MOE_ARCHS.items()
    }


def hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)


@pytest.mark.parametrize("arch", sorted(MOE_ARCHS))
def test_config_reads_the_moe_fields(moe_dirs, arch):
    path, hf = moe_dirs[arch]
    mc = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
    moe = mc.moe
    assert mc.architecture == arch and moe is not None
    expected = {
        "qwen3_moe": (8, 2, 32, True, 0, (1,), [True, False, True]),
        "qwen2_moe": (6, 2, 32, False, 48, (), [False, True, False, True]),
        "mixtral": (4, 2, 96, True, 0, (), [True, True]),
    }[arch]
    sparse = [moe.is_sparse(i) for i in range(mc.num_layers)]
    got = (moe.num_experts, moe.top_k, moe.intermediate_size, moe.norm_topk_prob)
    assert (*got, moe.shared_intermediate_size, moe.dense_layers, sparse) == expected
    assert mc.qk_norm == (arch == "qwen3_moe") and mc.qkv_bias == (arch == "qwen2_moe")
    # a sparse layer's weights as transformers counts them; a token computes with top_k experts
    layer = next(i for i in range(mc.num_layers) if sparse[i])
    block = hf.model.layers[layer].mlp
    assert moe.params(mc.hidden_size, moe.num_experts) == sum(p.numel() for p in block.parameters())
    routed = mc.num_params() - mc.active_params()
    per_expert = 3 * mc.hidden_size * moe.intermediate_size
    assert routed == sum(sparse) * (moe.num_experts - moe.top_k) * per_expert


@pytest.mark.parametrize("arch", sorted(MOE_ARCHS))
def test_prefill_and_greedy_match_transformers(moe_dirs, arch):
    path, hf = moe_dirs[arch]
    with sgjit.Runtime(str(path), device="cpu", max_total_tokens=1024) as rt:
        layers = rt.model.layers
        assert [isinstance(layer.mlp, SparseMoE) for layer in layers] == [
            rt.model_config.moe.is_sparse(i) for i in range(len(layers))
        ]
        assert all(isinstance(layer.mlp, (SparseMoE, DenseMLP)) for layer in layers)
        ids = rt.tokenizer.encode(PROMPT)
        out = rt.generate(
            input_ids=ids,
            sampling_params={"temperature": 0, "max_new_tokens": 16, "ignore_eos": True},
            return_logprob=True,
            logprob_start_len=0,
        )
    ours = torch.tensor([e[0] for e in out["meta_info"]["input_token_logprobs"][1:]])
    ref = hf_logprobs(hf, ids)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert (ours - ref).abs().max().item() < TOL
    with torch.no_grad():
        greedy = hf.generate(
            torch.tensor([ids]),
            max_new_tokens=16,
            do_sample=False,
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        )
    assert out["output_ids"] == greedy[0, len(ids) :].tolist()


def assert_steps_match(hf, prompt: list[int], out: dict) -> None:
    """Each decode step's chosen token and top-5 log-probs against transformers' full forward."""
    lp = hf_logprobs(hf, prompt + out["output_ids"])
    meta = out["meta_info"]
    for step, ((logprob, tok, _), top) in enumerate(
        zip(meta["output_token_logprobs"], meta["output_top_logprobs"])
    ):
        row = lp[len(prompt) - 1 + step]
        assert abs(logprob - row[tok].item()) < TOL
        assert len(top) == 5
        for value, t, _ in top:
            assert abs(value - row[t].item()) < TOL


@pytest.mark.parametrize("arch", sorted(MOE_ARCHS))
def test_decode_steps_with_paged_kv_and_prefix_cache(moe_dirs, arch):
    path, hf = moe_dirs[arch]
    params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    with sgjit.Runtime(str(path), device="cpu", max_total_tokens=1024, page_size=4) as rt:
        first = rt.tokenizer.encode(PROMPT)
        out = rt.generate(input_ids=first, sampling_params=params, return_logprob=True, top_logprobs_num=5)
        assert_steps_match(hf, first, out)
        # the follow-up extends the first conversation: its prefix comes from the cache's pages
        second = first + out["output_ids"] + rt.tokenizer.encode(FOLLOW_UP)
        other = rt.tokenizer.encode("Mixture of experts routes each token to a few of its experts.")
        both = rt.generate(
            input_ids=[second, other], sampling_params=params, return_logprob=True, top_logprobs_num=5
        )
        assert both[0]["meta_info"]["cached_tokens"] >= len(first) - 4
        assert both[1]["meta_info"]["cached_tokens"] == 0
        for ids, result in zip((second, other), both):
            assert_steps_match(hf, ids, result)
        assert_no_leaked_pages(rt)

"""DeepSeek-V4 through the engine (`sgjit.Runtime(<dir>)`, CPU, float32): several requests batched
continuously with their prompts read in chunks (16 tokens a step here, so prompts are cut inside
compress windows and pages), greedy tokens equal to transformers' `generate`, prompt log-probs equal
to its forward, a later request starting from an earlier one's cached pages, and no page leaked."""

from __future__ import annotations

import pytest
import torch
from test_deepseek_v4 import reference, sequence
from tiny_deepseek_v4 import save_tiny_v4

import sgjit

from conftest import assert_no_leaked_pages

NEW = 10


@pytest.fixture(scope="module")
def v4(tmp_path_factory, runtime):
    """(the runtime, the transformers model) of the tiny DeepSeek-V4."""
    path = tmp_path_factory.mktemp("dsv4-engine") / "tiny-v4"
    backend = runtime.tokenizer.backend
    hf = save_tiny_v4(path, backend.get_vocab_size(), backend)
    rt = sgjit.Runtime(str(path), device="cpu", max_total_tokens=2048, chunked_prefill_size=16, seed=0)
    yield rt, hf
    rt.shutdown()


def greedy(hf, ids: list[int], n: int = NEW) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]), max_new_tokens=n, do_sample=False, attention_mask=torch.ones(1, len(ids))
        )
    return out[0, len(ids) :].tolist()


def test_batched_greedy_equals_transformers(v4):
    rt, hf = v4
    assert rt.model_config.architecture == "deepseek_v4"
    prompts = [sequence(n, seed) for seed, n in enumerate((37, 5, 22, 61))]
    outs = rt.generate(
        input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}
    )
    for ids, out in zip(prompts, outs):
        assert out["output_ids"] == greedy(hf, ids)
    assert_no_leaked_pages(rt)


def test_prompt_logprobs_equal_transformers(v4):
    rt, hf = v4
    ids = sequence(40, 7)
    out = rt.generate(
        input_ids=ids,
        sampling_params={"temperature": 0, "max_new_tokens": 1},
        return_logprob=True,
        logprob_start_len=0,
    )
    ours = torch.tensor([e[0] for e in out["meta_info"]["input_token_logprobs"][1:]])
    lp = torch.log_softmax(reference(hf, ids), -1)
    theirs = lp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert (ours - theirs).abs().max().item() < 1e-4


def test_a_cached_prefix_is_reused(v4):
    """The second prompt shares 48 tokens (3 pages) with the first: it starts from the cached pages,
    the compressors resuming from the state saved in the last one, and still matches transformers."""
    rt, hf = v4
    rt.flush_cache()
    first = sequence(50, 8)
    second = first[:48] + sequence(9, 9)
    params = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}
    rt.generate(input_ids=first, sampling_params=params)
    out = rt.generate(input_ids=second, sampling_params=params)
    assert out["meta_info"]["cached_tokens"] == 48
    assert out["output_ids"] == greedy(hf, second)
    assert_no_leaked_pages(rt)


def test_overlap_schedule_gives_the_same_tokens(v4):
    """With overlap scheduling (a GPU's default) the next step is launched before the last is read
    back, its decode rows taking placeholder ids resolved on the device: same tokens."""
    rt, hf = v4
    overlapped = sgjit.Runtime(
        str(rt.model_path), device="cpu", max_total_tokens=2048, chunked_prefill_size=16, seed=0,
        overlap_schedule=True,
    )  # fmt: skip
    try:
        prompts = [sequence(n, seed) for seed, n in enumerate((29, 7, 50))]
        params = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}
        outs = overlapped.generate(input_ids=prompts, sampling_params=params)
        assert overlapped.stats()["overlapped_launches"] > 0
        for ids, out in zip(prompts, outs):
            assert out["output_ids"] == greedy(hf, ids)
        assert_no_leaked_pages(overlapped)
    finally:
        overlapped.shutdown()

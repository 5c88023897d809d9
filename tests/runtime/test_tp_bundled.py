"""The bundled SmolLM2 over two tensor-parallel ranks (gloo, two CPU processes) against one process:
the same greedy tokens, log-probs within fp32 all-reduce noise, batching and the prefix cache as
usual, and a prompt program compiled by the plan JIT runs as it does interpreted on one process.
SmolLM2's 9 query / 3 KV heads split unevenly (whole GQA groups: 6 and 3 query heads). The shared
`dense_runtime` fixture (one process, the GGUF weights dequantized at load as tensor parallelism
loads them) is the tp=1 reference."""

from __future__ import annotations

import pytest
import torch

import sgjit
from sgjit.lang.runtime_backend import RuntimeBackend

from conftest import assert_no_leaked_pages

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "1, 2, 3, 4, 5,",
]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
LOGPROB_TOL = 1e-3  # nats; measured ~2e-5 (row-parallel partial sums added in another order)


@pytest.fixture(scope="module")
def tp2():
    rt = sgjit.Runtime(device="cpu", max_total_tokens=4096, seed=0, tp=2, plan_jit=True)
    yield rt
    rt.shutdown()


def logprobs(out: dict) -> torch.Tensor:
    meta = out["meta_info"]
    return torch.tensor([e[0] for e in meta["input_token_logprobs"][1:] + meta["output_token_logprobs"]])


def test_the_model_is_split_over_two_ranks(tp2):
    assert tp2.model_config.num_heads == 9 and tp2.model.config.num_heads == 6  # rank 0's share
    assert tp2.model.config.num_kv_heads == 2 and tp2.pool.k.shape[3] == 2  # its pool: its KV heads
    assert tp2.model.embed.shape[0] == 49152 // 2
    # quantization "auto" keeps GGUF blocks packed on one CPU process only; the shards are dense
    assert type(tp2.model.layers[0].qkv).__name__ != "PanelWeight"


def test_greedy_batch_matches_one_process(dense_runtime, tp2):
    kw = dict(return_logprob=True, logprob_start_len=0, top_logprobs_num=2)
    ref = dense_runtime.generate(PROMPTS, GREEDY, **kw)
    out = tp2.generate(PROMPTS, GREEDY, **kw)
    for a, b in zip(ref, out):
        assert b["output_ids"] == a["output_ids"], b["text"]
        assert (logprobs(a) - logprobs(b)).abs().max().item() < LOGPROB_TOL
        top_a = [[t[1] for t in row] for row in a["meta_info"]["output_top_logprobs"]]
        top_b = [[t[1] for t in row] for row in b["meta_info"]["output_top_logprobs"]]
        assert top_a == top_b
    assert_no_leaked_pages(tp2)


def test_prefix_cache_serves_a_shared_prefix(dense_runtime, tp2):
    system = "You are a helpful assistant who answers in one short sentence. " * 4
    questions = ["What is the sky's colour?", "Name a fruit.", "How many legs has a cat?"]
    tp2.generate(system + "Hello.", GREEDY)  # puts the shared prefix in the cache
    before = tp2.stats()["prefix_cache_hit_tokens"]
    out = tp2.generate([system + q for q in questions], GREEDY)
    assert tp2.stats()["prefix_cache_hit_tokens"] - before >= 3 * 48  # each reused its full pages
    ref = dense_runtime.generate([system + q for q in questions], GREEDY)
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in ref]
    assert_no_leaked_pages(tp2)


def test_seeded_sampling_and_chat_match_one_process(dense_runtime, tp2):
    params = [
        {"temperature": 0.8, "top_p": 0.9, "seed": s, "max_new_tokens": 10, "ignore_eos": True}
        for s in (3, 4)
    ]
    assert [o["output_ids"] for o in tp2.generate(PROMPTS[:2], params)] == [
        o["output_ids"] for o in dense_runtime.generate(PROMPTS[:2], params)
    ]
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    assert (
        tp2.chat(chat, {"temperature": 0, "max_new_tokens": 20})["text"]
        == dense_runtime.chat(chat, {"temperature": 0, "max_new_tokens": 20})["text"]
    )


@sgjit.function
def review(s, text):
    s += sgjit.system("You label reviews.")
    s += sgjit.user("Review: " + text + "\nIs it positive or negative?")
    s += sgjit.assistant(sgjit.select("label", choices=["positive", "negative"]))
    s += sgjit.user("Why, in a few words?")
    s += sgjit.assistant(sgjit.gen("why", max_tokens=10, temperature=0))


def test_a_compiled_program_runs_as_on_one_process(dense_runtime, tp2):
    texts = ["Loved every minute of it.", "A waste of money."]
    got = [review.run(text=t, backend=tp2) for t in texts]
    want = [review.run(text=t, backend=dense_runtime) for t in texts]  # interpreted: no plan JIT there
    assert [(g["label"], g["why"]) for g in got] == [(w["label"], w["why"]) for w in want]
    assert RuntimeBackend.of(tp2).jit_counters()["jit_compiles"] >= 1
    assert_no_leaked_pages(tp2)

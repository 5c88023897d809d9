"""The serving engine: continuous batching, prefix cache, preemption, abort, seeds, stop strings."""

from __future__ import annotations

import queue
import threading

import pytest

import sgjit

from conftest import GREEDY, assert_no_leaked_pages

TOPICS = ["apples", "the moon", "Python lists", "rivers", "chess", "volcanoes", "jazz", "bridges",
          "bees", "glaciers", "coffee", "trains", "owls", "deserts", "violins", "comets"]  # fmt: skip
PROMPTS = [f"Write one sentence about {t}:" for t in TOPICS] + [
    f"List three facts about {t}:" for t in TOPICS
]


@pytest.fixture(scope="module")
def alone(runtime):
    """Each prompt's greedy continuation, run on its own."""
    return {p: runtime.generate(p, {**GREEDY, "max_new_tokens": 12})["output_ids"] for p in PROMPTS}


def test_32_concurrent_requests_equal_each_alone(runtime, alone):
    outs = runtime.generate(PROMPTS, {**GREEDY, "max_new_tokens": 12})
    assert [o["output_ids"] for o in outs] == [alone[p] for p in PROMPTS]
    assert_no_leaked_pages(runtime)


def test_requests_from_many_threads(runtime, alone):
    results: dict[str, list[int]] = {}

    def worker(p: str) -> None:
        results[p] = runtime.generate(p, {**GREEDY, "max_new_tokens": 12})["output_ids"]

    threads = [threading.Thread(target=worker, args=(p,)) for p in PROMPTS[:12]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {p: alone[p] for p in PROMPTS[:12]}


def test_shared_prefix_is_reused(runtime):
    prefix = " ".join(f"Fact {i}: the number {i} is {'even' if i % 2 == 0 else 'odd'}." for i in range(30))
    prompts = [prefix + f" Question {i}: is {i} even?" for i in range(16)]
    ids = [runtime.tokenizer.encode(p) for p in prompts]
    assert len(ids[0]) > 200
    runtime.flush_cache()
    uncached = []
    for i in ids:  # flush before each so nothing is reused
        uncached.append(runtime.generate(input_ids=i, sampling_params={**GREEDY, "max_new_tokens": 6}))
        runtime.flush_cache()
    first = runtime.generate(input_ids=ids[0], sampling_params={**GREEDY, "max_new_tokens": 6})
    rest = runtime.generate(input_ids=ids[1:], sampling_params={**GREEDY, "max_new_tokens": 6})
    assert first["meta_info"]["cached_tokens"] == 0
    assert all(r["meta_info"]["cached_tokens"] >= 192 for r in rest)
    assert [o["output_ids"] for o in [first, *rest]] == [u["output_ids"] for u in uncached]
    assert runtime.stats()["prefix_cache_hit_tokens"] >= 15 * 192
    assert_no_leaked_pages(runtime)


def test_a_list_sharing_a_prefix_computes_it_once(runtime):
    """Eight prompts with a 400-token common prefix sent as one list: the first computes the prefix,
    the other seven start from its cached pages (>= 384 cached tokens each), and every answer
    equals the same prompt run alone on an empty cache."""
    prefix = " ".join(f"Rule {i}: a {c} tile scores {i % 7} points." for i, c in zip(range(40), "rgbyo" * 8))
    ids = [runtime.tokenizer.encode(prefix + f" Question {i}: what does tile {i} score?") for i in range(8)]
    common = next(k for k in range(len(ids[0])) if len({tuple(i[: k + 1]) for i in ids}) > 1)
    assert common >= 400, common
    alone = []
    for i in ids:
        runtime.flush_cache()
        alone.append(
            runtime.generate(input_ids=i, sampling_params={**GREEDY, "max_new_tokens": 6})["output_ids"]
        )
    runtime.flush_cache()
    outs = runtime.generate(input_ids=ids, sampling_params={**GREEDY, "max_new_tokens": 6})
    cached = [o["meta_info"]["cached_tokens"] for o in outs]
    assert sum(c >= 384 for c in cached) >= 7, cached
    assert [o["output_ids"] for o in outs] == alone
    assert_no_leaked_pages(runtime)


def test_tiny_pool_preempts_and_loses_nothing(runtime, alone):
    small = sgjit.Runtime(device="cpu", max_total_tokens=16 * 12, page_size=16)
    try:
        prompts = PROMPTS[:20]
        outs = small.generate(prompts, {**GREEDY, "max_new_tokens": 12})
        assert [o["output_ids"] for o in outs] == [alone[p] for p in prompts]
        assert small.stats()["requests_total"] == 20
        assert_no_leaked_pages(small)
    finally:
        small.shutdown()


def test_abort_frees_pages_and_spares_the_others(runtime):
    runtime.flush_cache()
    free_before = runtime.stats()["kv_pages_free"]
    expected = runtime.generate("Hello", {**GREEDY, "max_new_tokens": 8})["text"]
    updates: queue.SimpleQueue = queue.SimpleQueue()
    long_req = runtime.make_request(
        runtime.tokenizer.encode("Count from one to one thousand:"),
        {**GREEDY, "max_new_tokens": 400, "ignore_eos": True},
    )
    runtime.submit(long_req, updates.put)
    other: dict = {}
    worker = threading.Thread(
        target=lambda: other.update(runtime.generate("Hello", {**GREEDY, "max_new_tokens": 8}))
    )
    worker.start()
    while not updates.get().token_ids:  # wait until the long request is decoding
        pass
    runtime.abort(long_req.rid)
    final = updates.get()
    while not final.finished:
        final = updates.get()
    worker.join()
    assert final.error is not None and long_req.num_output < 400
    assert other["text"] == expected
    runtime.flush_cache()
    assert runtime.stats()["kv_pages_free"] == free_before


def test_seeded_sampling_ignores_the_batch(runtime):
    params = {"temperature": 1.0, "max_new_tokens": 12, "seed": 1234, "ignore_eos": True}
    alone_out = runtime.generate("Once upon a time", params)["output_ids"]
    mixed = runtime.generate(
        ["Once upon a time", "The weather", "In 1905,"],
        [params, {"temperature": 1.0, "max_new_tokens": 12}, {"temperature": 0.7, "max_new_tokens": 5}],
    )
    assert mixed[0]["output_ids"] == alone_out
    other_seed = runtime.generate("Once upon a time", {**params, "seed": 99})["output_ids"]
    assert other_seed != alone_out


def test_stop_string_spanning_two_tokens(runtime):
    prompt = "The quick brown fox jumps over the lazy dog. The quick brown"
    ids = runtime.generate(prompt, {**GREEDY, "max_new_tokens": 20, "ignore_eos": True})["output_ids"]
    pieces = [runtime.tokenizer.decode([t]) for t in ids]
    k = next(
        i
        for i in range(3, len(pieces) - 1)
        if len(pieces[i].strip()) >= 2 and len(pieces[i + 1].strip()) >= 2
    )
    stop = pieces[k][-2:] + pieces[k + 1][:2]
    text = runtime.tokenizer.decode(ids)
    out = runtime.generate(prompt, {**GREEDY, "max_new_tokens": 20, "ignore_eos": True, "stop": stop})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == text[: text.index(stop)]
    assert stop not in out["text"]


def test_min_new_tokens_and_stop_token_ids(runtime):
    out = runtime.chat(
        [{"role": "user", "content": "Say hi."}], {**GREEDY, "max_new_tokens": 40, "min_new_tokens": 20}
    )
    assert out["meta_info"]["completion_tokens"] >= 20
    first = runtime.generate("1, 2, 3,", {**GREEDY, "max_new_tokens": 8})["output_ids"]
    out = runtime.generate("1, 2, 3,", {**GREEDY, "max_new_tokens": 8, "stop_token_ids": [first[2]]})
    assert out["output_ids"] == first[:3]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": first[2]}


def test_frequency_penalty_reduces_repetition(runtime):
    prompt = "la la la la la la la la la la"
    plain = runtime.generate(prompt, {**GREEDY, "max_new_tokens": 24, "ignore_eos": True})["output_ids"]
    penal = runtime.generate(
        prompt, {**GREEDY, "max_new_tokens": 24, "ignore_eos": True, "frequency_penalty": 2.0}
    )["output_ids"]
    assert max(penal.count(t) for t in set(penal)) < max(plain.count(t) for t in set(plain))


def test_chunked_prefill_and_lpm_give_the_same_tokens(runtime):
    prompt = " ".join(f"Line {i}: the quick brown fox." for i in range(40))
    ref = runtime.generate(prompt, {**GREEDY, "max_new_tokens": 8}, return_logprob=True, logprob_start_len=0)
    rt = sgjit.Runtime(device="cpu", max_total_tokens=4096, chunked_prefill_size=64, schedule_policy="lpm")
    try:
        # a long prompt prefilled in chunks while short requests decode in the same steps
        outs = rt.generate(
            [prompt, "Hi", "Hello there"],
            {**GREEDY, "max_new_tokens": 8},
            return_logprob=True,
            logprob_start_len=0,
        )
        assert outs[0]["output_ids"] == ref["output_ids"]
        ours = [e[0] for e in outs[0]["meta_info"]["input_token_logprobs"][1:]]
        theirs = [e[0] for e in ref["meta_info"]["input_token_logprobs"][1:]]
        assert max(abs(a - b) for a, b in zip(ours, theirs)) < 1e-3
        assert rt.stats()["steps"] > len(ref["meta_info"]["input_token_logprobs"]) // 64
        assert_no_leaked_pages(rt)
    finally:
        rt.shutdown()


def test_stats_keys(runtime):
    s = runtime.stats()
    for key in (
        "kv_pages_total",
        "kv_pages_free",
        "running",
        "waiting",
        "prefix_cache_hit_tokens",
        "prompt_tokens_total",
        "generation_tokens_total",
    ):
        assert key in s


def test_fp8_kv_cache_runs_close_to_full_precision(runtime):
    rt = sgjit.Runtime(device="cpu", kv_cache_dtype="fp8_e4m3", max_total_tokens=2048)
    try:
        assert rt.pool.k.dtype.itemsize == 1
        ids = runtime.tokenizer.encode("The history of Rome is a story of")
        a = rt.generate(
            input_ids=ids,
            sampling_params={**GREEDY, "max_new_tokens": 8},
            return_logprob=True,
            logprob_start_len=0,
        )
        b = runtime.generate(
            input_ids=ids,
            sampling_params={**GREEDY, "max_new_tokens": 8},
            return_logprob=True,
            logprob_start_len=0,
        )
        diffs = [
            abs(x[0] - y[0])
            for x, y in zip(
                a["meta_info"]["input_token_logprobs"][1:], b["meta_info"]["input_token_logprobs"][1:]
            )
        ]
        assert max(diffs) < 1.0  # fp8 e4m3 keeps ~2 significant digits of K and V
        assert a["output_ids"][:3] == b["output_ids"][:3]
    finally:
        rt.shutdown()


def test_protected_program_steps_are_never_preempted(alone):
    small = sgjit.Runtime(device="cpu", max_total_tokens=16 * 12, page_size=16)
    try:
        done: queue.SimpleQueue = queue.SimpleQueue()
        prog = small.make_request(
            small.tokenizer.encode(PROMPTS[0]), {**GREEDY, "max_new_tokens": 12}, protected=True
        )
        small.submit(prog, lambda u: done.put(u) if u.finished else None)
        others = small.generate(PROMPTS[1:16], {**GREEDY, "max_new_tokens": 12})
        final = done.get()
        assert prog.preemptions == 0
        assert final.result.output_ids == alone[PROMPTS[0]]
        assert [o["output_ids"] for o in others] == [alone[p] for p in PROMPTS[1:16]]
        assert_no_leaked_pages(small)
    finally:
        small.shutdown()


def test_num_threads_sets_the_engine_pool_and_leaves_tokens_alone(runtime, alone):
    """--num-threads reaches the engine thread's pool; the CPU kernels split work between threads by
    output rows only, so one thread computes the same tokens as the default pool."""
    import torch

    one = sgjit.Runtime(device="cpu", max_total_tokens=1024, num_threads=1)
    try:
        assert one.engine.call(torch.get_num_threads) == 1
        outs = one.generate(PROMPTS[:4], {**GREEDY, "max_new_tokens": 12})
        assert [o["output_ids"] for o in outs] == [alone[p] for p in PROMPTS[:4]]
    finally:
        one.shutdown()


def test_mixed_step_budget_defaults_by_device(runtime):
    """Unset, a step with decode rows takes 1024 tokens on a CPU (2048 on a GPU, where fewer, larger
    mixed steps measured faster); a set value is kept."""
    assert runtime.config.mixed_step_tokens is None
    assert runtime.engine.scheduler.config.mixed_step_tokens == 1024
    rt = sgjit.Runtime(device="cpu", max_total_tokens=2048, mixed_step_tokens=512)
    try:
        assert rt.engine.scheduler.config.mixed_step_tokens == 512
    finally:
        rt.shutdown()

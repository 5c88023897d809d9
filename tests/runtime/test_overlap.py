"""Overlap scheduling and the output thread (issue 14), on the CPU. With `overlap_schedule=True` the
engine launches step N+1 before it reads step N back, its decode rows taking step N's tokens as
device-side placeholders; on a CPU the steps still run one after the other, but through the same
code as on a GPU. Tokens are handed out on the engine's output thread. The results must be the
plain engine's (the session `runtime`): same ids, text, finish reasons and logprobs, every page free
afterwards; a stop string found late costs at most one launch of trimmed tokens."""

from __future__ import annotations

import math
import queue
import threading

import pytest

import sgjit
from sgjit.errors import InvalidRequestError
from sgjit.runtime.config import RuntimeConfig
from sgjit.runtime.result import RequestUpdate

from conftest import GREEDY, assert_no_leaked_pages

PROMPTS = ["The capital of France is", "1, 2, 3,", "def add(a, b):", "Once upon a time"]
MIXED = [
    {**GREEDY, "max_new_tokens": 10},
    {**GREEDY, "max_new_tokens": 14, "stop": ["6"]},  # a stop string mid-generation
    {**GREEDY, "max_new_tokens": 9, "stop_token_ids": [198]},  # a stop token (newline)
    {"temperature": 0.8, "seed": 5, "max_new_tokens": 7},  # seeded sampling
]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def _summary(outs: list[dict]) -> list[tuple]:
    return [(o["output_ids"], o["text"], o["meta_info"]["finish_reason"]) for o in outs]


@pytest.fixture(scope="module")
def overlapped():
    rt = sgjit.Runtime(device="cpu", max_total_tokens=8192, seed=0, overlap_schedule=True)
    rt.engine.output.hold = True  # as on a GPU: hand-out held until the engine blocks
    yield rt
    rt.shutdown()


@pytest.fixture(scope="module")
def multi():
    """Overlap on the bucketed decode path: multi-step launches of 4 tokens, the next one queued
    before the last is read back."""
    rt = sgjit.Runtime(
        device="cpu", max_total_tokens=4096, max_model_len=1024, seed=0, overlap_schedule=True,
        bucketed_decode=True, cuda_graph_max_bs=8, multi_step=4,
    )  # fmt: skip
    rt.engine.output.hold = True
    yield rt
    rt.shutdown()


def test_overlap_gives_the_plain_engines_results(runtime, overlapped):
    before = overlapped.stats()["overlapped_launches"]
    assert _summary(overlapped.generate(PROMPTS, MIXED)) == _summary(runtime.generate(PROMPTS, MIXED))
    assert overlapped.stats()["overlapped_launches"] > before  # the next step went before the last was read
    chat = {**GREEDY, "max_new_tokens": 30}
    assert overlapped.chat(CHAT, chat)["text"] == runtime.chat(CHAT, chat)["text"]  # ends at EOS
    assert_no_leaked_pages(overlapped)


def test_logprobs_and_host_bound_rows_are_unchanged(runtime, overlapped):
    """Prompt and output logprobs (values, top-n, text) come back as without overlap; rows whose
    sampling reads their tokens on the host (penalties, grammars) run without it, in order."""
    opts = dict(return_logprob=True, logprob_start_len=0, top_logprobs_num=2, return_text_in_logprobs=True)
    params = [{**GREEDY, "max_new_tokens": 6}, {**GREEDY, "max_new_tokens": 0}]  # the second: prompt only
    got = overlapped.generate(PROMPTS[:2], params, **opts)
    want = runtime.generate(PROMPTS[:2], params, **opts)
    for g, w in zip(got, want):
        assert g["output_ids"] == w["output_ids"]
        for key in (
            "input_token_logprobs",
            "output_token_logprobs",
            "input_top_logprobs",
            "output_top_logprobs",
        ):
            assert _close(g["meta_info"][key], w["meta_info"][key]), key
    host_bound = [
        {**GREEDY, "max_new_tokens": 8, "frequency_penalty": 1.5},
        {**GREEDY, "max_new_tokens": 8, "regex": "[a-z ]{1,20}"},
        {**GREEDY, "max_new_tokens": 8},
    ]
    assert _summary(overlapped.generate(PROMPTS[:3], host_bound)) == _summary(
        runtime.generate(PROMPTS[:3], host_bound)
    )
    assert_no_leaked_pages(overlapped)


def _close(a, b) -> bool:
    """Logprob structures equal, floats within 1e-5."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, abs_tol=1e-5)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


def test_multi_step_launches_overlap_and_trim_what_follows_a_stop(runtime, multi):
    """Stop strings, stop tokens and EOS inside 4-token launches: the tokens after them are dropped
    and the answers are the plain engine's."""
    greedy = MIXED[:3]
    s0 = multi.stats()
    assert _summary(multi.generate(PROMPTS[:3], greedy)) == _summary(runtime.generate(PROMPTS[:3], greedy))
    s1 = multi.stats()
    assert s1["multi_step_launches"] > s0["multi_step_launches"]
    assert s1["overlapped_launches"] > s0["overlapped_launches"]
    chat = {**GREEDY, "max_new_tokens": 30}
    assert multi.chat(CHAT, chat)["text"] == runtime.chat(CHAT, chat)["text"]
    assert_no_leaked_pages(multi)


def test_a_stop_string_costs_at_most_one_launch(runtime, multi):
    """A stop string is found on the output thread after its launch is read back, while the next
    launch already runs: the request takes at most one launch more than its tokens need, never
    runs on to max_new_tokens, and its text ends where the plain engine's does."""
    params = {**GREEDY, "max_new_tokens": 200, "stop": [" 9"]}
    want = runtime.generate("1, 2, 3,", params)
    n = len(want["output_ids"])
    assert want["meta_info"]["finish_reason"]["matched"] == " 9" and n > 5
    before = multi.stats()["multi_step_launches"]
    got = multi.generate("1, 2, 3,", params)
    assert _summary([got]) == _summary([want])
    needed = math.ceil((n - 1) / 4)  # the first token comes from the prompt's step
    assert multi.stats()["multi_step_launches"] - before <= needed + 1
    assert_no_leaked_pages(multi)


def test_preemption_under_overlap_loses_nothing(runtime):
    prompts = [f"Write one sentence about {t}:" for t in ("apples", "the moon", "rivers", "chess", "bees")]
    params = {**GREEDY, "max_new_tokens": 12}
    small = sgjit.Runtime(device="cpu", max_total_tokens=16 * 5, page_size=16, overlap_schedule=True)
    try:
        reqs = [small.make_request(small.tokenizer.encode(p), params) for p in prompts]
        results = small.run_requests(reqs)
        assert any(r.preemptions for r in reqs)
        want = [runtime.generate(p, params)["output_ids"] for p in prompts]
        assert [r.output_ids for r in results] == want
        assert_no_leaked_pages(small)
    finally:
        small.shutdown()


def test_abort_while_a_launch_is_in_flight(overlapped):
    stream = overlapped.generate("Count from one to one thousand:", {**GREEDY, "max_new_tokens": 300,
                                                                     "ignore_eos": True}, stream=True)  # fmt: skip
    chunks = [next(stream) for _ in range(3)]
    stream.close()  # aborts the request; its placeholders are dropped
    assert all(not c["finished"] for c in chunks)
    assert_no_leaked_pages(overlapped)


def test_sinks_run_on_the_output_thread_and_a_failing_one_ends_only_its_request(overlapped):
    params = {**GREEDY, "max_new_tokens": 6}
    reqs = [overlapped.make_request(overlapped.tokenizer.encode(p), params) for p in PROMPTS[:2]]
    threads: set[str] = set()
    finals: queue.SimpleQueue[RequestUpdate] = queue.SimpleQueue()
    failed_once = threading.Event()

    def sink(u: RequestUpdate) -> None:
        threads.add(threading.current_thread().name)
        if u.rid == reqs[0].rid and not failed_once.is_set():
            failed_once.set()
            raise RuntimeError("injected sink failure")
        if u.finished:
            finals.put(u)

    overlapped.submit_batch(reqs, sink)
    by_id = {u.rid: u for u in (finals.get(timeout=300), finals.get(timeout=300))}
    assert threads == {"sgjit-output"}
    assert "injected sink failure" in str(by_id[reqs[0].rid].error)
    ok = by_id[reqs[1].rid]
    assert ok.error is None and ok.result.output_ids == overlapped.generate(PROMPTS[1], params)["output_ids"]
    assert_no_leaked_pages(overlapped)


def test_streaming_n_and_the_prefix_cache_under_overlap(runtime, overlapped):
    """A stream's chunks add up to the plain engine's text; n > 1 samples of a prompt come back as
    the plain engine's, the later ones starting from the first one's pages (in-batch prefix sharing);
    a repeated prompt comes from the prefix cache with the same answer."""
    params = {**GREEDY, "max_new_tokens": 16, "stop": [" 7"]}
    chunks = list(overlapped.generate("1, 2, 3,", params, stream=True))
    want = runtime.generate("1, 2, 3,", params)
    assert chunks[-1]["finished"] and all(not c["finished"] for c in chunks[:-1])
    assert "".join(c["text"] for c in chunks) == want["text"]
    assert [t for c in chunks for t in c["output_ids"]] == want["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == want["meta_info"]["finish_reason"]
    prompt = "Here is a long list of fruit: " + ", ".join(["apple", "pear", "plum", "fig"] * 12) + ". Next:"
    n = {**GREEDY, "max_new_tokens": 6, "n": 3}
    got = overlapped.generate(prompt, n)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in runtime.generate(prompt, n)]
    prompt_len = got[0]["meta_info"]["prompt_tokens"]
    assert prompt_len > 64
    assert all(o["meta_info"]["cached_tokens"] >= prompt_len - 16 for o in got[1:])
    again = overlapped.generate(prompt, {**GREEDY, "max_new_tokens": 6})
    assert again["output_ids"] == got[0]["output_ids"]
    assert again["meta_info"]["cached_tokens"] >= prompt_len - 16
    assert_no_leaked_pages(overlapped)


def test_overlap_is_off_with_tensor_parallelism():
    """The other ranks rebuild each step from rank 0's host lists: placeholder ids cannot go there,
    so the overlap is off by default with tp > 1 and refused when asked for."""
    assert RuntimeConfig().use_overlap("cuda")
    assert not RuntimeConfig().use_overlap("cpu")
    assert not RuntimeConfig(tp=2).use_overlap("cuda")
    assert RuntimeConfig(overlap_schedule=True).use_overlap("cpu")
    with pytest.raises(InvalidRequestError, match="overlap_schedule"):
        RuntimeConfig(tp=2, overlap_schedule=True)

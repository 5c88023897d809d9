"""Tensor parallelism on the decode-graph path (the bucketed static-shape steps that CUDA graphs
capture), run uncaptured on two CPU processes (SGJIT_EAGER_DECODE_GRAPHS=1): single decode steps and
multi-step launches, whose tokens rank 0 broadcasts to the other rank inside the launch, give what
one process gives on its plain path (`dense_runtime`: tensor parallelism dequantizes GGUF weights at
load, as that fixture does). On a GPU the same steps are captured (tests/runtime/test_tp_gpu.py)."""

from __future__ import annotations

import pytest

import sgjit

from conftest import assert_no_leaked_pages

PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "def add(a, b):"]


@pytest.fixture(scope="module")
def tp2_graphs():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SGJIT_EAGER_DECODE_GRAPHS", "1")  # read by rank 0 at load, inherited by rank 1
        rt = sgjit.Runtime(
            device="cpu", max_total_tokens=4096, seed=0, tp=2, multi_step=4, cuda_graph_max_bs=8
        )
    yield rt
    rt.shutdown()


def test_multi_step_and_single_steps_match_one_process(dense_runtime, tp2_graphs):
    rt = tp2_graphs
    assert rt.engine.runner.graphs is not None and not rt.engine.runner.graphs.capture
    params = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in (7, 12, 5)]
    before = rt.stats()["multi_step_launches"]
    out = rt.generate(PROMPTS, params)  # greedy rows: multi-step launches
    assert rt.stats()["multi_step_launches"] > before
    want = dense_runtime.generate(PROMPTS, params)
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in want]
    # log-probs need the host after every token: single decode steps on the graph path
    lp = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
    one = rt.generate(PROMPTS[0], lp, return_logprob=True)
    ref = dense_runtime.generate(PROMPTS[0], lp, return_logprob=True)
    assert one["output_ids"] == ref["output_ids"]
    for (a, *_), (b, *_) in zip(
        one["meta_info"]["output_token_logprobs"], ref["meta_info"]["output_token_logprobs"]
    ):
        assert abs(a - b) < 1e-3
    assert_no_leaked_pages(rt)


def test_sampled_multi_step_matches_one_process_single_steps(dense_runtime, tp2_graphs):
    params = [
        {"temperature": 0.8, "top_p": 0.9, "seed": s, "max_new_tokens": 9, "ignore_eos": True}
        for s in (11, 12, 13)
    ]
    out = tp2_graphs.generate(PROMPTS, params)
    want = dense_runtime.generate(PROMPTS, params)
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in want]
    assert_no_leaked_pages(tp2_graphs)

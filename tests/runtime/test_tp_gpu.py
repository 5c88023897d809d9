"""Tensor parallelism on two GPUs (NCCL), with the JIT's CUDA kernels and CUDA graphs: decode steps
and multi-step launches captured with their all-reduces and all-gathers replay exactly what the same
ranks run eagerly, track one GPU within bf16 noise, and a rank that dies ends requests with an error
(NCCL's abort), not a hang. Needs two GPUs; not yet run (no multi-GPU machine was lent)."""

from __future__ import annotations

import os
import signal

import pytest
import torch

import sgjit
from sgjit.errors import TensorParallelError

from conftest import tp_rank_pids

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs"),
]

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,", "1, 2, 3, 4, 5,"] * 4
GREEDY = {"temperature": 0, "max_new_tokens": 48, "ignore_eos": True}
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "seed": 7, "max_new_tokens": 48, "ignore_eos": True}


def run(tp: int, **opts) -> tuple[list, list, list]:
    """(greedy ids, seeded sampled ids, prompt log-probs) of the bundled model (real weights: the
    greedy tokens do not hang on rounding) with the JIT on."""
    rt = sgjit.Runtime(device="cuda", tp=tp, seed=0, max_total_tokens=16384, enable_jit=True, **opts)
    try:
        greedy = [o["output_ids"] for o in rt.generate(PROMPTS, GREEDY)]
        sampled = [o["output_ids"] for o in rt.generate(PROMPTS, SAMPLED)]
        lp = rt.generate(PROMPTS[0], {"max_new_tokens": 1}, return_logprob=True, logprob_start_len=0)
        prompt_lp = [e[0] for e in lp["meta_info"]["input_token_logprobs"][1:]]
        if opts.get("cuda_graph", True):
            assert rt.engine.runner.graphs.num_graphs > 0 and rt.stats()["multi_step_launches"] > 0
        assert rt.engine.overlap is (tp == 1)  # overlap scheduling: a GPU's default, off with tp > 1
    finally:
        rt.shutdown()
    assert not tp_rank_pids()
    return greedy, sampled, prompt_lp


def test_captured_tp2_replays_eager_tp2_and_tracks_one_gpu():
    eager = run(2, cuda_graph=False)
    graphs = run(2)  # NCCL all-reduce / all-gather / broadcast captured in single and multi-step graphs
    assert graphs[0] == eager[0] and graphs[1] == eager[1]
    one = run(1)
    assert max(abs(a - b) for a, b in zip(graphs[2], one[2])) < 0.1  # bf16 partial sums, another order
    assert sum(a[:8] == b[:8] for a, b in zip(graphs[0], one[0])) >= len(PROMPTS) - 2


def test_a_dead_rank_ends_requests_with_an_error(monkeypatch):
    monkeypatch.setenv("SGJIT_TP_TIMEOUT", "30")
    rt = sgjit.Runtime(device="cuda", tp=2, max_total_tokens=4096, enable_jit=True)
    try:
        rt.generate("hello", GREEDY)
        (rank1,) = tp_rank_pids()
        os.kill(rank1, signal.SIGKILL)
        with pytest.raises(TensorParallelError, match="rank 1 exited with code -9"):
            rt.generate("hello again", GREEDY)
    finally:
        rt.shutdown()

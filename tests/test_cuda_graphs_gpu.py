"""CUDA-graph decode (single- and multi-step) is token-identical to eager execution (GPU only)."""

from __future__ import annotations

import pytest
import torch

import sgjit

pytestmark = pytest.mark.gpu

MODEL = "random:smollm2-135m"


@pytest.fixture(scope="module")
def runtimes():
    common = dict(device="cuda", max_total_tokens=64 * 512, seed=0)
    eager = sgjit.Runtime(MODEL, enable_jit=True, disable_cuda_graph=True, multi_step=1, **common)
    single = sgjit.Runtime(MODEL, enable_jit=True, multi_step=1, **common)
    multi = sgjit.Runtime(MODEL, enable_jit=True, multi_step=8, **common)
    yield eager, single, multi
    for rt in (eager, single, multi):
        rt.shutdown()


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(1000, 40000, (int(torch.randint(4, 60, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


@pytest.mark.parametrize("bs", [1, 3, 17, 64])
def test_graph_replay_equals_eager(runtimes, bs):
    eager, single, multi = runtimes
    ids = prompts(bs, seed=bs)
    params = {"temperature": 0.0, "max_new_tokens": 128, "ignore_eos": True}
    ref = [o["output_ids"] for o in eager.generate(input_ids=ids, sampling_params=params)]
    for rt in (single, multi):
        out = [o["output_ids"] for o in rt.generate(input_ids=ids, sampling_params=params)]
        assert out == ref
    assert single.engine.runner.graphs.num_graphs > 0
    assert multi.engine.runner.graphs.num_graphs > 0


def test_multi_step_stops_at_eos_and_max_tokens(runtimes):
    eager, _, multi = runtimes
    ids = prompts(5, seed=7)
    params = [{"temperature": 0.0, "max_new_tokens": n} for n in (1, 5, 9, 16, 33)]
    ref = eager.generate(input_ids=ids, sampling_params=params)
    out = multi.generate(input_ids=ids, sampling_params=params)
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in ref]
    assert [o["meta_info"]["finish_reason"] for o in out] == [o["meta_info"]["finish_reason"] for o in ref]
    multi.flush_cache()
    s = multi.stats()
    assert s["kv_pages_free"] == s["kv_pages_total"]

"""CUDA-graph decode (single- and multi-step) is token-identical to eager execution (GPU only)."""

from __future__ import annotations

import pytest
import torch

import sgjit
from sgjit.lang.runtime_backend import RuntimeBackend

pytestmark = pytest.mark.gpu

MODEL = "random:smollm2-135m"


@pytest.fixture(scope="module")
def runtimes():
    common = dict(device="cuda", max_total_tokens=64 * 512, seed=0)
    eager = sgjit.Runtime(MODEL, enable_jit=True, cuda_graph=False, multi_step=1, **common)
    single = sgjit.Runtime(MODEL, enable_jit=True, multi_step=1, **common)
    multi = sgjit.Runtime(MODEL, enable_jit=True, multi_step=8, **common)
    yield eager, single, multi
    for rt in (eager, single, multi):
        rt.shutdown()


@pytest.fixture(scope="module")
def deterministic():
    """Batched-versus-alone comparisons run in the deterministic mode: otherwise a greedy row's
    tokens may legitimately depend on its batch neighbours (GEMM shapes differ with the batch)."""
    rt = sgjit.Runtime(
        MODEL, device="cuda", max_total_tokens=64 * 512, seed=0, enable_jit=True, deterministic=True
    )
    yield rt
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


def test_sampled_multi_step_equals_single_step(runtimes):
    """Seeded temperature / top-p / top-k sampling inside multi-step graphs (the on-device sampler,
    Philox counter advanced on the device) draws what single-step graphs draw."""
    _, single, multi = runtimes
    ids = prompts(6, seed=3)
    params = [
        {"temperature": t, "top_p": p, "top_k": k, "seed": 100 + i, "max_new_tokens": 40, "ignore_eos": True}
        for i, (t, p, k) in enumerate([(0.7, 1.0, 0), (1.0, 0.9, 0), (0.9, 1.0, 40)] * 2)
    ]
    before = multi.stats()["multi_step_launches"]
    ref = [o["output_ids"] for o in single.generate(input_ids=ids, sampling_params=params)]
    out = [o["output_ids"] for o in multi.generate(input_ids=ids, sampling_params=params)]
    assert multi.stats()["multi_step_launches"] > before
    assert out == ref
    assert any(key[3] for key in multi.engine.runner.graphs._graphs)  # a sampled graph ran


@sgjit.function
def story(s, topic):
    s += "Write a story about " + topic + ". Once upon a time"
    s += sgjit.gen("story", max_tokens=24, temperature=0, ignore_eos=True)


@sgjit.function
def recipe(s, dish):
    s += "Recipe book, chapter 3. Ingredients for " + dish + ":"
    s += sgjit.gen("ingredients", max_tokens=24, temperature=0, ignore_eos=True)


def test_concurrent_plans_share_one_set_of_graphs(deterministic):
    """Two programs with different plans, run at once, go through the runtime's one set of decode
    graphs: once its buckets are captured, mixing the plans in a batch captures nothing new, and
    each program's output equals its output alone."""
    import threading

    rt = deterministic
    a_args = [{"topic": t} for t in ("a dragon", "the sea", "a robot", "winter")]
    b_args = [{"dish": d} for d in ("soup", "bread", "curry", "salad")]
    alone_a = [st["story"] for st in story.run_batch(a_args, backend=rt)]
    alone_b = [st["ingredients"] for st in recipe.run_batch(b_args, backend=rt)]
    graphs = rt.engine.runner.graphs

    def warm() -> None:
        for bs in (b for b in graphs.buckets if b <= 8):
            for steps in (1, graphs.steps):
                graphs.graph(bs, graphs.context_bucket(1, bs), steps)

    rt.engine.call(warm)
    captured = graphs.num_graphs
    results: dict[str, list[str]] = {}
    threads = [
        threading.Thread(target=lambda: results.__setitem__("a", [s["story"] for s in story.run_batch(a_args, backend=rt)])),
        threading.Thread(target=lambda: results.__setitem__("b", [s["ingredients"] for s in recipe.run_batch(b_args, backend=rt)])),
    ]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["a"] == alone_a and results["b"] == alone_b
    assert graphs.num_graphs == captured  # no plan captured graphs of its own
    stats = RuntimeBackend.of(rt).jit_counters()
    assert stats["jit_compiles"] >= 2 and stats["jit_cache_hits"] >= 2

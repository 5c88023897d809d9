"""Deterministic inference (`deterministic=True`, `--enable-deterministic-inference`) on the GPU: a
greedy request's tokens are the same alone, in any batch, in any order, next to prefills of other
prompts, with other chunk sizes and from a warm prefix cache. The model has random weights, whose
nearly flat logits make greedy decoding as sensitive to the last bit as a model can be."""

from __future__ import annotations

import random
import threading

import pytest
import torch

import sgjit

pytestmark = pytest.mark.gpu

MODEL = "random:smollm2-135m"
PARAMS = {"temperature": 0.0, "max_new_tokens": 40, "ignore_eos": True}


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = [3, 9, 60, 150, 333, 700, 1100] + [int(x) for x in torch.randint(2, 400, (n - 7,), generator=g)]
    return [torch.randint(1000, 40000, (n_,), generator=g).tolist() for n_ in lens[:n]]


def runtime(chunk: int, max_running: int = 64) -> sgjit.Runtime:
    return sgjit.Runtime(
        MODEL, device="cuda", enable_jit=True, deterministic=True, seed=0, max_total_tokens=64 * 1024,
        max_model_len=2048, chunked_prefill_size=chunk, max_running_requests=max_running,
    )  # fmt: skip


@pytest.fixture(scope="module")
def rts():
    a, b = runtime(chunk=256), runtime(chunk=64, max_running=8)
    yield a, b
    a.shutdown()
    b.shutdown()


def gen(rt: sgjit.Runtime, ids: list[list[int]]) -> list[list[int]]:
    return [o["output_ids"] for o in rt.generate(input_ids=ids, sampling_params=PARAMS)]


def test_tokens_do_not_depend_on_the_batch(rts):
    rt, other = rts
    ids = prompts(24)
    alone = []
    for p in ids:
        rt.flush_cache()
        alone.append(gen(rt, [p])[0])
    rt.flush_cache()
    order = list(range(len(ids)))
    random.Random(0).shuffle(order)
    together = gen(rt, [ids[i] for i in order])
    assert [together[order.index(i)] for i in range(len(ids))] == alone
    # again, from a warm prefix cache (whole-prompt hits recompute one token: a decode-shaped step)
    assert gen(rt, ids) == alone
    # another runtime: chunks of 64 tokens, at most 8 rows a step, the prompts in reverse
    assert gen(other, ids[::-1])[::-1] == alone


def test_tokens_do_not_depend_on_concurrent_arrivals(rts):
    """Requests arriving while others decode share steps with prefill chunks (mixed batches)."""
    rt, _ = rts
    ids = prompts(16, seed=1)
    rt.flush_cache()
    alone = [gen(rt, [p])[0] for p in ids]
    rt.flush_cache()
    results: dict[int, list[int]] = {}

    def one(i: int) -> None:
        results[i] = gen(rt, [ids[i]])[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ids))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(ids))] == alone

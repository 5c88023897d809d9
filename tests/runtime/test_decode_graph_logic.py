"""The bucketed decode path of `DecodeGraphs` (the one CUDA graphs capture), run eagerly on CPU: static
buffers, padding rows on the scratch page, multi-step decoding with on-device stop checks, pages
reserved ahead by the scheduler. The GPU tests then check that graph replay equals this path."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import sgjit
from sgjit.runtime.cuda_graph import _HostTwins, batch_buckets
from sgjit.runtime.kv_pool import SCRATCH_PAGE

from conftest import GREEDY, assert_no_leaked_pages


def test_batch_buckets():
    assert batch_buckets(256)[:12] == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80]
    assert batch_buckets(256)[-1] == 256 and batch_buckets(20)[-1] == 20


@pytest.fixture(scope="module")
def bucketed():
    """The bucketed decode path on the CPU (`bucketed_decode=True`), one runtime per steps a launch."""
    made: dict[int, sgjit.Runtime] = {}

    def get(steps: int) -> sgjit.Runtime:
        if steps not in made:
            made[steps] = sgjit.Runtime(
                device="cpu", max_total_tokens=4096, max_model_len=1024, bucketed_decode=True,
                cuda_graph_max_bs=8, multi_step=steps,
            )  # fmt: skip
        return made[steps]

    yield get
    for rt in made.values():
        rt.shutdown()


@pytest.mark.parametrize("steps", [1, 4])
def test_bucketed_decode_matches_plain_decode(runtime, bucketed, steps):
    rt = bucketed(steps)
    prompts = ["The capital of France is", "1, 2, 3, 4,", "def add(a, b):"]
    params = [{**GREEDY, "max_new_tokens": n} for n in (7, 12, 5)]
    ref = runtime.generate(prompts, params)
    before = rt.stats()["multi_step_launches"]
    out = rt.generate(prompts, params)
    assert (rt.stats()["multi_step_launches"] > before) == (steps > 1)
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in ref]
    assert [o["meta_info"]["finish_reason"] for o in out] == [o["meta_info"]["finish_reason"] for o in ref]
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    a = rt.chat(chat, {**GREEDY, "max_new_tokens": 30})
    assert a["text"] == runtime.chat(chat, {**GREEDY, "max_new_tokens": 30})["text"]  # stops at EOS
    assert_no_leaked_pages(rt)


def test_sampled_multi_step_matches_single_steps(runtime, bucketed):
    """Seeded sampling inside a multi-step launch draws exactly the tokens single steps draw (the
    Philox counter is the token index, advanced on the device); unseeded rows sample too."""
    rt = bucketed(4)
    prompts = ["Once upon a time", "My favourite colour is", "def add(a, b):"]
    params = [
        {"temperature": 0.8, "top_p": 0.9, "seed": 11, "max_new_tokens": 13, "ignore_eos": True},
        {"temperature": 1.0, "top_k": 20, "seed": 12, "max_new_tokens": 9, "ignore_eos": True},
        {"temperature": 0.7, "min_p": 0.05, "seed": 13, "max_new_tokens": 11, "ignore_eos": True},
    ]
    ref = runtime.generate(prompts, params)
    before = rt.stats()["multi_step_launches"]
    out = rt.generate(prompts, params)
    assert rt.stats()["multi_step_launches"] > before
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in ref]
    greedy = runtime.generate(prompts, [{**p, "temperature": 0.0} for p in params])
    assert [o["output_ids"] for o in out] != [o["output_ids"] for o in greedy]  # it did sample
    unseeded = rt.generate(prompts, [{**p, "seed": None} for p in params])
    assert [len(o["output_ids"]) for o in unseeded] == [13, 9, 11]
    assert_no_leaked_pages(rt)


class _ContextFreeAttention:
    """The reference attention, claiming (as the CUDA op does at large batches) that its decode launch
    does not depend on the context bound from 2 rows up."""

    def __init__(self, attention):
        self.attention = attention

    def __call__(self, *args):
        return self.attention(*args)

    def decode_launch(self, rows: int, max_kv_len: int) -> tuple[str, int]:
        return ("split", 1) if rows > 1 else ("split", max_kv_len)


def test_one_graph_serves_every_context_where_the_launch_allows(runtime):
    """Where the attention op launches the same grid for any context bound, the graph of a batch
    bucket is the whole-context one; its page table then goes over only as wide as the rows use,
    and the tokens still equal plain decoding's."""
    rt = sgjit.Runtime(
        device="cpu", max_total_tokens=4096, max_model_len=1024, bucketed_decode=True, cuda_graph_max_bs=8,
        multi_step=4,
    )  # fmt: skip
    try:
        graphs = rt.engine.runner.graphs
        graphs.model.ops.attention = _ContextFreeAttention(graphs.model.ops.attention)
        assert graphs.context_bucket(100, 1) == 512
        assert graphs.context_bucket(100, 2) == graphs.context_bucket(900, 8) == graphs.max_context == 1024
        prompts = ["The capital of France is", "1, 2, 3, 4,", "def add(a, b):"]
        params = [{**GREEDY, "max_new_tokens": n} for n in (7, 12, 5)]
        out = rt.generate(prompts, params)
        assert 1024 in graphs._buffers  # the steps of several rows ran on the whole-context buffers
        assert [o["output_ids"] for o in out] == [o["output_ids"] for o in runtime.generate(prompts, params)]
        assert_no_leaked_pages(rt)
    finally:
        rt.shutdown()


def test_page_tables_keep_rows_between_loads():
    """The pinned page tables rewrite only the pages a row gained since they last held it, yet every
    load sends what filling them afresh sends: each row's pages (cut to the table's width), then the
    scratch page, and padding rows on the scratch page alone. Page lists grow, get replaced, move
    between rows and leave, over two tables used in turn as loads use them."""
    rng = random.Random(0)
    max_bs, cols = 16, 10
    tables = [
        _HostTwins(
            torch.zeros(0), torch.zeros(0), torch.full((max_bs, cols), SCRATCH_PAGE, dtype=torch.int32)
        )
        for _ in range(2)
    ]
    lists = [[rng.randint(1, 99) for _ in range(rng.randint(1, 5))] for _ in range(20)]
    for load in range(3000):
        for j in range(len(lists)):
            if rng.random() < 0.2:
                lists[j].append(rng.randint(1, 99))  # a row gains a page
            elif rng.random() < 0.03:
                lists[j] = [rng.randint(1, 99) for _ in range(rng.randint(1, 14))]  # another request
        n = rng.randint(1, max_bs)
        bs = min(b for b in (1, 2, 4, 8, 16) if b >= n)
        rows = rng.sample(lists, n) if rng.random() < 0.3 else lists[:n]
        host = tables[load % 2]
        host.fill_table(rows, bs)
        expected = np.full((bs, cols), SCRATCH_PAGE, dtype=np.int32)
        for i, pages in enumerate(rows):
            expected[i, : min(len(pages), cols)] = pages[:cols]
        assert (host.table[:bs].numpy() == expected).all(), load

"""Overlap scheduling on a GPU (issue 14): with the JIT (CUDA graphs, multi-step launches) the engine
queues the next step before it reads the last one back. Its answers equal the same engine's with
overlap off, and the launch path never waits for the device (torch's sync debug mode, set to raise
while the engine launches, stays silent). Both runtimes are deterministic: with overlap a launch may
carry a row that has just finished (its tokens are dropped), so batch shapes differ between the
two, and only batch-invariant kernels make greedy tokens independent of that."""

from __future__ import annotations

import pytest
import torch

import sgjit

pytestmark = pytest.mark.gpu

MODEL = "random:smollm2-135m"


@pytest.fixture(scope="module")
def pair():
    common = dict(device="cuda", max_total_tokens=64 * 512, seed=0, enable_jit=True, deterministic=True)
    plain = sgjit.Runtime(MODEL, overlap_schedule=False, **common)
    overlapped = sgjit.Runtime(MODEL, overlap_schedule=True, **common)
    yield plain, overlapped
    plain.shutdown()
    overlapped.shutdown()


def _prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1000, 40000, (int(torch.randint(4, 60, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]  # fmt: skip


def _params(plain) -> tuple[list[list[int]], list[dict]]:
    """Twelve requests that end every way: max_new_tokens, a stop string and a stop token taken
    from the plain engine's own answer (so they are hit mid-launch), EOS, seeded sampling."""
    ids = _prompts(12, seed=5)
    probe = plain.generate(
        input_ids=ids, sampling_params={"temperature": 0.0, "max_new_tokens": 40, "ignore_eos": True}
    )
    params = []
    for i, p in enumerate(probe):
        kind = i % 4
        if kind == 0:
            params.append({"temperature": 0.0, "max_new_tokens": 5 + 7 * i, "ignore_eos": True})
        elif kind == 1:
            params.append({"temperature": 0.0, "max_new_tokens": 40, "stop": [p["text"][20:23]]})
        elif kind == 2:
            params.append({"temperature": 0.0, "max_new_tokens": 40, "stop_token_ids": [p["output_ids"][13]]})
        else:
            params.append({"temperature": 0.8, "top_p": 0.9, "seed": i, "max_new_tokens": 30})
    return ids, params


def test_overlap_answers_equal_no_overlap(pair):
    plain, overlapped = pair
    ids, params = _params(plain)
    want = plain.generate(input_ids=ids, sampling_params=params)
    before = overlapped.stats()
    got = overlapped.generate(input_ids=ids, sampling_params=params)
    after = overlapped.stats()
    assert [(o["output_ids"], o["meta_info"]["finish_reason"]) for o in got] == [
        (o["output_ids"], o["meta_info"]["finish_reason"]) for o in want
    ]
    assert after["overlapped_launches"] > before["overlapped_launches"]
    assert after["multi_step_launches"] > before["multi_step_launches"]
    overlapped.flush_cache()
    s = overlapped.stats()
    assert s["kv_pages_free"] == s["kv_pages_total"]


def test_launch_path_never_waits_for_the_device(pair):
    """Scheduling, building, loading the graphs' buffers, replay, sampling and queueing the read-back
    run with sync debug mode "error": a blocking copy or a host sync there would raise."""
    plain, overlapped = pair
    ids, params = _params(plain)
    for _ in range(2):  # every graph shape the run needs is captured (a capture synchronizes)
        overlapped.generate(input_ids=ids, sampling_params=params)
    engine = overlapped.engine
    launch = engine._launch
    errors: list[BaseException] = []

    def strict():
        torch.cuda.set_sync_debug_mode("error")
        try:
            return launch()
        except BaseException as e:
            errors.append(e)
            raise
        finally:
            torch.cuda.set_sync_debug_mode(0)

    engine._launch = strict
    try:
        got = overlapped.generate(input_ids=ids, sampling_params=params)
    finally:
        del engine._launch
    assert not errors, errors[0]
    want = plain.generate(input_ids=ids, sampling_params=params)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]

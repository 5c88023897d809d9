"""Programmatic dependent launch (kernels/cuda/pdl.py): captured decode graphs whose GEMV and
attention kernels start during the previous kernel's tail compute the very tokens that plain
launches compute. GPU only, compute capability 9.0+ (below it the launches are plain)."""

from __future__ import annotations

import pytest
import torch

import sgjit
from sgjit.kernels import selector
from sgjit.kernels.cuda import module

pytestmark = pytest.mark.gpu


def _prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(n)
    return [torch.randint(1000, 30000, (int(torch.randint(5, 90, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]  # fmt: skip


@pytest.mark.parametrize("model", ["random:smollm2-135m", "random:llama3-8b:4"])
def test_dependent_launches_change_no_token(model, monkeypatch):
    """Greedy tokens of 1 and 5 rows over 160 steps (contexts across pages and several key splits),
    multi-step graphs captured with the overlapping launches and without: the same tokens. Random
    weights give near-flat logits, so a read that raced its producer would show as a changed token."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs compute capability 9.0+")
    # every shape on dependent launches (whatever the selector would choose)
    monkeypatch.setattr(selector, "_dependent_launch", lambda profile: (True, "test"))
    calls = []
    real = module.launch_dependent
    monkeypatch.setattr(module, "launch_dependent", lambda *a: calls.append(1) or real(*a))
    params = {"temperature": 0.0, "max_new_tokens": 160, "ignore_eos": True}
    outputs = {}
    for pdl in ("1", "0"):
        monkeypatch.setenv("SGJIT_PDL", pdl)
        calls.clear()
        rt = sgjit.Runtime(model, device="cuda", enable_jit=True, multi_step=8, max_total_tokens=8192, seed=0)
        try:
            outputs[pdl] = [
                [o["output_ids"] for o in rt.generate(input_ids=_prompts(n), sampling_params=params)]
                for n in (1, 5)
            ]
        finally:
            rt.shutdown()
        assert (len(calls) > 0) == (pdl == "1"), f"SGJIT_PDL={pdl}: {len(calls)} dependent launches"
    assert outputs["1"] == outputs["0"]

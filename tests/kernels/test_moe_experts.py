"""The `moe_experts` op: the reference (the CPU path and every GPU test's oracle) against the plain
definition — each token's chosen experts run one by one, weighted and summed in float64 — on ragged
expert loads, an expert no token picks, one expert taking every token, and a single token; and the
grouped path's sort / offsets / unsort run through torch's own `_grouped_mm` on the CPU (its loop
over groups), which must land on the reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sgjit.kernels import reference
from sgjit.kernels.grouped_moe import moe_experts_grouped
from sgjit.kernels.synthetic import moe_experts_case


def by_definition(x, ids, weights, w_gate_up, w_down) -> torch.Tensor:
    x, wg, wd = x.double(), w_gate_up.double(), w_down.double()
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t].tolist()):
            gate, up = F.linear(x[t], wg[e]).chunk(2)
            out[t] += weights[t, j].double() * F.linear(F.silu(gate) * up, wd[e])
    return out


CASES = [
    # n, experts, top-k, hidden, expert width, load
    (1, 8, 2, 32, 16, "uniform"),
    (37, 8, 2, 32, 16, "skewed"),
    (64, 16, 4, 48, 24, "uniform"),
    (21, 6, 3, 40, 8, "one"),
    (5, 4, 1, 16, 32, "skewed"),
]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("n,e,k,h,i,load", CASES)
def test_reference_is_the_definition(n, e, k, h, i, load):
    args = moe_experts_case(n, e, k, h, i, torch.float32, "cpu", load).args
    counts = torch.bincount(args[1].flatten(), minlength=e)
    if load == "skewed":
        assert counts[1] == 0  # an expert without tokens is skipped, not run on nothing
    out = reference.moe_experts(*args)
    assert out.dtype == torch.float32 and out.shape == (n, h)
    assert rel(out, by_definition(*args)) < 1e-6


@pytest.mark.parametrize("n,e,k,h,i,load", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_path_matches_reference(n, e, k, h, i, load, dtype):
    args = moe_experts_case(n, e, k, h, i, dtype, "cpu", load, seed=1).args
    try:
        out = moe_experts_grouped(*args)
    except (NotImplementedError, RuntimeError) as err:  # torch builds without a CPU _grouped_mm
        pytest.skip(f"torch {torch.__version__} has no CPU _grouped_mm: {err}")
    ref = reference.moe_experts(*args)
    assert out.dtype == dtype and out.shape == ref.shape
    # float32: the same products summed in another order; bf16: the reference sums rounded
    # per-expert products in float32 too, so both sit within a rounding or two of each other
    assert rel(out, ref) < (1e-6 if dtype == torch.float32 else 1e-2)

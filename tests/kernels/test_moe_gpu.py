"""The grouped MoE op (`torch._grouped_mm`) on the GPU against the reference op, in bf16 on real
expert shapes (Qwen3-30B-A3B, Mixtral-8x7B, Qwen1.5-MoE) with even, skewed (an expert without
tokens) and one-expert loads, from one token to a prefill chunk; the oracle is the reference on the
same inputs upcast to float32. Then the op captured in a CUDA graph and replayed on new routings,
the selector's choice on this device, and a `random:` MoE model served with the JIT (graphs
captured) giving the same greedy tokens as the same steps run eagerly. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from sgjit.errors import ModelNotFoundError
from sgjit.kernels import reference
from sgjit.kernels.arch import device_profile
from sgjit.kernels.grouped_moe import GROUPED_ARCHS, moe_experts_grouped
from sgjit.kernels.selector import KernelSelector
from sgjit.kernels.spec import ModelShapes
from sgjit.kernels.synthetic import moe_experts_case
from sgjit.runtime.model.presets import shape_config

pytestmark = pytest.mark.gpu
DEV = "cuda"
TOL = 1.5e-2  # bf16 operands and GEMM outputs: about two output roundings, relative


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert not torch.isnan(a).any()
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def grouped_on_this_gpu() -> bool:
    return device_profile(DEV).compute_capability[0] in GROUPED_ARCHS


CASES = [
    # n, experts, top-k, hidden, expert width, load
    (1, 128, 8, 2048, 768, "uniform"),  # Qwen3-30B-A3B decode, one row
    (7, 128, 8, 2048, 768, "skewed"),
    (64, 128, 8, 2048, 768, "uniform"),
    (2048, 128, 8, 2048, 768, "skewed"),  # a prefill chunk
    (1, 8, 2, 4096, 14336, "uniform"),  # Mixtral-8x7B
    (300, 8, 2, 4096, 14336, "one"),
    (33, 60, 4, 2048, 1408, "skewed"),  # Qwen1.5-MoE-A2.7B
]


@pytest.mark.parametrize("n,e,k,h,i,load", CASES)
def test_grouped_matches_reference(n, e, k, h, i, load):
    if not grouped_on_this_gpu():
        pytest.skip("torch's grouped GEMM kernel needs sm_90 or sm_100")
    case = moe_experts_case(n, e, k, h, i, torch.bfloat16, DEV, load, seed=n)
    if load == "skewed":
        assert torch.bincount(case.topk_ids.flatten(), minlength=e)[1] == 0
    out = moe_experts_grouped(*case.args)
    exact = [t.float() if t.is_floating_point() else t for t in case.args]
    oracle = reference.moe_experts(*exact)
    ref = reference.moe_experts(*case.args)
    assert out.dtype == torch.bfloat16 and out.shape == (n, h)
    err, ref_err = rel(out, oracle), rel(ref, oracle)
    assert err < TOL, f"grouped {err:.2e} vs bf16 reference {ref_err:.2e} from fp32"


def test_grouped_replays_in_a_cuda_graph():
    """No host sync inside: captured once, replayed on routings with other expert loads, it gives
    what an eager call gives, bit for bit."""
    if not grouped_on_this_gpu():
        pytest.skip("torch's grouped GEMM kernel needs sm_90 or sm_100")
    static = moe_experts_case(16, 128, 8, 2048, 768, torch.bfloat16, DEV, "uniform", seed=0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        moe_experts_grouped(*static.args)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe_experts_grouped(*static.args)
    for seed, load in ((1, "skewed"), (2, "one"), (3, "uniform")):
        new = moe_experts_case(16, 128, 8, 2048, 768, torch.bfloat16, DEV, load, seed=seed)
        for dst, src in zip(
            (static.x, static.topk_ids, static.topk_weights), (new.x, new.topk_ids, new.topk_weights)
        ):
            dst.copy_(src)
        graph.replay()
        assert torch.equal(out, moe_experts_grouped(*static.args)), load


def test_selector_choice_on_this_gpu():
    shapes = ModelShapes.from_config(shape_config("qwen3-30b-a3b"), torch.bfloat16, torch.bfloat16, 16)
    choice = KernelSelector().select(device_profile(DEV), shapes)["moe_experts"]
    assert choice.variant == ("grouped_mm" if grouped_on_this_gpu() else "reference"), choice.reason


def test_random_moe_model_graphs_match_eager_steps():
    """`random:qwen3-30b-a3b` (two layers) with the JIT: its decode steps captured as graphs give
    the tokens the same bucketed steps give run eagerly (the bundled tokenizer is needed)."""
    import sgjit
    from sgjit.runtime.loader.resolve import bundled_model_path

    try:
        bundled_model_path("smollm2-135m")
    except ModelNotFoundError:
        pytest.skip("the bundled SmolLM2 (its tokenizer) is not installed here")
    prompts = [[1, 2, 3, 4], list(range(100, 400)), [7] * 33]
    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    outs = []
    for graphs in (True, False):
        with sgjit.Runtime(
            "random:qwen3-30b-a3b:2", device="cuda", enable_jit=True, cuda_graph=graphs, max_total_tokens=4096
        ) as rt:
            outs.append([o["output_ids"] for o in rt.generate(input_ids=prompts, sampling_params=params)])
            if grouped_on_this_gpu():
                assert rt.kernel_set["moe_experts"].variant == "grouped_mm"
                assert not rt.ops.moe_experts.failed
    assert outs[0] == outs[1]
    assert all(len(o) == 24 for o in outs[0])

"""The GEMV kernel (gemv.cu) and the FP8 linear on the GPU, against fp32 products of the same
values: bf16/fp16 and FP8 weights, every row bucket and ragged row counts, widths that are not
multiples of a warp's stride, bias, strided inputs, CUDA-graph replay, and rows that do not depend
on their batch neighbours. Then a whole model with FP8 weights on the kernels. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sgjit.kernels.fp8 import Fp8Weight, fp8_matmul_fits, linear_reference, scaled_mm_available

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
ROWS = (1, 2, 3, 5, 8, 13, 16)
SHAPES = ((6144, 4096), (4097, 272), (1000, 80), (129, 16))  # (N, K): ragged warps and K strides


@pytest.fixture(scope="module", params=["fma", "mma"])
def gemv(request):
    """GemvLinear for up to 16 rows: `fma` on gemv.TILES for both weight kinds, `mma` on the
    tensor-core body for 16-bit weights (gemv.MMA_TILES) and FP8 weights on their own default
    (gemv.FP8_TILES)."""
    from sgjit.kernels.cuda.gemv import MMA_TILES, TILES, GemvLinear

    tiles = MMA_TILES if request.param == "mma" else TILES
    return {
        dt: GemvLinear(dt, name, 16, 16, tiles=tiles)
        for dt, name in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16"))
    }


def _close(out: torch.Tensor, exact: torch.Tensor) -> None:
    """Within one rounding of the output dtype plus fp32 summation-order noise."""
    eps = torch.finfo(out.dtype).eps
    tol = exact.abs() * eps + 1e-4 * exact.abs().max()
    assert bool(((out.float() - exact).abs() <= tol).all()), (out.float() - exact).abs().max().item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", SHAPES)
def test_dense_gemv_matches_fp32(gemv, dtype, n, k):
    g = torch.Generator(device=DEV).manual_seed(n + k)
    w = torch.randn(n, k, device=DEV, generator=g).to(dtype) / k**0.5
    bias = torch.randn(n, device=DEV, generator=g).to(dtype)
    for m in ROWS:
        x = torch.randn(m, k, device=DEV, generator=g).to(dtype)
        for b in (None, bias):
            out = gemv[dtype](x, w, b)
            exact = F.linear(x.float(), w.float(), None if b is None else b.float())
            assert out.shape == (m, n) and out.dtype == dtype
            _close(out, exact)


@pytest.mark.parametrize("n,k", SHAPES)
def test_fp8_gemv_matches_the_reference(gemv, n, k):
    g = torch.Generator(device=DEV).manual_seed(7 * n + k)
    w = Fp8Weight.quantize(
        torch.randn(n, k, device=DEV, generator=g) * torch.rand(n, 1, device=DEV, generator=g)
    )
    bias = torch.randn(n, device=DEV, generator=g).bfloat16()
    for m in ROWS:
        x = torch.randn(m, k, device=DEV, generator=g).bfloat16()
        out = gemv[torch.bfloat16](x, w, bias)
        exact = (x.float() @ w.data.float().T) * w.scale + bias.float()
        _close(out, exact)
        assert torch.equal(linear_reference(x, w, bias), exact.bfloat16())


def test_rows_do_not_depend_on_their_batch(gemv):
    """Each row is its own reduction: the same row alone or among 15 others gives the same bits (the
    FMA and the tensor-core bodies alike: each takes a row's sums in one order whatever the rows)."""
    w = torch.randn(4096, 4096, device=DEV).bfloat16()
    w8 = Fp8Weight.quantize(w)
    op = gemv[torch.bfloat16]
    x = torch.randn(16, 4096, device=DEV).bfloat16()
    for weight in (w, w8):
        batch = op(x, weight)
        for m in (1, 3, 8):
            assert torch.equal(op(x[:m], weight), batch[:m])


def test_strided_input_and_graph_replay(gemv):
    k, n = 264, 520
    big = torch.randn(4, k + 3, device=DEV).bfloat16()
    x = big[:, :k]  # row stride k + 3: not 16-byte aligned, copied first
    w = torch.randn(n, k, device=DEV).bfloat16()
    _close(gemv[torch.bfloat16](x, w), F.linear(x.float(), w.float()))
    static = torch.randn(2, k, device=DEV).bfloat16()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        gemv[torch.bfloat16](static, w)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv[torch.bfloat16](static, w)
    static.copy_(torch.randn(2, k, device=DEV).bfloat16())
    graph.replay()
    torch.cuda.synchronize()
    _close(out, F.linear(static.float(), w.float()))


def test_fp8_gemm_for_larger_batches(gemv):
    """Past the GEMV's rows: cuBLASLt's FP8 GEMM with per-token activation scales, within the
    activations' e4m3 rounding of the exact product."""
    if not scaled_mm_available(0):
        pytest.skip("no FP8 tensor cores on this GPU")
    w = Fp8Weight.quantize(torch.randn(1024, 512, device=DEV))
    for m in (17, 64, 300):
        x = torch.randn(m, 512, device=DEV).bfloat16()
        assert fp8_matmul_fits(x, w)
        out = gemv[torch.bfloat16](x, w)
        exact = linear_reference(x, w).float()
        rel = ((out.float() - exact).norm() / exact.norm()).item()
        assert rel < 0.04, rel


def test_runtime_serves_fp8_weights_on_the_kernels():
    """quantization='fp8' on a random-weight SmolLM2 shape: layers in FP8, the GEMV and the FP8
    GEMM used without falling back, greedy tokens mostly those of the bf16 weights."""
    import sgjit

    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    prompts = [[1, 2, 3, 4], list(range(100, 180)), [7] * 33]
    outs = {}
    for q in ("fp8", "none"):
        with sgjit.Runtime(
            "random:smollm2-135m", device="cuda", enable_jit=True, max_total_tokens=4096, quantization=q
        ) as rt:
            if q == "fp8":
                assert isinstance(rt.model.layers[0].qkv, Fp8Weight)
                assert rt.kernel_set["linear"].variant == "cuda"
            outs[q] = [rt.generate(input_ids=p, sampling_params=params)["output_ids"] for p in prompts]
            assert not rt.ops.linear.failed
    same = sum(a == b for x, y in zip(outs["fp8"], outs["none"]) for a, b in zip(x, y))
    print(f"\nfp8 vs bf16 greedy tokens equal: {same}/{24 * len(prompts)}")
    assert all(len(o) == 24 for o in outs["fp8"])

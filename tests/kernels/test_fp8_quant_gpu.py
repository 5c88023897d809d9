"""fp8_quant.cu: per-token e4m3 of activations in one launch, bit for bit what `fp8.quantize_rows` (the
torch definition) gives: bf16 and fp16, one row and prefill-sized batches, zero rows, rows whose
scale hits the 1e-12 floor, values past e4m3's range relative to their row, strided rows, rows the
kernel does not take (the glue's torch fallback), and CUDA-graph replay. Then the CUDA linear op's
FP8 GEMM, which must give the bits of the same GEMM after torch's quantize. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from sgjit.kernels.fp8 import FP8, Fp8Weight, linear_scaled_mm, quantize_rows, scaled_mm_available

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


@pytest.fixture(scope="module")
def quant():
    from sgjit.kernels.cuda.fp8_quant import Fp8Quantize

    return {dt: Fp8Quantize(dt, name) for dt, name in DTYPES.items()}


def _poison_fp8(nbytes: int) -> None:
    """Leave 0xFF bytes (e4m3fn NaN) in the allocator's next block of this size: an element the
    kernel never wrote then fails the comparison."""
    block = torch.full((nbytes,), 255, dtype=torch.uint8, device=DEV)
    del block


def _assert_same_bits(got: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor) -> None:
    data, scale = got
    ref_data, ref_scale = quantize_rows(x)
    assert data.dtype == FP8 and data.shape == x.shape and scale.shape == (x.shape[0], 1)
    assert scale.dtype == torch.float32
    assert torch.equal(scale, ref_scale), (scale - ref_scale).abs().max().item()
    diff = (data.view(torch.uint8) != ref_data.view(torch.uint8)).nonzero()
    assert diff.numel() == 0, f"{diff.shape[0]} bytes differ, first at {diff[0].tolist()}"


def _rows(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rows of very different magnitudes (1e-6 .. 1e3, within fp16's range), heavy-tailed within a row."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    mag = torch.logspace(-6, 3, m, device=DEV)[torch.randperm(m, device=DEV, generator=g)]
    x = torch.randn(m, k, device=DEV, generator=g) ** 3 * mag[:, None]
    return x.to(dtype)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("m,k", [(1, 4096), (512, 4096), (37, 14336), (5, 8), (3, 136), (2048, 6144)])
def test_quantize_equals_torch_bit_for_bit(quant, dtype, m, k):
    x = _rows(m, k, dtype, m * k)
    _poison_fp8(m * k)
    _assert_same_bits(quant[dtype].rows(x), x)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_zero_tiny_and_saturating_rows(quant, dtype):
    """A zero row (scale 1e-12, all zeros), rows below the scale floor (amax / 448 < 1e-12 in bf16;
    fp16's smallest values in fp16), a row of one huge value among small ones (the small ones flush
    into e4m3's subnormals and zero), the dtype's largest finite values, and signed zeros."""
    k = 4096
    x = _rows(8, k, dtype, 3)
    x[0] = 0
    x[1] = torch.randn(k, device=DEV) * (1e-11 if dtype == torch.bfloat16 else 1e-7)
    x[2, 17] = torch.finfo(dtype).max
    x[3] = torch.finfo(dtype).max * torch.sign(torch.randn(k, device=DEV))
    x[4] = -0.0
    x[5, ::2] = -x[5, ::2]
    _assert_same_bits(quant[dtype].rows(x), x)


def test_the_torch_definition_gives_the_same_bits_on_cpu_and_gpu():
    """quantize_rows multiplies by 1/448 rather than dividing (torch turns a division by a scalar into
    that product on a GPU only), so the definition the kernel matches holds on either device."""
    x = _rows(256, 4096, torch.bfloat16, 11)
    data, scale = quantize_rows(x)
    cpu_data, cpu_scale = quantize_rows(x.cpu())
    assert torch.equal(scale.cpu(), cpu_scale)
    assert torch.equal(data.cpu().view(torch.uint8), cpu_data.view(torch.uint8))


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_rows_the_kernel_does_not_take_fall_back_to_torch(quant, dtype):
    """Odd widths, odd row strides and empty batches take the torch version (same results); a column
    slice whose row stride is a multiple of 8 goes through the kernel, reading only its columns."""
    x = _rows(9, 4099, dtype, 5)
    _assert_same_bits(quant[dtype].rows(x), x)
    _assert_same_bits(quant[dtype].rows(x[:, :4096]), x[:, :4096])  # stride 4099: fallback
    wide = _rows(9, 4104, dtype, 6)
    view = wide[:, 8:4104]
    assert view.stride(0) % 8 == 0 and view.data_ptr() % 16 == 0
    _assert_same_bits(quant[dtype].rows(view), view)
    empty = torch.empty(0, 4096, dtype=dtype, device=DEV)
    data, scale = quant[dtype].rows(empty)
    assert data.shape == (0, 4096) and scale.shape == (0, 1)


def test_quantize_replays_in_a_cuda_graph(quant):
    static = _rows(64, 4096, torch.bfloat16, 7)
    q = quant[torch.bfloat16]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        q.rows(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = q.rows(static)
    for seed in (8, 9):
        static.copy_(_rows(64, 4096, torch.bfloat16, seed))
        graph.replay()
        torch.cuda.synchronize()
        _assert_same_bits(out, static)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_fp8_linear_on_the_kernel_equals_torch_quantize_then_the_same_gemm(dtype):
    """The CUDA linear op past its GEMV rows: fp8_quant.cu then torch._scaled_mm, the same bits as
    `linear_scaled_mm` with torch's quantize (the reference op's path on this GPU), bias included."""
    from sgjit.kernels.cuda.gemv import GemvLinear

    if not scaled_mm_available(0):
        pytest.skip("no FP8 tensor cores on this GPU")
    op = GemvLinear(dtype, DTYPES[dtype], 0, 4)
    w = Fp8Weight.quantize(torch.randn(1024, 4096, device=DEV) / 64)
    bias = torch.randn(1024, device=DEV).to(dtype)
    for m in (5, 512, 1000):
        x = _rows(m, 4096, dtype, m).reshape(1, m, 4096)
        for b in (None, bias):
            # bit for bit; fp16 rows of dtype-max values overflow the GEMM to inf/NaN in both alike
            torch.testing.assert_close(op(x, w, b), linear_scaled_mm(x, w, b), rtol=0, atol=0, equal_nan=True)

"""FP8 (e4m3) weights with one float32 scale per output channel: `w[n, k] ~= data[n, k] * scale[n]`.

bf16 checkpoints are quantized at load (`Fp8Weight.quantize`, the scale from each row's absolute
maximum); FP8 checkpoints arrive as stored (`from_scaled`: a per-tensor or per-channel scale, or
`from_block_scaled`: DeepSeek's 128x128 block scales, re-quantized per channel, which costs one
extra rounding where a row's blocks had different scales). Activations are quantized per token at
run time (dynamic scales), so no calibration is needed.

How a product runs: decode-sized batches go through sgjit's GEMV kernel (`gemv.cu`, fp8 widened in
registers, fp32 sums); larger ones through cuBLASLt's FP8 GEMM (`torch._scaled_mm` with row-wise
scales, the activations quantized in one launch by fp8_quant.cu) on GPUs that have FP8 tensor cores
(compute capability 8.9+); `linear_reference` (fp32 math on the dequantized weight) is the check for
both and what runs on the CPU."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
_TINY = 1e-12  # a zero row or token keeps a finite scale


@dataclass(slots=True)
class Fp8Weight:
    data: torch.Tensor  # float8_e4m3fn [N, K], row-major
    scale: torch.Tensor  # float32 [N]

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def device(self) -> torch.device:
        return self.data.device

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Fp8Weight:
        """Per-channel e4m3 of a [N, K] weight (round to nearest, the row's max at 448)."""
        w = w.float()
        scale = (w.abs().amax(dim=1) / FP8_MAX).clamp(min=_TINY)
        data = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        return cls(data.contiguous(), scale.contiguous())

    @classmethod
    def from_scaled(cls, data: torch.Tensor, scale: torch.Tensor) -> Fp8Weight:
        """A checkpoint's e4m3 weight with a per-tensor (one element) or per-channel ([N] or [N, 1])
        scale."""
        if data.dtype != FP8:
            raise ValueError(f"an FP8 weight must be float8_e4m3fn, got {data.dtype}")
        scale = scale.float().reshape(-1)
        if scale.numel() == 1:
            scale = scale.expand(data.shape[0])
        if scale.numel() != data.shape[0]:
            raise ValueError(f"weight_scale of {scale.numel()} values for a weight of {data.shape[0]} rows")
        return cls(data.contiguous(), scale.contiguous().clone())

    @classmethod
    def from_block_scaled(
        cls, data: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]
    ) -> Fp8Weight:
        """DeepSeek-style FP8 (`weight_scale_inv` [ceil(N/bn), ceil(K/bk)], w = data * scale_inv of
        its block), re-quantized with one scale per row: the row's largest block scale, so a row
        whose blocks share one scale keeps its bytes and the others' values shrink by their
        block's ratio to it (one more rounding, never an overflow)."""
        bn, bk = block
        n, k = data.shape
        rows = scale_inv.float().repeat_interleave(bn, 0)[:n]
        row_scale = rows.amax(dim=1).clamp(min=_TINY)
        ratio = (rows / row_scale[:, None]).repeat_interleave(bk, 1)[:, :k]
        return cls((data.float() * ratio).to(FP8).contiguous(), row_scale.contiguous())

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.data.float() * self.scale[:, None]).to(dtype)

    def to(self, device: torch.device) -> Fp8Weight:
        return Fp8Weight(self.data.to(device), self.scale.to(device))

    @staticmethod
    def cat(parts: list[Fp8Weight]) -> Fp8Weight:
        return Fp8Weight(torch.cat([p.data for p in parts]).contiguous(), torch.cat([p.scale for p in parts]))


def dequantize_blocks(
    data: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """A block-scaled e4m3 weight (`scale_inv` [ceil(N/bn), ceil(K/bk)], float or e8m0) as `dtype`
    with no re-quantization: exact in bf16 where the scales are powers of two (DeepSeek-V4's e8m0)."""
    bn, bk = block
    n, k = data.shape
    scale = scale_inv.float().repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return (data.float() * scale).to(dtype)


QuantizeRows = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token e4m3 of activations [M, K]: (data, float32 scales [M, 1]). The definition:
    the CUDA kernel (fp8_quant.cu) gives these bits in one launch. The amax is multiplied by the
    float32 reciprocal of 448, which is what torch's division by a scalar does on a GPU (and not on a
    CPU), so the bits are the same on every device."""
    xf = x.float()
    scale = (xf.abs().amax(dim=1, keepdim=True) * (1.0 / FP8_MAX)).clamp(min=_TINY)
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def linear_reference(x: torch.Tensor, w: Fp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ (data * scale).T + bias in fp32, rounded once to x's dtype: what the kernels approximate
    (the GEMV exactly up to summation order; the FP8 GEMM also rounds the activations to e4m3)."""
    y = (x.float() @ w.data.float().T) * w.scale
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


@functools.cache
def scaled_mm_available(device_index: int) -> bool:
    """cuBLASLt FP8 GEMMs need FP8 tensor cores (Ada / Hopper, compute capability 8.9+)."""
    return torch.cuda.get_device_capability(device_index) >= (8, 9) and hasattr(torch, "_scaled_mm")


def linear_scaled_mm(
    x: torch.Tensor, w: Fp8Weight, bias: torch.Tensor | None = None, quantize: QuantizeRows = quantize_rows
) -> torch.Tensor:
    """A batch of tokens times the FP8 weight on FP8 tensor cores: activations quantized per token
    (`quantize`: this torch version, or the CUDA op's one-launch kernel with the same bits), cuBLASLt
    scales rows by the token scale and columns by the channel scale in its epilogue."""
    lead, k = x.shape[:-1], x.shape[-1]
    xq, sx = quantize(x.reshape(-1, k))
    y = torch._scaled_mm(xq, w.data.t(), scale_a=sx, scale_b=w.scale[None, :], out_dtype=x.dtype)
    if bias is not None:
        y = y + bias
    return y.reshape(*lead, y.shape[-1])


def fp8_matmul_fits(x: torch.Tensor, w: Fp8Weight) -> bool:
    """What cuBLASLt's FP8 GEMM takes: 16-aligned inner and output widths, a 16-bit output."""
    return (
        x.is_cuda
        and x.dtype in (torch.bfloat16, torch.float16)
        and x.shape[-1] % 16 == 0
        and w.shape[0] % 16 == 0
        and scaled_mm_available(x.device.index or 0)
    )

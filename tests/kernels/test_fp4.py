"""FP4 e2m1 weights as DeepSeek-V4 releases its experts: two codes a byte (low nibble first), one e8m0
power-of-two scale per group of inputs. Dequantizing must give each code's OCP e2m1 value times its
group's scale, exactly, in bf16 as in float32."""

from __future__ import annotations

import pytest
import torch

from sgjit.kernels.fp4 import E2M1_VALUES, dequantize_e2m1, unpack_e2m1

# the OCP e2m1 value of each code: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0
_OCP = [
    (-1) ** (c >> 3) * ((1 + (c & 1) / 2) * 2 ** (((c >> 1) & 3) - 1) if (c >> 1) & 3 else (c & 1) / 2)
    for c in range(16)
]


def test_the_value_table_is_ocp_e2m1():
    assert list(E2M1_VALUES) == _OCP


def test_low_nibble_is_the_first_value():
    packed = torch.tensor([[0x21, 0xF7]], dtype=torch.uint8)  # codes 1, 2 then 7, 15
    assert unpack_e2m1(packed).tolist() == [[0.5, 1.0, 6.0, -6.0]]
    assert unpack_e2m1(packed.view(torch.int8)).tolist() == [[0.5, 1.0, 6.0, -6.0]]  # as safetensors I8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_applies_each_groups_e8m0_scale(dtype):
    g = torch.Generator().manual_seed(0)
    rows, k, group = 6, 128, 32
    codes = torch.randint(0, 16, (rows, k), generator=g, dtype=torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    exponents = torch.randint(117, 135, (rows, k // group), generator=g, dtype=torch.uint8)
    scale = exponents.view(torch.float8_e8m0fnu)  # as stored: 2 ** (byte - 127)
    want = torch.tensor(_OCP)[codes.long()] * (2.0 ** (exponents.double() - 127)).repeat_interleave(group, 1)
    got = dequantize_e2m1(packed, scale, dtype)
    assert got.dtype == dtype and got.shape == (rows, k)
    assert torch.equal(got.double(), want)  # exact: a small float times a power of two


def test_scales_that_do_not_tile_the_row_are_refused():
    packed = torch.zeros(2, 24, dtype=torch.uint8)  # 48 values a row
    with pytest.raises(ValueError, match="do not tile"):
        dequantize_e2m1(packed, torch.ones(2, 5))
    with pytest.raises(ValueError, match="do not tile"):
        dequantize_e2m1(packed, torch.ones(3, 3))

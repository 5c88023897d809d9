"""GGUF weights repacked at load into the panels `gemm.cpp` computes on: 16 output rows a panel,
one record per (panel, group of 32 inputs) holding the integers as the int16 pairs vpdpwssd takes
(two inputs a lane, lane r = output row r), then the group's scales (and mins): fp16 when every one
of them is exact in fp16 (Q4_0, Q4_1, Q8_0, whose own scales are fp16), else fp32 (Q4_K). The
layout is spelled out at the top of gemm.cpp. So Q4_0/Q4_1 read 0.625 byte a weight as in the file,
Q8_0 1.0625, Q4_K 0.75 (against its 0.5625)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sgjit.kernels.quant import GROUP, QuantWeight, decompose

PANEL = 16  # output rows a panel


@dataclass(frozen=True, slots=True)
class PanelWeight:
    data: torch.Tensor  # uint8 [panels, in / 32, record bytes]
    bits: int  # 4 (Q4_0, Q4_1, Q4_K) or 8 (Q8_0)
    half_scales: bool  # scales (and mins) stored as fp16, else fp32
    out_features: int
    in_features: int

    @property
    def address(self) -> int:
        return self.data.data_ptr()

    @property
    def nbytes(self) -> int:
        return self.data.numel()


def to_panels(w: QuantWeight) -> PanelWeight:
    q, scale, low = decompose(w)
    out, k = w.shape
    panels, groups = -(-out // PANEL), k // GROUP
    pad = panels * PANEL - out

    def by_panel(
        a: np.ndarray, dtype: type
    ) -> np.ndarray:  # [out, ...] -> [panels, 16, ...], zero rows padded
        a = np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)]) if pad else a
        return a.astype(dtype, copy=False).reshape(panels, PANEL, *a.shape[1:])

    scales = [a for a in (scale, low) if a is not None]
    half = all(np.array_equal(a.astype(np.float16).astype(np.float32), a) for a in scales)

    def floats(a: np.ndarray) -> np.ndarray:  # [out, groups] -> bytes [panels, groups, 32 or 64]
        return np.ascontiguousarray(by_panel(a, np.float16 if half else np.float32).transpose(0, 2, 1)).view(
            np.uint8
        )

    if low is None:  # 8-bit: chunk c (0..15) byte 2r+e = q[r][2c+e]
        ints = by_panel(q, np.int8).reshape(panels, PANEL, groups, 16, 2).transpose(0, 2, 3, 1, 4)
        parts = [np.ascontiguousarray(ints).view(np.uint8).reshape(panels, groups, 512), floats(scale)]
    else:  # 4-bit: chunk c (0..7) byte 2r+e = q[r][4c+e] | q[r][4c+2+e] << 4
        nib = by_panel(q, np.uint8).reshape(panels, PANEL, groups, 8, 4)
        packed = (nib[..., :2] | (nib[..., 2:] << 4)).transpose(0, 2, 3, 1, 4)
        parts = [np.ascontiguousarray(packed).reshape(panels, groups, 256), floats(scale), floats(low)]
    data = np.ascontiguousarray(np.concatenate(parts, axis=-1))
    return PanelWeight(torch.from_numpy(data), 4 if low is not None else 8, half, out, k)

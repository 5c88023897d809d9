"""Batch-invariant GEMMs for the deterministic mode. A GEMM library picks its algorithm (tile shape,
split-K, reduction order) from the problem's M, so the same token row multiplied as part of 1, 7 or
300 rows can come out different in its last bits, and greedy decoding then drifts apart. Running
every product in blocks of exactly `rows` rows (the last one zero-padded) gives the library one
problem shape per weight, whatever the batch: a row's result depends only on the row. Attention gets
the same property from its fixed key splits (`PagedAttention(split_len=...)`); the norm, RoPE,
activation and sampling kernels are per row already."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from sgjit.kernels.ops import Linear

INVARIANT_ROWS = 128  # one GEMM shape per weight: big enough for prefill, cheap for decode


def fixed_rows(linear: Linear, rows: int = INVARIANT_ROWS) -> Linear:
    """`linear` run in blocks of exactly `rows` rows."""

    def fixed_rows_linear(x: torch.Tensor, weight: Any, bias: torch.Tensor | None = None) -> torch.Tensor:
        lead, k = x.shape[:-1], x.shape[-1]
        flat = x.reshape(-1, k)
        n = flat.shape[0]
        padded = -(-max(n, 1) // rows) * rows
        if padded != n:
            flat = F.pad(flat, (0, 0, 0, padded - n))
        blocks = [linear(flat[i : i + rows], weight, bias) for i in range(0, padded, rows)]
        out = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
        return out[:n].reshape(*lead, out.shape[-1])

    fixed_rows_linear.rows = rows  # type: ignore[attr-defined]
    return fixed_rows_linear

"""What the decode-attention GPU tests (decode.cu, lean_decode.cu) share: their cases and their oracle.

Inputs come from `paged_attention_case`: shuffled pages, garbage in the tails of rows' last pages and
in the scratch page, NaN in every page no row owns, so a read past a row's keys or outside its pages
shows. The oracle is the reference op in float32 on the same (fp8: the same stored) keys; errors are
‖out − ref‖ / ‖ref‖ per row, within one rounding of P and of the output (bf16 2e-2, fp16 4e-3).
A config is (dtype, kv dtype, Hq, Hkv, head_dim, page)."""

from __future__ import annotations

import pytest
import torch

from sgjit.kernels import reference
from sgjit.kernels.spec import ModelShapes
from sgjit.kernels.synthetic import AttentionCase, paged_attention_case

DEV = "cuda"
BF16, FP16, FP8 = torch.bfloat16, torch.float16, torch.float8_e4m3fn
NAMES = {BF16: "bfloat16", FP16: "float16", FP8: "fp8_e4m3"}
TOL = {BF16: 2e-2, FP16: 4e-3}
FP8_SCALE = 0.37


def config_id(c) -> str:
    return f"{NAMES[c[0]]}-{NAMES[c[1]]}-{c[2]}q{c[3]}kv-d{c[4]}-p{c[5]}"


def shapes_of(cfg) -> ModelShapes:
    dtype, kv_dtype, hq, hkv, d, page = cfg
    return ModelShapes(NAMES[dtype], NAMES[kv_dtype], 4096, 14336, hq, hkv, d, d, 32000, page)


def make_case(cfg, lens: list[int], seed: int = 0) -> AttentionCase:
    dtype, kv_dtype, hq, hkv, d, page = cfg
    scale = FP8_SCALE if kv_dtype == FP8 else 1.0
    return paged_attention_case([1] * len(lens), lens, hq, hkv, d, page, dtype, kv_dtype, DEV, seed, scale)


def poison(nbytes: int) -> None:
    """Leave a NaN-filled block in torch's caching allocator for the next allocation of this size."""
    block = torch.full((nbytes // 4 + 1,), float("nan"), device=DEV)
    del block


def check(out: torch.Tensor, case: AttentionCase, what: str = "") -> None:
    """Row by row against the reference; the failure names the rows, their lengths and errors."""
    ref = reference.attention(case.q.float(), case.kv, case.meta, case.q.shape[-1] ** -0.5).double()
    o = out.double()
    tol = TOL[out.dtype]
    err = (o - ref).norm(dim=(1, 2)) / ref.norm(dim=(1, 2))
    nan = torch.isnan(o).flatten(1).any(1)
    bad = ((err >= tol) | nan).nonzero().flatten().tolist()
    if bad:
        lens = case.meta.kv_lens.tolist()
        rows = [f"row {b} kv {lens[b]}: err {err[b].item():.2e} nan {bool(nan[b])}" for b in bad[:8]]
        pytest.fail(f"{what}: {len(bad)} of {len(lens)} rows off (tol {tol}):\n" + "\n".join(rows))

"""Batch-invariant attention (the deterministic mode's kernel setting) on the GPU: as accurate as the
normal setting against the reference, and a query's output is the same bits whether it is computed
in a whole-prompt prefill next to other rows, in a chunk of that prompt, or as a decode step among
other decode rows."""

from __future__ import annotations

import pytest
import torch

from sgjit.kernels import reference
from sgjit.kernels.arch import device_profile
from sgjit.kernels.ops import AttentionMetadata
from sgjit.kernels.selector import KernelSelector
from sgjit.kernels.spec import ModelShapes, Workload
from sgjit.kernels.synthetic import paged_attention_case

pytestmark = pytest.mark.gpu

DEV = "cuda"
NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float8_e4m3fn: "fp8_e4m3"}
# (dtype, kv dtype, Hq, Hkv, head_dim, page): Llama-3-8B, SmolLM2, an fp8 pool
CONFIGS = [
    (torch.bfloat16, torch.bfloat16, 32, 8, 128, 16),
    (torch.bfloat16, torch.bfloat16, 9, 3, 64, 16),
    (torch.float16, torch.float8_e4m3fn, 16, 2, 128, 16),
]


def _invariant_op(cfg, max_context: int):
    from sgjit.kernels.cuda.attention import PagedAttention

    dtype, kv_dtype, hq, hkv, d, page = cfg
    shapes = ModelShapes(NAMES[dtype], NAMES[kv_dtype], 4096, 14336, hq, hkv, d, d, 32000, page)
    profile = device_profile(DEV)
    workload = Workload(64, max_context, 2048, batch_invariant=True)
    t = KernelSelector().select(profile, shapes, workload)["attention"].tunables
    op = PagedAttention(
        profile, shapes, dtype, t["decode_tile"], t["prefill_tile"], max_context, split_len=t["split_len"]
    )
    return op, t


def _meta(q_lens: list[int], kv_lens: list[int], table: torch.Tensor, page: int) -> AttentionMetadata:
    qo = [0]
    for n in q_lens:
        qo.append(qo[-1] + n)
    return AttentionMetadata(
        qo_indptr=torch.tensor(qo, dtype=torch.int32, device=DEV),
        kv_lens=torch.tensor(kv_lens, dtype=torch.int32, device=DEV),
        page_table=table.contiguous(),
        page_size=page,
        max_q_len=max(q_lens),
        max_kv_len=max(kv_lens),
        qo_indptr_host=qo,
        kv_lens_host=list(kv_lens),
    )


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{NAMES[c[0]]}-{NAMES[c[1]]}-{c[2]}q{c[3]}kv-d{c[4]}")
def test_invariant_attention_matches_reference(cfg):
    op, _ = _invariant_op(cfg, max_context=8192)
    scale = cfg[4] ** -0.5
    kv_scale = 0.5 if cfg[1] == torch.float8_e4m3fn else 1.0
    for i, (q_lens, kv_lens) in enumerate(
        [([1] * 7, [1, 700, 4097, 513, 2, 8000, 512]), ([1, 17, 100, 2048], [1, 17, 1100, 5000])]
    ):
        case = paged_attention_case(q_lens, kv_lens, *cfg[2:], cfg[0], cfg[1], DEV, seed=i, kv_scale=kv_scale)
        out = op(case.q, case.kv, case.meta, scale)
        ref = reference.attention(case.q.float(), case.kv, case.meta, scale)
        err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
        assert err < 2e-2, err


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{NAMES[c[0]]}-{NAMES[c[1]]}-{c[2]}q{c[3]}kv-d{c[4]}")
def test_a_querys_output_does_not_depend_on_how_it_is_batched(cfg):
    dtype, kv_dtype, hq, hkv, d, page = cfg
    op, t = _invariant_op(cfg, max_context=4096)
    assert t["split_len"] < 2100  # the prompt below spans several key splits
    scale = d**-0.5
    length = 2100
    # row 0: the prompt under test, prefilled whole, next to a prefill with a prefix and a decode row
    case = paged_attention_case(
        [length, 300, 1], [length, 1900, 77], hq, hkv, d, page, dtype, kv_dtype, DEV, seed=3
    )
    whole = op(case.q, case.kv, case.meta, scale)[:length]
    table = case.meta.page_table[:1]
    # the same prompt in chunks (each chunk over the keys before it), alone
    for lo, hi in ((0, 5), (5, 700), (700, 1024), (1024, 2099), (2099, 2100)):
        chunk = op(case.q[lo:hi], case.kv, _meta([hi - lo], [hi], table, page), scale)
        assert torch.equal(chunk, whole[lo:hi]), (lo, hi)
    # its tokens as decode rows, several per batch, in shuffled order
    positions = [0, 1, 63, 64, 511, 512, 513, 1000, 1535, 2047, 2048, 2099]
    order = torch.randperm(len(positions), generator=torch.Generator().manual_seed(0)).tolist()
    picked = [positions[i] for i in order]
    for rows in (picked[:1], picked[:5], picked):
        meta = _meta([1] * len(rows), [p + 1 for p in rows], table.expand(len(rows), -1), page)
        out = op(case.q[rows], case.kv, meta, scale)
        assert torch.equal(out, whole[rows]), rows

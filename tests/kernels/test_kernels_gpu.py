"""Every CUDA kernel against reference.py on fresh random inputs (skipped without a GPU).

The oracle is the reference op on inputs upcast to float32 (higher precision than either side);
errors are ‖out − ref‖ / ‖ref‖. Tolerances per dtype: the kernels round what torch rounds, so
elementwise ops sit at the output rounding (bf16 2^-8, fp16 2^-11, relative); attention also
rounds P to the operand dtype before the PV product (FlashAttention's choice), one more rounding.
Outputs are allocated on memory poisoned with NaN first, so an element a kernel never wrote fails."""

from __future__ import annotations

import math
import random

import pytest
import torch

from sgjit.kernels import reference
from sgjit.kernels.arch import device_profile
from sgjit.kernels.ops import LayerKV, SamplingTensors
from sgjit.kernels.registry import CUDA, variant
from sgjit.kernels.selector import KernelSelector, decode_splits
from sgjit.kernels.spec import ModelShapes
from sgjit.kernels.synthetic import paged_attention_case

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 1.2e-2, torch.float16: 2.5e-3}  # elementwise ops: about one output rounding
ATTN_TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3}  # plus P rounded to the operand dtype
NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float8_e4m3fn: "fp8_e4m3"}
DEV = "cuda"


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert not torch.isnan(out).any(), "NaN in the output (an unwritten or corrupted element)"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def poison(nbytes: int) -> None:
    """Leave a NaN-filled block in torch's caching allocator for the next allocation of this size."""
    block = torch.full((nbytes // 4 + 1,), float("nan"), device=DEV)
    del block


@pytest.fixture(scope="module")
def profile():
    return device_profile(DEV)


def shapes_for(dtype, kv_dtype, hq, hkv, d, page, hidden=4096, inter=14336, rope_dim=None):
    return ModelShapes(NAMES[dtype], NAMES[kv_dtype], hidden, inter, hq, hkv, d, rope_dim or d, 32000, page)


# ---- norms, activation, rope ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,hidden", [(1, 4096), (7, 576), (8192, 4096), (33, 128)])
def test_add_rmsnorm(dtype, rows, hidden):
    from sgjit.kernels.cuda.norm import RMSNorm

    k = RMSNorm(dtype, NAMES[dtype], (hidden,))
    x = torch.randn(rows, hidden, device=DEV).to(dtype)
    r = torch.randn(rows, hidden, device=DEV).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, device=DEV)).to(dtype)
    poison(x.numel() * 2)
    y, s = k.add_rmsnorm(x, r, w, 1e-5)
    ry, rs = reference.add_rmsnorm(x, r, w, 1e-5)
    assert torch.equal(s, rs), "the residual sum is one rounding of x + r, as torch does it"
    assert rel_err(y, reference.rmsnorm(rs.float(), w.float(), 1e-5)) < TOL[dtype]
    assert rel_err(y, ry) < TOL[dtype] / 4
    y1 = k.rmsnorm(x, w, 1e-6)
    assert rel_err(y1, reference.rmsnorm(x.float(), w.float(), 1e-6)) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rmsnorm_strided_heads(dtype):
    """Per-head q/k norm on views of the qkv projection (Qwen3): strided [tokens, heads, D]."""
    from sgjit.kernels.cuda.norm import RMSNorm

    k = RMSNorm(dtype, NAMES[dtype], (128,))
    qkv = torch.randn(37, (32 + 16) * 128, device=DEV).to(dtype)
    q = qkv[:, : 32 * 128].reshape(37, 32, 128)
    kk = qkv[:, 32 * 128 : 40 * 128].reshape(37, 8, 128)
    w = torch.rand(128, device=DEV).to(dtype)
    for t in (q, kk):
        assert not t.is_contiguous()
        assert rel_err(k.rmsnorm(t, w, 1e-6), reference.rmsnorm(t.float(), w.float(), 1e-6)) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,inter", [(1, 14336), (8192, 4096), (5, 1536)])
def test_silu_mul(dtype, rows, inter, profile):
    from sgjit.kernels.cuda.activation import SiluMul

    op = SiluMul(dtype, NAMES[dtype], profile.sm_count)
    x = (2 * torch.randn(rows, 2 * inter, device=DEV)).to(dtype)
    poison(rows * inter * 2)
    out = op(x)
    assert rel_err(out, reference.silu_mul(x.float())) < TOL[dtype]
    assert rel_err(out, reference.silu_mul(x)) < TOL[dtype] / 4


@pytest.mark.parametrize(
    "dtype,kv_dtype,hq,hkv,d,rot,page",
    [
        (torch.bfloat16, torch.bfloat16, 32, 8, 128, 128, 16),
        (torch.float16, torch.float16, 9, 3, 64, 64, 64),
        (torch.bfloat16, torch.float8_e4m3fn, 32, 8, 128, 128, 16),
        (torch.float16, torch.float8_e4m3fn, 12, 4, 128, 64, 16),  # partial rotary
    ],
)
@pytest.mark.parametrize("tokens", [1, 300, 8192])
def test_rope_store_kv(dtype, kv_dtype, hq, hkv, d, rot, page, tokens):
    from sgjit.kernels.cuda.rope import RopeStoreKV

    op = RopeStoreKV(dtype, (NAMES[dtype], NAMES[kv_dtype]), d, rot)
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, device=DEV).to(dtype)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k, v = q.reshape(tokens, hq, d), k.reshape(tokens, hkv, d), v.reshape(tokens, hkv, d)
    angles = torch.rand(tokens, rot // 2, device=DEV) * 50
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
    num_pages = tokens // page + 4
    slots = torch.randperm((num_pages - 1) * page, device=DEV)[:tokens] + page  # never the scratch page
    scale = 0.5 if kv_dtype == torch.float8_e4m3fn else 1.0

    def pool():
        k_pool, v_pool = (torch.randn(num_pages, page, hkv, d, device=DEV).to(kv_dtype) for _ in range(2))
        return LayerKV(k_pool, v_pool, scale, scale)

    mine, ref = pool(), pool()
    ref.k.copy_(mine.k)
    ref.v.copy_(mine.v)
    poison(q.numel() * 2)
    q_out = op(q, k, v, cos_sin, mine, slots)
    q_ref = reference.rope_store_kv(q, k, v, cos_sin, ref, slots)
    assert rel_err(q_out, reference.apply_rope(q.float(), cos_sin)) < TOL[dtype]
    assert rel_err(q_out, q_ref) < TOL[dtype] / 4
    for a, b in ((mine.k, ref.k), (mine.v, ref.v)):
        written = torch.zeros(num_pages * page, dtype=torch.bool, device=DEV)
        written[slots] = True
        fa, fb = a.view(-1, hkv, d).float(), b.view(-1, hkv, d).float()
        assert torch.equal(fa[~written], fb[~written]), "slots outside the mapping must stay untouched"
        tol = 0.07 if kv_dtype == torch.float8_e4m3fn else TOL[dtype] / 4  # fp8: within one e4m3 step
        assert rel_err(fa[written], fb[written]) < tol


# ---- attention ------------------------------------------------------------------------------------

# (dtype, kv dtype, Hq, Hkv, head_dim, page): every head_dim, group 1/3/4/8, page 16/64, fp8 KV.
ATTN_CONFIGS = [
    (torch.bfloat16, torch.bfloat16, 32, 8, 128, 16),  # Llama-3-8B
    (torch.float16, torch.float16, 4, 4, 128, 64),  # MHA
    (torch.bfloat16, torch.float8_e4m3fn, 16, 2, 128, 16),  # group 8, fp8 KV
    (torch.bfloat16, torch.bfloat16, 9, 3, 64, 16),  # SmolLM2
    (torch.float16, torch.float8_e4m3fn, 8, 1, 64, 64),
    (torch.float16, torch.float16, 6, 2, 128, 64),  # group 3
    (torch.bfloat16, torch.float8_e4m3fn, 4, 4, 64, 16),
]


def _attn_op(profile, cfg, max_context=8192, decode=None, prefill=None):
    """The op with the selector's tiles for this shape (or the ones given)."""
    from sgjit.kernels.cuda.attention import PagedAttention

    dtype, kv_dtype, hq, hkv, d, page = cfg
    shapes = shapes_for(dtype, kv_dtype, hq, hkv, d, page)
    chosen = KernelSelector().select(profile, shapes)["attention"].tunables
    dec, pre = decode or chosen["decode_tile"], prefill or chosen["prefill_tile"]
    small = None if decode else chosen.get("small_decode_tile")  # the selector's tiles: small steps too
    return PagedAttention(profile, shapes, dtype, dec, pre, max_context, small_decode_tile=small)


def _check_attention(op, case, cfg):
    dtype = cfg[0]
    scale = cfg[4] ** -0.5
    poison(case.q.numel() * 2)
    out = op(case.q, case.kv, case.meta, scale)
    ref = reference.attention(case.q.float(), case.kv, case.meta, scale)
    err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    if not err < ATTN_TOL[dtype]:  # say where: which rows, which heads, NaN or wrong values
        qo, lens = case.meta.qo_indptr_host, case.meta.kv_lens_host
        rows = []
        for b in range(len(lens)):
            o, r = out[qo[b] : qo[b + 1]].double(), ref[qo[b] : qo[b + 1]].double()
            e = ((o - r).norm() / r.norm()).item()
            if not e < ATTN_TOL[dtype]:
                per_head = ((o - r).norm(dim=(0, 2)) / r.norm(dim=(0, 2))).tolist()
                bad_tok = (
                    ((o - r).norm(dim=(1, 2)) / r.norm(dim=(1, 2)) > ATTN_TOL[dtype]).nonzero().flatten()
                )
                rows.append(
                    f"row {b} q_len {qo[b + 1] - qo[b]} kv {lens[b]}: err {e:.2e} nan {torch.isnan(o).sum().item()} "
                    f"heads {[round(x, 3) for x in per_head[:8]]} bad tokens {bad_tok[:6].tolist()}"
                    f" of {len(bad_tok)}"
                )
        pytest.fail(
            f"rel err {err:.2e} (tile {op.decode_tile.name}/{op.prefill_tile.name}):\n" + "\n".join(rows[:8])
        )


def _lens(rng, b, lo, hi):
    return [rng.randint(lo, hi) for _ in range(b)]


@pytest.mark.parametrize(
    "cfg", ATTN_CONFIGS, ids=lambda c: f"{NAMES[c[0]]}-{NAMES[c[1]]}-{c[2]}q{c[3]}kv-d{c[4]}-p{c[5]}"
)
def test_decode_attention(cfg, profile):
    dtype, kv_dtype, hq, hkv, d, page = cfg
    rng = random.Random(hq * 1000 + d)
    op = _attn_op(profile, cfg)
    scale = 0.5 if kv_dtype == torch.float8_e4m3fn else 1.0
    for b, lo, hi in ((1, 1, 1), (1, 8192, 8192), (7, 1, 3000), (64, 1000, 4096), (256, 1, 600)):
        kv_lens = _lens(rng, b, lo, hi)
        case = paged_attention_case(
            [1] * b, kv_lens, hq, hkv, d, page, dtype, kv_dtype, DEV, seed=b + hi, kv_scale=scale
        )
        _check_attention(op, case, cfg)


@pytest.mark.parametrize(
    "cfg", ATTN_CONFIGS, ids=lambda c: f"{NAMES[c[0]]}-{NAMES[c[1]]}-{c[2]}q{c[3]}kv-d{c[4]}-p{c[5]}"
)
def test_prefill_attention(cfg, profile):
    """Ragged rows with and without cached prefixes, decode rows mixed in, one long row."""
    dtype, kv_dtype, hq, hkv, d, page = cfg
    op = _attn_op(profile, cfg)
    scale = 0.5 if kv_dtype == torch.float8_e4m3fn else 1.0
    batches = [
        ([1, 17, 100, 1, 64], [1, 17, 1100, 5000, 64]),  # mixed: decode rows, fresh and extended prompts
        ([2048], [2048]),
        ([333, 5, 8], [333 + 4000, 5, 8 + 31]),
        ([8192], [8192]),
        ([16], [8000]),  # short extend on a long prefix: split-KV prefill
    ]
    for i, (q_lens, kv_lens) in enumerate(batches):
        case = paged_attention_case(
            q_lens, kv_lens, hq, hkv, d, page, dtype, kv_dtype, DEV, seed=i, kv_scale=scale
        )
        _check_attention(op, case, cfg)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_every_registered_tile(kv_dtype, profile):
    """Each decode and prefill tile the selector may pick (or autotune may store) is correct."""
    cfg = (torch.bfloat16, kv_dtype, 32, 8, 128, 16)
    scale = 0.5 if kv_dtype == torch.float8_e4m3fn else 1.0
    tiles = variant("attention", CUDA).tunables
    dec_case = paged_attention_case(
        [1] * 9,
        [1, 70, 4097, 300, 2, 1999, 64, 65, 8000],
        32,
        8,
        128,
        16,
        torch.bfloat16,
        kv_dtype,
        DEV,
        kv_scale=scale,
    )
    pre_case = paged_attention_case(
        [1, 300, 77], [900, 300, 2000], 32, 8, 128, 16, torch.bfloat16, kv_dtype, DEV, seed=5, kv_scale=scale
    )
    for tile in tiles["decode_tile"]:
        _check_attention(_attn_op(profile, cfg, decode=tile), dec_case, cfg)
    for tile in tiles["prefill_tile"]:
        _check_attention(_attn_op(profile, cfg, prefill=tile), pre_case, cfg)


def test_decode_splits_any_count(profile):
    """The split count is only a partition of the keys: every count gives the same answer."""
    cfg = ATTN_CONFIGS[0]
    case = paged_attention_case(
        [1] * 5, [3000, 1, 64, 4097, 777], 32, 8, 128, 16, torch.bfloat16, torch.bfloat16, DEV
    )
    outs = []
    for ctx in (128, 1024, 8192, 1 << 17):  # bounds that give 1 .. 32 splits at batch 5
        op = _attn_op(profile, cfg, max_context=ctx)
        outs.append(op(case.q, case.kv, case.meta, 128**-0.5))
    ref = reference.attention(case.q.float(), case.kv, case.meta, 128**-0.5)
    for o in outs:
        assert rel_err(o, ref) < ATTN_TOL[torch.bfloat16]
    assert (
        decode_splits(profile, _attn_op(profile, cfg, 1 << 17).decode_tile, shapes_for(*cfg), 5, 1 << 17) > 1
    )


def test_decode_attention_graph_replay(profile):
    """Captured once, replayed with other lengths in the same tensors: the grid does not depend on
    the step's lengths (what the JIT's decode graphs rely on)."""
    cfg = ATTN_CONFIGS[0]
    op = _attn_op(profile, cfg)
    b = 16
    case = paged_attention_case([1] * b, [4096] * b, 32, 8, 128, 16, torch.bfloat16, torch.bfloat16, DEV)
    op(case.q, case.kv, case.meta, 128**-0.5)  # warm up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(case.q, case.kv, case.meta, 128**-0.5)
    rng = random.Random(3)
    for _ in range(3):
        lens = _lens(rng, b, 1, 4096)
        case.meta.kv_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        case.meta.kv_lens_host[:] = lens
        case.meta.max_kv_len = max(lens)
        graph.replay()
        ref = reference.attention(case.q.float(), case.kv, case.meta, 128**-0.5)
        assert rel_err(out, ref) < ATTN_TOL[torch.bfloat16]


# ---- sampling -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sampling(profile):
    from sgjit.kernels.cuda.sampling import Sampling

    return Sampling(profile.sm_count)


def _params(b, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, seeds=None, steps=None, greedy=False):
    f = lambda v: torch.full((b,), v, dtype=torch.float32, device=DEV)  # noqa: E731
    seeds = seeds if seeds is not None else list(range(b))
    steps = steps if steps is not None else [0] * b
    return SamplingTensors(
        temperature=f(0.0 if greedy else temperature), top_p=f(top_p),
        top_k=torch.full((b,), top_k, dtype=torch.int32, device=DEV), min_p=f(min_p),
        seeds=torch.tensor(seeds, dtype=torch.int64, device=DEV),
        steps=torch.tensor(steps, dtype=torch.int64, device=DEV),
        all_greedy=greedy, seeds_host=list(seeds), steps_host=list(steps),
    )  # fmt: skip


def test_apply_bitmask(sampling):
    for b, vocab in ((1, 49152), (33, 128256), (4, 1000)):
        logits = torch.randn(b, vocab, device=DEV)
        words = -(-vocab // 32)
        mask = torch.randint(-(2**31), 2**31 - 1, (b, words), dtype=torch.int32, device=DEV)
        mine, ref = logits.clone(), logits.clone()
        sampling.apply_bitmask(mine, mask)
        reference.apply_bitmask(ref, mask)
        assert torch.equal(mine, ref)


@pytest.mark.parametrize("rows", [1, 5, 130])
def test_advance_decode_matches_the_reference(sampling, rows):
    """A multi-step graph's bookkeeping kernel against the reference ops over several steps: tokens
    out and fed back, rows ending at an EOS they stop at or at their budget, positions crossing page
    boundaries and the table's last column, done rows sent to the scratch slot."""
    from sgjit.kernels.ops import DecodeAhead

    g = torch.Generator(device=DEV).manual_seed(rows)
    page, width = 16, 6

    def state() -> DecodeAhead:
        gen = torch.Generator(device=DEV).manual_seed(7)

        def ints(lo: int, hi: int, dt: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.randint(lo, hi, (rows,), generator=gen, device=DEV, dtype=dt)

        positions = ints(0, page * width + 8)  # some past the table's last column
        return DecodeAhead(
            input_ids=ints(0, 1000), positions=positions, slots=ints(0, 100),
            kv_lens=(positions + 1).int(), page_table=torch.randint(1, 500, (rows, width), generator=gen,
            device=DEV, dtype=torch.int32), budgets=ints(1, 6), stop_on_eos=ints(0, 2),
            done=ints(0, 2).bool() & (ints(0, 4) == 0), eos=torch.tensor([3, 11], device=DEV), page_size=page,
            scratch_slot=0,
        )  # fmt: skip

    mine, ref = state(), state()
    for k in range(6):
        tokens = torch.randint(0, 14, (rows,), generator=g, device=DEV)  # EOS ids drawn often
        out_m, out_r = torch.empty_like(tokens), torch.empty_like(tokens)
        sampling.advance_decode(mine, tokens, k, out_m)
        reference.advance_decode(ref, tokens, k, out_r)
        assert torch.equal(out_m, out_r)
        for name in ("input_ids", "positions", "slots", "kv_lens", "done"):
            assert torch.equal(getattr(mine, name), getattr(ref, name)), (name, k)
        if k == 0 and rows > 100:  # rows end at different steps
            assert bool(ref.done.any()) and not bool(ref.done.all())
    assert bool(ref.done.all())  # every budget (at most 5) is spent by the sixth step


def test_greedy_matches_argmax(sampling):
    logits = torch.randn(256, 128256, device=DEV)
    logits[3, 7] = logits[3, 9] = logits[3].max() + 1  # a tie: the first index wins, as in torch
    assert torch.equal(sampling.sample(logits, _params(256, greedy=True)), logits.argmax(-1))
    mixed = _params(256)
    mixed.temperature[::2] = 0.0
    got = sampling.sample(logits, mixed)
    assert torch.equal(got[::2], logits.argmax(-1)[::2])


@pytest.mark.parametrize("b,vocab", [(1, 49152), (3, 32001), (64, 128256), (300, 151936), (7, 1000)])
def test_split_row_argmax(sampling, b, vocab):
    """argmax_kernel splits a row over blocks: ties across blocks, -inf and NaN rows, unaligned rows
    and repeated launches (the kernel resets its own scratch) all agree with torch.argmax."""
    logits = torch.randn(b, vocab + 1, device=DEV) * 4
    top = logits.max() + 1
    logits[0, 5] = logits[0, vocab - 1] = top  # equal maxima at both ends of the row: the first wins
    if b > 2:
        logits[1] = -math.inf  # torch answers 0
        logits[2, vocab // 2] = math.nan  # a NaN wins, as in torch
    for view in (logits[:, :vocab], logits[:, 1:]):  # aligned rows (float4 loads) and unaligned ones
        want = view.argmax(-1)
        for _ in range(3):
            assert torch.equal(sampling.argmax(view), want)


def test_split_row_argmax_graph_replay(sampling):
    logits = torch.randn(64, 128256, device=DEV)
    sampling.argmax(logits)  # scratch allocated outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sampling.argmax(logits)
    for _ in range(3):
        logits.copy_(torch.randn_like(logits))
        graph.replay()
        assert torch.equal(out, logits.argmax(-1))


def test_seeded_sampling_is_batch_independent(sampling):
    logits = torch.randn(8, 32000, device=DEV) * 3
    p = _params(8, temperature=0.9, top_p=0.95, seeds=[11, 12, 13, 14, 15, 16, 17, 18], steps=[5] * 8)
    a = sampling.sample(logits, p)
    perm = torch.tensor([3, 1, 7, 0, 2, 6, 5, 4], device=DEV)
    p2 = _params(
        8, temperature=0.9, top_p=0.95, seeds=[p.seeds_host[i] for i in perm.tolist()], steps=[5] * 8
    )
    b = sampling.sample(logits[perm], p2)
    assert torch.equal(a[perm], b)
    unseeded = _params(64, temperature=1.0, seeds=[-1] * 64)
    flat = torch.zeros(64, 1000, device=DEV)
    draws = [sampling.sample(flat, unseeded, None) for _ in range(2)]
    assert not torch.equal(draws[0], draws[1])


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=1.0),
        dict(temperature=0.7, top_k=20),
        dict(temperature=1.0, top_p=0.8),
        dict(temperature=1.3, min_p=0.05),
        dict(temperature=0.8, top_k=50, top_p=0.9, min_p=0.01),
    ],
    ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()),
)
def test_sampling_distribution(sampling, params):
    """Many seeded draws from one row: never a token the reference filters out, and frequencies
    within sampling noise of the reference's filtered distribution."""
    vocab, n = 300, 20000
    row = torch.randn(vocab, device=DEV) * 2.5
    logits = row.expand(n, vocab).contiguous()
    st = _params(n, seeds=list(range(n)), steps=[1] * n, **params)
    got = sampling.sample(logits, st)
    probs = torch.softmax(row[None] / max(params["temperature"], 1e-6), dim=-1)
    kept = reference.filter_probs(probs, _params(1, **params))[0]
    target = kept / kept.sum()
    assert bool((target[got] > 0).all()), "sampled a token the filters exclude"
    freq = torch.bincount(got, minlength=vocab).float() / n
    tv = 0.5 * (freq - target).abs().sum().item()
    support = int((target > 0).sum())
    assert tv < 0.8 * math.sqrt(support / n) + 0.01, f"total variation {tv:.3f} over {support} tokens"


def test_sampling_large_vocab_thresholds(sampling):
    """On a 128k vocabulary the kept set is exactly the reference's (checked by membership)."""
    b, vocab = 16, 128256
    logits = torch.randn(b, vocab, device=DEV) * 4
    st = _params(b, temperature=0.8, top_k=40, top_p=0.9, min_p=0.0, seeds=list(range(b)))
    probs = torch.softmax(logits / 0.8, dim=-1)
    kept = reference.filter_probs(probs, st)
    for _ in range(20):
        st.steps += 1
        got = sampling.sample(logits, st)
        assert bool((kept.gather(1, got[:, None]) > 0).all())

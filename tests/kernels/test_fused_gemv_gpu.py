"""The fused decode GEMVs (gemv.cu through FusedGemv) against the composition of the unfused torch
ops they replace (reference.py; FP8 projections as the unfused GEMV computes them), on random inputs: bf16/fp16, 1-16 rows, ragged output widths,
random norm weights, a q|k|v bias, FP8 weights, bf16 and fp8 KV pools written at scattered slots
of partly filled pages, partial rotary dims; CUDA-graph replay; rows independent of their batch.
Then a whole model: the fused decode step against the unfused kernels. Skipped without a GPU.

Errors are ‖out − ref‖ / ‖ref‖. The kernels round every intermediate the unfused ops round (the
normalised row, the projection, the rotated value, silu, the residual sum), so they land within
about one output rounding of the bf16/fp16 reference and no further than it from a float32 oracle.
The fused ops here have no fallback: a step they refused would fail the test, not pass silently."""

from __future__ import annotations

import pytest
import torch
from model_steps import random_model_weights, rel_err

from sgjit.kernels import reference
from sgjit.kernels.arch import device_profile
from sgjit.kernels.fp8 import Fp8Weight, linear_reference
from sgjit.kernels.ops import LayerKV

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
ROWS = (1, 2, 3, 5, 8, 13, 16)
# (activation dtype, FP8 weights): FP8 weights with bf16 activations only, the instantiations' count
# (each is an NVRTC compile) being what the test run's time goes to
KINDS = [(torch.bfloat16, False), (torch.float16, False), (torch.bfloat16, True)]
NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float8_e4m3fn: "fp8_e4m3"}
TOL = {torch.bfloat16: 1.2e-2, torch.float16: 2.5e-3}  # about one output rounding
EPS = 1e-5


def _gemv_linear(x: torch.Tensor, w, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The projection as the unfused decode GEMV computes it, which the fused kernels replace. For FP8
    weights that is fp32 math rounded once (fp8.linear_reference); reference.linear would take
    cuBLASLt's FP8 GEMM where the shape is 16-aligned, which also rounds the activations to e4m3
    (about 2.7% relative error on a K=4096 row: not what a GEMV computes)."""
    return linear_reference(x, w, bias) if isinstance(w, Fp8Weight) else reference.linear(x, w, bias)


# What each fused op computes, rounding for rounding: the unfused torch ops with the GEMV's projection
REF = reference.Composition(reference.rmsnorm, _gemv_linear, reference.rope_store_kv, reference.silu_mul)


def _no_fallback(*_a, **_k):
    raise AssertionError("the fused kernel refused a step it should serve")


@pytest.fixture(scope="module", params=["fma", "mma"])
def fused(request):
    """FusedGemv for 16 rows, by (dtype, KV pool dtype), with no fallback: `fma` on gemv.TILES for
    both weight kinds, `mma` on the tensor-core body for 16-bit weights (gemv.MMA_TILES) and FP8
    weights on their own default (gemv.FP8_TILES)."""
    from sgjit.kernels.cuda.fused_gemv import FusedGemv
    from sgjit.kernels.cuda.gemv import MMA_TILES, TILES

    tiles = MMA_TILES if request.param == "mma" else TILES

    profile = device_profile(DEV)
    none = reference.Composition(_no_fallback, _no_fallback, _no_fallback, _no_fallback)
    cache = {}

    def get(dtype: torch.dtype, kv_dtype: torch.dtype | None = None):
        key = (dtype, kv_dtype or dtype)
        if key not in cache:
            cache[key] = FusedGemv(
                dtype,
                NAMES[dtype],
                NAMES[key[1]],
                16,
                profile.sm_count,
                profile.smem_per_block_optin,
                none,
                tiles=tiles,
            )
        return cache[key]

    return get


def _inputs(m: int, k: int, dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = (torch.randn(m, k, device=DEV, generator=g) * 3).to(dtype)
    norm_w = (1 + 0.3 * torch.randn(k, device=DEV, generator=g)).to(dtype)
    return x, norm_w


def _weight(n: int, k: int, dtype: torch.dtype, g: torch.Generator, fp8: bool):
    w = torch.randn(n, k, device=DEV, generator=g) / k**0.5
    return Fp8Weight.quantize(w) if fp8 else w.to(dtype)


def _f32(w):
    return w.dequantize() if isinstance(w, Fp8Weight) else w.float()


def _close(out: torch.Tensor, ref: torch.Tensor, oracle: torch.Tensor, dtype: torch.dtype) -> None:
    """Within about one rounding of the reference, and no further than it from the float32 oracle."""
    assert rel_err(out, ref) < TOL[dtype] / 2
    assert rel_err(out, oracle) <= 1.5 * rel_err(ref, oracle) + 1e-4


# ---- rmsnorm_linear, linear_residual, rmsnorm_gate_up_silu -----------------------------------------

SHAPES = ((6144, 4096), (1000, 576), (131, 64))  # (N, K): ragged channel groups, K strides


@pytest.mark.parametrize("dtype,fp8", KINDS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_rmsnorm_linear(fused, dtype, n, k, fp8):
    g = torch.Generator(device=DEV).manual_seed(n + k)
    w = _weight(n, k, dtype, g, fp8)
    bias = torch.randn(n, device=DEV, generator=g).to(dtype)
    for m in ROWS:
        x, norm_w = _inputs(m, k, dtype, g)
        for b in (None, bias):
            out = fused(dtype).rmsnorm_linear(x, norm_w, EPS, w, b)
            ref = REF.rmsnorm_linear(x, norm_w, EPS, w, b)
            xn = reference.rmsnorm(x.float(), norm_w.float(), EPS)
            oracle = xn @ _f32(w).T + (0 if b is None else b.float())
            assert out.shape == (m, n) and out.dtype == dtype
            _close(out, ref, oracle, dtype)


@pytest.mark.parametrize("dtype,fp8", KINDS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_linear_residual(fused, dtype, n, k, fp8):
    g = torch.Generator(device=DEV).manual_seed(3 * n + k)
    w = _weight(n, k, dtype, g, fp8)
    for m in ROWS:
        x = torch.randn(m, k, device=DEV, generator=g).to(dtype)
        residual = (torch.randn(m, n, device=DEV, generator=g) * 4).to(dtype)
        out = fused(dtype).linear_residual(x, w, residual)
        ref = REF.linear_residual(x, w, residual)
        _close(out, ref, x.float() @ _f32(w).T + residual.float(), dtype)


@pytest.mark.parametrize("dtype,fp8", KINDS)
@pytest.mark.parametrize("inter,k", [(14336, 4096), (1536, 576), (77, 64)])
def test_rmsnorm_gate_up_silu(fused, dtype, inter, k, fp8):
    g = torch.Generator(device=DEV).manual_seed(inter + k)
    w = _weight(2 * inter, k, dtype, g, fp8)
    for m in ROWS:
        x, norm_w = _inputs(m, k, dtype, g)
        out = fused(dtype).rmsnorm_gate_up_silu(x, norm_w, EPS, w)
        ref = REF.rmsnorm_gate_up_silu(x, norm_w, EPS, w)
        gu = reference.rmsnorm(x.float(), norm_w.float(), EPS) @ _f32(w).T
        assert out.shape == (m, inter)
        _close(out, ref, reference.silu_mul(gu), dtype)


# ---- rmsnorm_qkv_rope -------------------------------------------------------------------------------

# (dtype, KV pool dtype, Hq, Hkv, head_dim, rotary dims, page)
ROPE_CONFIGS = [
    (torch.bfloat16, torch.bfloat16, 32, 8, 128, 128, 16),  # Llama-3-8B
    (torch.bfloat16, torch.float8_e4m3fn, 32, 8, 128, 128, 16),
    (torch.float16, torch.float16, 9, 3, 64, 64, 16),  # SmolLM2
    (torch.float16, torch.float8_e4m3fn, 4, 2, 64, 32, 64),  # partial rotary
]


def _rope_case(cfg, m: int, g: torch.Generator):
    dtype, kv_dtype, hq, hkv, d, rot, page = cfg
    angles = torch.rand(m, rot // 2, device=DEV, generator=g) * 50
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
    num_pages = m // page + 4
    slots = torch.randperm((num_pages - 1) * page, device=DEV, generator=g)[:m] + page  # partly filled pages
    scale = 0.5 if kv_dtype == torch.float8_e4m3fn else 1.0
    pool = LayerKV(
        *(torch.randn(num_pages, page, hkv, d, device=DEV, generator=g).to(kv_dtype) for _ in range(2)), scale, scale
    )  # fmt: skip
    return cos_sin, slots, pool


def _copy(kv: LayerKV) -> LayerKV:
    return LayerKV(kv.k.clone(), kv.v.clone(), kv.k_scale, kv.v_scale)


@pytest.mark.parametrize(
    "cfg,fp8",
    [(c, False) for c in ROPE_CONFIGS] + [(c, True) for c in ROPE_CONFIGS if c[0] == torch.bfloat16],
)
def test_rmsnorm_qkv_rope(fused, cfg, fp8):
    dtype, kv_dtype, hq, hkv, d, rot, page = cfg
    k, n = 64 * hq, (hq + 2 * hkv) * d
    g = torch.Generator(device=DEV).manual_seed(hq * d + rot)
    w = _weight(n, k, dtype, g, fp8)
    bias = torch.randn(n, device=DEV, generator=g).to(dtype)
    op = fused(dtype, kv_dtype)
    for m in ROWS:
        x, norm_w = _inputs(m, k, dtype, g)
        cos_sin, slots, mine = _rope_case(cfg, m, g)
        ref = _copy(mine)
        b = bias if m % 2 else None
        q = op.rmsnorm_qkv_rope(x, norm_w, EPS, w, b, cos_sin, mine, slots)
        q_ref = REF.rmsnorm_qkv_rope(x, norm_w, EPS, w, b, cos_sin, ref, slots)
        assert q.shape == (m, hq, d)
        assert rel_err(q, q_ref) < TOL[dtype] / 2
        qkv = reference.rmsnorm(x.float(), norm_w.float(), EPS) @ _f32(w).T + (0 if b is None else b.float())
        q_exact = reference.apply_rope(qkv[:, : hq * d].reshape(m, hq, d), cos_sin)
        assert rel_err(q, q_exact) <= 1.5 * rel_err(q_ref, q_exact) + 1e-4
        for a, r in ((mine.k, ref.k), (mine.v, ref.v)):
            written = torch.zeros(a.shape[0] * page, dtype=torch.bool, device=DEV)
            written[slots] = True
            fa, fr = a.view(-1, hkv, d), r.view(-1, hkv, d)
            assert torch.equal(fa[~written].view(torch.uint8), fr[~written].view(torch.uint8)), (
                "slots off the map"
            )
            tol = 0.07 if kv_dtype == torch.float8_e4m3fn else TOL[dtype] / 2  # fp8: one e4m3 step
            assert rel_err(fa[written].float(), fr[written].float()) < tol


# ---- graphs, batch independence, limits ---------------------------------------------------------------


def _all_four(op, x, norm_w, w_qkv, w_gu, w_o, res, cos_sin, pool, slots):
    q = op.rmsnorm_qkv_rope(x, norm_w, EPS, w_qkv, None, cos_sin, pool, slots)
    r = op.linear_residual(q.reshape(q.shape[0], -1), w_o, res)
    return q, r, op.rmsnorm_gate_up_silu(r, norm_w, EPS, w_gu), op.rmsnorm_linear(r, norm_w, EPS, w_gu, None)


def test_graph_replay_and_rows_independent_of_their_batch(fused):
    """Captured in a CUDA graph (no allocation but the caching allocator's), the ops replay new inputs
    exactly as eager calls compute them; and a row's outputs are the same bits alone or in a batch."""
    cfg = (torch.bfloat16, torch.bfloat16, 8, 2, 128, 128, 16)
    g = torch.Generator(device=DEV).manual_seed(0)
    h = 1024
    w_qkv, w_gu, w_o = _weight(12 * 128, h, torch.bfloat16, g, False), _weight(2 * 3000, h, torch.bfloat16, g, False), _weight(h, h, torch.bfloat16, g, False)  # fmt: skip
    op = fused(torch.bfloat16)
    m = 4
    x, norm_w = _inputs(m, h, torch.bfloat16, g)
    res = torch.randn(m, h, device=DEV, generator=g).bfloat16()
    cos_sin, slots, pool = _rope_case(cfg, m, g)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _all_four(op, x, norm_w, w_qkv, w_gu, w_o, res, cos_sin, pool, slots)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = _all_four(op, x, norm_w, w_qkv, w_gu, w_o, res, cos_sin, pool, slots)
    new_x, _ = _inputs(m, h, torch.bfloat16, g)
    x.copy_(new_x)
    graph.replay()
    torch.cuda.synchronize()
    eager_pool = _copy(pool)
    eager = _all_four(op, x, norm_w, w_qkv, w_gu, w_o, res, cos_sin, eager_pool, slots)
    for a, b in zip(outs, eager):
        assert torch.equal(a, b)
    assert torch.equal(pool.k, eager_pool.k) and torch.equal(pool.v, eager_pool.v)
    for rows in (1, 3):
        alone = _all_four(
            op, x[:rows], norm_w, w_qkv, w_gu, w_o, res[:rows], cos_sin[:rows], _copy(pool), slots[:rows]
        )
        for a, b in zip(alone, eager):
            assert torch.equal(a, b[:rows])


def test_steps_past_the_rows_run_the_composition():
    from sgjit.kernels.cuda.fused_gemv import FusedGemv

    profile = device_profile(DEV)
    op = FusedGemv(
        torch.bfloat16, "bfloat16", "bfloat16", 2, profile.sm_count, profile.smem_per_block_optin,
        reference.Composition(reference.rmsnorm, reference.linear, reference.rope_store_kv, reference.silu_mul),
    )  # fmt: skip
    g = torch.Generator(device=DEV).manual_seed(1)
    x, norm_w = _inputs(5, 512, torch.bfloat16, g)
    w = _weight(300, 512, torch.bfloat16, g, False)
    assert torch.equal(op.rmsnorm_linear(x, norm_w, EPS, w), reference.rmsnorm_linear(x, norm_w, EPS, w))
    assert (
        rel_err(op.rmsnorm_linear(x[:2], norm_w, EPS, w), reference.rmsnorm_linear(x[:2], norm_w, EPS, w))
        < 6e-3
    )


# ---- the model: fused decode against the unfused kernels ------------------------------------------------

PROMPT_LENS = (7, 40, 129, 300)
STEPS = 32


@pytest.mark.parametrize("shape", ["llama3-8b", "smollm2-135m"])
def test_fused_decode_matches_the_unfused_kernels(shape):
    """Real shapes, random weights (norms too). Prefill runs unfused on both sides; then 32 decode steps
    of 4 rows, teacher-forced on the unfused side's greedy tokens: the fused step's logits land as
    close to a float32 oracle as the unfused kernels' do, and its greedy token is theirs except at
    near-ties that this noise explains."""
    from model_steps import Side, teacher_forced

    from sgjit.kernels.reference import REFERENCE_OPS
    from sgjit.kernels.registry import FUSED_OPS
    from sgjit.kernels.selector import KernelSelector
    from sgjit.kernels.spec import KernelChoice, KernelSet, ModelShapes, Workload
    from sgjit.kernels.table import build_ops
    from sgjit.runtime.model.llama import LlamaModel
    from sgjit.runtime.model.presets import shape_config

    cfg = shape_config(shape)
    weights = random_model_weights(cfg, DEV, seed=2, norm_seed=3, norm_spread=0.2)
    exact = {k: v.float() for k, v in weights.items()}
    rows, max_tokens = len(PROMPT_LENS), max(PROMPT_LENS) + STEPS + 1
    profile = device_profile(DEV)
    shapes = ModelShapes.from_config(cfg, torch.bfloat16, torch.bfloat16, 16)
    ks = KernelSelector().select(profile, shapes, Workload(rows, max_tokens))
    assert all(ks[op].variant == "cuda" for op in FUSED_OPS)
    fused_rows = {op: KernelChoice("cuda", {"rows": 16}, "test: every row bucket") for op in FUSED_OPS}
    # Attention on its GPU-verified kernels (SGJIT_UNVERIFIED_KERNELS=1 also offers the streaming decode
    # and sm_90 prefill ones): both sides share it, and this test is about the GEMVs
    attn = ks["attention"]
    verified = {k: v for k, v in attn.tunables.items() if k not in ("stream_decode", "prefill_sm90")}
    choices = {
        **ks.choices,
        **fused_rows,
        "attention": KernelChoice(attn.variant, verified, "test: verified"),
    }
    ops = build_ops(profile, shapes, KernelSet(choices, shapes, ks.workload))
    assert ops.fused_rows == 16 and type(ops.linear_residual).__name__ == "GuardedOp"
    model = LlamaModel(cfg, weights, ops, DEV, torch.bfloat16, max_positions=4096)
    oracle = LlamaModel(cfg, exact, REFERENCE_OPS, DEV, torch.float32, max_positions=4096)
    fused = Side(model, ops, rows, max_tokens)
    unfused = Side(model, ops.with_overrides(fused_rows=0), rows, max_tokens)
    f32 = Side(oracle, REFERENCE_OPS, rows, max_tokens)
    gen = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    for side in (fused, unfused, f32):
        side.step(seqs, [0] * rows)
    got = teacher_forced(fused, unfused, f32, seqs, STEPS)
    assert not any(op.failed for op in (ops.rmsnorm_qkv_rope, ops.linear_residual, ops.rmsnorm_gate_up_silu))
    print(f"\n{shape} ({STEPS * rows} tokens): decode " + got.summary("fused", "unfused kernels"))
    got.assert_within_noise()

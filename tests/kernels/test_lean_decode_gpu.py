"""The lean decode kernel (lean_decode.cu) against the reference op (skipped without a GPU).

Inputs come from `paged_attention_case` (shuffled pages, garbage past each row's keys, NaN in pages no
row owns); outputs are allocated on NaN-poisoned memory, so an element no CTA wrote fails. The oracle
is the reference op in float32 on the same stored keys; errors are ‖out − ref‖ / ‖ref‖ per row (bf16
2e-2, fp16 4e-3). Beyond the shapes: split merges by the last CTA (lengths from one key to 32k), the
per-pair counters back at zero after every call and every graph replay, and a graph captured once
for a context bound and replayed for other lengths."""

from __future__ import annotations

import random

import pytest
import torch

from sgjit.kernels import reference
from sgjit.kernels.arch import device_profile
from sgjit.kernels.spec import ModelShapes, Workload
from sgjit.kernels.synthetic import AttentionCase, paged_attention_case

pytestmark = pytest.mark.gpu

DEV = "cuda"
BF16, FP16, FP8 = torch.bfloat16, torch.float16, torch.float8_e4m3fn
NAMES = {BF16: "bfloat16", FP16: "float16", FP8: "fp8_e4m3"}
TOL = {BF16: 2e-2, FP16: 4e-3}
FP8_SCALE = 0.37

# (dtype, kv dtype, Hq, Hkv, head_dim, page)
CONFIGS = [
    (BF16, BF16, 32, 8, 128, 16),  # Llama-3-8B
    (FP16, FP16, 8, 8, 128, 16),  # MHA: group 1 (8 keys a block, 8 scores a warp)
    (BF16, BF16, 16, 8, 128, 32),  # group 2
    (BF16, BF16, 9, 3, 64, 16),  # SmolLM2: group 3 (laid out as 4)
    (BF16, BF16, 28, 4, 128, 16),  # Qwen2.5-7B: group 7 (laid out as 8, 4 keys a block)
    (FP16, FP16, 32, 2, 64, 8),  # group 16 (2 keys a block)
    (BF16, BF16, 24, 2, 128, 1),  # group 12, one-key pages
    (BF16, FP8, 32, 8, 128, 16),  # fp8 Llama-3-8B
    (FP16, FP8, 16, 4, 64, 64),  # fp8, head_dim 64 (two bytes a lane)
]


def _id(c) -> str:
    return f"{NAMES[c[0]]}-{NAMES[c[1]]}-{c[2]}q{c[3]}kv-d{c[4]}-p{c[5]}"


@pytest.fixture(scope="module")
def profile():
    return device_profile(DEV)


def _shapes(cfg) -> ModelShapes:
    dtype, kv_dtype, hq, hkv, d, page = cfg
    return ModelShapes(NAMES[dtype], NAMES[kv_dtype], 4096, 14336, hq, hkv, d, d, 32000, page)


def _op(profile, cfg):
    from sgjit.kernels.cuda.lean_decode import LeanDecode

    return LeanDecode(profile, _shapes(cfg))


def _case(cfg, lens: list[int], seed: int = 0) -> AttentionCase:
    dtype, kv_dtype, hq, hkv, d, page = cfg
    scale = FP8_SCALE if kv_dtype == FP8 else 1.0
    return paged_attention_case([1] * len(lens), lens, hq, hkv, d, page, dtype, kv_dtype, DEV, seed, scale)


def _run(op, case: AttentionCase) -> torch.Tensor:
    block = torch.full((case.q.numel() * case.q.element_size() // 4 + 1,), float("nan"), device=DEV)
    del block  # the output lands on NaN-filled memory
    out = op(case.q, case.kv, case.meta, case.q.shape[-1] ** -0.5)
    torch.cuda.synchronize()
    assert int(op.counters.abs().sum()) == 0, "a pair's counter was left non-zero"
    return out


def _check(out: torch.Tensor, case: AttentionCase, what: str = "") -> None:
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


def _batches(rng: random.Random) -> list[tuple[str, list[int]]]:
    return [
        ("one key", [1]),
        ("16 rows of one key", [1] * 16),
        ("block, split and page edges", [7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1, 2]),
        ("one row, 512 keys", [512]),
        ("one row, 4096 keys", [4096]),
        ("8 ragged rows", [rng.randint(1, 4096) for _ in range(8)]),
        ("32k and short", [32768, 1, 5, 100]),
    ]


@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_matches_reference(cfg, profile):
    op = _op(profile, cfg)
    rng = random.Random(cfg[2] * 100 + cfg[4])
    for i, (what, lens) in enumerate(_batches(rng)):
        case = _case(cfg, lens, seed=i)
        _check(_run(op, case), case, f"{what} ({op.splits(len(lens), max(lens))} splits)")


@pytest.mark.parametrize("kv_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_graph_replay_any_lengths(kv_dtype, profile):
    """Captured once for 4 rows under a 4096-key bound through the attention op's lean kernel (its
    own selection rule takes one row under 1024 keys; the test widens it), replayed for other lengths
    written into the same tensors; the counters stay at zero across replays."""
    from sgjit.kernels.cuda.attention import PagedAttention
    from sgjit.kernels.selector import KernelSelector

    cfg = (BF16, kv_dtype, 32, 8, 128, 16)
    shapes = _shapes(cfg)
    t = KernelSelector().select(profile, shapes, Workload(4, 4096))["attention"].tunables
    op = PagedAttention(profile, shapes, BF16, t["decode_tile"], t["prefill_tile"], 4096, lean_decode=True)
    op._leans = lambda rows, max_kv_len: True
    assert op.decode_launch(4, 4096)[0] == "lean"
    b = 4
    case = _case(cfg, [4096] * b)
    scale = 128**-0.5
    op(case.q, case.kv, case.meta, scale)  # compile and warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(case.q, case.kv, case.meta, scale)
    rng = random.Random(7)
    for lens in ([1] * b, [4096] * b, [rng.randint(1, 4096) for _ in range(b)], [4096, 1, 64, 65]):
        case.meta.kv_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        case.meta.kv_lens_host[:] = lens
        case.meta.max_kv_len = max(lens)
        for _ in range(3):
            out.fill_(float("nan"))
            graph.replay()
        torch.cuda.synchronize()
        assert int(op.lean.counters.abs().sum()) == 0
        _check(out, case, f"replay with lengths {lens}")


@pytest.mark.parametrize("kv_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_adversarial_queries_and_keys(kv_dtype, profile):
    """Logits far apart (a near one-hot softmax), nearly equal, all-zero query heads; for fp8, a key
    and value at e4m3's largest."""
    cfg = (BF16, kv_dtype, 32, 8, 128, 16)
    op = _op(profile, cfg)
    lens = [3000, 17, 1, 700]
    for what, q_mul in (("huge queries", 2e3), ("tiny queries", 1e-4)):
        case = _case(cfg, lens, seed=3)
        case.q.mul_(q_mul)
        _check(_run(op, case), case, what)
    case = _case(cfg, lens, seed=4)
    case.q[:, ::3] = 0
    _check(_run(op, case), case, "zero query heads")
    if kv_dtype == FP8:
        case = _case(cfg, lens, seed=5)
        page = case.meta.page_table[0, 7].item()
        case.kv.k[page, 3].view(torch.uint8).fill_(0x7E)  # +448
        case.kv.v[page, 3].view(torch.uint8).fill_(0xFE)  # -448
        _check(_run(op, case), case, "keys and values at e4m3's maximum")


@pytest.mark.parametrize("warps", [4, 8])
def test_rows_past_the_launch_bound_are_recut(warps, profile):
    """An eager call whose metadata bound is below a row's length (the splits' keys come from the
    bound): that row is cut evenly over the grid's splits on the device; rows within it keep the
    bound's cut. Both warp counts the benchmark sweeps."""
    from sgjit.kernels.cuda.lean_decode import LeanDecode

    cfg = (BF16, BF16, 32, 8, 128, 16)
    op = LeanDecode(profile, _shapes(cfg), warps=warps)
    case = _case(cfg, [4096, 100, 512, 3000], seed=9)
    case.meta.max_kv_len = 512
    assert op.splits(4, 512) == 8 and op.split_keys(8, 512) == 64
    out = _run(op, case)
    case.meta.max_kv_len = 4096  # the reference reads keys up to the metadata's bound
    _check(out, case, f"bound 512, {warps} warps")

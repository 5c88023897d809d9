"""The streaming decode kernel (decode.cu) against the reference op (skipped without a GPU).

Inputs come from `paged_attention_case`: shuffled pages, garbage in the tails of rows' last pages and
in the scratch page, NaN in every page no row owns, so a read past a row's keys or outside its pages
shows. The oracle is the reference op in float32 on the same (fp8: the same stored) keys; errors are
‖out − ref‖ / ‖ref‖ per row, within one rounding of P and of the output (bf16 2e-2, fp16 4e-3).
Outputs are allocated on NaN-poisoned memory, so an element no CTA wrote fails. Shapes: head_dim
64/128, groups 1 to 16, pages 1 to 64, bf16/fp16 and fp8 pools with scales != 1; batches of 1 to 64
rows from 1 key to 32k, every tile and page boundary, every registered ring and head count, and a
CUDA graph captured once and replayed for other lengths."""

from __future__ import annotations

import random

import pytest
import torch

from sgjit.kernels import reference
from sgjit.kernels.arch import device_profile
from sgjit.kernels.registry import StreamTile
from sgjit.kernels.selector import KernelSelector, stream_tile_for
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
    (BF16, BF16, 32, 8, 128, 16),  # Llama-3-8B: a CTA streams whole 2 KB key rows
    (FP16, FP16, 32, 32, 128, 16),  # MHA: group 1, four head groups a row
    (BF16, BF16, 16, 2, 128, 64),  # group 8
    (BF16, BF16, 9, 3, 64, 16),  # SmolLM2: 3 kv heads a CTA
    (FP16, FP16, 32, 2, 64, 8),  # group 16 (both halves of the m16 tile), pages shorter than a tile
    (BF16, FP8, 32, 8, 128, 16),  # fp8 Llama-3-8B
    (FP16, FP8, 16, 4, 64, 1),  # fp8, one-key pages
    (BF16, FP8, 48, 4, 128, 32),  # fp8, group 12
]


def _id(c) -> str:
    return f"{NAMES[c[0]]}-{NAMES[c[1]]}-{c[2]}q{c[3]}kv-d{c[4]}-p{c[5]}"


@pytest.fixture(scope="module")
def profile():
    return device_profile(DEV)


def _shapes(cfg) -> ModelShapes:
    dtype, kv_dtype, hq, hkv, d, page = cfg
    return ModelShapes(NAMES[dtype], NAMES[kv_dtype], 4096, 14336, hq, hkv, d, d, 32000, page)


def _op(profile, cfg, tile: StreamTile | None = None):
    from sgjit.kernels.cuda.decode import StreamDecode

    shapes = _shapes(cfg)
    tile = tile or stream_tile_for(profile, shapes, Workload())[0]
    assert tile is not None, "the selector gave this shape no streaming decode tile"
    return StreamDecode(profile, shapes, tile)


def _case(cfg, lens: list[int], seed: int = 0) -> AttentionCase:
    dtype, kv_dtype, hq, hkv, d, page = cfg
    scale = FP8_SCALE if kv_dtype == FP8 else 1.0
    return paged_attention_case([1] * len(lens), lens, hq, hkv, d, page, dtype, kv_dtype, DEV, seed, scale)


def _poison(nbytes: int) -> None:
    """Leave a NaN-filled block in torch's caching allocator for the next allocation of this size."""
    block = torch.full((nbytes // 4 + 1,), float("nan"), device=DEV)
    del block


def _run(op, case: AttentionCase) -> torch.Tensor:
    _poison(case.q.numel() * case.q.element_size())
    return op(case.q, case.kv, case.meta, case.q.shape[-1] ** -0.5)


def _check(out: torch.Tensor, case: AttentionCase, what: str = "") -> None:
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


def _batches(rng: random.Random) -> list[tuple[str, list[int]]]:
    return [
        ("one key", [1]),
        ("64 rows of one key", [1] * 64),
        ("tile and page edges", [15, 16, 17, 31, 32, 33, 1, 2, 47, 48, 49, 63, 64, 65]),
        ("8 ragged rows", [rng.randint(1, 4096) for _ in range(8)]),
        ("64 rows 1k-4k", [rng.randint(1000, 4096) for _ in range(64)]),
        ("32k and short", [32768, 1, 5, 100]),
    ]


@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_matches_reference(cfg, profile):
    op = _op(profile, cfg)
    rng = random.Random(cfg[2] * 100 + cfg[4])
    for i, (what, lens) in enumerate(_batches(rng)):
        case = _case(cfg, lens, seed=i)
        _check(_run(op, case), case, f"{what} (tile {op.tile.name}, {op.ctas(len(lens), max(lens))} CTAs)")


@pytest.mark.parametrize("kv_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_graph_replay_any_lengths(kv_dtype, profile):
    """Captured once for 16 rows and a context bound of 4096, replayed for other lengths written into
    the same tensors: the partition moves on the device (as the JIT's decode graphs need)."""
    from sgjit.kernels.cuda.attention import PagedAttention

    cfg = (BF16, kv_dtype, 32, 8, 128, 16)
    shapes = _shapes(cfg)
    t = KernelSelector().select(profile, shapes, Workload(16, 4096))["attention"].tunables
    tile = stream_tile_for(profile, shapes, Workload(16, 4096))[0]
    op = PagedAttention(profile, shapes, BF16, t["decode_tile"], t["prefill_tile"], 4096, stream_tile=tile)
    assert op.stream is not None
    b = 16
    case = _case(cfg, [4096] * b)
    scale = 128**-0.5
    op(case.q, case.kv, case.meta, scale)  # compile and warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(case.q, case.kv, case.meta, scale)
    rng = random.Random(7)
    for lens in ([1] * b, [4096] * b, [rng.randint(1, 4096) for _ in range(b)], [4096] + [1] * (b - 1)):
        case.meta.kv_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        case.meta.kv_lens_host[:] = lens
        case.meta.max_kv_len = max(lens)
        out.fill_(float("nan"))
        graph.replay()
        _check(out, case, f"replay with lengths {lens[:4]}...")


@pytest.mark.parametrize("kv_dtype", [BF16, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("batch,ctx", [(1, 32768), (8, 32768), (64, 512), (64, 4096)])
def test_benchmark_grid_shapes(kv_dtype, batch, ctx, profile):
    """The benchmark's shapes, every row at the full length (Llama-3-8B heads)."""
    cfg = (BF16, kv_dtype, 32, 8, 128, 16)
    case = _case(cfg, [ctx] * batch)
    _check(_run(_op(profile, cfg), case), case, f"B={batch} ctx={ctx}")


@pytest.mark.parametrize("kv_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_every_ring_and_head_count(kv_dtype, profile):
    """Tiles the selector picks on other devices: 8 kv heads a CTA at every ring depth (bf16) or the
    deeper ones (fp8), and fewer heads a CTA (more head groups a row)."""
    cfg = (BF16, kv_dtype, 32, 8, 128, 16)
    depths, fewer = ((2, 3, 4, 6), ((4, 3), (1, 2))) if kv_dtype == BF16 else ((4, 6), ((2, 6),))
    tiles = [StreamTile(8, s) for s in depths] + [StreamTile(h, s) for h, s in fewer]
    case = _case(cfg, [1, 70, 4097, 300, 2, 1999, 64, 65, 8000])
    for tile in tiles:
        if tile.blocks_per_sm(profile, 128, cfg[1].itemsize, 9) == 0:
            continue  # does not fit this device's shared memory
        _check(_run(_op(profile, cfg, tile), case), case, f"tile {tile.name}")


@pytest.mark.parametrize("kv_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_adversarial_queries_and_keys(kv_dtype, profile):
    """Logits far apart (a near one-hot softmax), nearly equal (uniform), all-zero query heads; for
    fp8, queries beyond fp16's range (3e4 x randn: the kernel scales each head into it) and a key and
    value at e4m3's largest."""
    cfg = (BF16, kv_dtype, 32, 8, 128, 16)
    op = _op(profile, cfg)
    lens = [3000, 17, 1, 700]
    for what, q_mul in (("huge queries", 2e3 if kv_dtype == BF16 else 3e4), ("tiny queries", 1e-4)):
        case = _case(cfg, lens, seed=3)
        case.q.mul_(q_mul)
        _check(_run(op, case), case, what)
    case = _case(cfg, lens, seed=4)
    case.q[:, ::3] = 0
    _check(_run(op, case), case, "zero query heads")
    if kv_dtype == FP8:
        case = _case(cfg, lens, seed=5)
        page = case.meta.page_table[0, 7].item()  # keys 112.. of row 0: one key at +-448 in every dim
        case.kv.k[page, 3].view(torch.uint8).fill_(0x7E)  # +448
        case.kv.v[page, 3].view(torch.uint8).fill_(0xFE)  # -448
        _check(_run(op, case), case, "keys and values at e4m3's maximum")

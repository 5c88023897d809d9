"""The streaming decode kernel (decode.cu) against the reference op (skipped without a GPU); cases
and oracle as tests/decode_cases.py says. Outputs are allocated on NaN-poisoned memory, so an element
no CTA wrote fails. Shapes: head_dim 64/128, groups 1 to 16, pages 1 to 64, bf16/fp16 and fp8 pools
with scales != 1; batches of 1 to 64 rows from 1 key to 32k, every tile and page boundary, every
registered ring and head count, and a CUDA graph captured once and replayed for other lengths."""

from __future__ import annotations

import random

import pytest
import torch
from decode_cases import BF16, DEV, FP8, FP16, check, config_id, make_case, poison, shapes_of

from sgjit.kernels.arch import device_profile
from sgjit.kernels.registry import StreamTile
from sgjit.kernels.selector import KernelSelector, stream_tile_for
from sgjit.kernels.spec import Workload
from sgjit.kernels.synthetic import AttentionCase

pytestmark = pytest.mark.gpu


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


@pytest.fixture(scope="module")
def profile():
    return device_profile(DEV)


def _op(profile, cfg, tile: StreamTile | None = None):
    from sgjit.kernels.cuda.decode import StreamDecode

    shapes = shapes_of(cfg)
    tile = tile or stream_tile_for(profile, shapes, Workload())[0]
    assert tile is not None, "the selector gave this shape no streaming decode tile"
    return StreamDecode(profile, shapes, tile)


def _run(op, case: AttentionCase) -> torch.Tensor:
    poison(case.q.numel() * case.q.element_size())
    return op(case.q, case.kv, case.meta, case.q.shape[-1] ** -0.5)


def _batches(rng: random.Random) -> list[tuple[str, list[int]]]:
    return [
        ("one key", [1]),
        ("64 rows of one key", [1] * 64),
        ("tile and page edges", [15, 16, 17, 31, 32, 33, 1, 2, 47, 48, 49, 63, 64, 65]),
        ("8 ragged rows", [rng.randint(1, 4096) for _ in range(8)]),
        ("64 rows 1k-4k", [rng.randint(1000, 4096) for _ in range(64)]),
        ("32k and short", [32768, 1, 5, 100]),
    ]


@pytest.mark.parametrize("cfg", CONFIGS, ids=config_id)
def test_matches_reference(cfg, profile):
    op = _op(profile, cfg)
    rng = random.Random(cfg[2] * 100 + cfg[4])
    for i, (what, lens) in enumerate(_batches(rng)):
        case = make_case(cfg, lens, seed=i)
        check(_run(op, case), case, f"{what} (tile {op.tile.name}, {op.ctas(len(lens), max(lens))} CTAs)")


@pytest.mark.parametrize("kv_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_graph_replay_any_lengths(kv_dtype, profile):
    """Captured once for 16 rows and a context bound of 4096, replayed for other lengths written into
    the same tensors: the partition moves on the device (as the JIT's decode graphs need)."""
    from sgjit.kernels.cuda.attention import PagedAttention

    cfg = (BF16, kv_dtype, 32, 8, 128, 16)
    shapes = shapes_of(cfg)
    t = KernelSelector().select(profile, shapes, Workload(16, 4096))["attention"].tunables
    tile = stream_tile_for(profile, shapes, Workload(16, 4096))[0]
    op = PagedAttention(profile, shapes, BF16, t["decode_tile"], t["prefill_tile"], 4096, stream_tile=tile)
    assert op.stream is not None
    b = 16
    case = make_case(cfg, [4096] * b)
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
        check(out, case, f"replay with lengths {lens[:4]}...")


@pytest.mark.parametrize("kv_dtype", [BF16, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("batch,ctx", [(1, 32768), (8, 32768), (64, 512), (64, 4096)])
def test_benchmark_grid_shapes(kv_dtype, batch, ctx, profile):
    """The benchmark's shapes, every row at the full length (Llama-3-8B heads)."""
    cfg = (BF16, kv_dtype, 32, 8, 128, 16)
    case = make_case(cfg, [ctx] * batch)
    check(_run(_op(profile, cfg), case), case, f"B={batch} ctx={ctx}")


@pytest.mark.parametrize("kv_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_every_ring_and_head_count(kv_dtype, profile):
    """Tiles the selector picks on other devices: 8 kv heads a CTA at every ring depth (bf16) or the
    deeper ones (fp8), and fewer heads a CTA (more head groups a row)."""
    cfg = (BF16, kv_dtype, 32, 8, 128, 16)
    depths, fewer = ((2, 3, 4, 6), ((4, 3), (1, 2))) if kv_dtype == BF16 else ((4, 6), ((2, 6),))
    tiles = [StreamTile(8, s) for s in depths] + [StreamTile(h, s) for h, s in fewer]
    case = make_case(cfg, [1, 70, 4097, 300, 2, 1999, 64, 65, 8000])
    for tile in tiles:
        if tile.blocks_per_sm(profile, 128, cfg[1].itemsize, 9) == 0:
            continue  # does not fit this device's shared memory
        check(_run(_op(profile, cfg, tile), case), case, f"tile {tile.name}")


@pytest.mark.parametrize("kv_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_adversarial_queries_and_keys(kv_dtype, profile):
    """Logits far apart (a near one-hot softmax), nearly equal (uniform), all-zero query heads; for
    fp8, queries beyond fp16's range (3e4 x randn: the kernel scales each head into it) and a key and
    value at e4m3's largest."""
    cfg = (BF16, kv_dtype, 32, 8, 128, 16)
    op = _op(profile, cfg)
    lens = [3000, 17, 1, 700]
    for what, q_mul in (("huge queries", 2e3 if kv_dtype == BF16 else 3e4), ("tiny queries", 1e-4)):
        case = make_case(cfg, lens, seed=3)
        case.q.mul_(q_mul)
        check(_run(op, case), case, what)
    case = make_case(cfg, lens, seed=4)
    case.q[:, ::3] = 0
    check(_run(op, case), case, "zero query heads")
    if kv_dtype == FP8:
        case = make_case(cfg, lens, seed=5)
        page = case.meta.page_table[0, 7].item()  # keys 112.. of row 0: one key at +-448 in every dim
        case.kv.k[page, 3].view(torch.uint8).fill_(0x7E)  # +448
        case.kv.v[page, 3].view(torch.uint8).fill_(0xFE)  # -448
        check(_run(op, case), case, "keys and values at e4m3's maximum")

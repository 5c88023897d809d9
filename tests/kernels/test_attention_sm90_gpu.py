"""The Hopper prefill kernel (attention_sm90.cu) against the reference op, on compute capability 9.0
only (skipped elsewhere): fresh prompts of 1 to 4097 tokens (tile edges and past them), prompts over
cached prefixes with partial pages, several rows of different lengths in one step, decode rows
mixed in, few long rows (split keys), bf16 and fp16, GQA groups 1/3/4/7/8, head_dim 64 and 128,
pages of 16/32/64 slots, every consumer schedule (serial, intra-warpgroup overlap, ping-pong, both)
and the TMA producer under the serial and the overlapped ping-pong consumers, every registered tile,
and a layer past the first of a many-layer pool (the TMA producer's tensor map spans all layers). Errors are ‖out − ref‖ / ‖ref‖ against the
reference on float32 inputs, at test_kernels_gpu's attention tolerances; pages no row owns hold
NaN and padding slots hold large values, so a read outside a row's keys shows.

tests/kernels/sm90_harness.py runs these cases without pytest, each in a child process with a
timeout, for runs that may hang."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from sgjit.kernels import reference
from sgjit.kernels.arch import device_profile
from sgjit.kernels.ops import LayerKV
from sgjit.kernels.registry import SM90_CC, SM90_PREFILL_TILES, SM90_SCHEDULES, SM90_TMA, Sm90Tile
from sgjit.kernels.selector import KernelSelector
from sgjit.kernels.spec import ModelShapes
from sgjit.kernels.synthetic import paged_attention_case

DEV = "cuda"
NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
ATTN_TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3}  # as test_kernels_gpu: P rounded to the dtype


def _on_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == SM90_CC


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _on_sm90(), reason="needs compute capability 9.0")]

# (dtype, Hq, Hkv, head_dim, page)
CONFIGS = [
    (torch.bfloat16, 32, 8, 128, 16),  # Llama-3-8B: group 4
    (torch.float16, 8, 8, 128, 16),  # MHA: group 1
    (torch.bfloat16, 16, 2, 128, 64),  # group 8, big pages
    (torch.bfloat16, 9, 3, 64, 16),  # SmolLM2: group 3, head_dim 64
    (torch.float16, 28, 4, 128, 32),  # group 7
    (torch.float16, 16, 2, 64, 64),  # head_dim 64, group 8, fp16
]
# (label, q_lens, kv_lens): kv_len - q_len is each row's cached prefix
BATCHES = [
    ("2 tokens", [2], [2]),  # the smallest step the sm_90 kernel runs (one token is decode): one key tile
    ("one token", [1], [1]),
    ("7 tokens", [7], [7]),
    ("tile edges", [31, 32, 33], [31, 32, 33]),
    ("127/128/129", [127, 128, 129], [127, 128, 129]),
    ("1000", [1000], [1000]),
    ("4097", [4097], [4097]),
    ("prefix, partial pages", [100, 37], [1100, 37 + 19]),
    ("one-token prompts among longer", [1, 1, 40], [1, 300, 40]),
    ("decode-shaped step (stays on attention.cu)", [1, 1], [2049, 77]),
    ("mixed with decode rows", [1, 17, 100, 1, 64], [1, 17, 1100, 5000, 64]),
    ("short extend, long prefix (split keys)", [16], [8000]),
    ("ragged rows", [333, 5, 8, 250, 1, 129], [333 + 4000, 5, 8 + 31, 250, 3, 129 + 128]),
    ("2048 over 2048 prefix", [2048], [4096]),
]
# The batches every registered tile runs (one long prompt, a prefix, one-token rows, decode rows).
TILE_BATCHES = ("1000", "4097", "prefix, partial pages", "one-token prompts among longer",
                "decode-shaped step (stays on attention.cu)")  # fmt: skip


def shapes_for(dtype: torch.dtype, hq: int, hkv: int, d: int, page: int) -> ModelShapes:
    name = NAMES[dtype]
    return ModelShapes(name, name, 4096, 14336, hq, hkv, d, d, 32000, page)


def make_op(cfg: tuple, tile: Sm90Tile | None = None, schedule: int | None = None):
    """PagedAttention with the selector's tiles for this shape, the sm_90 tile forced if given (or
    the selector's geometry with the consumer schedule given)."""
    from sgjit.kernels.cuda.attention import PagedAttention

    profile = device_profile(DEV)
    shapes = shapes_for(*cfg)
    t = KernelSelector().select(profile, shapes)["attention"].tunables
    sm90 = tile or t["prefill_sm90"]
    if schedule is not None:
        sm90 = replace(sm90, schedule=schedule)
    return PagedAttention(
        profile, shapes, cfg[0], t["decode_tile"], t["prefill_tile"], 8192, prefill_sm90=sm90
    )


def check(
    op, cfg: tuple, q_lens: list[int], kv_lens: list[int], seed: int = 0, consecutive: bool = False
) -> dict:
    """Run one batch through the op and the reference; the errors, overall and per row."""
    dtype, hq, hkv, d, page = cfg
    case = paged_attention_case(
        q_lens, kv_lens, hq, hkv, d, page, dtype, dtype, DEV, seed=seed, consecutive_pages=consecutive
    )
    scale = d**-0.5
    torch.full((case.q.numel() // 2 + 1,), float("nan"), device=DEV)  # poison the allocator's next block
    out = op(case.q, case.kv, case.meta, scale)
    ref = reference.attention(case.q.float(), case.kv, case.meta, scale)
    o, r = out.double(), ref.double()
    rows = []
    qo = case.meta.qo_indptr_host
    for b in range(len(kv_lens)):
        ob, rb = o[qo[b] : qo[b + 1]], r[qo[b] : qo[b + 1]]
        err_b = ((ob - rb).norm() / rb.norm().clamp_min(1e-30)).item()
        rows.append({"row": b, "q_len": q_lens[b], "kv_len": kv_lens[b], "err": err_b,
                     "nan": int(torch.isnan(ob).sum())})  # fmt: skip
    return {
        "err": ((o - r).norm() / r.norm().clamp_min(1e-30)).item(),
        "max_abs": (o - r).abs().nan_to_num(float("inf")).max().item(),
        "nan": int(torch.isnan(o).sum()),
        "rows": rows,
    }


def _assert_ok(res: dict, dtype: torch.dtype) -> None:
    bad = [r for r in res["rows"] if not r["err"] < ATTN_TOL[dtype]]
    assert res["nan"] == 0 and res["err"] < ATTN_TOL[dtype] and not bad, json.dumps(res)[:2000]


def cfg_id(c: tuple) -> str:
    return f"{NAMES[c[0]]}-{c[1]}q{c[2]}kv-d{c[3]}-p{c[4]}"


@pytest.mark.parametrize("schedule", SM90_SCHEDULES, ids=lambda s: f"schedule{s}")
@pytest.mark.parametrize("cfg", CONFIGS, ids=cfg_id)
def test_sm90_prefill_matches_reference(cfg, schedule):
    op = make_op(cfg, schedule=schedule)
    assert op.sm90 is not None and op.sm90.tile.schedule == schedule
    for i, (_, q_lens, kv_lens) in enumerate(BATCHES):
        res = check(op, cfg, q_lens, kv_lens, seed=i)
        _assert_ok(res, cfg[0])
        assert (op._plan.kernel is op.sm90) == (max(q_lens) > 1)  # prefill and mixed steps only


@pytest.mark.parametrize("tile", SM90_PREFILL_TILES, ids=lambda t: t.name)
def test_every_sm90_tile(tile):
    """Each registered tile, including those the selector does not prefer."""
    cfg = CONFIGS[0]
    op = make_op(cfg, tile)
    for i, (label, q_lens, kv_lens) in enumerate(BATCHES):
        if label in TILE_BATCHES:
            _assert_ok(check(op, cfg, q_lens, kv_lens, seed=100 + i), cfg[0])


@pytest.mark.parametrize("schedule", SM90_SCHEDULES, ids=lambda s: f"schedule{s}")
def test_sm90_prefill_is_deterministic(schedule):
    """No atomics or races: the same inputs give bit-identical outputs."""
    cfg = CONFIGS[0]
    op = make_op(cfg, schedule=schedule)
    case = paged_attention_case([3000, 77], [3000, 2077], 32, 8, 128, 16, torch.bfloat16, torch.bfloat16, DEV)
    first = op(case.q, case.kv, case.meta, 128**-0.5)
    for _ in range(3):
        assert torch.equal(op(case.q, case.kv, case.meta, 128**-0.5), first)


@pytest.mark.parametrize("schedule", SM90_SCHEDULES, ids=lambda s: f"schedule{s}")
def test_sm90_persistent_walk_over_many_items(schedule):
    """A persistent grid of 3 CTAs walks every item of ragged batches (item boundaries after items of
    one tile and of many, the next Q loaded under the last tile, O started afresh): the reference's
    result, and bit for bit the result of a CTA an item (each item is computed the same way wherever
    it runs)."""
    cfg = CONFIGS[0]
    op = make_op(cfg, schedule=schedule)
    op.sm90.sm_count = 3
    for label, q_lens, kv_lens in BATCHES:
        if label not in (
            "tile edges",
            "ragged rows",
            "one-token prompts among longer",
            "2048 over 2048 prefix",
        ):
            continue
        _assert_ok(check(op, cfg, q_lens, kv_lens), cfg[0])
        case = paged_attention_case(q_lens, kv_lens, 32, 8, 128, 16, torch.bfloat16, torch.bfloat16, DEV)
        op.sm90.persistent = True
        walked = op(case.q, case.kv, case.meta, 128**-0.5)
        op.sm90.persistent = False
        one_each = op(case.q, case.kv, case.meta, 128**-0.5)
        op.sm90.persistent = True
        assert torch.equal(walked, one_each), label


@pytest.mark.parametrize("schedule", SM90_SCHEDULES, ids=lambda s: f"schedule{s}")
def test_sm90_prefill_reads_its_layer_of_a_many_layer_pool(schedule):
    """K/V as the runtime's pool hands them out: views of layer 2 of one [layers, pages, slot, head, D]
    tensor whose other layers hold NaN, so a copy from the wrong layer (the TMA map's layer
    coordinate, or its strides) shows; the same twice, the second time from the cached map."""
    cfg = CONFIGS[0]
    dtype, hq, hkv, d, page = cfg
    op = make_op(cfg, schedule=schedule)
    case = paged_attention_case([700, 33], [700, 33 + 300], hq, hkv, d, page, dtype, dtype, DEV, seed=5)
    pool_k = torch.full((4, *case.kv.k.shape), float("nan"), dtype=dtype, device=DEV)
    pool_v = torch.full_like(pool_k, float("nan"))
    pool_k[2].copy_(case.kv.k)
    pool_v[2].copy_(case.kv.v)
    kv = LayerKV(pool_k[2], pool_v[2])
    ref = reference.attention(case.q.float(), case.kv, case.meta, d**-0.5).double()
    for _ in range(2):
        out = op(case.q, kv, case.meta, d**-0.5).double()
        err = ((out - ref).norm() / ref.norm()).item()
        assert not torch.isnan(out).any() and err < ATTN_TOL[dtype], err
    if schedule & SM90_TMA:
        assert len(op.sm90.maps._maps) == 1  # one map pair for the pool, whichever layer


@pytest.mark.parametrize("tile", [t for t in SM90_PREFILL_TILES if t.tma], ids=lambda t: t.name)
def test_sm90_tma_tiles_on_pages_larger_than_a_tile(tile):
    """Pages of 128 slots: a TMA box is the tile's part of a page (slot 0, or 64 for 64-key tiles),
    the tensor map's slot coordinate; the other configs' pages hold whole tiles' boxes."""
    cfg = (torch.bfloat16, 16, 2, 128, 128)
    op = make_op(cfg, tile)
    for i, (label, q_lens, kv_lens) in enumerate(BATCHES):
        if label in TILE_BATCHES:
            _assert_ok(check(op, cfg, q_lens, kv_lens, seed=200 + i), cfg[0])


@pytest.mark.parametrize("tile", [t for t in SM90_PREFILL_TILES if t.tma], ids=lambda t: t.name)
def test_sm90_tma_tiles_over_consecutive_pages(tile):
    """Pages in id order (a fresh prompt's): a tile whose pages are consecutive loads as one box a
    64-column block through the run map, the others (a row's last tile, whose pages past its end
    repeat the last; a row starting mid-run of another's) a box a page. Every batch, pages of 16 and
    32, and a layer of a many-layer pool (the run map's layer stride)."""
    for cfg in (CONFIGS[0], CONFIGS[3], CONFIGS[4]):
        op = make_op(cfg, tile)
        assert op.sm90.maps.run_rows == tile.bn
        for i, (_, q_lens, kv_lens) in enumerate(BATCHES):
            _assert_ok(check(op, cfg, q_lens, kv_lens, seed=300 + i, consecutive=True), cfg[0])
    dtype, hq, hkv, d, page = cfg = CONFIGS[0]
    op = make_op(cfg, tile)
    case = paged_attention_case(
        [700, 33], [700, 33 + 300], hq, hkv, d, page, dtype, dtype, DEV, seed=6, consecutive_pages=True
    )
    pool_k = torch.full((3, *case.kv.k.shape), float("nan"), dtype=dtype, device=DEV)
    pool_v = torch.full_like(pool_k, float("nan"))
    pool_k[1].copy_(case.kv.k)
    pool_v[1].copy_(case.kv.v)
    ref = reference.attention(case.q.float(), case.kv, case.meta, d**-0.5).double()
    out = op(case.q, LayerKV(pool_k[1], pool_v[1]), case.meta, d**-0.5).double()
    err = ((out - ref).norm() / ref.norm()).item()
    assert not torch.isnan(out).any() and err < ATTN_TOL[dtype], err

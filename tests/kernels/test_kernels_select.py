"""The selector's choices for recorded device profiles (A100, H100, H200, L4, RTX 4090, T4), the
SGJIT_KERNELS overrides, and autotuning's store — all on the CPU."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sgjit.errors import SgjitError
from sgjit.kernels.arch import DeviceProfile, arch_hash, cpu_profile
from sgjit.kernels.ops import OpTable
from sgjit.kernels.registry import AttnTile
from sgjit.kernels.selector import AutotuneStore, KernelSelector, decode_splits, stream_tile_for
from sgjit.kernels.spec import ModelShapes, Workload
from sgjit.runtime.model.presets import shape_config

PROFILES = {
    k: DeviceProfile.from_dict(v)
    for k, v in json.loads((Path(__file__).parents[1] / "data" / "device_profiles.json").read_text()).items()
    if not k.startswith("_")
}
KERNEL_OPS = ("rmsnorm", "add_rmsnorm", "rope_store_kv", "attention", "silu_mul", "apply_bitmask", "sample")


def shapes(name="llama3-8b", dtype=torch.bfloat16, kv=None, page=16) -> ModelShapes:
    return ModelShapes.from_config(shape_config(name), dtype, kv or dtype, page)


@pytest.fixture(autouse=True)
def _auto(monkeypatch, tmp_path):
    monkeypatch.setenv("SGJIT_KERNELS", "auto")
    monkeypatch.setenv("SGJIT_CACHE_DIR", str(tmp_path))


@pytest.mark.parametrize(
    "device,decode,prefill",
    [
        ("H200", "m1x1n2b32s2", "m1x4n1b64s2"),
        ("H100-SXM5-80GB", "m1x1n2b32s2", "m1x4n1b64s2"),
        ("A100-SXM4-80GB", "m1x1n2b32s2", "m1x4n1b64s2"),
        ("L4", "m1x1n2b32s2", "m1x4n1b64s2"),
        ("RTX-4090", "m1x1n2b32s2", "m1x4n1b64s2"),
    ],
)
def test_attention_tiles_follow_shared_memory(device, decode, prefill):
    ks = KernelSelector().select(PROFILES[device], shapes())
    for op in KERNEL_OPS:
        assert ks[op].variant == "cuda", (op, ks[op].reason)
    t = ks["attention"].tunables
    assert (t["decode_tile"].name, t["prefill_tile"].name) == (decode, prefill)
    p = PROFILES[device]
    assert t["decode_tile"].blocks_per_sm(p, 128, 2) >= 2
    assert ks["linear"].variant == "cuda" and ks["linear"].tunables["fp8_rows"] >= 1


def test_gemv_rows_by_device_and_mode():
    """The GEMV takes decode-sized products; without FP8 tensor cores (A100) it takes every FP8
    product it can; the deterministic mode sends everything to its fixed-row GEMMs instead."""
    h200 = KernelSelector().select(PROFILES["H200"], shapes())["linear"].tunables
    a100 = KernelSelector().select(PROFILES["A100-SXM4-80GB"], shapes())["linear"].tunables
    assert h200["dense_rows"] >= 1 and 1 <= h200["fp8_rows"] <= a100["fp8_rows"] == 16
    det = KernelSelector().select(PROFILES["H200"], shapes(), Workload(batch_invariant=True))["linear"]
    assert det.tunables["dense_rows"] == det.tunables["fp8_rows"] == 0 and "batch-invariant" in det.reason
    f32 = KernelSelector().select(PROFILES["H200"], shapes(dtype=torch.float32))["linear"]
    assert f32.variant == "reference"


def test_small_decode_steps_get_their_own_tile():
    """Decode steps with fewer CTAs than SMs (latency-bound) take the 4-warp, 64-key, 3-stage tile;
    the batch-invariant mode keeps one tile for every step."""
    from sgjit.kernels.registry import SMALL_DECODE_PREFERENCE

    t = KernelSelector().select(PROFILES["H200"], shapes())["attention"].tunables
    assert t["small_decode_tile"].name == SMALL_DECODE_PREFERENCE[0] != t["decode_tile"].name
    det = KernelSelector().select(PROFILES["H200"], shapes(), Workload(batch_invariant=True))["attention"]
    assert "small_decode_tile" not in det.tunables


def _attention_rule(sh, t: dict, stream=None, lean=None):
    """The attention op's launch rule without its kernels (host arithmetic): PagedAttention's methods
    bound to a stand-in holding the selector's tiles, with `stream`/`lean` stand-ins (None: none)."""
    from types import SimpleNamespace

    from sgjit.kernels.cuda.attention import PagedAttention

    op = SimpleNamespace(
        profile=PROFILES["H200"], shapes=sh, decode_tile=t["decode_tile"], small_decode_tile=t["small_decode_tile"],
        decode_kernel="large", small_decode_kernel="small", split_len=0, fixed_splits=None, max_context=8192,
        stream=stream, lean=lean,
    )  # fmt: skip
    for name in ("_small_ctas", "_decode_tile", "_streams", "_leans", "splits_for_batch", "decode_launch"):
        setattr(op, name, getattr(PagedAttention, name).__get__(op))
    return op


def test_small_decode_tile_serves_steps_of_fewer_than_two_ctas_a_sm():
    """The op's rule (no kernels needed: the launch plan is host arithmetic): on the H200's 132 SMs
    and the 8B's 8 kv heads, steps of up to 32 rows decode on the small tile (split up to 16 rows,
    whole from 17: a CTA for every SM), from 33 rows on the large tile; a graph key names the tile,
    so the two never share one."""

    from sgjit.kernels.cuda.attention import PagedAttention

    t = KernelSelector().select(PROFILES["H200"], shapes())["attention"].tunables
    op = _attention_rule(shapes(), t)
    rows = (1, 16, 17, 32, 33, 64)
    assert [PagedAttention._decode_tile(op, r)[1] for r in rows] == ["small"] * 4 + ["large"] * 2
    assert [PagedAttention.splits_for_batch(op, r) > 1 for r in rows] == [True, True] + [False] * 4
    one, big = PagedAttention.decode_launch(op, 1, 8192), PagedAttention.decode_launch(op, 64, 8192)
    assert t["small_decode_tile"].name in one[0] and t["decode_tile"].name in big[0]
    assert one[1] > 1  # a lone row's keys split over the SMs


def test_fp8_pools_leave_the_smallest_steps_to_the_small_tile():
    """fp8 pools decode on the streaming kernel, except steps of at most half the SMs' worth of
    small-tile CTAs (H100 sweep): on 132 SMs and 8 kv heads, up to 8 rows take the small mma.sync
    tile, from 9 rows on the stream; eager calls and graph keys agree."""
    from types import SimpleNamespace

    from sgjit.kernels.cuda.attention import PagedAttention

    sh = shapes(kv=torch.float8_e4m3fn)
    t = KernelSelector().select(PROFILES["H200"], sh)["attention"].tunables
    assert t["stream_decode"] is not None and t["small_decode_tile"] is not None
    op = _attention_rule(
        sh, t, stream=SimpleNamespace(smem_bytes=lambda rows: 1024, ctas=lambda rows, ctx: 132)
    )
    assert [op._streams(rows) for rows in (1, 8, 9, 64)] == [False, False, True, True]
    assert PagedAttention.decode_launch(op, 1, 8192)[0] == f"split {t['small_decode_tile'].name}"
    assert PagedAttention.decode_launch(op, 9, 8192) == ("stream", 132)


def test_lean_decode_takes_the_small_steps_over_short_contexts():
    """The selector offers the lean decode kernel (never in batch-invariant mode); the op sends it the
    steps where it measured faster: at most 64 (row, kv head) pairs and at most 8 x 4096 pairs x context
    bound (one row of the 8B up to 4096 keys, 8 rows at 512), with a split count that fills one wave
    capped by the bound's 64-key runs, and a graph key that names it."""
    from types import SimpleNamespace

    from sgjit.kernels.cuda.attention import PagedAttention
    from sgjit.kernels.cuda.lean_decode import LeanDecode

    t = KernelSelector().select(PROFILES["H200"], shapes())["attention"].tunables
    assert t["lean_decode"] is True
    invariant = Workload(64, 4096, batch_invariant=True)
    assert (
        KernelSelector().select(PROFILES["H200"], shapes(), invariant)["attention"].tunables["lean_decode"]
        is False
    )

    def lean_rule(max_cluster: int) -> SimpleNamespace:  # one CTA a SM, as the 8-warp kernel holds
        lean = SimpleNamespace(
            profile=PROFILES["H200"],
            shapes=shapes(),
            ctas_per_sm=1,
            min_split_keys=64,
            max_cluster=max_cluster,
        )
        lean.splits, lean.cluster = LeanDecode.splits.__get__(lean), LeanDecode.cluster.__get__(lean)
        return lean

    # one wave (132 CTAs over the pairs), no more splits than 64-key runs; up to 8 (a cluster) rounded
    # down to a power of two on sm_90
    lean = lean_rule(8)
    steps = [(1, 512), (1, 4096), (8, 4096), (16, 64), (3, 512)]
    assert [lean.splits(b, ctx) for b, ctx in steps] == [8, 16, 2, 1, 4]
    assert [lean.cluster(lean.splits(b, ctx)) for b, ctx in steps] == [8, 1, 2, 1, 4]
    assert [lean_rule(1).splits(b, ctx) for b, ctx in steps] == [8, 16, 2, 1, 5]
    op = _attention_rule(shapes(), t, lean=lean)
    assert [op._leans(rows, 1024) for rows in (1, 2, 4, 8)] == [True, True, True, False]
    assert [op._leans(rows, 512) for rows in (1, 8, 9)] == [True, True, False]
    assert op._leans(1, 4096) and not op._leans(1, 8192) and not op._leans(2, 4096)
    assert PagedAttention.decode_launch(op, 1, 512) == ("lean", 8)
    assert PagedAttention.decode_launch(op, 1, 4096) == ("lean", 16)
    assert PagedAttention.decode_launch(op, 8, 4096)[0] != "lean"


def test_dependent_launch_on_hopper():
    """The decode GEMVs and attention overlap the kernel before them on sm_90+, small layers and large
    (SmolLM2's 9 MB, the 8B's 436 MB: both measured faster), never below sm_90 (no griddepcontrol)."""
    from sgjit.kernels.selector import DEPENDENT_LAUNCH_OPS

    def on(profile: str, name: str) -> set[bool]:
        ks = KernelSelector().select(PROFILES[profile], shapes(name))
        return {
            ks[op].tunables["dependent_launch"] for op in DEPENDENT_LAUNCH_OPS if ks[op].variant == "cuda"
        }

    assert on("H200", "smollm2-135m") == {True}
    assert on("H200", "llama3-8b") == {True}
    assert on("A100-SXM4-80GB", "smollm2-135m") == {False}


def test_fused_decode_rows_by_shape_and_mode(unverified_kernels):
    """Decode steps run as the fused GEMVs up to FUSED_ROWS rows on large layers (the 8B's), more on
    small ones (SmolLM2's), fewer where the normalised rows would crowd shared memory; never in the
    deterministic mode or for fp32."""
    from dataclasses import replace

    from sgjit.kernels.registry import FUSED_OPS
    from sgjit.kernels.selector import FUSED_NORM_SMEM, FUSED_ROWS, FUSED_ROWS_SMALL_LAYERS

    for name, rows in (("llama3-8b", FUSED_ROWS), ("smollm2-135m", FUSED_ROWS_SMALL_LAYERS)):
        ks = KernelSelector().select(PROFILES["H200"], shapes(name))
        for op in FUSED_OPS:
            assert ks[op].variant == "cuda" and ks[op].tunables["rows"] == rows, (op, ks[op].reason)
    small = shapes("smollm2-135m")
    # two rows fill the budget, the layer still small
    wide = replace(small, hidden=FUSED_NORM_SMEM // 4, intermediate=64, num_heads=1, num_kv_heads=1)
    assert KernelSelector().select(PROFILES["H200"], wide)["linear_residual"].tunables["rows"] == min(
        2, FUSED_ROWS_SMALL_LAYERS
    )
    too_wide = replace(small, hidden=FUSED_NORM_SMEM)
    assert KernelSelector().select(PROFILES["H200"], too_wide)["rmsnorm_linear"].variant == "reference"
    det = KernelSelector().select(PROFILES["H200"], shapes(), Workload(batch_invariant=True))
    f32 = KernelSelector().select(PROFILES["H200"], shapes(dtype=torch.float32))
    for op in FUSED_OPS:
        assert det[op].variant == "reference" and "batch-invariant" in det[op].reason
        assert f32[op].variant == "reference"


def test_fp8_pool_tile():
    """The fp8 ring is half the bytes (plus the widened tile it is converted into); its preferred
    tile still runs two or more per SM on a 100 KB part."""
    tile = AttnTile.parse("m1x1n4b64s3")
    assert tile.smem_bytes(128, 1) < tile.smem_bytes(128, 2)
    fp8 = shapes(kv=torch.float8_e4m3fn)
    for device in ("H200", "L4"):
        t = KernelSelector().select(PROFILES[device], fp8)["attention"].tunables["decode_tile"]
        assert t.name == "m1x1n2b32s3" and t.blocks_per_sm(PROFILES[device], 128, 1) >= 2


def test_pre_ampere_keeps_torch_for_bf16_kernels():
    ks = KernelSelector().select(PROFILES["T4"], shapes())
    assert ks["attention"].variant == "reference" and "compute capability >= 8.0" in ks["attention"].reason
    assert ks["sample"].variant == "cuda"  # fp32 logits, sm_70+ intrinsics only


def test_unsupported_shapes_fall_to_reference():
    ks = KernelSelector().select(PROFILES["H200"], shapes(dtype=torch.float32))
    assert ks["rmsnorm"].variant == "reference" and "float32" in ks["rmsnorm"].reason
    assert ks["sample"].variant == "cuda"
    big = ModelShapes("bfloat16", "bfloat16", 4096, 14336, 16, 4, 256, 256, 32000, 16)
    ks = KernelSelector().select(PROFILES["H200"], big)
    assert ks["attention"].variant == "reference" and "head_dim 256" in ks["attention"].reason
    assert ks["rope_store_kv"].variant == "cuda"


def test_cpu_profile_is_all_reference():
    ks = KernelSelector().select(cpu_profile(), shapes())
    assert all(ks[op].variant == "reference" for op in OpTable.names())


def test_decode_splits_from_sm_count_and_context():
    p, s = PROFILES["H200"], shapes()
    tile = AttnTile.parse("m1x1n2b32s2")  # 16 KB in flight a CTA, 6 resident per SM
    splits = [decode_splits(p, tile, s, b, 4096) for b in (1, 2, 8, 64, 256)]
    assert splits == sorted(splits, reverse=True)
    assert splits[0] == 32 and splits[-2] == splits[-1] == 1  # B=64: 512 CTAs already keep HBM busy
    assert decode_splits(p, tile, s, 32, 1024) == 1  # 256 CTAs: a CTA for every SM, no merge
    assert decode_splits(p, tile, s, 16, 1024) > 1  # 128 CTAs: fewer than the 132 SMs
    ctas = 8 * 8 * splits[2]  # batch 8: three CTAs (48 KB) per SM, all in one wave
    assert 3 * 132 <= ctas <= 6 * 132
    assert decode_splits(p, tile, s, 1, 128) == 2  # no split shorter than two tiles of the bound
    small = DeviceProfile.from_dict({**PROFILES["H200"].as_dict(), "sm_count": 66})
    assert decode_splits(small, tile, s, 8, 4096) < splits[2]
    deep = AttnTile.parse("m1x1n4b64s3")  # 64 KB in flight: one CTA per SM suffices
    assert decode_splits(p, deep, s, 8, 4096) == 3


def test_overrides(monkeypatch):
    monkeypatch.setenv("SGJIT_KERNELS", "reference")
    ks = KernelSelector().select(PROFILES["H200"], shapes())
    assert all(ks[op].variant == "reference" for op in OpTable.names())
    monkeypatch.setenv("SGJIT_KERNELS", "attention=reference,sample=reference")
    ks = KernelSelector().select(PROFILES["H200"], shapes())
    assert ks["attention"].variant == "reference" and "SGJIT_KERNELS" in ks["attention"].reason
    assert ks["sample"].variant == "reference" and ks["rmsnorm"].variant == "cuda"
    for bad in ("attention=wgmma", "attn=cuda", "attention"):
        monkeypatch.setenv("SGJIT_KERNELS", bad)
        with pytest.raises((SgjitError, KeyError)):
            KernelSelector().select(PROFILES["H200"], shapes())


def test_arch_hash_tracks_the_profile():
    h = {arch_hash(p) for p in PROFILES.values()}
    assert len(h) == len(PROFILES)
    assert arch_hash(PROFILES["H200"]) == arch_hash(DeviceProfile.from_dict(PROFILES["H200"].as_dict()))


def test_autotune_times_once_and_stores_winners(tmp_path):
    calls = []

    def timer(profile, shapes, workload, knob, tile):
        calls.append((knob, tile.name))
        return 1.0 if tile.stages == 3 else 2.0  # pretend the 3-stage tiles win

    store = AutotuneStore(tmp_path / "tune.json")
    w = Workload(64, 4096, 2048)
    ks = KernelSelector(autotune=True, timer=timer, store=store).select(PROFILES["H200"], shapes(), w)
    t = ks["attention"].tunables
    assert t["decode_tile"].name == "m1x1n2b32s3" and t["prefill_tile"].name == "m1x4n1b64s3"
    assert "autotuned" in ks["attention"].reason
    n = len(calls)
    assert n >= 4
    again = KernelSelector(autotune=True, timer=timer, store=store).select(PROFILES["H200"], shapes(), w)
    assert len(calls) == n, "stored winners are reused"
    assert again["attention"].tunables == t
    other = KernelSelector(autotune=True, timer=timer, store=store).select(
        PROFILES["H100-SXM5-80GB"], shapes(), w
    )
    assert len(calls) > n and other["attention"].variant == "cuda"
    assert len(json.loads((tmp_path / "tune.json").read_text())) == 4


@pytest.mark.parametrize(
    "device,model,kv,tile",
    [
        ("H200", "llama3-8b", torch.bfloat16, "h8s3"),  # whole 2 KB key rows, 128 KB in flight a SM
        ("H200", "llama3-8b", torch.float8_e4m3fn, "h8s4"),
        ("H100-SXM5-80GB", "llama3-8b", torch.bfloat16, "h8s3"),
        ("A100-SXM4-80GB", "llama3-8b", torch.bfloat16, "h8s2"),  # 164 KB: the deepest ring that fits
        ("L4", "llama3-8b", torch.bfloat16, "h4s3"),  # 100 KB: half the heads a CTA
        ("H200", "smollm2-135m", torch.bfloat16, "h3s4"),  # 3 kv heads: all of them a CTA
    ],
)
def test_streaming_decode_tile_by_device(device, model, kv, tile):
    """The decode kernel holds the most kv heads a CTA that fit (a divisor of the model's, up to 8)
    with the shallowest ring keeping ~96 KB of K/V in flight a SM, else the deepest that fits."""
    t, _ = stream_tile_for(PROFILES[device], shapes(model, kv=kv), Workload())
    assert t.name == tile
    p = PROFILES[device]
    assert t.smem_bytes(128, kv.itemsize, 256) <= p.smem_per_block_optin
    assert shape_config(model).num_kv_heads % t.heads == 0


def test_streaming_decode_for_fp8_pools_only():
    """The selector decodes fp8 pools on the streaming kernel (0.51-0.55x the bf16 time where the step is
    bandwidth-bound, measured on the H100) and 16-bit pools on the mma.sync kernel (streaming measured no
    faster there); both on every device the streaming kernel fits."""
    for device in ("H200", "H100-SXM5-80GB", "A100-SXM4-80GB"):
        fp8 = KernelSelector().select(PROFILES[device], shapes(kv=torch.float8_e4m3fn))["attention"]
        assert fp8.tunables["stream_decode"] is not None and "decode streams" in fp8.reason
        bf16 = KernelSelector().select(PROFILES[device], shapes())["attention"]
        assert bf16.tunables["stream_decode"] is None and "mma.sync" in bf16.reason


def test_streaming_decode_not_where_it_does_not_apply():
    """Batch-invariant mode keeps the fixed-split kernel (the flat split depends on the whole batch),
    and so do groups over 16 query heads a kv head (one m16 tile)."""
    h200, fp8 = PROFILES["H200"], torch.float8_e4m3fn
    det = KernelSelector().select(h200, shapes(kv=fp8), Workload(batch_invariant=True))["attention"]
    assert det.variant == "cuda" and det.tunables["stream_decode"] is None
    wide = ModelShapes("bfloat16", "fp8_e4m3", 8192, 28672, 64, 2, 128, 128, 128256, 16)  # group 32
    t = KernelSelector().select(h200, wide)["attention"]
    assert t.variant == "cuda" and t.tunables["stream_decode"] is None and "group 32" in t.reason


def test_sm90_prefill_only_on_hopper_for_16bit_pools():
    """Compute capability 9.0 gets the warpgroup-MMA prefill tile (decode keeps the mma.sync tile);
    other devices, fp8 pools, head_dim 256 and the batch-invariant mode do not."""
    for device in ("H200", "H100-SXM5-80GB"):
        ks = KernelSelector().select(PROFILES[device], shapes())
        t = ks["attention"].tunables
        assert t["prefill_sm90"].name == "sm90b128s3opt" and "sm90b128s3opt" in ks["attention"].reason
        assert t["prefill_sm90"].fits(PROFILES[device], 128) and t["decode_tile"].name == "m1x1n2b32s2"
    for device in ("A100-SXM4-80GB", "L4", "RTX-4090"):
        assert "prefill_sm90" not in KernelSelector().select(PROFILES[device], shapes())["attention"].tunables
    fp8 = KernelSelector().select(PROFILES["H200"], shapes(kv=torch.float8_e4m3fn))["attention"]
    assert "prefill_sm90" not in fp8.tunables and "no sm_90 prefill (KV dtype fp8_e4m3)" in fp8.reason
    inv = KernelSelector().select(PROFILES["H200"], shapes(), Workload(batch_invariant=True))["attention"]
    assert "prefill_sm90" not in inv.tunables
    small = KernelSelector().select(PROFILES["H200"], shapes("smollm2-135m"))["attention"].tunables
    assert small["prefill_sm90"].bn == 128  # head_dim 64


@pytest.fixture
def unverified_kernels(monkeypatch):
    """The selector with the kernels not yet verified on a GPU offered (SGJIT_UNVERIFIED_KERNELS=1)."""
    monkeypatch.setenv("SGJIT_UNVERIFIED_KERNELS", "1")


def test_sm90_prefill_takes_tma_under_the_overlapped_ping_pong_consumers():
    """The Hopper prefill loads K/V by TMA under FlashAttention-3's intra-warpgroup overlap and
    ping-pong (verified and fastest on the H100) on the preferred geometry, at head_dim 128 and 64;
    pages smaller than a TMA box's 8-row swizzle atom keep the same consumers on the cp.async
    producer. The reason names the tile."""
    from sgjit.kernels.registry import SM90_OVERLAP, SM90_PINGPONG, SM90_SCHEDULE_PREFERENCE, SM90_TMA

    consumers = SM90_OVERLAP | SM90_PINGPONG
    assert SM90_SCHEDULE_PREFERENCE == (consumers | SM90_TMA, consumers)
    for device in ("H200", "H100-SXM5-80GB"):
        attn = KernelSelector().select(PROFILES[device], shapes())["attention"]
        tile = attn.tunables["prefill_sm90"]
        assert (tile.bn, tile.stages, tile.schedule) == (128, 3, consumers | SM90_TMA)
        assert tile.name == "sm90b128s3opt" and tile.name in attn.reason
    small = KernelSelector().select(PROFILES["H200"], shapes("smollm2-135m"))["attention"]
    assert small.tunables["prefill_sm90"].schedule == consumers | SM90_TMA  # head_dim 64
    tiny_pages = KernelSelector().select(PROFILES["H200"], shapes(page=4))["attention"].tunables
    assert tiny_pages["prefill_sm90"].name == "sm90b128s3op"


def test_sm90_tiles_cover_every_geometry_with_every_schedule():
    """One name per (geometry, schedule), the serial names unchanged (stored results keep meaning),
    and shared memory for the fourth barrier a stage (K and V are freed separately)."""
    from sgjit.kernels.registry import SM90_GEOMETRIES, SM90_PREFILL_TILES, SM90_SCHEDULES, Sm90Tile

    names = [t.name for t in SM90_PREFILL_TILES]
    assert len(set(names)) == len(names) == len(SM90_GEOMETRIES) * len(SM90_SCHEDULES)
    assert {"sm90b128s2", "sm90b128s2o", "sm90b128s2p", "sm90b128s2op", "sm90b64s4op"} <= set(names)
    assert Sm90Tile(128, 2).smem_bytes(128) == 1024 + 128 * 128 * 2 + 2 * 2 * 128 * 128 * 2 + 2 * 4 * 8
    assert all(t.fits(PROFILES["H200"], 128) for t in SM90_PREFILL_TILES)


def test_unverified_kernels_are_not_offered_by_default(monkeypatch):
    """The decode megakernel (correct, but no faster than the layered kernels) waits for
    SGJIT_UNVERIFIED_KERNELS=1; the fused decode GEMVs and the multi-step bookkeeping kernel, verified
    on the H100 and H200, are offered without it."""
    monkeypatch.delenv("SGJIT_UNVERIFIED_KERNELS", raising=False)
    ks = KernelSelector().select(PROFILES["H200"], shapes("smollm2-135m"))
    assert ks["decode_megakernel"].variant == "reference"
    assert "SGJIT_UNVERIFIED_KERNELS" in ks["decode_megakernel"].reason
    assert ks["rmsnorm_qkv_rope"].variant != "reference"
    assert ks["advance_decode"].variant == "cuda"
    monkeypatch.setenv("SGJIT_UNVERIFIED_KERNELS", "1")
    assert (
        KernelSelector().select(PROFILES["H200"], shapes("smollm2-135m"))["decode_megakernel"].variant
        == "cuda"
    )


def test_moe_experts_grouped_only_where_it_never_syncs(monkeypatch):
    """torch's grouped GEMM runs without the host on sm_90/sm_100 in bf16: there the selector takes
    it; elsewhere (A100, fp16, a dense model, widths off 16 bytes) the reference op serves."""
    moe = shapes("qwen3-30b-a3b")
    assert (moe.experts, moe.expert_intermediate) == (128, 768)
    h200 = KernelSelector().select(PROFILES["H200"], moe)["moe_experts"]
    assert h200.variant == "grouped_mm", h200.reason
    a100 = KernelSelector().select(PROFILES["A100-SXM4-80GB"], moe)["moe_experts"]
    assert a100.variant == "reference" and "compute capability >= 9.0" in a100.reason
    fp16 = KernelSelector().select(PROFILES["H200"], shapes("qwen3-30b-a3b", dtype=torch.float16))
    assert fp16["moe_experts"].variant == "reference" and "float16" in fp16["moe_experts"].reason
    dense = KernelSelector().select(PROFILES["H200"], shapes())["moe_experts"]
    assert dense.variant == "reference" and "dense model" in dense.reason
    odd = KernelSelector().select(PROFILES["H200"], replace(moe, expert_intermediate=100))["moe_experts"]
    assert odd.variant == "reference" and "multiples of 8" in odd.reason
    monkeypatch.setenv("SGJIT_KERNELS", "cuda")  # the CUDA kernels forced; the grouped GEMM still chosen
    assert KernelSelector().select(PROFILES["H200"], moe)["moe_experts"].variant == "grouped_mm"
    monkeypatch.setenv("SGJIT_KERNELS", "moe_experts=reference")
    assert KernelSelector().select(PROFILES["H200"], moe)["moe_experts"].variant == "reference"


def test_decode_megakernel_for_small_dense_models_only(monkeypatch, unverified_kernels):
    """The one-launch decode step: SmolLM2 (7 MB layers) up to MEGAKERNEL_ROWS rows, fewer where the
    runtime's batch is smaller; never for 8B-sized layers, Qwen3's q/k norms, MoE layers, an fp8 pool,
    the deterministic mode, more rotary dims than a head has (each CTA keeps rows x head_dim of them),
    a CPU, or without SGJIT_UNVERIFIED_KERNELS=1."""
    from sgjit.kernels.selector import MEGAKERNEL_ROWS, SMALL_LAYER_BYTES, _layer_bytes

    op = "decode_megakernel"
    small = shapes("smollm2-135m")
    assert _layer_bytes(small) < SMALL_LAYER_BYTES < _layer_bytes(shapes())
    for device in ("H200", "H100-SXM5-80GB", "A100-SXM4-80GB"):
        c = KernelSelector().select(PROFILES[device], small)[op]
        assert c.variant == "cuda" and c.tunables["rows"] == MEGAKERNEL_ROWS, c.reason
    assert KernelSelector().select(PROFILES["H200"], small, Workload(max_batch=3))[op].tunables["rows"] == 2
    refused = {
        "8b layers": (shapes(), Workload()),
        "qk norm": (replace(small, qk_norm=True), Workload()),
        "moe": (replace(small, experts=8, expert_intermediate=64), Workload()),
        "fp8 pool": (shapes("smollm2-135m", kv=torch.float8_e4m3fn), Workload()),
        "deterministic": (small, Workload(batch_invariant=True)),
        "fp32": (shapes("smollm2-135m", dtype=torch.float32), Workload()),
        "rotary dims past the head": (replace(small, rope_dim=2 * small.head_dim), Workload()),
    }
    for why, (s, w) in refused.items():
        assert KernelSelector().select(PROFILES["H200"], s, w)[op].variant == "reference", why
    assert KernelSelector().select(cpu_profile(), small)[op].variant == "reference"
    monkeypatch.delenv("SGJIT_UNVERIFIED_KERNELS")
    c = KernelSelector().select(PROFILES["H200"], small)[op]
    assert c.variant == "reference" and "SGJIT_UNVERIFIED_KERNELS" in c.reason

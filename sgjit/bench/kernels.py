"""`python -m sgjit.bench.kernels`: every CUDA kernel next to the best torch equivalent on the same
inputs (torch SDPA on contiguous K/V for attention, the reference ops for the rest), against the
roofline measured at the start of the same run (device-to-device copy bandwidth, bf16 GEMM peak).
Memory-bound kernels are scored in bytes moved (each input read once, each output written once)
over the copy bandwidth; prefill attention in causal FLOPs per second. Writes JSON (--out) and
prints a markdown table. Times are CUDA-event medians after warm-up."""

from __future__ import annotations

import argparse
import itertools
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from sgjit.bench import kernel_profile
from sgjit.bench.ceilings import Ceilings, measure
from sgjit.bench.report import environment, markdown_table, write_json
from sgjit.kernels import reference
from sgjit.kernels.arch import DeviceProfile, arch_hash, device_profile
from sgjit.kernels.ops import LayerKV, SamplingTensors
from sgjit.kernels.registry import CUDA, SM90_CC, SM90_PREFILL_TILES, SM90_SCHEDULES, AttnTile, variant
from sgjit.kernels.selector import AutotuneStore, KernelSelector, stream_tile_for
from sgjit.kernels.spec import KernelChoice, KernelSet, ModelShapes, Workload
from sgjit.kernels.synthetic import paged_attention_case
from sgjit.kernels.tune import attention_timer, median_cuda_seconds, median_graph_seconds

log = logging.getLogger(__name__)
DEV = torch.device("cuda")
BF16 = torch.bfloat16
HQ, HKV, D, PAGE = 32, 8, 128, 16  # the Llama-3-8B attention shape of the targets
SCALE = D**-0.5


def _shapes(kv: str = "bfloat16") -> ModelShapes:
    return ModelShapes("bfloat16", kv, 4096, 14336, HQ, HKV, D, D, 128256, PAGE)


def _row(kernel: str, shape: str, ours: float, torch_s: float | None, **extra: Any) -> dict[str, Any]:
    r = {"kernel": kernel, "shape": shape, "ours_us": ours * 1e6, "torch_us": None, "speedup": None}
    if torch_s is not None:
        r["torch_us"] = torch_s * 1e6
        r["speedup"] = torch_s / ours
    return r | extra


def _membound(row: dict, nbytes: int, seconds: float, ceil: Ceilings, target: float) -> dict:
    gbps = nbytes / seconds / 1e9
    pct = 100 * gbps / ceil.copy_gbps
    return row | {"GB/s": gbps, "% copy BW": pct, "target": f">= {target:.0f}% copy BW", "met": pct >= target}


# Decode shapes of the targets: rows x context, Llama-3-8B heads, page 16.
DECODE_GRID = tuple((b, ctx) for b in (1, 8, 64) for ctx in (512, 4096, 32768))
KV_DOMINANT_BYTES = 64 << 20  # above this the step is a K/V stream (below, launch and latency rule it)
SDPA_EXPANDED_MAX_BYTES = 2 << 30  # K/V expanded to every query head, where that fits beside the rest


def _graph_seconds(fn: Callable[[], object]) -> float:
    """Device seconds a call, replayed from a CUDA graph as the engine's decode steps are (an eager
    call of a few us would time the host); ~20 ms of calls a graph."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    fn()
    end.record()
    end.synchronize()
    calls = max(1, min(50, int(20e-3 / max(start.elapsed_time(end) / 1e3, 1e-7))))
    return median_graph_seconds(fn, calls=calls, reps=10)


def _attention_op(profile: DeviceProfile, shapes: ModelShapes, ctx: int, stream: bool = True):
    """The attention op with the selector's tiles for a `ctx`-token workload, decoding on the streaming
    kernel's tile for these shapes (stream=False: on the mma.sync decode kernel), whichever of the two
    the selector would pick for the pool's dtype."""
    from sgjit.kernels.cuda.attention import PagedAttention

    workload = Workload(64, ctx)
    t = KernelSelector().select(profile, shapes, workload)["attention"].tunables
    tile = stream_tile_for(profile, shapes, workload)[0] if stream else None
    return PagedAttention(
        profile, shapes, BF16, t["decode_tile"], t["prefill_tile"], ctx, stream_tile=tile,
        small_decode_tile=t.get("small_decode_tile"), lean_decode=t.get("lean_decode", False),
    )  # fmt: skip


def _selector_streams(profile: DeviceProfile, ctx: int) -> bool:
    """Whether the selector decodes a bf16 pool of these shapes on the streaming kernel."""
    t = KernelSelector().select(profile, _shapes(), Workload(64, ctx))["attention"].tunables
    return t.get("stream_decode") is not None


def _sdpa_seconds(b: int, ctx: int, q: torch.Tensor) -> dict[str, float]:
    """torch SDPA of one query a row over contiguous K/V [B, Hkv, ctx, D]: with enable_gqa, and with
    K/V expanded to every query head where that fits."""
    q4 = q[:, :, None, :]
    k = torch.randn(b, HKV, ctx, D, device=DEV, dtype=BF16)
    v = torch.randn_like(k)
    out = {
        "sdpa_gqa": _graph_seconds(
            lambda: F.scaled_dot_product_attention(q4, k, v, scale=SCALE, enable_gqa=True)
        )
    }
    if 2 * k.numel() * 2 * (HQ // HKV) <= SDPA_EXPANDED_MAX_BYTES:
        ke, ve = k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1)
        out["sdpa_expanded"] = _graph_seconds(lambda: F.scaled_dot_product_attention(q4, ke, ve, scale=SCALE))
    return out


def bench_decode(profile: DeviceProfile, ceil: Ceilings, rows: list, detail: dict) -> None:
    """Decode attention over DECODE_GRID (32 q / 8 kv heads, d=128, page 16): the selected op on a
    bf16 and on an fp8 pool (the streaming kernel), the mma.sync decode kernel it replaced, and torch
    SDPA on contiguous K/V, each as CUDA-graph replays. Scored in the K/V bytes each pool holds over
    the copy bandwidth; where those bytes dominate (>= 64 MB) the target is 95% of it and faster than
    SDPA, and fp8 85% of it in its own bytes and <= 0.6x the bf16 time."""
    grid = {}
    for b, ctx in DECODE_GRID:
        case = paged_attention_case([1] * b, [ctx] * b, HQ, HKV, D, PAGE, BF16, BF16, DEV)
        fp8 = paged_attention_case(
            [1] * b, [ctx] * b, HQ, HKV, D, PAGE, BF16, torch.float8_e4m3fn, DEV, kv_scale=0.5
        )
        ops = {
            "bf16": (_attention_op(profile, _shapes(), ctx), case),
            "fp8": (_attention_op(profile, _shapes("fp8_e4m3"), ctx), fp8),
            "mma.sync bf16": (_attention_op(profile, _shapes(), ctx, stream=False), case),
        }
        times = {
            k: _graph_seconds(lambda op=op, c=c: op(c.q, c.kv, c.meta, SCALE)) for k, (op, c) in ops.items()
        }
        sdpa = _sdpa_seconds(b, ctx, case.q)
        del case, fp8
        torch.cuda.empty_cache()
        kv_bytes = 2 * b * ctx * HKV * D * 2
        shape = f"B={b} ctx={ctx} 32q/8kv d128 p16"
        torch_s = min(sdpa.values())
        dominant = kv_bytes >= KV_DOMINANT_BYTES
        stream = ops["bf16"][0].stream
        ctas = stream.ctas(b, ctx) if stream is not None else None
        r = _row(
            f"decode attention bf16 ({stream.tile.name if stream else 'mma.sync'})",
            shape,
            times["bf16"],
            torch_s,
        )
        r = _membound(r, kv_bytes, times["bf16"], ceil, 95 if dominant else 0)
        r |= {"ctas": ctas, "vs mma.sync": times["mma.sync bf16"] / times["bf16"]}
        r["met"] = bool((r["met"] or not dominant) and times["bf16"] < torch_s)
        r["target"] = ">= 95% copy BW and < SDPA" if dominant else "< SDPA"
        rows.append(r)
        r8 = _row("decode attention fp8 KV", shape + " fp8 e4m3", times["fp8"], torch_s)
        r8 = _membound(r8, kv_bytes // 2, times["fp8"], ceil, 85)
        r8["vs bf16"] = times["fp8"] / times["bf16"]
        r8["met"] = bool(r8["met"] and r8["vs bf16"] <= 0.6) if dominant else None
        r8["target"] = ">= 85% copy BW (own bytes) and <= 0.6x bf16" if dominant else "(launch-bound)"
        rows.append(r8)
        grid[shape] = {k: t * 1e6 for k, t in {**times, **sdpa}.items()} | {"ctas": ctas}
    detail["decode_grid_us"] = grid
    _decode_sweep(profile, detail)


def _decode_sweep(profile: DeviceProfile, detail: dict) -> None:
    """The mma.sync decode kernel (kept for the batch-invariant mode and groups over 16) at B=64
    ctx=4096: every tile and split count, and the L2 prefetch hint on the fastest."""
    from sgjit.kernels.cuda.attention import PagedAttention

    b, ctx = 64, 4096
    case = paged_attention_case([1] * b, [ctx] * b, HQ, HKV, D, PAGE, BF16, BF16, DEV)
    tiles = variant("attention", CUDA).tunables
    prefill = tiles["prefill_tile"][0]
    results = {}
    for tile in tiles["decode_tile"]:
        for splits in (1, 2):
            op = PagedAttention(profile, _shapes(), BF16, tile, prefill, ctx, fixed_splits=splits)
            results[f"{tile.name}/splits{splits}"] = median_cuda_seconds(
                lambda op=op: op(case.q, case.kv, case.meta, SCALE)
            )
    top = min(results, key=results.get)
    tile, splits = AttnTile.parse(top.split("/")[0]), int(top.split("splits")[1])
    op = PagedAttention(profile, _shapes(), BF16, tile, prefill, ctx, fixed_splits=splits, kv_prefetch=128)
    results[f"{top}/prefetch128"] = median_cuda_seconds(lambda: op(case.q, case.kv, case.meta, SCALE))
    detail["mma_sync_decode_sweep_us"] = {k: v * 1e6 for k, v in results.items()}
    detail["decode_reference_op_us"] = 1e6 * median_cuda_seconds(
        lambda: reference.attention(case.q, case.kv, case.meta, SCALE), reps=5
    )
    detail["small_decode_sweep_us"] = _small_decode_sweep(profile, tiles)


# The latency-bound small steps: where the selector's small-step tile and the lean decode kernel's
# regime (registry.py) come from; and the 8B's b=32 step of `bench.latency` (rows of 512-576 keys),
# where the split count decode_splits picks is measured against the others.
SMALL_DECODE_STEPS = ((1, 512), (1, 1024), (1, 4096), (8, 512), (8, 4096), (32, 576))
SMALL_DECODE_SPLITS = (1, 2, 4, 8, 16, 32)
# (warps, CTAs a SM (None: the occupancy calculator's), least keys a split, largest cluster (1: none))
LEAN_SWEEP = ((8, None, 64, 8), (8, None, 64, 1), (4, None, 64, 8), (8, None, 128, 8), (8, 2, 64, 1))


def _small_decode_sweep(profile: DeviceProfile, tiles: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Small decode steps (fewer CTAs than SMs before any split): every mma.sync decode tile at
    several split counts, merge included, and the lean decode kernel at the LEAN_SWEEP launch shapes
    (`lean wW cC kK clL sS`: S the splits it took), as CUDA-graph replays, beside torch SDPA (GQA)."""
    from sgjit.kernels.cuda.attention import PagedAttention
    from sgjit.kernels.cuda.lean_decode import LeanDecode

    out = {}
    prefill = tiles["prefill_tile"][0]
    for b, ctx in SMALL_DECODE_STEPS:
        case = paged_attention_case([1] * b, [ctx] * b, HQ, HKV, D, PAGE, BF16, BF16, DEV)
        times = {}
        for tile, splits in itertools.product(tiles["decode_tile"], SMALL_DECODE_SPLITS):
            op = PagedAttention(profile, _shapes(), BF16, tile, prefill, 8192, fixed_splits=splits)
            times[f"{tile.name}/splits{splits}"] = 1e6 * _graph_seconds(
                lambda op=op, c=case: op(c.q, c.kv, c.meta, SCALE)
            )
        for warps, per_sm, least, cluster in LEAN_SWEEP:
            lean = LeanDecode(
                profile, _shapes(), warps=warps, ctas_per_sm=per_sm, min_split_keys=least, max_cluster=cluster
            )
            label = f"lean w{warps} c{per_sm or 'occ'} k{least} cl{cluster} s{lean.splits(b, ctx)}"
            times[label] = 1e6 * _graph_seconds(lambda op=lean, c=case: op(c.q, c.kv, c.meta, SCALE))
        # what a model's step runs: the selector's op (its decode kernel for a bf16 pool), its splits
        # from a graph's power-of-two bound
        bound = 1 << (ctx - 1).bit_length()
        selected = _attention_op(profile, _shapes(), bound, stream=_selector_streams(profile, bound))
        times["selected"] = 1e6 * _graph_seconds(lambda op=selected, c=case: op(c.q, c.kv, c.meta, SCALE))
        times["sdpa_gqa"] = 1e6 * _sdpa_seconds(b, ctx, case.q)["sdpa_gqa"]
        out[f"B={b} ctx={ctx}"] = times
    return out


def bench_prefill(profile: DeviceProfile, ceil: Ceilings, rows: list, detail: dict) -> None:
    """Causal self-attention of one T-token row, 32 q / 8 kv heads, d=128, bf16: every prefill tile
    (mma.sync, and on compute capability 9.0 the warpgroup-MMA kernel's, every geometry with every
    consumer schedule, a row for the fastest of each schedule) on the paged pool vs torch SDPA
    (flash) on contiguous K/V; then a 4096-token chunk over a 12288-token paged prefix, scored
    against the same kernel's fresh T=16384 rate."""
    fresh = {}
    for t_len in (4096, 16384):
        fresh[t_len] = _prefill_one(profile, ceil, rows, detail, t_len)
    _prefill_prefix(profile, rows, detail, 4096, 16384, fresh[16384])


def _prefill_ops(profile: DeviceProfile, max_context: int) -> dict[str, Any]:
    """Name -> PagedAttention for every prefill tile that can run here."""
    from sgjit.kernels.cuda.attention import PagedAttention

    tiles = variant("attention", CUDA).tunables
    dec = tiles["decode_tile"][0]
    ops = {
        t.name: PagedAttention(profile, _shapes(), BF16, dec, t, max_context) for t in tiles["prefill_tile"]
    }
    if profile.compute_capability == SM90_CC:
        for t in tiles["prefill_sm90"]:
            if t.fits(profile, D):
                ops[t.name] = PagedAttention(
                    profile, _shapes(), BF16, dec, tiles["prefill_tile"][0], max_context, prefill_sm90=t
                )
    return ops


def _selected_prefill(profile: DeviceProfile) -> str:
    t = KernelSelector().select(profile, _shapes())["attention"].tunables
    return (t.get("prefill_sm90") or t["prefill_tile"]).name


def _prefill_one(
    profile: DeviceProfile, ceil: Ceilings, rows: list, detail: dict, t_len: int
) -> dict[str, float]:
    case = paged_attention_case([t_len], [t_len], HQ, HKV, D, PAGE, BF16, BF16, DEV)
    flops = 4 * t_len * t_len * HQ * D / 2  # causal: half the square
    scale = D**-0.5
    times = {}
    ops = _prefill_ops(profile, t_len)
    for name, op in ops.items():
        try:
            times[name] = median_cuda_seconds(lambda op=op: op(case.q, case.kv, case.meta, scale), reps=10)
        except Exception as e:  # one broken tile must not hide the others' numbers
            log.exception("prefill tile %s failed", name)
            detail[f"prefill_{t_len}_{name}_error"] = repr(e)
    q = case.q.transpose(0, 1)[None]  # [1, Hq, T, D]
    k = torch.randn(1, HKV, t_len, D, device=DEV, dtype=BF16)
    v = torch.randn_like(k)
    ke, ve = k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1)
    sdpa = {
        "sdpa_gqa": lambda: F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scale, enable_gqa=True
        ),
        "sdpa_expanded": lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True, scale=scale),
    }
    torch_times = {n: median_cuda_seconds(fn, reps=10) for n, fn in sdpa.items()}
    detail[f"prefill_{t_len}_us"] = {k_: v_ * 1e6 for k_, v_ in {**times, **torch_times}.items()}
    torch_best = min(torch_times.values())
    best = min(times, key=times.get)
    chosen = _selected_prefill(profile)
    labelled = [("selected", chosen), ("best config", best)]
    if profile.compute_capability == SM90_CC:  # the fastest geometry of each sm_90 consumer schedule
        for schedule in SM90_SCHEDULES:
            ran = [t.name for t in SM90_PREFILL_TILES if t.schedule == schedule and t.name in times]
            if ran:
                labelled.append((f"sm_90 schedule {schedule}", min(ran, key=times.get)))

    def add_row(kernel: str, t: float) -> None:
        r = _row(kernel, f"T={t_len} causal 32q/8kv d128 bf16 p16", t, torch_best)
        rows.append(r | {
            "TFLOP/s": flops / t / 1e12, "torch TFLOP/s": flops / torch_best / 1e12,
            "% GEMM peak": 100 * flops / t / 1e12 / ceil.gemm_tflops,
            "target": ">= 1.0x SDPA", "met": torch_best / t >= 1.0,
        })  # fmt: skip

    for label, name in labelled:
        if name in times:
            add_row(f"prefill attention ({label}: {name})", times[name])
    if chosen in times:  # the same tile over pages in id order, as a fresh prompt's are handed out
        run = paged_attention_case(
            [t_len], [t_len], HQ, HKV, D, PAGE, BF16, BF16, DEV, consecutive_pages=True
        )
        op = ops[chosen]
        t = median_cuda_seconds(lambda: op(run.q, run.kv, run.meta, scale), reps=10)
        detail[f"prefill_{t_len}_consecutive_pages_us"] = {chosen: t * 1e6}
        add_row(f"prefill attention (selected: {chosen}), pages in id order", t)
        sm90 = getattr(op, "sm90", None)
        if sm90 is not None:  # the persistent walk (the default) against a CTA an item, same pages
            sm90.persistent = False
            try:
                for order, c in (("random order", case), ("id order", run)):
                    t = median_cuda_seconds(lambda c=c: op(c.q, c.kv, c.meta, scale), reps=10)
                    detail[f"prefill_{t_len}_cta_an_item_{order.split()[0]}_us"] = {chosen: t * 1e6}
                    add_row(f"prefill attention (selected: {chosen}), a CTA an item, pages in {order}", t)
            finally:
                sm90.persistent = True
    return {name: flops / t for name, t in times.items()}


def _prefill_prefix(
    profile: DeviceProfile, rows: list, detail: dict, q_len: int, kv_len: int, fresh: dict[str, float]
) -> None:
    """A chunk of q_len queries over kv_len - q_len cached tokens (chunked prefill): FLOP/s against
    the same tile's fresh prompt of kv_len tokens, whose keys it reads from the same paged pool."""
    case = paged_attention_case([q_len], [kv_len], HQ, HKV, D, PAGE, BF16, BF16, DEV, seed=1)
    flops = 4 * HQ * D * (q_len * (kv_len - q_len) + q_len * q_len / 2)
    times = {}
    for name, op in _prefill_ops(profile, kv_len).items():
        try:
            times[name] = median_cuda_seconds(lambda op=op: op(case.q, case.kv, case.meta, D**-0.5), reps=10)
        except Exception as e:
            log.exception("prefill tile %s failed on a prefix", name)
            detail[f"prefill_prefix_{name}_error"] = repr(e)
    detail[f"prefill_prefix_{q_len}_{kv_len}_us"] = {k: v * 1e6 for k, v in times.items()}
    name = _selected_prefill(profile)
    if name in times and name in fresh:
        rate = flops / times[name]
        rows.append(
            _row(f"prefill attention over a paged prefix (selected: {name})",
                 f"{q_len} queries over {kv_len - q_len} cached, 32q/8kv d128 bf16 p16", times[name], None)
            | {"TFLOP/s": rate / 1e12, "target": f">= 0.9x its fresh T={kv_len} rate",
               "met": rate >= 0.9 * fresh[name], "fresh TFLOP/s": fresh[name] / 1e12}
        )  # fmt: skip


def bench_elementwise(profile: DeviceProfile, ceil: Ceilings, rows: list) -> None:
    """RMSNorm (+residual), RoPE + KV write and SiLU-mul at 8k tokens x 4096."""
    from sgjit.kernels.cuda.activation import SiluMul
    from sgjit.kernels.cuda.norm import RMSNorm
    from sgjit.kernels.cuda.rope import RopeStoreKV

    n, h = 8192, 4096
    norm = RMSNorm(BF16, "bfloat16", (h,))
    x, r = (torch.randn(n, h, device=DEV, dtype=BF16) for _ in range(2))
    w = torch.ones(h, device=DEV, dtype=BF16)
    ours = median_cuda_seconds(lambda: norm.add_rmsnorm(x, r, w, 1e-5))
    ref = median_cuda_seconds(lambda: reference.add_rmsnorm(x, r, w, 1e-5))
    rows.append(_membound(_row("add_rmsnorm", f"{n} x {h} bf16", ours, ref), 4 * n * h * 2, ours, ceil, 80))
    ours = median_cuda_seconds(lambda: norm.rmsnorm(x, w, 1e-5))
    ref = median_cuda_seconds(lambda: reference.rmsnorm(x, w, 1e-5))
    rows.append(_membound(_row("rmsnorm", f"{n} x {h} bf16", ours, ref), 2 * n * h * 2, ours, ceil, 80))

    rope = RopeStoreKV(BF16, ("bfloat16", "bfloat16"), D, D)
    qkv = torch.randn(n, (HQ + 2 * HKV) * D, device=DEV, dtype=BF16)
    q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], -1)
    q, k, v = q.view(n, HQ, D), k.view(n, HKV, D), v.view(n, HKV, D)
    ang = torch.rand(n, D // 2, device=DEV) * 100
    cos_sin = torch.cat([ang.cos(), ang.sin()], -1)
    pool = LayerKV(*(torch.empty(n // PAGE + 1, PAGE, HKV, D, device=DEV, dtype=BF16) for _ in range(2)))
    slots = torch.randperm(n, device=DEV) + PAGE
    ours = median_cuda_seconds(lambda: rope(q, k, v, cos_sin, pool, slots))
    ref = median_cuda_seconds(lambda: reference.rope_store_kv(q, k, v, cos_sin, pool, slots))
    nbytes = n * ((HQ + 2 * HKV) * D * 2 + D * 4 + 8 + (HQ + 2 * HKV) * D * 2)
    rows.append(
        _membound(_row("rope_store_kv", f"{n} tok, 32q/8kv d128 bf16", ours, ref), nbytes, ours, ceil, 80)
    )

    silu = SiluMul(BF16, "bfloat16", profile.sm_count)
    for inter in (4096, 14336):
        g = torch.randn(n, 2 * inter, device=DEV, dtype=BF16)
        ours = median_cuda_seconds(lambda g=g: silu(g))
        ref = median_cuda_seconds(lambda g=g: reference.silu_mul(g))
        rows.append(
            _membound(_row("silu_mul", f"{n} x {inter} bf16", ours, ref), 3 * n * inter * 2, ours, ceil, 80)
        )


def bench_sampling(profile: DeviceProfile, ceil: Ceilings, rows: list) -> None:
    from sgjit.kernels.cuda.sampling import Sampling

    s = Sampling(profile.sm_count)
    b, vocab = 64, 128256
    logits = torch.randn(b, vocab, device=DEV) * 3
    st = _sampling_params(b, top_p=0.9, top_k=50)
    cases = {
        "top-k 50, top-p 0.9, T 0.8": st,
        "top-p 0.95": _sampling_params(b, top_p=0.95, top_k=0),
        "top-k 40": _sampling_params(b, top_p=1.0, top_k=40),
    }
    for label, params in cases.items():
        ours = median_cuda_seconds(lambda params=params: s.sample(logits, params))
        ref = median_cuda_seconds(lambda params=params: reference.sample(logits, params), reps=5)
        rows.append(_row(f"sample ({label}, seeded)", f"B={b} V={vocab}", ours, ref))
    greedy = _sampling_params(b, greedy=True)
    ours = median_cuda_seconds(lambda: s.sample(logits, greedy))  # eager calls: paced by the host
    ref = median_cuda_seconds(lambda: reference.sample(logits, greedy))
    rows.append(
        _membound(
            _row("sample (greedy, eager)", f"B={b} V={vocab}", ours, ref), b * vocab * 4, ours, ceil, 80
        )
    )
    for small in (1, 8, 64):  # device time, as a decode graph runs it
        x, params = logits[:small], _sampling_params(small, greedy=True)
        ours = median_graph_seconds(lambda x=x, params=params: s.sample(x, params))
        ref = median_graph_seconds(lambda x=x, params=params: reference.sample(x, params))
        row = _row("sample (greedy, graph replay)", f"B={small} V={vocab}", ours, ref)
        rows.append(_membound(row, small * vocab * 4, ours, ceil, 80))


# (name, N, K) of the Llama-3-8B GEMM weights a decode step streams
GEMV_WEIGHTS = (("qkv", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336),
                ("lm_head", 128256, 4096))  # fmt: skip


def bench_gemv(profile: DeviceProfile, ceil: Ceilings, rows: list) -> None:
    """Decode-sized products on the 8B weights, as graph replays (the engine's decode path): sgjit's
    GEMV on bf16 weights against cuBLAS (F.linear), and on FP8 weights against cuBLASLt's FP8 GEMM
    (torch._scaled_mm, activations quantized per token). Scored in weight bytes over copy BW."""
    from sgjit.kernels.cuda.gemv import ROW_BUCKETS, GemvLinear
    from sgjit.kernels.fp8 import Fp8Weight, fp8_matmul_fits, linear_scaled_mm

    gemv = GemvLinear(BF16, "bfloat16", max(ROW_BUCKETS), max(ROW_BUCKETS))
    for name, n, k in GEMV_WEIGHTS:
        w = torch.randn(n, k, device=DEV, dtype=BF16) / k**0.5
        w8 = Fp8Weight.quantize(w)
        for m in ROW_BUCKETS:
            x = torch.randn(m, k, device=DEV, dtype=BF16)
            ours = median_graph_seconds(lambda x=x, w=w: gemv(x, w))
            ref = median_graph_seconds(lambda x=x, w=w: F.linear(x, w))
            row = _row("gemv bf16 (vs cuBLAS)", f"{name} M={m} {n}x{k}", ours, ref)
            rows.append(_membound(row, n * k * 2 + m * (n + k) * 2, ours, ceil, 90))
            ours = median_graph_seconds(lambda x=x, w8=w8: gemv(x, w8))
            peer = (
                median_graph_seconds(lambda x=x, w8=w8: linear_scaled_mm(x, w8))
                if fp8_matmul_fits(x, w8)
                else None
            )
            row = _row(
                "gemv fp8 (vs cuBLASLt fp8)", f"{name} M={m} {n}x{k}", ours, peer, bf16_cublas_us=ref * 1e6
            )
            rows.append(_membound(row, n * k + 4 * n + m * (n + k) * 2, ours, ceil, 85))
        del w, w8
        torch.cuda.empty_cache()


FP8_PREFILL_ROWS = (512, 4096)


def bench_fp8_quant(profile: DeviceProfile, ceil: Ceilings, rows: list) -> None:
    """Prefill-sized FP8 products on the 8B layer weights, eager as prefill runs: the activations'
    per-token e4m3 by fp8_quant.cu (one launch) against torch's `fp8.quantize_rows` (seven kernels),
    scored in bytes over copy BW; then the whole FP8 linear (our quantize + torch._scaled_mm, the CUDA
    linear op's path) against the same GEMM after torch's quantize (torch_us) and against bf16
    `F.linear` ("vs bf16": time over its time; "torch TFLOP/s" is bf16's), in TFLOP/s."""
    from sgjit.kernels.cuda.gemv import GemvLinear
    from sgjit.kernels.fp8 import Fp8Weight, fp8_matmul_fits, linear_scaled_mm, quantize_rows

    gemv = GemvLinear(BF16, "bfloat16", 0, 0)  # every row count to the GEMMs
    for name, n, k in GEMV_WEIGHTS[:4]:
        w = torch.randn(n, k, device=DEV, dtype=BF16) / k**0.5
        w8 = Fp8Weight.quantize(w)
        for m in FP8_PREFILL_ROWS:
            x = torch.randn(m, k, device=DEV, dtype=BF16)
            ours = median_cuda_seconds(lambda x=x: gemv.quantize.rows(x))
            ref = median_cuda_seconds(lambda x=x: quantize_rows(x))
            row = _row("fp8 quantize (vs torch)", f"{name} in M={m} K={k}", ours, ref)
            rows.append(_membound(row, m * k * 3 + m * 4, ours, ceil, 80))
            if not fp8_matmul_fits(x, w8):
                continue
            ours = median_cuda_seconds(lambda x=x, w8=w8: gemv(x, w8))
            peer = median_cuda_seconds(lambda x=x, w8=w8: linear_scaled_mm(x, w8))
            bf16 = median_cuda_seconds(lambda x=x, w=w: F.linear(x, w))
            flops = 2 * m * n * k
            rows.append(
                _row(
                    "fp8 linear (vs torch quantize + same GEMM)", f"{name} M={m} {n}x{k}", ours, peer,
                    **{"vs bf16": ours / bf16, "bf16_us": bf16 * 1e6, "TFLOP/s": flops / ours / 1e12,
                       "torch TFLOP/s": flops / bf16 / 1e12, "target": "<= 0.625 of bf16 F.linear's time",
                       "met": ours / bf16 <= 0.625},
                )
            )  # fmt: skip
        del w, w8
        torch.cuda.empty_cache()


GEMV_TILE_CANDIDATES = ((1, 4), (1, 8), (2, 2), (2, 4), (2, 8), (4, 1), (4, 2))
GEMV_MMA_CANDIDATES = ((0, 1), (0, 2), (0, 4))  # the tensor-core body (16-bit weights)


def bench_gemv_tiles(profile: DeviceProfile, ceil: Ceilings, rows: list, detail: dict) -> None:
    """The GEMV's tile (channels a warp owns, loads in flight per channel and lane) swept on three 8B
    weights (graph replays, weights rotated past L2): bf16 weights at 1-8 rows on both bodies and at
    16 on the tensor-core body (NPW 0; the FMA body's tiles spill or crawl there), FP8 weights
    on the FMA body at the 1, 2 and 4 rows the GEMV takes them; cuBLAS on the same bf16 weights
    beside them (`cublas_us`). What `TILES`, `FP8_TILES` and the GEMV's rows should be."""
    from sgjit.kernels.cuda.gemv import FP8_KIND, TILES, GemvLinear, tile_of
    from sgjit.kernels.fp8 import Fp8Weight

    swept: dict[str, float] = {}
    for name, n, k in GEMV_WEIGHTS[1:4]:  # o_proj, gate_up, down
        for kind, elem, row_counts in (("bf16", 2, (1, 2, 4, 8, 16)), ("fp8", 1, (1, 2, 4))):
            copies = max(1, -(-3 * profile.l2_bytes // (elem * n * k)))
            ws = [torch.randn(n, k, device=DEV, dtype=BF16) / k**0.5 for _ in range(copies)]
            if kind == "fp8":
                ws = [Fp8Weight.quantize(w) for w in ws]
            for m in row_counts:
                current = tile_of(m, FP8_KIND if kind == "fp8" else "bfloat16")
                fma = GEMV_TILE_CANDIDATES if m <= 8 else (current,)
                candidates = fma + (GEMV_MMA_CANDIDATES if kind == "bf16" else ())
                x = torch.randn(m, k, device=DEV, dtype=BF16)
                limits = (m, 0) if kind == "bf16" else (0, m)  # the GEMV's rows for this weight kind
                times = {}
                for tile in candidates:
                    op = GemvLinear(BF16, "bfloat16", *limits, tiles={**TILES, m: tile})
                    times[tile] = median_graph_seconds(
                        _rotating(lambda i, op=op, x=x, ws=ws: lambda: op(x, ws[i]), copies)
                    )
                    swept[f"{name} {kind} M={m} {tile}"] = times[tile] * 1e6
                best = min(times, key=times.get)
                peer = {}  # cuBLAS on the same rotated bf16 weights (what takes these rows past the GEMV's)
                if kind == "bf16":
                    peer["cublas_us"] = 1e6 * median_graph_seconds(
                        _rotating(lambda i, x=x, ws=ws: lambda: F.linear(x, ws[i]), copies)
                    )
                row = _row(f"gemv tile sweep ({kind}): best {best}, current {current}", f"{name} M={m} {n}x{k}",
                           times[best], times[current], current_us=times[current] * 1e6, **peer)  # fmt: skip
                rows.append(_membound(row, elem * n * k, times[best], ceil, 90))
            del ws
            torch.cuda.empty_cache()
    detail["gemv_tiles_us"] = swept


def _rotating(make: Callable[[int], Callable[[], object]], copies: int) -> Callable[[], object]:
    """A call cycling over `copies` weight sets, so each call a graph captures streams its weights
    from memory rather than from L2."""
    fns = itertools.cycle([make(i) for i in range(copies)])
    return lambda: next(fns)()


def _layer_calls(
    ops: Any, w: dict[str, list[torch.Tensor]], m: int
) -> dict[str, Callable[[Any, int], object]]:
    """On random decode inputs of m rows: each fused op, as `call(table, copy)` (the table: the fused
    ops or their composition of unfused ops), and the whole layer without attention, fused and as the
    model's unfused layer (from the second on: add_rmsnorm, GEMM, RoPE + KV write, GEMM, add_rmsnorm,
    GEMM, SiLU-mul, GEMM)."""
    h, inter, q_size, eps = 4096, 14336, HQ * D, 1e-5
    norm_w = (1 + 0.1 * torch.randn(h, device=DEV)).to(BF16)
    residual, hidden = (torch.randn(m, h, device=DEV, dtype=BF16) for _ in range(2))
    attn, act = torch.randn(m, q_size, device=DEV, dtype=BF16), torch.randn(m, inter, device=DEV, dtype=BF16)
    ang = torch.rand(m, D // 2, device=DEV) * 100
    cos_sin = torch.cat([ang.cos(), ang.sin()], -1)
    pool = LayerKV(*(torch.zeros(m // PAGE + 2, PAGE, HKV, D, device=DEV, dtype=BF16) for _ in range(2)))
    slots = torch.randperm(m, device=DEV) + PAGE

    def fused_layer(f: Any, i: int) -> object:
        q = f.rmsnorm_qkv_rope(residual, norm_w, eps, w["qkv"][i], None, cos_sin, pool, slots)
        r = f.linear_residual(attn, w["o_proj"][i], residual)
        return f.linear_residual(f.rmsnorm_gate_up_silu(r, norm_w, eps, w["gate_up"][i]), w["down"][i], r), q

    def unfused_layer(_: Any, i: int) -> object:
        x, r = ops.add_rmsnorm(hidden, residual, norm_w, eps)
        q, k, v = (
            t.reshape(m, -1, D)
            for t in ops.linear(x, w["qkv"][i], None).split([q_size, HKV * D, HKV * D], -1)
        )
        q = ops.rope_store_kv(q, k, v, cos_sin, pool, slots)
        x, r = ops.add_rmsnorm(ops.linear(attn, w["o_proj"][i], None), r, norm_w, eps)
        return ops.linear(ops.silu_mul(ops.linear(x, w["gate_up"][i], None)), w["down"][i], None), q

    return {
        "rmsnorm_qkv_rope": lambda f, i: f.rmsnorm_qkv_rope(residual, norm_w, eps, w["qkv"][i], None, cos_sin, pool, slots),
        "linear_residual (o_proj)": lambda f, i: f.linear_residual(attn, w["o_proj"][i], residual),
        "rmsnorm_gate_up_silu": lambda f, i: f.rmsnorm_gate_up_silu(residual, norm_w, eps, w["gate_up"][i]),
        "linear_residual (down)": lambda f, i: f.linear_residual(act, w["down"][i], residual),
        "layer fused": fused_layer,
        "layer unfused": unfused_layer,
    }  # fmt: skip


def bench_fused(profile: DeviceProfile, ceil: Ceilings, rows: list, detail: dict) -> None:
    """The fused decode GEMVs on the Llama-3-8B layer, as graph replays: each fused op against the
    unfused ops it replaces (`reference.Composition` on the CUDA table: norm kernel, GEMV or cuBLAS as
    the selector sends them, RoPE + KV write, SiLU-mul, residual add), and a whole layer without its
    attention (4 kernels against 8, the residual adds moved from the norms into the projections).
    Weights rotate over copies larger than L2 together. Scored in weight bytes over copy BW."""
    from sgjit.kernels.cuda.gemv import ROW_BUCKETS
    from sgjit.kernels.registry import FUSED_OPS
    from sgjit.kernels.table import build_ops

    shapes = _shapes()
    ks = KernelSelector().select(profile, shapes, Workload(16, 4096))
    every_row = {op: KernelChoice(CUDA, {"rows": 16}, "bench: every row bucket") for op in FUSED_OPS}
    unused = {
        op: KernelChoice("reference", {}, "bench: not timed here")
        for op in ("attention", "sample", "apply_bitmask")
    }
    ops = build_ops(profile, shapes, KernelSet({**ks.choices, **every_row, **unused}, shapes, ks.workload))
    unfused = reference.Composition(ops.rmsnorm, ops.linear, ops.rope_store_kv, ops.silu_mul)
    h, n_qkv = 4096, (HQ + 2 * HKV) * D
    sizes = {"qkv": (n_qkv, h), "o_proj": (h, HQ * D), "gate_up": (2 * 14336, h), "down": (h, 14336)}
    w = {
        name: [torch.randn(n, k, device=DEV, dtype=BF16) / k**0.5 for _ in range(max(1, -(-3 * profile.l2_bytes // (2 * n * k))))]
        for name, (n, k) in sizes.items()
    }  # fmt: skip
    weight_of = {"rmsnorm_qkv_rope": "qkv", "linear_residual (o_proj)": "o_proj", "rmsnorm_gate_up_silu": "gate_up",
                 "linear_residual (down)": "down"}  # fmt: skip
    layer_us: dict[str, dict[int, float]] = {"fused": {}, "unfused": {}}
    for m in ROW_BUCKETS:
        calls = _layer_calls(ops, w, m)
        timed = {}
        for name, call in calls.items():
            copies = len(w[weight_of[name]]) if name in weight_of else min(len(c) for c in w.values())
            for label, table in (("fused", ops), ("unfused", unfused)):
                if name.startswith("layer") and not name.endswith(label):
                    continue
                make = lambda i, call=call, table=table: lambda: call(table, i)  # noqa: E731
                timed[name, label] = median_graph_seconds(_rotating(make, copies))
        for name, wname in weight_of.items():
            t, ref = timed[name, "fused"], timed[name, "unfused"]
            row = _row(f"fused {name} (vs unfused ops)", f"M={m} {sizes[wname]}", t, ref)
            rows.append(_membound(row, 2 * sizes[wname][0] * sizes[wname][1], t, ceil, 85))
        t, ref = timed["layer fused", "fused"], timed["layer unfused", "unfused"]
        layer_us["fused"][m], layer_us["unfused"][m] = t * 1e6, ref * 1e6
        row = _row("decoder layer w/o attention: 4 fused vs 8 unfused kernels", f"8B M={m}", t, ref)
        row = _membound(row, sum(2 * n * k for n, k in sizes.values()), t, ceil, 85)
        rows.append(row | {"met": bool(row["met"] and t < ref), "target": row["target"] + " and < unfused"})
    detail["fused_layer_us"] = layer_us
    lm = torch.randn(128256, h, device=DEV, dtype=BF16) / h**0.5
    norm_w = torch.ones(h, device=DEV, dtype=BF16)
    for m in ROW_BUCKETS:
        x = torch.randn(m, h, device=DEV, dtype=BF16)
        t = median_graph_seconds(lambda x=x: ops.rmsnorm_linear(x, norm_w, 1e-5, lm, None))
        ref = median_graph_seconds(lambda x=x: unfused.rmsnorm_linear(x, norm_w, 1e-5, lm, None))
        row = _row("fused rmsnorm_linear (LM head, vs unfused ops)", f"M={m} (128256, 4096)", t, ref)
        rows.append(_membound(row, lm.numel() * 2, t, ceil, 85))


def _sampling_params(b: int, top_p: float = 1.0, top_k: int = 0, greedy: bool = False) -> SamplingTensors:
    f = lambda x: torch.full((b,), x, device=DEV)  # noqa: E731
    return SamplingTensors(
        f(0.0 if greedy else 0.8), f(top_p), torch.full((b,), top_k, dtype=torch.int32, device=DEV), f(0.0),
        torch.arange(b, device=DEV), torch.zeros(b, dtype=torch.int64, device=DEV), greedy, list(range(b)), [0] * b,
    )  # fmt: skip


def kernel_resources() -> dict[str, Any]:
    """Registers and local (spill) bytes of every compiled kernel, as the driver reports them."""
    from sgjit.kernels.cuda.module import _modules

    out = {}
    for (family, name, defines), module in _modules.items():
        k = module.get_function(name)
        out[f"{family}:{name}{list(defines) if defines else ''}"] = {
            "regs": k.num_regs,
            "local_bytes": k.local_size_bytes,
        }
    return out


def autotune_report(profile: DeviceProfile, out: str | None) -> dict[str, Any]:
    """What autotune mode picks for the Llama-3-8B shape (its store goes beside --out)."""
    path = (Path(out).resolve().parent if out else Path(tempfile.mkdtemp())) / "autotune_store.json"
    sel = KernelSelector(autotune=True, timer=attention_timer, store=AutotuneStore(path))
    ks = sel.select(profile, _shapes(), Workload(64, 4096, 4096))
    return {"reason": ks["attention"].reason, "arch_hash": arch_hash(profile)}


def run(out: str | None, only: list[str] | None) -> dict[str, Any]:
    profile = device_profile(DEV)
    ceil = measure(DEV)
    rows: list[dict[str, Any]] = []
    detail: dict[str, Any] = {}
    steps: dict[str, Callable[[], None]] = {
        "decode": lambda: bench_decode(profile, ceil, rows, detail),
        "prefill": lambda: bench_prefill(profile, ceil, rows, detail),
        "elementwise": lambda: bench_elementwise(profile, ceil, rows),
        "sampling": lambda: bench_sampling(profile, ceil, rows),
        "gemv": lambda: bench_gemv(profile, ceil, rows),
        "gemv_tiles": lambda: bench_gemv_tiles(profile, ceil, rows, detail),
        "fp8_quant": lambda: bench_fp8_quant(profile, ceil, rows),
        "fused": lambda: bench_fused(profile, ceil, rows, detail),
        "autotune": lambda: detail.__setitem__("autotune", autotune_report(profile, out)),
    }
    for name, step in steps.items():
        if only and name not in only:
            continue
        try:
            step()
        except Exception as e:  # one failing section must not lose the others' numbers
            log.exception("benchmark %s failed", name)
            detail[f"{name}_error"] = repr(e)
        torch.cuda.empty_cache()
    ks = KernelSelector().select(profile, _shapes())
    result = {
        "benchmark": "kernels", "env": environment(), "ceilings": ceil.as_dict(), "profile": profile.as_dict(),
        "selected": {op: {"variant": c.variant, "reason": c.reason} for op, c in ks.choices.items()},
        "rows": rows, "detail": detail, "resources": kernel_resources(),
    }  # fmt: skip
    write_json(out, result)
    return result


COLUMNS = [
    "kernel",
    "shape",
    "ours_us",
    "torch_us",
    "speedup",
    "vs mma.sync",
    "vs bf16",
    "GB/s",
    "% copy BW",
    "TFLOP/s",
    "torch TFLOP/s",
    "target",
    "met",
]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sgjit.bench.kernels", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the full result as JSON here")
    ap.add_argument(
        "--only",
        nargs="+",
        help="sections: decode prefill elementwise sampling gemv gemv_tiles fp8_quant fused autotune",
    )
    ap.add_argument(
        "--profile", metavar="DIR",
        help="instead (or, with --only, as well): an nsys timeline and an ncu report of the decode and "
        "prefill attention kernels under DIR, and a summary (sgjit/bench/kernel_profile.py)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    if not torch.cuda.is_available():
        raise SystemExit("python -m sgjit.bench.kernels needs a CUDA GPU")
    if args.profile:
        kernel_profile.profile(args.profile)
        if not args.only:
            return
    result = run(args.out, args.only)
    c = result["ceilings"]
    print(
        f"\n{result['env']['gpu']}: copy {c['copy_gbps']:.0f} GB/s, bf16 GEMM {c['gemm_tflops']:.0f} TFLOP/s\n"
    )
    print(markdown_table(result["rows"], COLUMNS))


if __name__ == "__main__":
    main()

"""`KernelSelector`: device profile x model shapes x workload -> `KernelSet`, per op the variant, its
tunables and the reason. Heuristics read the device's properties (shared memory decides the tile
configs that fit and how many blocks share an SM; the SM count and the context bound decide the
decode split count). An autotune mode times the candidate tiles once per (arch, shape bucket) and
stores the winners on disk. `SGJIT_KERNELS=reference` or `SGJIT_KERNELS=op=variant,...` forces
choices."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sgjit.errors import SgjitError
from sgjit.kernels.arch import DeviceProfile, arch_hash
from sgjit.kernels.grouped_moe import grouped_unsupported
from sgjit.kernels.ops import OpTable
from sgjit.kernels.registry import (
    CUDA,
    DECODE_PREFERENCE,
    FUSED_OPS,
    FUSED_ROW_CHOICES,
    HALF_DTYPES,
    LEAN_HEAD_DIMS,
    LEAN_MAX_GROUP,
    LEAN_MAX_KEYS,
    LEAN_MAX_PAIRS,
    MEGAKERNEL_ROW_CHOICES,
    REFERENCE,
    SM90_CC,
    SM90_HEAD_DIMS,
    SM90_SCHEDULE_PREFERENCE,
    SMALL_DECODE_CTAS_PER_SM,
    SMALL_DECODE_PREFERENCE,
    STREAM_HEAD_DIMS,
    STREAM_MAX_GROUP,
    STREAM_TILES,
    TORCH_ONLY_REASON,
    VARIANTS,
    AttnTile,
    Sm90Tile,
    StreamTile,
    variant,
)
from sgjit.kernels.spec import KernelChoice, KernelSet, ModelShapes, Workload
from sgjit.settings import env

log = logging.getLogger(__name__)

MAX_DECODE_SPLITS = 32
INFLIGHT_PER_SM = 48 * 1024


def decode_splits(
    profile: DeviceProfile, tile: AttnTile, shapes: ModelShapes, batch: int, max_context: int
) -> int:
    """Splits of each row's keys in a decode step: none once the unsplit step has a CTA for every SM
    (a split then costs its merge and shortens every CTA's stream for no more SMs: at 32 rows of 576
    keys on the 8B shape one split took 32.7-35.1 us with each decode tile, two 39.8-49.0, H100,
    docs/performance.md); else the fewest that give every SM enough CTAs to keep ~48 KB of K/V in
    flight (what HBM needs to stay busy), but never more CTAs than fit at once (a second, partial
    wave leaves SMs idle: measured on the H200), no split shorter than two tiles of the context
    bound, at most 32. Depends only on static values (batch, bound), so a captured graph's grid
    stays valid."""
    m_tiles = -(-shapes.group // tile.bm)
    ctas = batch * shapes.num_kv_heads * m_tiles
    if ctas >= profile.sm_count:
        return 1
    resident = max(1, tile.blocks_per_sm(profile, shapes.head_dim, shapes.kv_bytes))
    per_sm = min(resident, -(-INFLIGHT_PER_SM // tile.inflight_bytes(shapes.head_dim, shapes.kv_bytes)))
    want = -(-profile.sm_count * per_sm // ctas)
    if ctas * want > profile.sm_count * resident:  # would spill into a second wave
        want = max(1, profile.sm_count * resident // ctas)
    by_context = max(1, max_context // (2 * tile.bn))
    return max(1, min(want, by_context, MAX_DECODE_SPLITS))


MIN_INVARIANT_SPLIT = 512


def invariant_split_len(tile: AttnTile, max_context: int) -> int:
    """Keys per split in batch-invariant mode: fixed for the runtime (so the same for every step and
    row), at least 512 so prefill does not multiply its CTAs, and long enough that the longest
    context needs at most MAX_DECODE_SPLITS splits. A multiple of the tile's key block."""
    want = max(MIN_INVARIANT_SPLIT, -(-max_context // MAX_DECODE_SPLITS))
    return -(-want // tile.bn) * tile.bn


def _attention_tiles(profile: DeviceProfile, shapes: ModelShapes) -> tuple[AttnTile, AttnTile, str]:
    """The preferred decode tile with two resident CTAs per SM and the first prefill tile that fits."""
    d, kvb = shapes.head_dim, shapes.kv_bytes
    vt = variant("attention", CUDA)
    tiles = {t.name: t for t in vt.tunables["decode_tile"]}
    ordered = [tiles[n] for n in DECODE_PREFERENCE[kvb]]
    dec = [t for t in ordered if t.blocks_per_sm(profile, d, kvb) >= 2 and t.fits(profile, d, kvb)]
    pre = [
        t
        for t in vt.tunables["prefill_tile"]
        if t.fits(profile, d, kvb) and t.blocks_per_sm(profile, d, kvb) >= 1
    ]
    if not dec:
        dec = [t for t in ordered if t.fits(profile, d, kvb)]
    if not dec or not pre:
        raise _Unfit(f"no attention tile fits {profile.smem_per_block_optin // 1024} KB of shared memory")
    why = (
        f"decode {dec[0].name} ({dec[0].smem_bytes(d, kvb) // 1024} KB smem, "
        f"{dec[0].blocks_per_sm(profile, d, kvb)} CTAs/SM of {profile.smem_per_sm // 1024} KB), "
        f"prefill {pre[0].name} ({pre[0].smem_bytes(d, kvb) // 1024} KB); splits from {profile.sm_count} SMs"
    )
    return dec[0], pre[0], why


def _small_decode_tile(profile: DeviceProfile, shapes: ModelShapes) -> AttnTile | None:
    """The latency-bound small steps' decode tile (registry.SMALL_DECODE_PREFERENCE): the first that fits."""
    d, kvb = shapes.head_dim, shapes.kv_bytes
    tiles = {t.name: t for t in variant("attention", CUDA).tunables["decode_tile"]}
    fit = [tiles[n] for n in SMALL_DECODE_PREFERENCE if tiles[n].fits(profile, d, kvb)]
    return fit[0] if fit else None


def _lean_decode(shapes: ModelShapes, workload: Workload) -> tuple[bool, str]:
    """Whether the latency-bound small steps decode on lean_decode.cu."""
    if workload.batch_invariant:
        return False, "batch-invariant: no lean decode (its splits follow the row's length)"
    if shapes.head_dim not in LEAN_HEAD_DIMS or shapes.group > LEAN_MAX_GROUP:
        return False, f"no lean decode for head_dim {shapes.head_dim}, group {shapes.group}"
    return True, (
        f"steps of <= {LEAN_MAX_PAIRS} (row, kv head) pairs with pairs x context bound <= {LEAN_MAX_KEYS} "
        "decode on the lean kernel"
    )


STREAM_INFLIGHT = 96 * 1024


def stream_tile_for(
    profile: DeviceProfile, shapes: ModelShapes, workload: Workload
) -> tuple[StreamTile | None, str]:
    """The streaming decode kernel's tile: the most kv heads a CTA can hold (a divisor of the model's,
    up to 8: whole key rows of the pool per copy), then the shallowest ring that keeps ~96 KB of K/V
    in flight per SM (HBM3 needs ~latency x bandwidth / SMs = 1 us x 4.8 TB/s / 132 = 36 KB; the
    margin covers the stalls at segment starts), else the deepest that fits. None where the kernel
    does not apply: batch-invariant mode (its partition depends on the whole batch), more than 16
    query heads a kv head, head dims other than 64/128."""
    if workload.batch_invariant:
        return None, "batch-invariant: decode keeps the fixed-split mma.sync kernel"
    if shapes.group > STREAM_MAX_GROUP or shapes.head_dim not in STREAM_HEAD_DIMS:
        return None, f"group {shapes.group} / head_dim {shapes.head_dim}: decode keeps the mma.sync kernel"
    d, kvb, rows = shapes.head_dim, shapes.kv_bytes, workload.max_batch
    heads = [h for h in range(min(8, shapes.num_kv_heads), 0, -1) if shapes.num_kv_heads % h == 0]
    for h in heads:
        fits = [t for t in STREAM_TILES if t.heads == h and t.blocks_per_sm(profile, d, kvb, rows) >= 1]
        if not fits:
            continue
        enough = [t for t in fits if t.inflight_bytes(profile, d, kvb, rows) >= STREAM_INFLIGHT]
        tile = min(enough, key=lambda t: t.stages) if enough else max(fits, key=lambda t: t.stages)
        kb = tile.inflight_bytes(profile, d, kvb, rows) // 1024
        return tile, (
            f"decode streams {tile.name}: {h} kv heads a CTA, {tile.stages}-tile ring, {kb} KB in flight a SM, "
            f"keys of all rows split flat over {profile.sm_count} SMs"
        )
    return None, f"no streaming decode tile fits {profile.smem_per_block_optin // 1024} KB of shared memory"


def _sm90_prefill_tile(profile: DeviceProfile, shapes: ModelShapes) -> tuple[Sm90Tile | None, str]:
    """The Hopper prefill kernel's tile where it serves: compute capability 9.0 exactly (sm_90a code
    runs nowhere else), a 16-bit pool of the model's dtype (fp8 pools stay on mma.sync), head_dim 64
    or 128, pages of at least BN / 32 slots (8 for the TMA producer); the first registered tile of
    the first schedule in SM90_SCHEDULE_PREFERENCE that fits shared memory and the page size."""
    if profile.compute_capability != SM90_CC:
        return None, ""
    why_not = None
    if shapes.dtype not in HALF_DTYPES or shapes.kv_dtype != shapes.dtype:
        why_not = f"KV dtype {shapes.kv_dtype}"
    elif shapes.head_dim not in SM90_HEAD_DIMS:
        why_not = f"head_dim {shapes.head_dim}"
    if why_not:
        return None, f"; no sm_90 prefill ({why_not})"
    tiles = variant("attention", CUDA).tunables["prefill_sm90"]
    for schedule in SM90_SCHEDULE_PREFERENCE:
        for t in tiles:
            if (
                t.schedule == schedule
                and t.fits(profile, shapes.head_dim)
                and t.serves_page(shapes.page_size)
            ):
                return (
                    t,
                    f"; prefill on sm_90 by warpgroup MMAs, {t.name} ({t.smem_bytes(shapes.head_dim) // 1024} KB)",
                )
    return None, "; no sm_90 prefill tile fits"


class _Unfit(Exception):
    """A variant's heuristics found no tunable setting for this device."""


# Rows up to which sgjit's GEMV beats the tensor-core GEMMs on every Llama-3-8B weight, from the
# Hopper sweep in docs/performance.md (`python -m sgjit.bench.kernels --only gemv`, H100 2026-12-06):
# bf16 1.02-1.11x cuBLAS at M=1 and behind it from M=2; fp8 1.14-3.8x cuBLASLt's FP8 GEMM up to M=4,
# behind it on gate_up and down at M=8.
GEMV_DENSE_ROWS = 1
GEMV_FP8_ROWS = 4


def _gemv_rows(profile: DeviceProfile, workload: Workload) -> tuple[dict[str, Any], str]:
    if workload.batch_invariant:  # every product goes through fixed 128-row GEMMs instead
        return {"dense_rows": 0, "fp8_rows": 0}, "batch-invariant: GEMMs of fixed 128-row blocks, no GEMV"
    fp8_rows = GEMV_FP8_ROWS if profile.compute_capability >= (8, 9) else 16  # no FP8 tensor cores below
    return (
        {"dense_rows": GEMV_DENSE_ROWS, "fp8_rows": fp8_rows},
        f"GEMV up to {GEMV_DENSE_ROWS} rows (bf16/fp16 weights) and {fp8_rows} (fp8), cuBLAS above",
    )


# Rows up to which a decode step runs as the fused GEMVs (the norm, RoPE + KV write, SiLU-and-mul and
# residual adds inside the projections: 5 kernels a layer instead of 10). The fused kernels are the GEMV,
# so they take the GEMV's rows: one on a model whose layers stream for long (cuBLAS wins from two rows
# on the 8B weights, docs/performance.md), more where a layer's weights stream in about what the
# removed launches cost (SmolLM2: ~7 MB a layer, a few µs), so that the GEMV's slowdown with rows
# costs less than the kernels it saves.
FUSED_ROWS = 1
FUSED_ROWS_SMALL_LAYERS = 4
SMALL_LAYER_BYTES = 32 << 20
# Shared memory for the rows a fused block normalises in its prologue (rows x hidden x 2 bytes): at
# most this much, so several blocks share an SM.
FUSED_NORM_SMEM = 64 * 1024


def _layer_bytes(shapes: ModelShapes) -> int:
    """Bytes of one decoder layer's projection weights in the model dtype."""
    h, d = shapes.hidden, shapes.head_dim
    qkv = h * (shapes.num_heads + 2 * shapes.num_kv_heads) * d
    return 2 * (qkv + shapes.num_heads * d * h + 3 * h * shapes.intermediate)


# Programmatic dependent launch (kernels/cuda/pdl.py) of the decode GEMVs and attention captured in CUDA
# graphs, sm_90+: a kernel starts as the one before it issues its last loads, its own first weight loads
# in flight before it waits. SmolLM2-135M b=1 decode 1365 -> 1529 tok/s on the H100; on the 8B shape
# 176.8 -> 182.1 tok/s once the GEMVs let the next kernel start at their last loads rather than after
# them (it had measured 2% slower with the later trigger: docs/performance.md).
DEPENDENT_LAUNCH_OPS = ("linear", "attention", *FUSED_OPS)


def _dependent_launch(profile: DeviceProfile) -> tuple[bool, str]:
    if profile.compute_capability < (9, 0):
        return False, "plain launches (dependent launch needs sm_90)"
    return True, "dependent launches in captured graphs"


def _fused_rows(
    profile: DeviceProfile, shapes: ModelShapes, workload: Workload
) -> tuple[dict[str, Any], str]:
    if workload.batch_invariant:  # the unfused path serves larger steps: a row would change with its batch
        raise _Unfit("batch-invariant mode: every step runs the unfused ops")
    small = _layer_bytes(shapes) <= SMALL_LAYER_BYTES
    want = FUSED_ROWS_SMALL_LAYERS if small else FUSED_ROWS
    budget = min(FUSED_NORM_SMEM, profile.smem_per_block_optin // 2)
    fit = [b for b in FUSED_ROW_CHOICES if 0 < b <= want and b * shapes.hidden * 2 <= budget]
    if not fit:
        raise _Unfit(
            f"one normalised row of {shapes.hidden} does not fit {budget // 1024} KB of shared memory"
        )
    return {"rows": fit[-1]}, (
        f"decode steps of <= {fit[-1]} rows as fused GEMVs ({'small' if small else 'large'} layers: "
        f"{_layer_bytes(shapes) >> 20} MB), larger ones unfused"
    )


# The decode megakernel (megakernel.cu): the whole step in one launch, for models whose layers stream
# in about what a layer's launches cost (the small-layer bound of the fused GEMVs above) and steps of
# up to MEGAKERNEL_ROWS rows (the GEMV's register tiles end there). Query heads a kv head: its
# attention keeps G x head_dim / 32 accumulators a lane.
MEGAKERNEL_ROWS = 8
MEGAKERNEL_MAX_GROUP = 8


def _megakernel_rows(
    profile: DeviceProfile, shapes: ModelShapes, workload: Workload
) -> tuple[dict[str, Any], str]:
    if workload.batch_invariant:
        raise _Unfit("batch-invariant mode: every step runs the unfused ops")
    if not env().unverified_kernels:
        raise _Unfit(
            "decode megakernel: correct on the H100 and H200 but slower than the layered kernels "
            "(H200, SmolLM2 b=1: median 2002 vs ~2290 tok/s); SGJIT_UNVERIFIED_KERNELS=1 offers it"
        )
    layer = _layer_bytes(shapes)
    if layer > SMALL_LAYER_BYTES:
        raise _Unfit(f"layers of {layer >> 20} MB stream longer than their launches cost; layered kernels")
    if shapes.qk_norm or shapes.experts:
        raise _Unfit("per-head q/k norms and MoE layers run layer by layer")
    if shapes.kv_dtype != shapes.dtype:
        raise _Unfit(f"KV pool of {shapes.kv_dtype}: the megakernel reads a pool of the model dtype")
    if (
        shapes.group > MEGAKERNEL_MAX_GROUP
        or shapes.hidden % 8
        or shapes.intermediate % 8
        or shapes.rope_dim % 2
        or shapes.rope_dim > shapes.head_dim  # each CTA keeps the rows' cos|sin in rows x head_dim floats
    ):
        raise _Unfit(
            f"group {shapes.group}, hidden {shapes.hidden}, intermediate {shapes.intermediate}, "
            f"rotary dims {shapes.rope_dim} of head_dim {shapes.head_dim}: unsupported"
        )
    want = min(MEGAKERNEL_ROWS, max(1, workload.max_batch))
    budget = min(FUSED_NORM_SMEM, profile.smem_per_block_optin // 2)
    width = max(shapes.hidden, shapes.num_heads * shapes.head_dim)  # a GEMV phase's input row
    fit = [b for b in MEGAKERNEL_ROW_CHOICES if b <= want and b * width * 2 <= budget]
    if not fit:
        raise _Unfit(f"one input row of {width} does not fit {budget // 1024} KB of shared memory")
    return {"rows": fit[-1]}, (
        f"decode steps of <= {fit[-1]} rows in one launch ({layer >> 20} MB layers), larger ones layer by layer"
    )


def _parse_overrides(spec: str) -> dict[str, str]:
    """SGJIT_KERNELS: "auto" | "reference" | "op=variant,...". Unknown names are an error that
    lists the valid ones."""
    spec = spec.strip()
    if spec in ("", "auto"):
        return {}
    if spec == REFERENCE:
        return {op: spec for op in OpTable.names()}
    if spec == CUDA:  # every op that has a CUDA kernel; the others keep their automatic choice
        return {op: spec for op in OpTable.names() if any(v.name == CUDA for v in VARIANTS[op])}
    out = {}
    for item in spec.split(","):
        op, sep, name = item.strip().partition("=")
        if not sep or op not in VARIANTS:
            raise SgjitError(f"SGJIT_KERNELS item {item!r} is not op=variant with op in {sorted(VARIANTS)}")
        variant(op, name)  # raises on an unknown variant
        out[op] = name
    return out


class AutotuneStore:
    """Winners of autotuning, one JSON file: key -> tile name. Keys carry the arch hash, so a new
    device, driver or kernel source starts fresh."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or env().cache_dir / "autotune.json"

    def load(self) -> dict[str, str]:
        """The stored winners; a missing file is empty, and so is a corrupt or truncated one (a crash
        mid-write on another machine, a disk error): it is only a cache, so it is ignored with a
        warning and the next `put` rewrites it whole."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as e:
            log.warning("ignoring the autotune store %s: unreadable (%s); it will be rebuilt", self.path, e)
            return {}
        try:
            data = json.loads(text)
        except ValueError as e:
            log.warning("ignoring the autotune store %s: not JSON (%s); it will be rebuilt", self.path, e)
            return {}
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            log.warning(
                "ignoring the autotune store %s: not an object of tile names; it will be rebuilt", self.path
            )
            return {}
        return data

    def get(self, key: str) -> str | None:
        return self.load().get(key)

    def put(self, key: str, value: str) -> None:
        data = self.load()
        data[key] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(self.path)


# (profile, shapes, workload, knob, candidate) -> seconds for one representative step.
Timer = Callable[[DeviceProfile, ModelShapes, Workload, str, AttnTile], float]


def shape_bucket(shapes: ModelShapes, workload: Workload, knob: str) -> str:
    """What a tuning result is valid for: the kernel's template shape and the workload's scale
    rounded to powers of two."""
    scale = workload.max_batch if knob == "decode_tile" else workload.max_prefill_tokens
    return (
        f"{shapes.dtype}/{shapes.kv_dtype}/d{shapes.head_dim}/g{shapes.group}/kv{shapes.num_kv_heads}"
        f"/p{shapes.page_size}/{knob}/{2 ** math.ceil(math.log2(max(1, scale)))}"
        f"/c{2 ** math.ceil(math.log2(max(1, workload.max_context)))}"
    )


class KernelSelector:
    def __init__(
        self, autotune: bool = False, timer: Timer | None = None, store: AutotuneStore | None = None
    ):
        self.autotune = autotune
        self.timer = timer
        self.store = store or AutotuneStore()

    def select(
        self, profile: DeviceProfile, shapes: ModelShapes, workload: Workload | None = None
    ) -> KernelSet:
        workload = workload or Workload()
        forced = _parse_overrides(env().kernels)
        choices = {op: self._choose(op, profile, shapes, workload, forced.get(op)) for op in OpTable.names()}
        return KernelSet(choices, shapes, workload)

    def _choose(
        self, op: str, profile: DeviceProfile, shapes: ModelShapes, workload: Workload, forced: str | None
    ) -> KernelChoice:
        if op in TORCH_ONLY_REASON:
            return KernelChoice(REFERENCE, {}, TORCH_ONLY_REASON[op])
        if forced == REFERENCE:
            return KernelChoice(REFERENCE, {}, "forced by SGJIT_KERNELS")
        rejected = []
        for v in VARIANTS[op]:
            if v.name == REFERENCE or (forced is not None and v.name != forced):
                continue
            why_not = v.unsupported(profile, shapes.dtype, shapes.kv_dtype, shapes.head_dim)
            if why_not is None:
                try:
                    tunables, why = self._tune(op, profile, shapes, workload)
                except _Unfit as e:
                    why_not = str(e)
                else:
                    origin = "forced by SGJIT_KERNELS; " if forced else ""
                    return KernelChoice(v.name, tunables, origin + (why or v.doc))
            rejected.append(f"{v.name}: {why_not}")
        return KernelChoice(REFERENCE, {}, "; ".join(rejected) or "no kernel variant")

    def _tune(
        self, op: str, profile: DeviceProfile, shapes: ModelShapes, workload: Workload
    ) -> tuple[dict[str, Any], str]:
        tunables, why = self._tune_op(op, profile, shapes, workload)
        if op in DEPENDENT_LAUNCH_OPS:
            on, how = _dependent_launch(profile)
            tunables, why = {**tunables, "dependent_launch": on}, f"{why}; {how}" if why else how
        return tunables, why

    def _tune_op(
        self, op: str, profile: DeviceProfile, shapes: ModelShapes, workload: Workload
    ) -> tuple[dict[str, Any], str]:
        if op == "linear":
            return _gemv_rows(profile, workload)
        if op in FUSED_OPS:
            return _fused_rows(profile, shapes, workload)
        if op == "decode_megakernel":
            return _megakernel_rows(profile, shapes, workload)
        if op == "moe_experts":
            why_not = grouped_unsupported(profile, shapes)
            if why_not:
                raise _Unfit(why_not)
            return {}, ""
        if op != "attention":
            return {}, ""
        dec, pre, why = _attention_tiles(profile, shapes)
        stream, stream_why = stream_tile_for(profile, shapes, workload)
        if stream is not None and shapes.kv_bytes != 1:
            # measured on the H100 (docs/performance.md, 2026-12-06): 0.62-1.34x the mma.sync decode kernel
            # on 16-bit pools, no consistent gain; on fp8 pools 0.51-0.55x the bf16 time where it counts
            stream, stream_why = None, "16-bit pool: decode keeps the mma.sync kernel (streaming no faster)"
        tunables: dict[str, Any] = {"decode_tile": dec, "prefill_tile": pre, "stream_decode": stream}
        why += f"; {stream_why}"
        small = _small_decode_tile(profile, shapes)
        if small is not None and not workload.batch_invariant:
            tunables["small_decode_tile"] = small
            why += f"; steps of fewer than {SMALL_DECODE_CTAS_PER_SM} CTAs a SM decode on {small.name}"
            if stream is not None:
                why += " (fp8 pools: steps of at most half as many, the rest stream)"
        lean, lean_why = _lean_decode(shapes, workload)
        tunables["lean_decode"] = lean
        why += f"; {lean_why}"
        if workload.batch_invariant:
            split_len = invariant_split_len(dec, workload.max_context)
            tunables.update(prefill_tile=dec, split_len=split_len)
            return tunables, (
                f"batch-invariant: decode and prefill both {dec.name}, key splits of {split_len} tokens "
                f"from position 0 ({-(-workload.max_context // split_len)} for {workload.max_context})"
            )
        sm90, sm90_why = _sm90_prefill_tile(profile, shapes)
        if sm90 is not None:
            tunables["prefill_sm90"] = sm90
        why += sm90_why
        if self.autotune:
            for knob in ("decode_tile", "prefill_tile"):
                tunables[knob], how = self._autotuned(profile, shapes, workload, knob, tunables[knob])
                why += f"; {knob} {how}"
        return tunables, why

    def _autotuned(
        self, profile: DeviceProfile, shapes: ModelShapes, workload: Workload, knob: str, default: AttnTile
    ) -> tuple[AttnTile, str]:
        key = f"{arch_hash(profile)}/{shape_bucket(shapes, workload, knob)}"
        stored = self.store.get(key)
        if stored is not None:
            return AttnTile.parse(stored), f"{stored} (autotuned, stored)"
        if self.timer is None:
            return default, "heuristic (autotune has no timer on this device)"
        d, kvb = shapes.head_dim, shapes.kv_bytes
        candidates = [t for t in variant("attention", CUDA).tunables[knob] if t.fits(profile, d, kvb)]
        times = {t: self.timer(profile, shapes, workload, knob, t) for t in candidates}
        best = min(times, key=times.get)
        self.store.put(key, best.name)
        summary = ", ".join(f"{t.name} {s * 1e6:.0f} us" for t, s in times.items())
        log.info("autotuned %s for %s: %s", knob, key, summary)
        return best, f"{best.name} (autotuned: {summary})"

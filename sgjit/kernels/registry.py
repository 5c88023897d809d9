"""Every kernel variant of every op, with what it needs of the device and the model (minimum compute
capability, dtypes, head dims, shared memory) and the tunables the selector may set. The reference
variant (torch) of each op always qualifies; it is what a failed kernel falls back to."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from sgjit.kernels.arch import DeviceProfile
from sgjit.kernels.ops import OpTable

REFERENCE = "reference"
CUDA = "cuda"
GROUPED_MM = "grouped_mm"
HALF_DTYPES = frozenset({"float16", "bfloat16"})
KV_DTYPES = frozenset({"float16", "bfloat16", "fp8_e4m3"})


@dataclass(frozen=True, slots=True)
class AttnTile:
    """One tiling of the attention kernel: WM x WN warps, MW m16 blocks per warp along the packed
    (token, head) rows, BN keys per tile split over WN warps, STAGES-deep copy ring."""

    mw: int
    wm: int
    wn: int
    bn: int
    stages: int

    @property
    def name(self) -> str:
        return f"m{self.mw}x{self.wm}n{self.wn}b{self.bn}s{self.stages}"

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn

    @property
    def bm(self) -> int:
        return 16 * self.mw * self.wm

    def smem_bytes(self, head_dim: int, kv_bytes: int) -> int:
        """Dynamic shared memory, laid out as attention.cu lays it out: the Q tile, then the K/V
        ring (plus the widened tiles of an fp8 pool), which the WN-way merge reuses at the end."""
        q = self.bm * head_dim * 2
        ring = self.stages * 2 * self.bn * head_dim * kv_bytes
        widened = 2 * self.bn * head_dim * 2 if kv_bytes == 1 else 0
        merge = self.wn * self.bm * (head_dim + 2) * 4 if self.wn > 1 else 0
        return q + max(ring + widened, merge)

    def fits(self, profile: DeviceProfile, head_dim: int, kv_bytes: int) -> bool:
        return self.smem_bytes(head_dim, kv_bytes) <= profile.smem_per_block_optin

    def inflight_bytes(self, head_dim: int, kv_bytes: int) -> int:
        """K/V bytes one CTA has in flight while it computes (the tiles its ring prefetches)."""
        return (self.stages - 1) * 2 * self.bn * head_dim * kv_bytes

    def blocks_per_sm(self, profile: DeviceProfile, head_dim: int, kv_bytes: int) -> int:
        """Resident CTAs per SM as shared memory allows (1 KB per block is reserved by the driver)."""
        need = self.smem_bytes(head_dim, kv_bytes) + 1024
        by_smem = profile.smem_per_sm // need
        by_threads = profile.max_threads_per_sm // self.threads
        return max(0, min(by_smem, by_threads))

    @classmethod
    def parse(cls, name: str) -> AttnTile:
        """Inverse of `name` (for overrides and stored autotuning results)."""
        m = re.fullmatch(r"m(\d+)x(\d+)n(\d+)b(\d+)s(\d+)", name)
        if not m:
            raise ValueError(f"not an attention tile name: {name!r} (e.g. m1x1n4b64s3)")
        return cls(*(int(g) for g in m.groups()))


# Decode: one m16 block (a row's G heads), keys spread over the warps.
DECODE_TILES = (
    AttnTile(1, 1, 2, 32, 2),
    AttnTile(1, 1, 2, 32, 3),
    AttnTile(1, 1, 2, 64, 2),
    AttnTile(1, 1, 4, 64, 2),
    AttnTile(1, 1, 4, 64, 3),
    AttnTile(1, 1, 4, 128, 2),
)
# Preference among the decode tiles that fit, by KV element size, from the H200 sweeps of
# docs/performance.md (B=64, ctx 4096, Llama-3-8B heads): small 2-warp CTAs, many resident per SM,
# stream the pool fastest (bf16 253 us, fp8 254 us; 4-warp tiles 254-295 us).
DECODE_PREFERENCE = {
    2: ("m1x1n2b32s2", "m1x1n2b32s3", "m1x1n4b64s3", "m1x1n2b64s2", "m1x1n4b64s2", "m1x1n4b128s2"),
    1: ("m1x1n2b32s3", "m1x1n2b32s2", "m1x1n4b64s3", "m1x1n4b64s2", "m1x1n2b64s2", "m1x1n4b128s2"),
}


# Decode steps too small to give every SM a CTA before splitting (rows x kv heads < SMs) are latency-
# bound: 4-warp CTAs with 64-key tiles three deep cut a call's time by a third, from the H100 sweep of
# docs/performance.md (Llama-3-8B heads, bf16: B=1 ctx 512 11.4 vs 14.8-17.6 us, ctx 4096 15.1 vs
# 20.7 us; B=8 ctx 512 13.8 vs 16.4 us). They keep the lead up to two CTAs a SM (B=32, one split:
# 576 keys 33.1 vs 34.9 us, 4096 keys 178 vs 187, 32768 keys 1368 vs 1431) and lose it at four (B=64:
# 576 keys 61.7 vs 58.5, 4096 keys level at 348 vs 347), H100, 2026-12-07.
SMALL_DECODE_PREFERENCE = ("m1x1n4b64s3", "m1x1n4b128s2", "m1x1n4b64s2")
SMALL_DECODE_CTAS_PER_SM = 2  # the small tile serves steps of fewer CTAs than this many a SM


@dataclass(frozen=True, slots=True)
class StreamTile:
    """One configuration of the streaming decode kernel (decode.cu): `heads` kv heads per CTA, one warp
    each (a key's `heads * head_dim` elements are adjacent in the pool, so the CTA copies them as one
    piece), and a `stages`-deep ring of 16-key tiles."""

    heads: int
    stages: int

    # Registers a thread, an upper bound over the instantiations ptxas builds (160-170 on sm_90 for
    # head_dim 128; `python -m sgjit.kernels.nvcc_check --resources`): bounds the CTAs an SM holds.
    REGS = 192
    KEYS = 16  # keys per tile

    @property
    def name(self) -> str:
        return f"h{self.heads}s{self.stages}"

    @property
    def threads(self) -> int:
        return 32 * self.heads

    def stage_bytes(self, head_dim: int, kv_bytes: int) -> int:
        """K and V of one tile: 16 keys x `heads` rows of head_dim elements, each."""
        return 2 * self.KEYS * self.heads * head_dim * kv_bytes

    def smem_bytes(self, head_dim: int, kv_bytes: int, rows: int) -> int:
        """The ring, then each row's key count and unit prefix (two ints a row, one more)."""
        return self.stages * self.stage_bytes(head_dim, kv_bytes) + 4 * (2 * rows + 1)

    def blocks_per_sm(
        self, profile: DeviceProfile, head_dim: int, kv_bytes: int, rows: int, regs: int = 0
    ) -> int:
        """Resident CTAs per SM as shared memory, threads and registers allow (`regs`: the compiled
        kernel's count when known; registers go to warps in units of 256)."""
        smem = self.smem_bytes(head_dim, kv_bytes, rows)
        if smem > profile.smem_per_block_optin:
            return 0
        per_warp = -(-32 * (regs or self.REGS) // 256) * 256
        return max(0, min(
            profile.smem_per_sm // (smem + 1024), profile.max_threads_per_sm // self.threads,
            profile.regs_per_sm // (per_warp * self.heads), 32,
        ))  # fmt: skip

    def inflight_bytes(self, profile: DeviceProfile, head_dim: int, kv_bytes: int, rows: int) -> int:
        """K/V bytes an SM has in flight while it computes: the tiles each resident CTA prefetches."""
        per_cta = (self.stages - 1) * self.stage_bytes(head_dim, kv_bytes)
        return self.blocks_per_sm(profile, head_dim, kv_bytes, rows) * per_cta


# The attention op's `stream_decode` knob (decode.cu; the mma.sync decode tiles above remain for the
# batch-invariant mode and groups over 16): every kv-head count a CTA may hold (the selector takes the
# largest divisor of the model's kv heads up to 8) with every ring depth it may pick from the
# device's shared memory.
STREAM_TILES = tuple(StreamTile(h, s) for h in range(8, 0, -1) for s in (2, 3, 4, 6))
STREAM_MAX_GROUP = 16  # query heads a kv head may serve: one m16 tile
STREAM_HEAD_DIMS = frozenset({64, 128})

# The attention op's `lean_decode` knob (lean_decode.cu: the latency-bound small steps in one launch):
# what its lanes' layout takes.
LEAN_HEAD_DIMS = frozenset({64, 128})  # 2 or 4 dims a lane
LEAN_MAX_GROUP = 16  # query heads a kv head (registers)
# Where it measured faster than the op's other decode kernels (H100, 2026-12-06, docs/performance.md):
# its cost grows with the keys a CTA walks, so the bound is on (row, kv head) pairs x the context
# bound. 8 pairs (one row of the 8B) at 512 / 1024 / 4096 keys: 6.4 / 7.6 / 13.7 us, the mma.sync
# kernel at its best split count 10.9 / 11.8 / 14.9; 64 pairs at 512 keys: 12.7 against the op's
# streaming kernel's 13.7 (mma.sync at one split: 11.8); 64 pairs at 4096 keys: 133 against 57. The
# steps between (16 pairs at 2048 keys, 32 at 1024) are admitted by the same product, not measured.
LEAN_MAX_PAIRS = 64
LEAN_MAX_KEYS = 8 * 4096

# MW=2 halves the shared-memory reads per FLOP (each warp reuses a K/V fragment for 32 rows) at the
# price of ~250 registers a thread.
PREFILL_TILES = (
    AttnTile(1, 4, 1, 64, 2),
    AttnTile(1, 4, 1, 64, 3),
    AttnTile(1, 8, 1, 64, 2),
    AttnTile(2, 4, 1, 32, 3),
    AttnTile(2, 4, 1, 64, 2),
)


# The decode step's fused ops (one unit: the model runs a step either all fused or all unfused)
FUSED_OPS = ("rmsnorm_linear", "rmsnorm_qkv_rope", "rmsnorm_gate_up_silu", "linear_residual")
FUSED_ROW_CHOICES = (0, 1, 2, 4, 8, 16)
# Rows the decode megakernel is built for (one launch per step of up to this many rows).
MEGAKERNEL_ROW_CHOICES = (1, 2, 4, 8)


# Consumer schedules of the Hopper prefill kernel (attention_sm90.cu's SCHEDULE bits): serial (each
# warpgroup's Q K^T, softmax and P V back to back), OVERLAP (a tile's softmax while the next tile's
# Q K^T and this one's P V run, FlashAttention-3's intra-warpgroup pipelining), PINGPONG (the two
# consumer warpgroups take turns at the tensor cores, one's softmax under the other's GEMMs); TMA is
# the producer's bit: K/V tiles by the tensor memory accelerator (a few copies a tile from one
# thread) instead of 128 threads' 16-byte cp.async.
SM90_SERIAL = 0
SM90_OVERLAP = 1
SM90_PINGPONG = 2
SM90_TMA = 4
SM90_SCHEDULES = (
    SM90_SERIAL,
    SM90_OVERLAP,
    SM90_PINGPONG,
    SM90_OVERLAP | SM90_PINGPONG,
    SM90_TMA,
    SM90_OVERLAP | SM90_PINGPONG | SM90_TMA,
)
_SCHEDULE_BITS = ((SM90_OVERLAP, "o"), (SM90_PINGPONG, "p"), (SM90_TMA, "t"))
# TMA copies a tile as boxes of min(page, BN) rows, each of whole 8-row swizzle atoms.
SM90_TMA_MIN_PAGE = 8


@dataclass(frozen=True, slots=True)
class Sm90Tile:
    """One tiling of the Hopper prefill kernel (attention_sm90.cu): 128 packed query rows over two
    consumer warpgroups and a producer warpgroup, BN keys per tile, a STAGES-deep K/V ring, and the
    consumers' `schedule` (SM90_SCHEDULES)."""

    bn: int
    stages: int
    schedule: int = SM90_SERIAL

    BM = 128
    THREADS = 384

    @property
    def name(self) -> str:
        """sm90b<BN>s<STAGES>, then o (overlap), p (ping-pong), t (TMA producer) for those bits."""
        return f"sm90b{self.bn}s{self.stages}" + "".join(
            c for bit, c in _SCHEDULE_BITS if self.schedule & bit
        )

    @property
    def tma(self) -> bool:
        return bool(self.schedule & SM90_TMA)

    def serves_page(self, page_size: int) -> bool:
        """A tile spans at most 32 pages (one lane each looks them up); TMA needs pages of whole
        swizzle atoms."""
        return self.bn <= 32 * page_size and (not self.tma or page_size >= SM90_TMA_MIN_PAGE)

    def smem_bytes(self, head_dim: int) -> int:
        """As attention_sm90.cu lays it out: 1 KB of alignment slack (the swizzle atoms sit on 1 KB
        boundaries), the Q tile, the K/V ring, four mbarriers a stage (K and V each full and empty)."""
        return 1024 + self.BM * head_dim * 2 + self.stages * 2 * self.bn * head_dim * 2 + 4 * self.stages * 8

    def fits(self, profile: DeviceProfile, head_dim: int) -> bool:
        return self.smem_bytes(head_dim) <= profile.smem_per_block_optin


# Only sm_90a has the warpgroup MMAs; its binaries run on compute capability 9.0 and nothing else.
SM90_CC = (9, 0)
SM90_HEAD_DIMS = frozenset({64, 128})
# Preference order: 128-key tiles (half the softmax rounds a key) with the deepest ring that fits.
# Three stages (225 KB at head_dim 128) against two, same runs on the H100 (bench.kernels --only
# prefill, 2026-12-07): 4283 vs 4494 us at T=16384, 1968 vs 2105 over a 12k paged prefix, 312 vs 307
# at T=4096 (the earlier tree: 4368 vs 4379, 1920 vs 2051, 315 vs 316).
SM90_GEOMETRIES = ((128, 3), (128, 2), (64, 3), (64, 4))
# The schedules the selector takes, in order of preference: the TMA producer under the overlapped
# ping-pong consumers (H100: 0.78x / 0.71x SDPA at T=4096 / 16384, 18-20% faster than the cp.async
# producer; harness 111/111, tests/kernels/test_attention_sm90_gpu.py 80/80), and where pages are too
# small for TMA boxes, the same consumers on the cp.async producer (2-3% faster than the serial
# schedule there). The others stay for the benchmark's comparison (docs/performance.md).
SM90_SCHEDULE_PREFERENCE = (SM90_OVERLAP | SM90_PINGPONG | SM90_TMA, SM90_OVERLAP | SM90_PINGPONG)
# Every geometry with every schedule (what nvcc_check builds and the GPU tests and bench run).
SM90_PREFILL_TILES = tuple(Sm90Tile(bn, st, sch) for sch in SM90_SCHEDULES for bn, st in SM90_GEOMETRIES)


@dataclass(frozen=True, slots=True)
class Variant:
    op: str
    name: str
    family: str | None  # kernel source family; None for torch
    min_cc: tuple[int, int] = (0, 0)
    dtypes: frozenset[str] | None = HALF_DTYPES  # None = any
    kv_dtypes: frozenset[str] | None = KV_DTYPES
    head_dims: frozenset[int] | None = None
    tunables: Mapping[str, tuple] = field(default_factory=dict)  # knob -> candidates
    doc: str = ""

    def unsupported(self, profile: DeviceProfile, dtype: str, kv_dtype: str, head_dim: int) -> str | None:
        """Why this variant cannot serve (None when it can)."""
        if self.name == REFERENCE:
            return None
        if not profile.is_cuda:
            return "needs a CUDA device"
        if profile.compute_capability < self.min_cc:
            return f"needs compute capability >= {self.min_cc[0]}.{self.min_cc[1]}"
        if self.dtypes is not None and dtype not in self.dtypes:
            return f"dtype {dtype} unsupported (has {sorted(self.dtypes)})"
        if self.kv_dtypes is not None and kv_dtype not in self.kv_dtypes:
            return f"KV dtype {kv_dtype} unsupported"
        if self.head_dims is not None and head_dim not in self.head_dims:
            return f"head_dim {head_dim} unsupported (has {sorted(self.head_dims)})"
        return None


def _reference(op: str) -> Variant:
    return Variant(op, REFERENCE, None, dtypes=None, kv_dtypes=None, doc="torch (reference.py)")


def _sampling_op(op: str, doc: str) -> tuple[Variant, ...]:
    """A sampling-family op: float32 logits whatever the model dtype, any KV dtype."""
    return (Variant(op, CUDA, "sampling", (7, 0), dtypes=None, kv_dtypes=None, doc=doc), _reference(op))


VARIANTS: dict[str, tuple[Variant, ...]] = {
    "rmsnorm": (
        Variant("rmsnorm", CUDA, "norm", (8, 0), doc="one pass, row in registers"),
        _reference("rmsnorm"),
    ),
    "add_rmsnorm": (
        Variant("add_rmsnorm", CUDA, "norm", (8, 0), doc="residual add fused, one pass"),
        _reference("add_rmsnorm"),
    ),
    "rope_store_kv": (
        Variant(
            "rope_store_kv",
            CUDA,
            "rope",
            (8, 0),
            head_dims=frozenset({64, 128, 256}),
            doc="rotate q,k and write k,v into the paged pool in one pass",
        ),
        _reference("rope_store_kv"),
    ),  # fmt: skip
    "attention": (
        Variant(
            "attention",
            CUDA,
            "attention",
            (8, 0),
            head_dims=frozenset({64, 128}),
            tunables={
                "decode_tile": DECODE_TILES,
                "prefill_tile": PREFILL_TILES,
                "prefill_sm90": SM90_PREFILL_TILES,
            },
            doc="paged FA2 (mma.sync), GQA-packed rows, split-KV decode with merge; on sm_90 prefill "
            "by warpgroup MMAs (attention_sm90.cu)",
        ),
        _reference("attention"),
    ),  # fmt: skip
    "silu_mul": (Variant("silu_mul", CUDA, "activation", (8, 0), doc="streaming"), _reference("silu_mul")),
    "linear": (
        Variant(
            "linear",
            CUDA,
            "gemv",
            (8, 0),
            kv_dtypes=None,
            tunables={"dense_rows": (0, 1, 2, 4, 8, 16), "fp8_rows": (0, 1, 2, 4, 8, 16)},
            doc="own GEMV up to a few rows (weights streamed once, fp8 widened in registers); cuBLAS above",
        ),
        _reference("linear"),
    ),  # fmt: skip
    "prepare_weight": (_reference("prepare_weight"),),
    "moe_experts": (
        Variant(
            "moe_experts",
            GROUPED_MM,
            None,
            (9, 0),
            dtypes=frozenset({"bfloat16"}),
            kv_dtypes=None,
            doc="torch._grouped_mm: all experts' gate|up in one grouped GEMM, all downs in another (no host sync)",
        ),
        _reference("moe_experts"),
    ),  # fmt: skip
    "decode_megakernel": (
        Variant(
            "decode_megakernel",
            CUDA,
            "megakernel",
            (8, 0),
            kv_dtypes=HALF_DTYPES,
            head_dims=frozenset({64, 128}),
            tunables={"rows": MEGAKERNEL_ROW_CHOICES},
            doc="the whole decode step in one persistent launch (grid barriers between the layers' GEMVs)",
        ),
        Variant("decode_megakernel", REFERENCE, None, dtypes=None, kv_dtypes=None, doc="layer by layer"),
    ),  # fmt: skip
    "apply_bitmask": _sampling_op("apply_bitmask", "one pass over the logits, in place"),
    "sample": _sampling_op("sample", "radix-select thresholds + Philox exponential race, one block per row"),
    "advance_decode": _sampling_op("advance_decode", "a multi-step graph's bookkeeping, one thread a row"),
    **{
        op: (Variant(op, CUDA, "gemv", (8, 0), kv_dtypes=kv, tunables={"rows": FUSED_ROW_CHOICES}, doc=doc),
             _reference(op))
        for op, kv, doc in (
            ("rmsnorm_linear", None, "GEMV with the RMSNorm of its rows in the prologue"),
            ("rmsnorm_qkv_rope", KV_DTYPES, "norm + q|k|v GEMV, RoPE and the paged KV write in the epilogue"),
            ("rmsnorm_gate_up_silu", None, "norm + gate|up GEMV, SiLU-and-mul in the epilogue"),
            ("linear_residual", None, "GEMV with the residual add in the epilogue"),
        )
    },
}  # fmt: skip
assert set(VARIANTS) == set(OpTable.names()), "every op needs its variants listed"

TORCH_ONLY_REASON = {
    "prepare_weight": "weights stay in torch's layout for cuBLAS",
}


def variant(op: str, name: str) -> Variant:
    for v in VARIANTS[op]:
        if v.name == name:
            return v
    raise KeyError(f"op {op!r} has no variant {name!r}; it has {[v.name for v in VARIANTS[op]]}")

"""The decode megakernel's schedule (megakernel.cu), transliterated to Python and run on the CPU: the
monotonic grid barrier under every arrival order the CTAs could take, over several launches (no CTA
leaves a barrier before the last one arrives, none waits forever, nothing needs resetting); the GEMV
phases' grid-strided channel groups and weight rows (gemv.cuh's epilogues) at SmolLM2's shapes and
every rows bucket, showing each weight row streamed once, each output element written once, and the
L2 prefetch asking for exactly the rows each CTA then streams; the attention plan (every key of every
(row, kv head) in exactly one split, every unit in exactly one CTA, the merge count reaching the
split count once) and its arithmetic in float64 (each warp's online softmax in the exp2 domain, the
warps' combine, the splits' merge) against the reference attention on a paged pool whose rows cross
page boundaries."""

from __future__ import annotations

import math
import random

import pytest
import torch

from sgjit.kernels import reference
from sgjit.kernels.cuda.gemv import ROW_BUCKETS
from sgjit.kernels.cuda.megakernel import MAX_SPLITS, MEGA_TILES, MIN_SPLIT_KEYS, WARPS, keys_a_warp
from sgjit.kernels.ops import AttentionMetadata, LayerKV

# SmolLM2-135M
HIDDEN, INTER, HQ, HKV, D, VOCAB, LAYERS = 576, 1536, 9, 3, 64, 49152, 30
GRIDS = (1, 7, 132, 264)  # one CTA, an odd count, H100/H200 SMs at 1 and 2 CTAs a SM


# ---- the barrier ------------------------------------------------------------------------------------


def run_launches(n: int, barriers: int, launches: int, rng: random.Random) -> int:
    """`launches` launches of n CTAs, each passing `barriers` grid barriers, in a random interleaving
    of single steps (arrive, or re-check the wait). Asserts that a CTA leaves barrier i only after all
    n arrived at it; returns the counter at the end."""
    counter = 0
    for _ in range(launches):
        at = [0] * n  # barrier a CTA is at
        target: list[int | None] = [None] * n  # its wait target once arrived
        arrived = [0] * barriers
        done = 0
        while done < n:
            c = rng.choice([i for i in range(n) if at[i] < barriers])
            if target[c] is None:  # arrive: atomicAdd, then the next multiple of n above what it saw
                seen, counter = counter, counter + 1
                target[c] = (seen // n + 1) * n
                arrived[at[c]] += 1
            elif counter >= target[c]:  # the acquire load sees the target: leave
                assert arrived[at[c]] == n, f"left barrier {at[c]} with {arrived[at[c]]}/{n} arrived"
                at[c] += 1
                target[c] = None
                done += at[c] == barriers
        assert counter % n == 0  # what the next launch (or graph replay) starts from
    return counter


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_barrier_releases_only_when_all_arrived_and_never_resets(n):
    rng = random.Random(n)
    barriers = 1 + 5 * 3  # phase 0, then five a layer
    assert run_launches(n, barriers, launches=4, rng=rng) == 4 * barriers * n


# ---- the GEMV phases --------------------------------------------------------------------------------


def rope_epi(m: int, rot: int = D):
    """EpiRopeStoreKV: (groups, weight_row, outputs of group g) -> output ids (r, head, dim)."""
    pairs = (HQ + 2 * HKV) * (D // 2)

    def dims(j: int) -> tuple[int, int]:
        return (j, j + rot // 2) if j < rot // 2 else (2 * j, 2 * j + 1)

    def groups(cpb: int) -> int:
        return -(-pairs // (cpb // 2))

    def weight_row(g: int, local: int, cpb: int) -> int:
        half = cpb // 2
        p = g * half + local % half
        if p >= pairs:
            return -1
        head, (a, b) = p // (D // 2), dims(p % (D // 2))
        return head * D + (a if local < half else b)

    def outputs(g: int, cpb: int) -> list[tuple]:
        half, out = cpb // 2, []
        for i in range(m * half):
            r, c = divmod(i, half)
            p = g * half + c
            if p >= pairs:
                continue
            head, (a, b) = p // (D // 2), dims(p % (D // 2))
            out += [(r, head, a), (r, head, b)]
        return out

    return groups, weight_row, outputs, (HQ + 2 * HKV) * D, {(r, h, d) for r in range(m) for h in range(HQ + 2 * HKV) for d in range(D)}  # fmt: skip


def silu_epi(m: int):
    def groups(cpb: int) -> int:
        return -(-INTER // (cpb // 2))

    def weight_row(g: int, local: int, cpb: int) -> int:
        half = cpb // 2
        j = g * half + local % half
        return -1 if j >= INTER else (j if local < half else INTER + j)

    def outputs(g: int, cpb: int) -> list[tuple]:
        half = cpb // 2
        return [(r, g * half + c) for r in range(m) for c in range(half) if g * half + c < INTER]

    return groups, weight_row, outputs, 2 * INTER, {(r, j) for r in range(m) for j in range(INTER)}


def plain_epi(m: int, n: int):
    """EpiResidual and EpiLogits: channel c of group g is weight row g * cpb + c; the owning lane
    stores (r, row) for every row r < m."""

    def groups(cpb: int) -> int:
        return -(-n // cpb)

    def weight_row(g: int, local: int, cpb: int) -> int:
        c = g * cpb + local
        return c if c < n else -1

    def outputs(g: int, cpb: int) -> list[tuple]:
        return [(r, row) for r in range(m) for local in range(cpb) if (row := weight_row(g, local, cpb)) >= 0]

    return groups, weight_row, outputs, n, {(r, c) for r in range(m) for c in range(n)}


PHASES = {
    "qkv_rope": rope_epi,
    "o_proj": lambda m: plain_epi(m, HIDDEN),
    "gate_up_silu": silu_epi,
    "down": lambda m: plain_epi(m, HIDDEN),
    "lm_head": lambda m: plain_epi(m, VOCAB),
}


@pytest.mark.parametrize("phase", sorted(PHASES))
@pytest.mark.parametrize("rows", [b for b in ROW_BUCKETS if b <= 8])
def test_gemv_phase_streams_each_row_once_and_writes_each_output_once(phase, rows):
    groups, weight_row, outputs, n_rows, want = PHASES[phase](rows)
    cpb = WARPS * MEGA_TILES[rows][0]
    for grid in GRIDS:
        streamed, written = [], []
        for cta in range(grid):
            mine = []
            for g in range(cta, groups(cpb), grid):  # gemv_phase
                rows_g = [weight_row(g, warp * (cpb // WARPS) + c, cpb) for warp in range(WARPS) for c in range(cpb // WARPS)]  # fmt: skip
                mine += [r for r in rows_g if r >= 0]
                written += outputs(g, cpb)
            fetched, i = [], 0  # prefetch_rows: thread-strided over (group, local)
            while (g := cta + (i // cpb) * grid) < groups(cpb):
                if (row := weight_row(g, i % cpb, cpb)) >= 0:
                    fetched.append(row)
                i += 1
            assert sorted(fetched) == sorted(mine)
            streamed += mine
        assert sorted(streamed) == list(range(n_rows))
        assert len(written) == len(want) and set(written) == want


# ---- attention ----------------------------------------------------------------------------------------


def attn_plan(kv_lens: list[int], hkv: int, grid: int, max_splits: int) -> list[tuple[int, int]]:
    """megakernel.cu's attn_plan: (splits, keys) a row."""
    m = len(kv_lens)
    cap = max(1, min(max_splits, -(-grid // (m * hkv))))
    plan = []
    for length in kv_lens:
        length = max(length, 1)
        s = max(1, min(cap, length // MIN_SPLIT_KEYS))
        keys = -(-length // s)
        plan.append((-(-length // keys), keys))
    return plan


def units_of(
    plan: list[tuple[int, int]], hkv: int, kv_lens: list[int]
) -> list[tuple[int, int, int, int, int]]:
    """Unit u -> (row, head, split, k0, k1), as attention_phase decodes it."""
    start = [0]
    for s, _ in plan:
        start.append(start[-1] + hkv * s)
    out = []
    for u in range(start[-1]):
        r = 0
        while u >= start[r + 1]:
            r += 1
        splits, keys = plan[r]
        h, s = divmod(u - start[r], splits)
        k0 = s * keys
        out.append((r, h, s, k0, min(max(kv_lens[r], 1), k0 + keys)))
    return out


@pytest.mark.parametrize("grid", GRIDS)
def test_attention_units_cover_every_key_once(grid):
    rng = random.Random(grid)
    for _ in range(50):
        m = rng.choice([1, 2, 4, 8])
        lens = [rng.choice([1, 2, 15, 16, 17, 31, 32, 33, 100, 511, 512, 1000, 4096]) for _ in range(m)]
        plan = attn_plan(lens, HKV, grid, MAX_SPLITS)
        units = units_of(plan, HKV, lens)
        assert all(1 <= s <= MAX_SPLITS for s, _ in plan)
        seen: dict[tuple[int, int], list[int]] = {}
        arrivals: dict[tuple[int, int], int] = {}
        for cta in range(grid):
            for r, h, _s, k0, k1 in units[cta::grid]:
                assert k0 < k1, "an empty split would leave its slot unwritten"
                seen.setdefault((r, h), []).extend(range(k0, k1))
                arrivals[r, h] = arrivals.get((r, h), 0) + 1
        for r in range(m):
            for h in range(HKV):
                assert sorted(seen[r, h]) == list(range(lens[r]))
                assert arrivals[r, h] == plan[r][0]  # the merge count reaches the split count once


def merge_states(a, b):
    """megakernel.cu's merge_lanes: two online-softmax states (max, sum, output) as one; a state that
    saw no key (max -inf) weighs nothing."""
    m_new = torch.maximum(a[0], b[0])
    fa = torch.where(a[0] == -math.inf, 0.0, torch.exp2(a[0] - m_new))
    fb = torch.where(b[0] == -math.inf, 0.0, torch.exp2(b[0] - m_new))
    return m_new, a[1] * fa + b[1] * fb, a[2] * fa[:, None] + b[2] * fb[:, None]


def emulate_attention(q, k_pool, v_pool, table, lens, page, scale, grid):
    """attention_phase in float64: per unit, lane group j of warp w takes keys k0 + w * KPW + j, then
    every WARPS * KPW-th after it, with an online softmax in the exp2 domain; a warp's groups merge
    pairwise (the lanes' butterfly), then the warps combine; a (row, head) of several splits merges
    its slots' normalised outputs by their log2-sum-exp."""
    m, hq, d = q.shape
    hkv = k_pool.shape[2]
    g_ = hq // hkv
    kpw = keys_a_warp(d, g_)
    sl = scale / math.log(2.0)
    out = torch.full((m, hq, d), float("nan"), dtype=torch.float64)
    slots: dict[tuple[int, int], list] = {}
    plan = attn_plan(lens, hkv, grid, MAX_SPLITS)
    for r, h, _s, k0, k1 in units_of(plan, hkv, lens):
        qh = q[r, h * g_ : (h + 1) * g_]
        pieces = []
        for w in range(WARPS):
            groups = []
            for j in range(kpw):
                mx, l_, o = torch.full((g_,), -math.inf, dtype=torch.float64), torch.zeros(g_, dtype=torch.float64), torch.zeros(g_, d, dtype=torch.float64)  # fmt: skip
                for pos in range(k0 + w * kpw + j, k1, WARPS * kpw):
                    slot = table[r, pos // page] * page + pos % page
                    kv_k, kv_v = k_pool.view(-1, hkv, d)[slot, h], v_pool.view(-1, hkv, d)[slot, h]
                    sc = (qh @ kv_k) * sl
                    m_new = torch.maximum(mx, sc)
                    alpha, p = torch.exp2(mx - m_new), torch.exp2(sc - m_new)
                    l_ = l_ * alpha + p
                    o = o * alpha[:, None] + p[:, None] * kv_v[None, :]
                    mx = m_new
                groups.append((mx, l_, o))
            step = 1
            while step < kpw:  # merge_lanes: group j takes group j ^ step's state
                groups = [merge_states(groups[j], groups[j ^ step]) for j in range(kpw)]
                step *= 2
            pieces.append(groups[0])
        m_all = torch.stack([p[0] for p in pieces]).amax(0)
        f = [torch.where(p[0] == -math.inf, 0.0, torch.exp2(p[0] - m_all)) for p in pieces]
        total = sum(p[1] * fi for p, fi in zip(pieces, f))
        acc = sum(p[2] * fi[:, None] for p, fi in zip(pieces, f))
        res, lse = acc / total[:, None], m_all + torch.log2(total)
        if plan[r][0] == 1:
            out[r, h * g_ : (h + 1) * g_] = res
        else:
            slots.setdefault((r, h), []).append((lse, res))
    for (r, h), parts in slots.items():
        m_all = torch.stack([lse for lse, _ in parts]).amax(0)
        f = [torch.exp2(lse - m_all) for lse, _ in parts]
        out[r, h * g_ : (h + 1) * g_] = sum(fi[:, None] * o for fi, (_, o) in zip(f, parts)) / sum(f)[:, None]
    return out


@pytest.mark.parametrize("grid", [1, 7, 132])
def test_attention_arithmetic_matches_reference(grid):
    g = torch.Generator().manual_seed(grid)
    page, lens = 16, [1, 17, 100, 700]
    m = len(lens)
    pages_per_row = -(-max(lens) // page)
    num_pages = 1 + m * pages_per_row
    k_pool = torch.randn(num_pages, page, HKV, D, generator=g, dtype=torch.float64)
    v_pool = torch.randn(num_pages, page, HKV, D, generator=g, dtype=torch.float64)
    table = torch.tensor([[1 + r + m * i for i in range(pages_per_row)] for r in range(m)], dtype=torch.int32)
    q = torch.randn(m, HQ, D, generator=g, dtype=torch.float64)
    scale = D**-0.5
    got = emulate_attention(q, k_pool, v_pool, table, lens, page, scale, grid)
    meta = AttentionMetadata(
        qo_indptr=torch.arange(m + 1, dtype=torch.int32), kv_lens=torch.tensor(lens, dtype=torch.int32),
        page_table=table, page_size=page, max_q_len=1, max_kv_len=max(lens),
        qo_indptr_host=list(range(m + 1)), kv_lens_host=lens,
    )  # fmt: skip
    want = reference.attention(q, LayerKV(k_pool, v_pool), meta, scale)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)

"""The streaming decode kernel's index math (decode.cu), transliterated to Python and run on the CPU.

A GPU run found rows longer than one 16-key tile wrong while one-tile rows were right; this emulation
follows the .cu line by line where indices are made: the partition's warp scan and the CTA ranges,
the cursors (locate/advance), the producer's page lookups one tile ahead, its chunk addresses and the
swizzled shared-memory offsets, the cp.async ring (a group's copies land only at the wait that covers
it, so a read of a stage too early sees the previous tile), the ldmatrix row addresses of K and V, the
masking and online softmax, the pieces' slots and spans, and the merge kernel. Arithmetic is float64
with whole-tile products in place of the mma fragments (their layout is not emulated), and only
16-bit pools (the fp8 path's byte permutes are not). Buffers the kernel does not own start as NaN
(or as out-of-range span ids), as torch.empty may leave them, so a read of anything not written shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from sgjit.kernels import reference
from sgjit.kernels.synthetic import AttentionCase, paged_attention_case

BT = 16  # DEC_BT


@dataclass
class Cursor:
    u: int
    b: int
    g: int
    t: int
    nt: int


def dec_off(tok: int, hh: int, ch: int, hg: int, rowb: int) -> int:
    """Byte offset in a stage's K or V tile (16-bit pools)."""
    return (tok * hg + hh) * rowb + ((ch ^ (tok & 7)) << 4)


def emulate(case: AttentionCase, hg: int, stages: int, ctas: int, scale: float) -> torch.Tensor:
    q = case.q.double().numpy()
    rows, hq, d = q.shape
    kpool = case.kv.k.double().numpy()
    vpool = case.kv.v.double().numpy()
    page, hkv = kpool.shape[1], kpool.shape[2]
    kflat, vflat = kpool.reshape(-1), vpool.reshape(-1)
    table = case.meta.page_table.numpy()
    lens = case.meta.kv_lens.numpy()
    g_ = hq // hkv
    kvb, rowb = 2, d * 2
    cpr = rowb // 16
    tile = BT * hg * rowb
    cpt = BT * cpr // 32
    tok_stride = 32 // cpr
    npg = 1 if page >= BT else cpt
    hgg = hg * g_
    ng = hkv // hg
    nt_threads = 32 * hg
    scale_log2 = scale / math.log(2.0)
    q_flat = q.reshape(-1)
    q_stride = hq * d

    out = np.full(rows * hq * d, np.nan)
    part_o = np.full(2 * ctas * hgg * d, np.nan)
    part_lse = np.full(2 * ctas * hgg, np.nan)
    spans = np.full(2 * rows * ng, -(10**9), dtype=np.int64)

    def run_cta(cta: int) -> None:
        # ---- the partition: warp 0's scan ----
        s_len = [int(x) for x in lens]
        s_pre = [0] * (rows + 1)
        run = 0
        for base in range(0, rows, 32):
            x = [ng * ((s_len[base + ln] + BT - 1) // BT) if base + ln < rows else 0 for ln in range(32)]
            o_ = 1
            while o_ < 32:
                y = list(x)
                x = [x[ln] + (y[ln - o_] if ln >= o_ else 0) for ln in range(32)]
                o_ <<= 1
            for ln in range(32):
                if base + ln < rows:
                    s_pre[base + ln + 1] = run + x[ln]
            run += x[31]
        total = s_pre[rows]
        p_ = min(ctas, total)
        if cta >= p_:
            return
        u_begin = cta * total // p_
        u_end = (cta + 1) * total // p_
        if u_begin >= u_end:
            return

        def locate(u: int) -> Cursor:
            lo, hi = 0, rows - 1
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if s_pre[mid] <= u:
                    lo = mid
                else:
                    hi = mid - 1
            nt = (s_pre[lo + 1] - s_pre[lo]) // ng
            return Cursor(u, lo, (u - s_pre[lo]) // nt, (u - s_pre[lo]) % nt, nt)

        def advance(c: Cursor) -> None:
            c.u += 1
            c.t += 1
            if c.t < c.nt:
                return
            c.t = 0
            c.g += 1
            if c.g < ng:
                return
            c.g = 0
            c.b += 1
            while c.b < rows and s_pre[c.b + 1] == s_pre[c.b]:
                c.b += 1
            c.nt = (s_pre[c.b + 1] - s_pre[c.b]) // ng if c.b < rows else 1

        # ---- producer ----
        ring_k = np.full((stages, tile // kvb), np.nan)
        ring_v = np.full((stages, tile // kvb), np.nan)
        pending: list[list[tuple[int, int, np.ndarray, np.ndarray]]] = []  # committed groups not landed
        pc = locate(u_begin)
        ppg = np.zeros((nt_threads, npg), dtype=np.int64)

        def fetch() -> None:
            if pc.u >= u_end:
                return
            ln = s_len[pc.b]
            for tid in range(nt_threads):
                tok0 = tid // (hg * cpr)
                for j in range(npg):
                    pos = pc.t * BT + (0 if npg == 1 else tok0 + j * tok_stride)
                    ppg[tid, j] = table[pc.b, pos // page] if pos < ln else 0

        def issue(stage: int) -> None:
            group = []
            if pc.u < u_end:
                ln = s_len[pc.b]
                for tid in range(nt_threads):
                    rem = tid % (hg * cpr)
                    hh, ch, tok0 = rem // cpr, rem % cpr, tid // (hg * cpr)
                    head = pc.g * hg + hh
                    for i in range(cpt):
                        tok = tok0 + i * tok_stride
                        pos = pc.t * BT + tok
                        ok = pos < ln
                        slot = int(ppg[tid, 0 if npg == 1 else i]) * page + (pos & (page - 1))
                        off = (slot * hkv + head) * d + ch * (16 // kvb) if ok else 0
                        dst = dec_off(tok, hh, ch, hg, rowb) // kvb
                        kk = kflat[off : off + 8] if ok else np.zeros(8)
                        vv = vflat[off : off + 8] if ok else np.zeros(8)
                        group.append((stage, dst, kk.copy(), vv.copy()))
                advance(pc)
                fetch()
            pending.append(group)

        def wait(n: int) -> None:
            while len(pending) > n:
                for stage, dst, kk, vv in pending.pop(0):
                    ring_k[stage, dst : dst + 8] = kk
                    ring_v[stage, dst : dst + 8] = vv

        fetch()
        for s in range(stages - 1):
            issue(s)

        # ---- consumer: all warps at once, rows = [warp, 16 m-rows] ----
        cc = locate(u_begin)
        seg_k0 = 0
        qa = np.zeros((hg, 16, d))
        o = np.zeros((hg, 16, d))
        m_run = np.full((hg, 16), -np.inf)
        l_run = np.zeros((hg, 16))

        def begin_segment() -> None:
            nonlocal o, m_run, l_run
            qa[:] = 0.0
            for w in range(hg):
                qrow = cc.b * q_stride + (cc.g * hg + w) * g_ * d
                for row in range(min(16, g_)):
                    qa[w, row] = q_flat[qrow + row * d : qrow + row * d + d]
            o = np.zeros((hg, 16, d))
            m_run = np.full((hg, 16), -np.inf)
            l_run = np.zeros((hg, 16))

        def end_segment(full: bool, slot: int) -> None:
            for w in range(hg):
                for row in range(min(16, g_)):
                    ll = l_run[w, row]
                    inv = 1.0 / ll if ll > 0 else 0.0
                    head_local = w * g_ + row
                    if full:
                        dst = (cc.b * hq + cc.g * hgg + head_local) * d
                        out[dst : dst + d] = o[w, row] * inv
                    else:
                        prow = (2 * cta + slot) * hgg + head_local
                        part_o[prow * d : prow * d + d] = o[w, row] * inv
                        part_lse[prow] = m_run[w, row] + math.log2(ll) if ll > 0 else -np.inf

        n_tiles = u_end - u_begin
        begin_segment()
        for k in range(n_tiles):
            wait(stages - 2)
            issue((k + stages - 1) % stages)
            if k > 0 and cc.t == 0:
                begin_segment()
                seg_k0 = k
            sk, sv = ring_k[k % stages], ring_v[k % stages]
            ln = s_len[cc.b]
            kt = np.empty((hg, BT, d))
            vt = np.empty((hg, BT, d))
            for w in range(hg):
                for mat in range(4):
                    for r8 in range(8):
                        for ks in range(d // 16):  # ldsm_x4 of K: row r8 of matrix mat
                            tok = (mat >> 1) * 8 + r8
                            a = dec_off(tok, w, 2 * ks + (mat & 1), hg, rowb) // kvb
                            kt[w, tok, 16 * ks + 8 * (mat & 1) : 16 * ks + 8 * (mat & 1) + 8] = sk[a : a + 8]
                            tok = (mat & 1) * 8 + r8  # ldsm_x4_t of V
                            ch = 2 * ks + (mat >> 1)
                            a = dec_off(tok, w, ch, hg, rowb) // kvb
                            vt[w, tok, 8 * ch : 8 * ch + 8] = sv[a : a + 8]
            s = np.einsum("wrd,wkd->wrk", qa, kt) * scale_log2
            if (cc.t + 1) * BT > ln:
                s[:, :, np.arange(BT) + cc.t * BT >= ln] = -np.inf
            mx = s.max(axis=2)
            m_new = np.maximum(m_run, mx)
            base = np.where(m_new == -np.inf, 0.0, m_new)
            corr = np.exp2(m_run - base)
            p = np.exp2(s - base[..., None])
            l_run = l_run * corr + p.sum(axis=2)
            m_run = m_new
            pv = np.einsum("wrk,wkd->wrd", p, vt)
            o = o * corr[..., None] + pv
            if k == n_tiles - 1 or cc.t == cc.nt - 1:
                has_first = cc.t == k - seg_k0
                stream_u0 = s_pre[cc.b] + cc.g * cc.nt
                c_last = ((stream_u0 + cc.nt) * p_ - 1) // total
                slot = 0 if seg_k0 == 0 else 1
                end_segment(has_first and c_last == cta, slot)
                if has_first:
                    spans[2 * (cc.b * ng + cc.g)] = 2 * cta + slot
                    spans[2 * (cc.b * ng + cc.g) + 1] = c_last
            advance(cc)
        wait(0)

    for cta in range(ctas):
        run_cta(cta)

    # ---- merge ----
    for b in range(rows):
        for head in range(hq):
            dst = (b * hq + head) * d
            if lens[b] <= 0:
                out[dst : dst + d] = 0.0
                continue
            g, hl = head // hgg, head % hgg
            first, last = int(spans[2 * (b * ng + g)]), int(spans[2 * (b * ng + g) + 1])
            c0 = first >> 1
            if c0 == last:
                continue
            ps = [first if c == c0 else 2 * c for c in range(c0, last + 1)]
            lse = np.array([part_lse[p * hgg + hl] for p in ps])
            mx = np.fmax.reduce(lse, initial=-np.inf)  # fmaxf: a NaN loses to a number
            acc, wsum = np.zeros(d), 0.0
            if mx != -np.inf:
                for p, x in zip(ps, lse):
                    if x == -np.inf:
                        continue
                    w = 2.0 ** (x - mx)
                    wsum += w
                    acc += w * part_o[(p * hgg + hl) * d : (p * hgg + hl) * d + d]
            out[dst : dst + d] = acc / wsum if wsum > 0 else 0.0
    return torch.from_numpy(out.reshape(rows, hq, d))


def _check(out: torch.Tensor, case: AttentionCase, scale: float) -> None:
    ref = reference.attention(case.q.float(), case.kv, case.meta, scale).double()
    err = (out - ref).norm(dim=(1, 2)) / ref.norm(dim=(1, 2))
    bad = (~(err < 1e-2)).nonzero().flatten().tolist()
    lens = case.meta.kv_lens_host
    assert not bad, "rows off: " + ", ".join(f"row {b} kv {lens[b]} err {err[b].item():.2e}" for b in bad[:8])


EDGES = [15, 16, 17, 31, 32, 33, 1, 2, 47, 48, 49, 63, 64, 65]


# (Hq, Hkv, head_dim, page, kv heads a CTA, stages, CTAs)
@pytest.mark.parametrize(
    "hq,hkv,d,page,hg,stages,ctas",
    [
        (32, 8, 128, 16, 8, 3, 70),  # the GPU failure: more CTAs than units, most hold one tile
        (32, 8, 128, 16, 8, 2, 5),  # several tiles a CTA: the ring, a CTA's two cut pieces
        (32, 8, 128, 16, 4, 4, 7),  # two head groups a row
        (16, 4, 64, 8, 2, 3, 9),  # pages shorter than a tile (a page id per chunk)
        (16, 2, 64, 64, 2, 6, 200),
    ],
)
def test_emulated_kernel_matches_reference(hq, hkv, d, page, hg, stages, ctas):
    case = paged_attention_case(
        [1] * len(EDGES), EDGES, hq, hkv, d, page, torch.float32, torch.bfloat16, "cpu"
    )
    scale = d**-0.5
    _check(emulate(case, hg, stages, ctas, scale), case, scale)

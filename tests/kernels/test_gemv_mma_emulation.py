"""The tensor-core GEMV body's index math (gemv.cuh, `gemv_mma_group`), transliterated to Python and
run on the CPU, so a wrong fragment word or block offset shows without a GPU.

What is emulated as the .cu writes it: each warp's 64-element blocks (w, w + WARPS, ...), lane
(g, t)'s two 16-byte pieces of a block from channels g and g + 8 and from input row 8 nt + g of each
n8 tile nt (zero past K, past the channel count, past the rows), the words each k16 step hands to
the mma as a0..a3 and b0, b1, the mma.sync m16n8k16 operand layout (PTX: A row-major, a0 = (g, 2t..2t+1), a1 = (g + 8,
2t..), a2 = (g, 2t + 8..), a3 = (g + 8, 2t + 8..); B column-major, b0 = (2t.., column g), b1 =
(2t + 8.., column g); C c0, c1 = (g, columns 2t, 2t + 1), c2, c3 = (g + 8, ...)), the partial sums
in shared memory and their sum in warp order. Arithmetic is float64, so the check is the mapping:
every product W[c, k] x[r, k] taken exactly once."""

from __future__ import annotations

import numpy as np
import pytest

WARPS = 4


def mma_m16n8k16(c: np.ndarray, a_words: list, b_words: list) -> None:
    """One warp's mma.sync m16n8k16 from the lanes' fragments: `a_words[lane]` = 4 pairs (a0..a3),
    `b_words[lane]` = 2 pairs (b0, b1), each pair the two 16-bit values of a 32-bit word; `c[lane]`
    the 4 accumulators."""
    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        a0, a1, a2, a3 = a_words[lane]
        A[g, 2 * t : 2 * t + 2], A[g + 8, 2 * t : 2 * t + 2] = a0, a1
        A[g, 2 * t + 8 : 2 * t + 10], A[g + 8, 2 * t + 8 : 2 * t + 10] = a2, a3
        b0, b1 = b_words[lane]
        B[2 * t : 2 * t + 2, g], B[2 * t + 8 : 2 * t + 10, g] = b0, b1
    D = A @ B
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        c[lane] += [D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]]


def emulate_group(w: np.ndarray, x: np.ndarray, channels: list[int], rows_bound: int) -> np.ndarray:
    """One group of 16 channels (`channels[i]`: the weight row of local channel i, -1 past the end)
    against x's m rows, in a kernel built for `rows_bound` rows: the [m, 16] outputs before scale
    and bias."""
    n_k = w.shape[1]
    m = x.shape[0]
    vecs, blocks = n_k // 8, (n_k + 63) // 64
    n_tiles = (rows_bound + 7) // 8

    def piece(row: np.ndarray | None, v: int, ok: bool) -> np.ndarray:  # one 16-byte load: 8 values
        return row[v * 8 : v * 8 + 8] if ok and row is not None else np.zeros(8)

    def word(vals: np.ndarray, i: int) -> np.ndarray:  # word i of a piece: two values
        return vals[2 * i : 2 * i + 2]

    part = np.zeros((WARPS, 16, 8 * n_tiles))
    for warp in range(WARPS):
        c = np.zeros((n_tiles, 32, 4))
        for b in range(warp, blocks, WARPS):
            for nt in range(n_tiles):
                if 8 * nt >= m:
                    break
                a_steps, b_steps = [[None] * 32 for _ in range(4)], [[None] * 32 for _ in range(4)]
                for lane in range(32):
                    gq, tq = lane >> 2, lane & 3
                    r = 8 * nt + gq
                    vs = [b * 8 + 2 * tq + p for p in range(2)]
                    rows = [w[max(channels[h], 0)] for h in (gq, gq + 8)]
                    wv = [[piece(rows[h], v, v < vecs) for v in vs] for h in range(2)]
                    xv = [piece(x[r] if r < m else None, v, v < vecs) for v in vs]
                    for j in range(4):
                        lo = 2 * (j & 1)
                        w0, w1, xw = wv[0][j >> 1], wv[1][j >> 1], xv[j >> 1]
                        a_steps[j][lane] = [word(w0, lo), word(w1, lo), word(w0, lo + 1), word(w1, lo + 1)]
                        b_steps[j][lane] = [word(xw, lo), word(xw, lo + 1)]
                for j in range(4):
                    mma_m16n8k16(c[nt], a_steps[j], b_steps[j])
        for nt in range(n_tiles):
            for lane in range(32):
                gq, tq = lane >> 2, lane & 3
                col = 8 * nt + 2 * tq
                part[warp, gq, col], part[warp, gq, col + 1] = c[nt, lane, 0], c[nt, lane, 1]
                part[warp, gq + 8, col], part[warp, gq + 8, col + 1] = c[nt, lane, 2], c[nt, lane, 3]
    out = np.zeros((m, 16))
    for r in range(m):
        for local in range(16):
            out[r, local] = sum(part[x_, local, r] for x_ in range(WARPS))
    return out


@pytest.mark.parametrize("k", [64, 80, 272, 1000, 4096 + 8])
@pytest.mark.parametrize("m,bound", [(1, 1), (3, 4), (8, 8), (9, 16), (16, 16), (27, 32)])
def test_every_product_once(k: int, m: int, bound: int) -> None:
    rng = np.random.default_rng(k * 10 + m)
    n = 29  # a ragged last group
    w, x = rng.standard_normal((n, k)), rng.standard_normal((m, k))
    for g0 in range(0, n, 16):
        channels = [g0 + i if g0 + i < n else -1 for i in range(16)]
        got = emulate_group(w, x, channels, bound)
        want = x @ w[[max(ch, 0) for ch in channels]].T
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)

// Decode attention (one query per row) that streams the paged pool at full bandwidth.
//
// Work is split flat: every row's keys are cut into 16-key tiles, the tiles of all rows (and of each
// group of HG kv heads, when a CTA does not hold all of them) are laid end to end, and CTA c of P
// takes units [c*W/P, (c+1)*W/P), P = min(grid, W) (the CTAs past P, if any, have nothing to do).
// Every CTA moves the same number of bytes whatever the mix of lengths, and the grid (SMs x resident
// CTAs) depends on nothing but the device, so a captured CUDA graph replays for any lengths: each CTA
// recomputes the partition from kv_lens on the device.
// A (row, head group) held by one CTA is written straight to the output; one cut between CTAs leaves
// each piece's normalised O and log2-sum-exp in a slot (a CTA has at most two cut pieces: the one it
// starts in and the one it ends in), and stream_merge_kernel combines them.
//
// A CTA holds HG kv heads, one warp each, and streams each key's HG*D-element row of the pool
// ([page, slot, kv head, D]: a token's kv heads are adjacent) as one contiguous piece through a
// STAGES-deep cp.async ring; with HG = kv heads that is the token's whole 2 KB row (Llama-3-8B).
//
// The warp of kv head h computes its G <= 16 query heads as the 16 rows of one mma tile:
// S = Q K^T (m16 heads, n8 keys, k16 dims), an online softmax in the exp2 domain, O += P V with P
// straight from the S accumulators. A 16-bit pool feeds the mma through ldmatrix. An fp8 e4m3 pool
// is widened in registers: K words convert pairwise (cvt e4m3x2 -> f16x2) into B fragments because
// the dims of the QK product may be taken in any order (Q is loaded in the same order), and V's
// fragments, which pair two keys of one dim, come from byte permutes of two keys' words before the
// conversion. The fp8 path computes in fp16 (every e4m3 value is exact in fp16); Q is scaled per
// head by a power of two into fp16's range and the scale folded into the softmax scale.
#include "common.cuh"

using namespace sgjit;

namespace sgjit {

constexpr int DEC_BT = 16;  // keys per tile: one k16 step of P V

template <typename T, bool FP8> struct DecMma {
  typedef T type;
};
template <typename T> struct DecMma<T, true> {
  typedef __half type;
};

// Byte offset of 16-byte chunk `ch` of head `hh`'s row of key `tok` in a stage's K or V tile
// ([key][head][ROWB bytes]). Chunks are XOR-swizzled by key so that the reads below hit distinct
// banks: 16-bit pools read 8 keys at one chunk (ldmatrix); fp8 pools read keys 2i, 2i+1 (K) and
// 2c + {0, 2, 4, 6} (V) at once.
template <int HG, int ROWB, bool FP8> __device__ __forceinline__ int dec_off(int tok, int hh, int ch) {
  constexpr int CPR = ROWB / 16;
  int x;
  if constexpr (FP8) {
    x = ((((tok >> 1) & 3) << 1) ^ ((tok & 1) << 2)) & (CPR - 1);
  } else {
    x = tok & 7;
  }
  return (tok * HG + hh) * ROWB + ((ch ^ x) << 4);
}

// Where the units of this step go: cursor over (row, head group, tile) in flat unit order.
struct DecCursor {
  int u, b, g, t, nt;
};

}  // namespace sgjit

template <typename T, typename KVT, int D, int G, int PAGE, int HG, int STAGES>
__global__ void __launch_bounds__(32 * HG)
    stream_decode_kernel(const T* __restrict__ q, i64 q_stride, const KVT* __restrict__ k_cache,
                         const KVT* __restrict__ v_cache, const int* __restrict__ page_table, int pt_stride,
                         const int* __restrict__ kv_lens, int num_rows, int hkv, T* __restrict__ out,
                         float* __restrict__ part_o, float* __restrict__ part_lse, int* __restrict__ spans,
                         float scale_log2, float v_scale) {
  constexpr bool FP8 = sizeof(KVT) == 1;
  typedef typename DecMma<T, FP8>::type MT;
  constexpr int NT = 32 * HG;
  constexpr int KVB = (int)sizeof(KVT);
  constexpr int ROWB = D * KVB;                 // bytes of one head's K (or V) row
  constexpr int CPR = ROWB / 16;                // its 16-byte chunks
  constexpr int TILE = DEC_BT * HG * ROWB;      // bytes of a stage's K (or V) tile
  constexpr int CPT = DEC_BT * CPR / 32;        // chunks a thread copies per K (or V) tile
  constexpr int TOK_STRIDE = 32 / CPR;          // keys between a thread's successive chunks
  constexpr int NPG = PAGE >= DEC_BT ? 1 : CPT;  // page ids a thread looks up per tile
  constexpr int HF = G > 8 ? 2 : 1;             // halves of the m16 tile that hold heads
  constexpr int HGG = HG * G;                   // query heads of a CTA
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(G >= 1 && G <= 16, "one m16 tile of query heads per kv head");
  static_assert((PAGE & (PAGE - 1)) == 0, "page size is a power of two");
  static_assert(CPT >= 1 && 32 % CPR == 0, "tile copy must divide evenly");

  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* ring = smem;  // STAGES x (K tile, V tile)
  int* s_pre = reinterpret_cast<int*>(smem + STAGES * 2 * TILE);  // [num_rows + 1] units before row b
  int* s_len = s_pre + num_rows + 1;                              // [num_rows] keys of row b

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ng = hkv / HG;
  const int hq = hkv * G;

  // ---- the partition: units of every row, then this CTA's range ----
  for (int b = tid; b < num_rows; b += NT) s_len[b] = kv_lens[b];
  __syncthreads();
  if (warp == 0) {
    int run = 0;
    for (int base = 0; base < num_rows; base += 32) {
      const int b = base + lane;
      int x = b < num_rows ? ng * ((s_len[b] + DEC_BT - 1) / DEC_BT) : 0;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
      }
      if (b < num_rows) s_pre[b + 1] = run + x;
      run += __shfl_sync(0xffffffffu, x, 31);
    }
    if (lane == 0) s_pre[0] = 0;
  }
  __syncthreads();
  // No more CTAs take part than there are units, so each holds at least one: the merge reads a slot of
  // every CTA from a stream's first to its last, and an empty one would leave its slot unwritten.
  const int total = s_pre[num_rows];
  const int P = min((int)gridDim.x, total), cta = blockIdx.x;
  if (cta >= P) return;
  const int u_begin = (int)((i64)cta * total / P);
  const int u_end = (int)((i64)(cta + 1) * total / P);

  auto locate = [&](int u) {
    int lo = 0, hi = num_rows - 1;  // the last row starting at or before u
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (s_pre[mid] <= u) lo = mid;
      else hi = mid - 1;
    }
    DecCursor c;
    c.u = u;
    c.b = lo;
    c.nt = (s_pre[lo + 1] - s_pre[lo]) / ng;
    c.g = (u - s_pre[lo]) / c.nt;
    c.t = (u - s_pre[lo]) % c.nt;
    return c;
  };
  auto advance = [&](DecCursor& c) {
    ++c.u;
    if (++c.t < c.nt) return;
    c.t = 0;
    if (++c.g < ng) return;
    c.g = 0;
    do {
      ++c.b;
    } while (c.b < num_rows && s_pre[c.b + 1] == s_pre[c.b]);
    c.nt = c.b < num_rows ? (s_pre[c.b + 1] - s_pre[c.b]) / ng : 1;
  };

  // ---- producer: every thread copies CPT chunks of K and of V per tile ----
  const int my_rem = tid % (HG * CPR);
  const int my_hh = my_rem / CPR, my_ch = my_rem % CPR;
  const int my_tok0 = tid / (HG * CPR);
  DecCursor pc = locate(u_begin);
  int ppg[NPG];  // page ids of the producer's next tile, loaded one tile ahead
  auto fetch = [&]() {
    if (pc.u >= u_end) return;
    const int* pages = page_table + (i64)pc.b * pt_stride;
    const int len = s_len[pc.b];
#pragma unroll
    for (int j = 0; j < NPG; ++j) {
      const int pos = pc.t * DEC_BT + (NPG == 1 ? 0 : my_tok0 + j * TOK_STRIDE);
      ppg[j] = pos < len ? pages[pos / PAGE] : 0;
    }
  };
  auto issue = [&](int stage) {
    if (pc.u < u_end) {
      unsigned char* sk = ring + stage * 2 * TILE;
      unsigned char* sv = sk + TILE;
      const int len = s_len[pc.b];
      const int head = pc.g * HG + my_hh;
#pragma unroll
      for (int i = 0; i < CPT; ++i) {
        const int tok = my_tok0 + i * TOK_STRIDE;
        const int pos = pc.t * DEC_BT + tok;
        const bool ok = pos < len;
        const i64 slot = (i64)ppg[NPG == 1 ? 0 : i] * PAGE + (pos & (PAGE - 1));
        const i64 off = ok ? (slot * hkv + head) * D + my_ch * (16 / KVB) : 0;
        const int dst = dec_off<HG, ROWB, FP8>(tok, my_hh, my_ch);
        cp_async16(smem_addr(sk + dst), k_cache + off, ok ? 16 : 0);
        cp_async16(smem_addr(sv + dst), v_cache + off, ok ? 16 : 0);
      }
      advance(pc);
      fetch();
    }
    cp_async_commit();
  };
  fetch();
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) issue(s);

  // ---- consumer: warp `warp` owns kv head (group * HG + warp) and its G query heads ----
  const int r = lane >> 2, c4 = lane & 3;
  u32 qa[D / 16][4];  // A fragments of Q (rows r, r + 8)
  float sl[HF];       // softmax scale (log2 domain) of rows r, r + 8
  float o[D / 8][4];
  float m_run[HF], l_run[HF];
  DecCursor cc = locate(u_begin);
  int seg_k0 = 0;

  auto begin_segment = [&]() {
    const T* qrow = q + (i64)cc.b * q_stride + (i64)(cc.g * HG + warp) * G * D;
#pragma unroll
    for (int hf = 0; hf < HF; ++hf) {
      const int row = r + 8 * hf;
      const bool ok = row < G;
      const T* qh = qrow + row * D;
      if constexpr (FP8) {
        // dims 64 qg + 16 c4 + [0, 16) of the row, scaled by 2^sh into fp16's range
        float x[D / 64][16];
        float amax = 0.f;
#pragma unroll
        for (int qg = 0; qg < D / 64; ++qg) {
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            Vec8<T> v;
            if (ok) v = load8(qh + 64 * qg + 16 * c4 + 8 * h2);
            else *reinterpret_cast<uint4*>(&v) = make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              x[qg][8 * h2 + j] = to_float(v.v[j]);
              amax = fmaxf(amax, fabsf(x[qg][8 * h2 + j]));
            }
          }
        }
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        int e = 0;
        frexpf(amax, &e);  // amax < 2^e
        const int sh = amax > 0.f ? max(-120, min(120, 14 - e)) : 0;
        const float up = ldexpf(1.f, sh);
        sl[hf] = scale_log2 * ldexpf(1.f, -sh);
#pragma unroll
        for (int qg = 0; qg < D / 64; ++qg) {
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            qa[4 * qg + s][hf] = pack2<__half>(x[qg][4 * s] * up, x[qg][4 * s + 1] * up);
            qa[4 * qg + s][2 + hf] = pack2<__half>(x[qg][4 * s + 2] * up, x[qg][4 * s + 3] * up);
          }
        }
      } else {
        sl[hf] = scale_log2;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          qa[ks][hf] = ok ? __ldg(reinterpret_cast<const u32*>(qh + 16 * ks + 2 * c4)) : 0u;
          qa[ks][2 + hf] = ok ? __ldg(reinterpret_cast<const u32*>(qh + 16 * ks + 8 + 2 * c4)) : 0u;
        }
      }
    }
    if constexpr (HF == 1) {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) qa[ks][1] = qa[ks][3] = 0u;
    }
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[nb][e] = 0.f;
    }
#pragma unroll
    for (int hf = 0; hf < HF; ++hf) {
      m_run[hf] = -INFINITY;
      l_run[hf] = 0.f;
    }
  };

  // Physical dim of element (n-block i, column n) of the O accumulator.
  auto o_dim = [&](int i, int n) {
    if constexpr (FP8) {
      return 64 * (i >> 3) + 8 * n + (i & 7);
    } else {
      return 8 * i + n;
    }
  };

  auto end_segment = [&](bool full, int slot) {
#pragma unroll
    for (int hf = 0; hf < HF; ++hf) {
      l_run[hf] += __shfl_xor_sync(0xffffffffu, l_run[hf], 1);
      l_run[hf] += __shfl_xor_sync(0xffffffffu, l_run[hf], 2);
    }
#pragma unroll
    for (int hf = 0; hf < HF; ++hf) {
      const int row = r + 8 * hf;
      if (row >= G) continue;
      const float l = l_run[hf];
      const float inv = l > 0.f ? v_scale / l : 0.f;
      const int head_local = warp * G + row;
      if (full) {
        T* dst = out + ((i64)cc.b * hq + cc.g * HGG + head_local) * D;
        if constexpr (FP8) {
          // column n = 2 c4 + e holds dims 64 hb + 16 c4 + 8 e + [0, 8): one 16-byte store each
#pragma unroll
          for (int hb = 0; hb < D / 64; ++hb) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float f[8];
#pragma unroll
              for (int j = 0; j < 8; ++j) f[j] = o[8 * hb + j][2 * hf + e] * inv;
              store8(dst + o_dim(8 * hb, 2 * c4 + e), from_floats<T>(f));
            }
          }
        } else {
#pragma unroll
          for (int nb = 0; nb < D / 8; ++nb) {
            *reinterpret_cast<u32*>(dst + o_dim(nb, 2 * c4)) =
                pack2<T>(o[nb][2 * hf] * inv, o[nb][2 * hf + 1] * inv);
          }
        }
      } else {
        const i64 prow = (i64)(2 * blockIdx.x + slot) * HGG + head_local;
        float* dst = part_o + prow * D;
#pragma unroll
        for (int nb = 0; nb < D / 8; ++nb) {
          if constexpr (FP8) {
            dst[o_dim(nb, 2 * c4)] = o[nb][2 * hf] * inv;
            dst[o_dim(nb, 2 * c4 + 1)] = o[nb][2 * hf + 1] * inv;
          } else {
            *reinterpret_cast<float2*>(dst + o_dim(nb, 2 * c4)) =
                make_float2(o[nb][2 * hf] * inv, o[nb][2 * hf + 1] * inv);
          }
        }
        if (c4 == 0) part_lse[prow] = l > 0.f ? m_run[hf] + log2f(l) : -INFINITY;
      }
    }
  };

  const int n_tiles = u_end - u_begin;
  begin_segment();  // the first piece's Q: its loads overlap the ring's first copies
  for (int k = 0; k < n_tiles; ++k) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    issue((k + STAGES - 1) % STAGES);
    if (k > 0 && cc.t == 0) {
      begin_segment();
      seg_k0 = k;
    }
    const unsigned char* sk = ring + (k % STAGES) * 2 * TILE;
    const unsigned char* sv = sk + TILE;
    const int len = s_len[cc.b];

    // ---- S = Q K^T: s[nb] holds rows r, r + 8 and keys 8 nb + 2 c4 + {0, 1} ----
    float s[2][4];
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nb][e] = 0.f;
    }
    if constexpr (FP8) {
#pragma unroll
      for (int qg = 0; qg < D / 64; ++qg) {
        uint4 w[2];
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {
          w[nb] = *reinterpret_cast<const uint4*>(sk + dec_off<HG, ROWB, true>(8 * nb + r, warp, 4 * qg + c4));
        }
#pragma unroll
        for (int sidx = 0; sidx < 4; ++sidx) {
#pragma unroll
          for (int nb = 0; nb < 2; ++nb) {
            const u32 word = sidx == 0 ? w[nb].x : sidx == 1 ? w[nb].y : sidx == 2 ? w[nb].z : w[nb].w;
            const u32 b0 = fp8x2_to<__half>((unsigned short)(word & 0xffff));
            const u32 b1 = fp8x2_to<__half>((unsigned short)(word >> 16));
            mma16816<MT>(s[nb], qa[4 * qg + sidx], b0, b1);
          }
        }
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        const int mat = lane >> 3;
        const int tok = (mat >> 1) * 8 + (lane & 7);
        u32 b0, b1, b2, b3;
        ldsm_x4(smem_addr(sk + dec_off<HG, ROWB, false>(tok, warp, 2 * ks + (mat & 1))), b0, b1, b2, b3);
        mma16816<MT>(s[0], qa[ks], b0, b1);
        mma16816<MT>(s[1], qa[ks], b2, b3);
      }
    }

    // ---- mask the row's end, online softmax ----
    const bool need_mask = (cc.t + 1) * DEC_BT > len;
#pragma unroll
    for (int hf = 0; hf < HF; ++hf) {
      float mx = -INFINITY;
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float x = s[nb][2 * hf + e] * sl[hf];
          if (need_mask && cc.t * DEC_BT + 8 * nb + 2 * c4 + e >= len) x = -INFINITY;
          s[nb][2 * hf + e] = x;
          mx = fmaxf(mx, x);
        }
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[hf], mx);
      const float base = m_new == -INFINITY ? 0.f : m_new;
      const float corr = exp2f(m_run[hf] - base);
      float rs = 0.f;
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = exp2f(s[nb][2 * hf + e] - base);
          s[nb][2 * hf + e] = p;
          rs += p;
        }
      }
      l_run[hf] = l_run[hf] * corr + rs;
      m_run[hf] = m_new;
#pragma unroll
      for (int nb = 0; nb < D / 8; ++nb) {
        o[nb][2 * hf] *= corr;
        o[nb][2 * hf + 1] *= corr;
      }
    }

    // ---- O += P V ----
    u32 pa[4];
    pa[0] = pack2<MT>(s[0][0], s[0][1]);
    pa[2] = pack2<MT>(s[1][0], s[1][1]);
    if constexpr (HF == 2) {
      pa[1] = pack2<MT>(s[0][2], s[0][3]);
      pa[3] = pack2<MT>(s[1][2], s[1][3]);
    } else {
      pa[1] = pa[3] = 0u;
    }
    if constexpr (FP8) {
      // column n = r of n-block i is dim 64 (i / 8) + 8 r + i % 8; keys 2 c4 + {0, 1} (b0) and + 8 (b1)
#pragma unroll
      for (int hb = 0; hb < D / 64; ++hb) {
        uint2 x[2][2];  // [key pair][key of the pair]
#pragma unroll
        for (int kp = 0; kp < 2; ++kp) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int tok = 8 * kp + 2 * c4 + e;
            x[kp][e] = *reinterpret_cast<const uint2*>(sv + dec_off<HG, ROWB, true>(tok, warp, 4 * hb + (r >> 1)) +
                                                       8 * (r & 1));
          }
        }
#pragma unroll
        for (int wi = 0; wi < 2; ++wi) {
          u32 lo[2], hi[2];
#pragma unroll
          for (int kp = 0; kp < 2; ++kp) {
            const u32 a = wi ? x[kp][0].y : x[kp][0].x;
            const u32 b = wi ? x[kp][1].y : x[kp][1].x;
            lo[kp] = __byte_perm(a, b, 0x5140);
            hi[kp] = __byte_perm(a, b, 0x7362);
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int i = 8 * hb + 4 * wi + j;
            u32 bb[2];
#pragma unroll
            for (int kp = 0; kp < 2; ++kp) {
              const u32 src = j < 2 ? lo[kp] : hi[kp];
              bb[kp] = fp8x2_to<__half>((unsigned short)((j & 1) ? src >> 16 : src & 0xffff));
            }
            mma16816<MT>(o[i], pa, bb[0], bb[1]);
          }
        }
      }
    } else {
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        const int mat = lane >> 3;
        const int tok = (mat & 1) * 8 + (lane & 7);
        u32 b0, b1, b2, b3;
        ldsm_x4_t(smem_addr(sv + dec_off<HG, ROWB, false>(tok, warp, 2 * dp + (mat >> 1))), b0, b1, b2, b3);
        mma16816<MT>(o[2 * dp], pa, b0, b1);
        mma16816<MT>(o[2 * dp + 1], pa, b2, b3);
      }
    }

    if (k == n_tiles - 1 || cc.t == cc.nt - 1) {
      const bool has_first = cc.t == k - seg_k0;  // the piece starts at the stream's tile 0
      const int stream_u0 = s_pre[cc.b] + cc.g * cc.nt;
      const int c_last = (int)(((i64)(stream_u0 + cc.nt) * P - 1) / total);
      const int slot = seg_k0 == 0 ? 0 : 1;
      end_segment(has_first && c_last == cta, slot);
      if (has_first && tid == 0) {
        spans[2 * (cc.b * ng + cc.g)] = 2 * cta + slot;
        spans[2 * (cc.b * ng + cc.g) + 1] = c_last;
      }
    }
    advance(cc);
  }
  cp_async_wait<0>();
}

// The pieces of every (row, head group) that CTAs cut: out = sum_c 2^(lse_c - max) o_c / sum_c
// 2^(lse_c - max) over the CTAs first .. last that hold it. One thread per output element.
template <typename T, int D>
__global__ void __launch_bounds__(128)
    stream_merge_kernel(const float* __restrict__ part_o, const float* __restrict__ part_lse,
                        const int* __restrict__ spans, const int* __restrict__ kv_lens, T* __restrict__ out,
                        int hq, int hgg) {
  const int b = blockIdx.x;
  const int e = blockIdx.y * 128 + threadIdx.x;
  const int head = e / D, d = e % D;
  if (head >= hq) return;
  T* dst = out + ((i64)b * hq + head) * D + d;
  if (kv_lens[b] <= 0) {  // no keys: no CTA wrote this row
    *dst = from_float<T>(0.f);
    return;
  }
  const int ng = hq / hgg, g = head / hgg, hl = head % hgg;
  const int first = spans[2 * (b * ng + g)], last = spans[2 * (b * ng + g) + 1];
  const int c0 = first >> 1;
  if (c0 == last) return;  // held whole by one CTA, which wrote it
  float mx = -INFINITY;
  for (int c = c0; c <= last; ++c) {
    const int p = c == c0 ? first : 2 * c;
    mx = fmaxf(mx, part_lse[(i64)p * hgg + hl]);
  }
  float acc = 0.f, wsum = 0.f;
  if (mx != -INFINITY) {
    for (int c = c0; c <= last; ++c) {
      const int p = c == c0 ? first : 2 * c;
      const float lse = part_lse[(i64)p * hgg + hl];
      if (lse == -INFINITY) continue;
      const float w = exp2f(lse - mx);
      wsum += w;
      acc += w * part_o[((i64)p * hgg + hl) * D + d];
    }
  }
  *dst = from_float<T>(wsum > 0.f ? acc / wsum : 0.f);
}

// Paged attention for every step shape: FlashAttention-2 style tiling on mma.sync tensor cores
// (m16n8k16, fp32 accumulation), online softmax in the exp2 domain, causal mask offset by each
// row's cached prefix, and split-KV with a merge kernel for long contexts and small batches.
//
// The M dimension of an mma tile is not "query tokens" but packed (token, head-of-group) pairs:
// packed row p is token p / G and q head kv_head * G + p % G. A CTA therefore serves all q heads
// that share one kv head, and every K/V tile it streams from the pool is read once and used by
// the whole group (GQA). A decode row (one token) fills G of the 16 rows of one mma tile.
//
// Warps split the tile two ways: WM warps along M (each owning MW m16 blocks) and WN warps along
// the keys of a tile (each owning BN / WN of them, merged through shared memory at the end).
// Prefill wants WM > 1 (many query rows, FA2 style); decode wants WN > 1 (one m16 block, many keys).
//
// K/V tiles stream through a STAGES-deep cp.async ring. Page indices for the tile after next are
// loaded a whole iteration ahead, so the address chase never stalls a copy. An fp8 pool is copied
// raw and widened to T in shared memory before the mma (its scales are folded into the softmax
// scale and the output).
//
// The grid is (kv heads, work items, splits): heads vary fastest, so the CTAs of one row's kv
// heads run together and stream adjacent 256-byte pieces of the same token rows (the pool is
// [page, slot, kv head, D]) instead of strided ones. Decode launches use a static grid — one item per
// row (times the m tiles of a group) and a split count fixed by the caller — and read each row's
// real length from kv_lens on the device, so a CUDA graph captured once replays for any lengths.
//
// split_len > 0 fixes each split to that many keys from position 0 (a multiple of BN; the caller
// launches enough splits to cover the longest row, extra ones write lse = -inf and merge to nothing).
// Every key tile then starts at the same absolute position in every launch, so a query's output
// depends only on its own position and keys, not on its batch, its chunk or the tile it shares:
// the batch-invariant (deterministic) mode. split_len == 0 splits each row evenly.
#include "common.cuh"

using namespace sgjit;

namespace sgjit {

// Element offset of 8-element chunk `c` of row `r` in a [rows, D] tile of 2-byte values, XOR
// swizzled so the 8 rows an ldmatrix reads at one column land in 8 different bank groups.
template <int D> __device__ __forceinline__ int swz(int r, int c) { return r * D + ((c ^ (r & 7)) << 3); }

// K/V copies, optionally asking L2 to fetch the whole 128/256-byte block on the first miss (a
// compile-time choice: -DSGJIT_KV_L2_PREFETCH=128|256).
#ifndef SGJIT_KV_L2_PREFETCH
#define SGJIT_KV_L2_PREFETCH 0
#endif
__device__ __forceinline__ void cp_async16_kv(u32 dst, const void* src, int src_bytes) {
#if SGJIT_KV_L2_PREFETCH == 256
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
#elif SGJIT_KV_L2_PREFETCH == 128
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
#else
  cp_async16(dst, src, src_bytes);
#endif
}

}  // namespace sgjit

template <typename T, typename KVT, int D, int G, int PAGE, int MW, int WM, int WN, int BN, int STAGES>
__global__ void __launch_bounds__(32 * WM * WN)
    attention_kernel(const T* __restrict__ q, i64 q_stride, const KVT* __restrict__ k_cache,
                     const KVT* __restrict__ v_cache, const int* __restrict__ page_table, int pt_stride,
                     const int* __restrict__ qo_indptr, const int* __restrict__ kv_lens,
                     const int* __restrict__ work, int item_base, int m_tiles, T* __restrict__ out,
                     float* __restrict__ part_o, float* __restrict__ part_lse, int num_tokens, int hkv,
                     float scale_log2, float v_scale, int split_len) {
  constexpr int NT = 32 * WM * WN;
  constexpr int BM = 16 * MW * WM;
  constexpr int BNW = BN / WN;
  constexpr bool FP8 = sizeof(KVT) == 1;
  constexpr int KV_CPR = D * (int)sizeof(KVT) / 16;  // 16-byte chunks per K/V row in the pool
  constexpr int ROWS_PER_PASS = NT / KV_CPR;
  constexpr int TPT = BN / ROWS_PER_PASS;  // tokens of a tile each thread copies
  constexpr int Q_CPR = D / 8;
  constexpr int KV_TILE = BN * D * (int)sizeof(KVT);  // bytes
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(BNW % 16 == 0, "each warp needs whole k16 blocks of keys");
  static_assert(NT % KV_CPR == 0 && BN % ROWS_PER_PASS == 0, "tile copy must divide evenly");
  static_assert(G >= 1 && (PAGE & (PAGE - 1)) == 0, "page size is a power of two");

  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  unsigned char* sKV = smem + BM * D * 2;  // STAGES x (K tile, V tile)
  T* sKc = reinterpret_cast<T*>(sKV + STAGES * 2 * KV_TILE);  // fp8 only: widened K and V
  T* sVc = sKc + BN * D;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / WN, wn = warp % WN;
  const int item = item_base + blockIdx.y;
  int row, mt;
  if (work != nullptr) {
    row = work[2 * item];
    mt = work[2 * item + 1];
  } else {
    row = item / m_tiles;
    mt = item % m_tiles;
  }
  const int h = blockIdx.x, split = blockIdx.z, num_splits = gridDim.z;
  const int hq = hkv * G;
  const int qo_start = qo_indptr[row];
  const int q_len = qo_indptr[row + 1] - qo_start;
  const int kv_len = kv_lens[row];
  const int pr0 = mt * BM;
  if (pr0 >= q_len * G) return;

  // Keys this CTA covers: its split of the row, cut at the last query position of its rows.
  const int i_first = pr0 / G;
  const int i_last = min(q_len - 1, (pr0 + BM - 1) / G);
  const int pos_first = kv_len - q_len + i_first;
  const int pos_last = kv_len - q_len + i_last;
  const int chunk = split_len > 0 ? split_len : ((kv_len + num_splits - 1) / num_splits + BN - 1) / BN * BN;
  const int kv_begin = split * chunk;
  const int kv_end = min(kv_len, kv_begin + chunk);
  const int kv_stop = min(kv_end, pos_last + 1);
  const int num_tiles = kv_stop > kv_begin ? (kv_stop - kv_begin + BN - 1) / BN : 0;
  const int* pages = page_table + (i64)row * pt_stride;

  // ---- K/V tile copies ----
  const int my_part = tid % KV_CPR;
  const int my_tok = tid / KV_CPR;
  int pg[TPT];
  auto fetch_pages = [&](int tile) {
#pragma unroll
    for (int j = 0; j < TPT; ++j) {
      const int pos = kv_begin + tile * BN + my_tok + j * ROWS_PER_PASS;
      pg[j] = (tile < num_tiles && pos < kv_stop) ? pages[pos / PAGE] : -1;
    }
  };
  auto issue_tile = [&](int tile, int stage) {
    unsigned char* sk = sKV + stage * 2 * KV_TILE;
    unsigned char* sv = sk + KV_TILE;
#pragma unroll
    for (int j = 0; j < TPT; ++j) {
      const int tok = my_tok + j * ROWS_PER_PASS;
      const int pos = kv_begin + tile * BN + tok;
      const bool ok = pg[j] >= 0;
      const i64 off = ok ? (((i64)pg[j] * PAGE + (pos & (PAGE - 1))) * hkv + h) * D + my_part * (16 / (int)sizeof(KVT)) : 0;
      int dst;
      if constexpr (FP8) {
        dst = tok * D + my_part * 16;
      } else {
        dst = swz<D>(tok, my_part) * 2;
      }
      cp_async16_kv(smem_addr(sk + dst), k_cache + off, ok ? 16 : 0);
      cp_async16_kv(smem_addr(sv + dst), v_cache + off, ok ? 16 : 0);
    }
  };

  // The first tiles. Launched to overlap the kernel before it (pdl.py), the CTA copies the tiles
  // that hold only cached keys (below kv_len - q_len: no kernel of this step writes them; the
  // metadata above was copied before the step) before it waits, then Q and the tiles with this
  // step's own keys. All of them form the first cp.async group; the others are empty.
  const int cached_end = kv_len - q_len;
  auto cached_only = [&](int tile) { return min(kv_begin + (tile + 1) * BN, kv_stop) <= cached_end; };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < num_tiles && cached_only(s)) {
      fetch_pages(s);
      issue_tile(s, s);
    }
  }
  pdl_wait();
  // ---- Q tile -> shared (zero rows past the row's queries) ----
  for (int c = tid; c < BM * Q_CPR; c += NT) {
    const int r = c / Q_CPR, part = c % Q_CPR;
    const int pr = pr0 + r, i = pr / G;
    const bool ok = i < q_len;
    const T* src = ok ? q + (i64)(qo_start + i) * q_stride + (h * G + pr % G) * D + part * 8 : q;
    cp_async16(smem_addr(sQ + swz<D>(r, part)), src, ok ? 16 : 0);
  }

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < num_tiles && !cached_only(s)) {
      fetch_pages(s);
      issue_tile(s, s);
    }
    cp_async_commit();
  }
  fetch_pages(STAGES - 1);

  // ---- per-thread row state ----
  // Thread owns rows (lane / 4) and (lane / 4 + 8) of each of its MW m16 blocks.
  int qpos[MW][2];
#pragma unroll
  for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = (pr0 + wm * 16 * MW + mi * 16 + lane / 4 + 8 * hf) / G;
      qpos[mi][hf] = i < q_len ? kv_len - q_len + i : -1;
    }
  }
  float o[MW][D / 8][4];
  float m_run[MW][2], l_run[MW][2];
#pragma unroll
  for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
    for (int db = 0; db < D / 8; ++db) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mi][db][e] = 0.f;
    }
    m_run[mi][0] = m_run[mi][1] = -INFINITY;
    l_run[mi][0] = l_run[mi][1] = 0.f;
  }

  for (int t = 0; t < num_tiles; ++t) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    {
      const int nt = t + STAGES - 1;
      if (nt < num_tiles) issue_tile(nt, nt % STAGES);
      cp_async_commit();
      fetch_pages(nt + 1);
    }
    const unsigned char* stage_k = sKV + (t % STAGES) * 2 * KV_TILE;
    const T* tk;
    const T* tv;
    if constexpr (FP8) {
      // Widen the raw fp8 tiles into T tiles with the swizzled layout the mma loads expect.
      for (int c = tid; c < 2 * BN * (D / 16); c += NT) {
        const bool is_v = c >= BN * (D / 16);
        const int cc = is_v ? c - BN * (D / 16) : c;
        const int tok = cc / (D / 16), part = cc % (D / 16);
        const uint4 raw = *reinterpret_cast<const uint4*>(stage_k + (is_v ? KV_TILE : 0) + tok * D + part * 16);
        const u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
        uint4 lo, hi;
        lo.x = fp8x2_to<T>((unsigned short)(w[0] & 0xffff));
        lo.y = fp8x2_to<T>((unsigned short)(w[0] >> 16));
        lo.z = fp8x2_to<T>((unsigned short)(w[1] & 0xffff));
        lo.w = fp8x2_to<T>((unsigned short)(w[1] >> 16));
        hi.x = fp8x2_to<T>((unsigned short)(w[2] & 0xffff));
        hi.y = fp8x2_to<T>((unsigned short)(w[2] >> 16));
        hi.z = fp8x2_to<T>((unsigned short)(w[3] & 0xffff));
        hi.w = fp8x2_to<T>((unsigned short)(w[3] >> 16));
        T* dst = is_v ? sVc : sKc;
        *reinterpret_cast<uint4*>(dst + swz<D>(tok, 2 * part)) = lo;
        *reinterpret_cast<uint4*>(dst + swz<D>(tok, 2 * part + 1)) = hi;
      }
      __syncthreads();
      tk = sKc;
      tv = sVc;
    } else {
      tk = reinterpret_cast<const T*>(stage_k);
      tv = reinterpret_cast<const T*>(stage_k + KV_TILE);
    }

    // ---- S = Q K^T over this warp's keys ----
    float s[MW][BNW / 8][4];
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
      for (int nb = 0; nb < BNW / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mi][nb][e] = 0.f;
      }
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      u32 a[MW][4];
#pragma unroll
      for (int mi = 0; mi < MW; ++mi) {
        const int r = wm * 16 * MW + mi * 16 + lane % 16;
        ldsm_x4(smem_addr(sQ + swz<D>(r, 2 * kk + lane / 16)), a[mi][0], a[mi][1], a[mi][2], a[mi][3]);
      }
#pragma unroll
      for (int np = 0; np < BNW / 16; ++np) {
        const int mat = lane / 8;
        const int tok = wn * BNW + np * 16 + (mat / 2) * 8 + lane % 8;
        u32 b0, b1, b2, b3;
        ldsm_x4(smem_addr(tk + swz<D>(tok, 2 * kk + mat % 2)), b0, b1, b2, b3);
#pragma unroll
        for (int mi = 0; mi < MW; ++mi) {
          mma16816<T>(s[mi][2 * np], a[mi], b0, b1);
          mma16816<T>(s[mi][2 * np + 1], a[mi], b2, b3);
        }
      }
    }

    // ---- mask, online softmax ----
    const int n0 = kv_begin + t * BN + wn * BNW;
    const bool need_mask = kv_begin + (t + 1) * BN > kv_end || kv_begin + (t + 1) * BN - 1 > pos_first;
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = -INFINITY;
#pragma unroll
        for (int nb = 0; nb < BNW / 8; ++nb) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float x = s[mi][nb][2 * hf + e] * scale_log2;
            if (need_mask) {
              const int j = n0 + nb * 8 + 2 * (lane % 4) + e;
              if (j >= kv_end || j > qpos[mi][hf]) x = -INFINITY;
            }
            s[mi][nb][2 * hf + e] = x;
            mx = fmaxf(mx, x);
          }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run[mi][hf], mx);
        const float base = m_new == -INFINITY ? 0.f : m_new;
        const float corr = exp2f(m_run[mi][hf] - base);
        float rs = 0.f;
#pragma unroll
        for (int nb = 0; nb < BNW / 8; ++nb) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = exp2f(s[mi][nb][2 * hf + e] - base);
            s[mi][nb][2 * hf + e] = p;
            rs += p;
          }
        }
        l_run[mi][hf] = l_run[mi][hf] * corr + rs;
        m_run[mi][hf] = m_new;
#pragma unroll
        for (int db = 0; db < D / 8; ++db) {
          o[mi][db][2 * hf] *= corr;
          o[mi][db][2 * hf + 1] *= corr;
        }
      }
    }

    // ---- O += P V ----
#pragma unroll
    for (int kt = 0; kt < BNW / 16; ++kt) {
      u32 a[MW][4];
#pragma unroll
      for (int mi = 0; mi < MW; ++mi) {
        a[mi][0] = pack2<T>(s[mi][2 * kt][0], s[mi][2 * kt][1]);
        a[mi][1] = pack2<T>(s[mi][2 * kt][2], s[mi][2 * kt][3]);
        a[mi][2] = pack2<T>(s[mi][2 * kt + 1][0], s[mi][2 * kt + 1][1]);
        a[mi][3] = pack2<T>(s[mi][2 * kt + 1][2], s[mi][2 * kt + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        const int mat = lane / 8;
        const int tok = wn * BNW + kt * 16 + (mat % 2) * 8 + lane % 8;
        u32 b0, b1, b2, b3;
        ldsm_x4_t(smem_addr(tv + swz<D>(tok, 2 * dp + mat / 2)), b0, b1, b2, b3);
#pragma unroll
        for (int mi = 0; mi < MW; ++mi) {
          mma16816<T>(o[mi][2 * dp], a[mi], b0, b1);
          mma16816<T>(o[mi][2 * dp + 1], a[mi], b2, b3);
        }
      }
    }
  }

  pdl_launch_dependents();  // the keys are read: the next kernel may start
  // ---- finish: row sums across the quad, then write (or merge the WN key slices first) ----
#pragma unroll
  for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      l_run[mi][hf] += __shfl_xor_sync(0xffffffffu, l_run[mi][hf], 1);
      l_run[mi][hf] += __shfl_xor_sync(0xffffffffu, l_run[mi][hf], 2);
    }
  }
  const bool split_out = num_splits > 1;
  // Writes one output element of packed row r (value already normalised); lse with d == 0.
  auto emit = [&](int r, int d, float val, float lse) {
    const int pr = pr0 + r, i = pr / G;
    if (i >= q_len) return;
    const i64 head_row = (i64)(qo_start + i) * hq + h * G + pr % G;
    if (split_out) {
      const i64 prow = (i64)split * num_tokens * hq + head_row;
      part_o[prow * D + d] = val;
      if (d == 0) part_lse[prow] = lse;
    } else {
      out[head_row * D + d] = from_float<T>(val);
    }
  };

  if constexpr (WN == 1) {
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = wm * 16 * MW + mi * 16 + lane / 4 + 8 * hf;
        const float l = l_run[mi][hf];
        const float inv = l > 0.f ? v_scale / l : 0.f;
        const float lse = l > 0.f ? m_run[mi][hf] + log2f(l) : -INFINITY;
        const int pr = pr0 + r, i = pr / G;
        if (i >= q_len) continue;
        const i64 head_row = (i64)(qo_start + i) * hq + h * G + pr % G;
#pragma unroll
        for (int db = 0; db < D / 8; ++db) {
          const int d = db * 8 + 2 * (lane % 4);
          const float v0 = o[mi][db][2 * hf] * inv, v1 = o[mi][db][2 * hf + 1] * inv;
          if (split_out) {
            const i64 prow = (i64)split * num_tokens * hq + head_row;
            *reinterpret_cast<float2*>(part_o + prow * D + d) = make_float2(v0, v1);
          } else {
            *reinterpret_cast<u32*>(out + head_row * D + d) = pack2<T>(v0, v1);
          }
        }
        if (split_out && lane % 4 == 0) part_lse[(i64)split * num_tokens * hq + head_row] = lse;
      }
    }
  } else {
    // Each key slice's (m, l, unnormalised O) goes to shared memory; all threads then combine
    // them element by element and write coalesced.
    cp_async_wait<0>();
    __syncthreads();
    float* sm_o = reinterpret_cast<float*>(sKV);
    float* sm_m = sm_o + WN * BM * D;
    float* sm_l = sm_m + WN * BM;
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = wm * 16 * MW + mi * 16 + lane / 4 + 8 * hf;
#pragma unroll
        for (int db = 0; db < D / 8; ++db) {
          const int d = db * 8 + 2 * (lane % 4);
          *reinterpret_cast<float2*>(sm_o + (wn * BM + r) * D + d) =
              make_float2(o[mi][db][2 * hf], o[mi][db][2 * hf + 1]);
        }
        if (lane % 4 == 0) {
          sm_m[wn * BM + r] = m_run[mi][hf];
          sm_l[wn * BM + r] = l_run[mi][hf];
        }
      }
    }
    __syncthreads();
    for (int idx = tid; idx < BM * D; idx += NT) {
      const int r = idx / D, d = idx % D;
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < WN; ++w) mx = fmaxf(mx, sm_m[w * BM + r]);
      float lsum = 0.f, acc = 0.f;
      if (mx != -INFINITY) {
#pragma unroll
        for (int w = 0; w < WN; ++w) {
          const float f = exp2f(sm_m[w * BM + r] - mx);
          lsum += sm_l[w * BM + r] * f;
          acc += sm_o[(w * BM + r) * D + d] * f;
        }
      }
      const float val = lsum > 0.f ? acc * v_scale / lsum : 0.f;
      emit(r, d, val, lsum > 0.f ? mx + log2f(lsum) : -INFINITY);
    }
  }
}

// out[r] = sum_s 2^(lse_s - max) o_s / sum_s 2^(lse_s - max) over the splits of each (token, head) row r,
// one warp a row. The lanes read the splits' log-sum-exps 32 at a time (the max by shuffles); then each
// lane owns D / 32 dims and walks the splits in order with MERGE_UNROLL partial loads in flight (in
// CUDA-graph replays this measured the same as one thread a row walking the splits: the launch, not
// the loads, is the merge's cost; docs/performance.md). A split with no keys (lse = -inf, its
// partial never written) adds nothing. Sums run in split order, as one thread a row summed them before.
constexpr int MERGE_UNROLL = 16;
template <int N> struct FloatVec;
template <> struct FloatVec<2> { typedef float2 type; };
template <> struct FloatVec<4> { typedef float4 type; };

template <typename T, int D>
__global__ void __launch_bounds__(256)
    merge_splits_kernel(const float* __restrict__ part_o, const float* __restrict__ part_lse, T* __restrict__ out,
                        int rows, int num_splits) {
  constexpr int DPL = D / 32;  // dims a lane
  static_assert(DPL == 2 || DPL == 4, "head_dim 64 or 128");
  typedef typename FloatVec<DPL>::type Vec;
  pdl_launch_dependents();
  pdl_wait();  // the partials come from the kernel before
  const int lane = threadIdx.x % 32;
  const i64 r = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  if (r >= rows) return;
  float mx = -INFINITY;
  for (int s = lane; s < num_splits; s += 32) mx = fmaxf(mx, part_lse[(i64)s * rows + r]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float acc[DPL] = {};
  float wsum = 0.f;
  if (mx != -INFINITY) {
    for (int s0 = 0; s0 < num_splits; s0 += 32) {
      const int n = min(32, num_splits - s0);
      const float lse = lane < n ? part_lse[(i64)(s0 + lane) * rows + r] : -INFINITY;
      const float w = lse == -INFINITY ? 0.f : exp2f(lse - mx);
#pragma unroll MERGE_UNROLL
      for (int j = 0; j < n; ++j) {
        const float wj = __shfl_sync(0xffffffffu, w, j);
        const Vec v = *reinterpret_cast<const Vec*>(part_o + ((i64)(s0 + j) * rows + r) * D + lane * DPL);
        const float* f = reinterpret_cast<const float*>(&v);
        if (wj != 0.f) {
          wsum += wj;
#pragma unroll
          for (int e = 0; e < DPL; ++e) acc[e] = fmaf(wj, f[e], acc[e]);
        }
      }
    }
  }
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  T* dst = out + r * D + lane * DPL;
  if constexpr (DPL == 4) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<T>(acc[0] * inv, acc[1] * inv), pack2<T>(acc[2] * inv, acc[3] * inv));
  } else {
    *reinterpret_cast<u32*>(dst) = pack2<T>(acc[0] * inv, acc[1] * inv);
  }
}

// Decode attention for latency-bound steps: few rows x kv heads over short or medium contexts, where
// a call moves a few MB and its time is the chain of dependent memory round trips, not bandwidth.
// One launch, no shared-memory staging of K/V, and each (row, kv head)'s key splits merged by the
// last of its CTAs to finish (no second kernel).
//
// Grid (kv heads, splits, rows); a CTA of WARPS warps takes one (row b, kv head h, split). Splits are
// `split_keys` keys (the host's cut of the launch's context bound into S = gridDim.y, whole blocks of
// KPW keys), so a CTA knows its keys' positions before it knows the row's length and loads their page
// ids beside it; CTAs past the row's last split return at once, and a row longer than S splits of
// split_keys (an eager call past the bound) is re-cut evenly. A captured graph thus replays for any
// lengths up to its bound. Warp w takes blocks w, w + WARPS, ... of its split.
//
// Registers only. Lane l holds dims [l * DPL, (l + 1) * DPL) (DPL = D / 32) of every query head of
// the group (pre-scaled into the exp2 domain) and loads the same dims of each key's K and V row: one
// 2-8 byte load a key, 32 lanes covering the row's D contiguous elements. A block's KPW x GP partial
// dot products (GP: the group rounded up to a power of two) are summed over the lanes by a transpose
// reduction (each stage halves what a lane holds, 31 shuffles for 32 sums instead of 160), leaving
// each lane whole scores; the online softmax in the exp2 domain runs per query head with every lane
// holding every head's running max, and O += P V broadcasts each probability from the lane that
// holds it. A warp keeps two blocks' K/V loads in flight (even blocks in one set of registers, odd
// in the other), and their page ids two blocks ahead. An fp8 e4m3 pool is widened in registers
// (its scales folded into the query scale and the output).
//
// The warps combine through shared memory. Then the splits of a (row, kv head) merge one of two ways:
// - CL > 1 (sm_90, the launch's S = CL splits a cluster): each CTA leaves its combined max, sum and O
//   in its shared memory, the cluster syncs, and each CTA merges its share of the group's outputs by
//   reading every CTA's through distributed shared memory; a second cluster sync keeps every CTA's
//   shared memory alive until the others have read it. No global round trip, no counter; a CTA past
//   the row's last split takes part with an empty result.
// - CL == 1: a row's only split writes `out`; otherwise each split writes its normalised O and
//   log2-sum-exp to its slot, fences, and counts itself in the pair's counter; the CTA that brings it
//   to the split count merges the slots into `out` and resets the counter to zero for the next launch
//   (the counters are zero between launches, so graph replays and every layer share them).
#include "common.cuh"

using namespace sgjit;

namespace sgjit {

// Two packed 16-bit values as floats.
__device__ __forceinline__ void widen2(u32 w, float* f, const __nv_bfloat16*) {
  f[0] = __uint_as_float(w << 16);
  f[1] = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void widen2(u32 w, float* f, const __half*) {
  const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&w));
  f[0] = x.x;
  f[1] = x.y;
}

// A lane's DPL elements of type X as floats (every X here is exact in float).
template <typename X, int DPL> __device__ __forceinline__ void widen(lane_bits_t<X, DPL> bits, float* f) {
  constexpr int WORDS = (DPL * (int)sizeof(X) + 3) / 4;
  u32 w[WORDS];
  if constexpr (sizeof(bits) == 2) {
    w[0] = bits;
  } else {
    *reinterpret_cast<lane_bits_t<X, DPL>*>(w) = bits;
  }
  if constexpr (sizeof(X) == 1) {
#pragma unroll
    for (int i = 0; i < DPL / 2; ++i) {
      __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((unsigned short)(w[i / 2] >> (16 * (i % 2))), __NV_E4M3);
      const float2 x = __half22float2(*reinterpret_cast<__half2*>(&hr));
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < DPL / 2; ++i) widen2(w[i], f + 2 * i, static_cast<const X*>(nullptr));
  }
}

// Sums each of N per-lane values over the warp. Stage o (16, 8, ..., 1) halves what a lane holds: the
// lanes with bit o set keep the upper half and send the lower, their partners the reverse. After it,
// N >= 32: lane l holds the sums of values [l * N / 32, (l + 1) * N / 32) in v[0 .. N / 32); N < 32:
// lane l holds the sum of value l >> (5 - log2 N) in v[0].
template <int N, int O> __device__ __forceinline__ void transpose_sum(float* v, int lane) {
  if constexpr (O > 0) {
    if constexpr (N > 1) {
      constexpr int H = N / 2;
      const bool up = lane & O;
#pragma unroll
      for (int k = 0; k < H; ++k) {
        const float send = up ? v[k] : v[k + H];
        const float keep = up ? v[k + H] : v[k];
        v[k] = keep + __shfl_xor_sync(0xffffffffu, send, O);
      }
      transpose_sum<H, O / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
      transpose_sum<1, O / 2>(v, lane);
    }
  }
}

// The cluster's pieces (sm_90): this CTA's rank, a cluster-wide barrier whose release/acquire order
// the shared-memory writes before it, and a float read from rank r's copy of a shared variable.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LEAN_CLUSTER_DIMS(n) __cluster_dims__(1, n, 1)
__device__ __forceinline__ u32 cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ float cluster_load(const float* local, u32 rank) {
  u32 remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"((u32)__cvta_generic_to_shared(local)), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}
#else
#define LEAN_CLUSTER_DIMS(n)
#endif

__host__ __device__ constexpr int ilog2(int n) { return n <= 1 ? 0 : 1 + ilog2(n / 2); }
__host__ __device__ constexpr int pow2_at_least(int n) { return n <= 1 ? 1 : 2 * pow2_at_least((n + 1) / 2); }

}  // namespace sgjit

template <typename T, typename KVT, int D, int G, int PAGE, int WARPS, int KPW, int CL>
__global__ void __launch_bounds__(32 * WARPS) LEAN_CLUSTER_DIMS(CL)
    lean_decode_kernel(const T* __restrict__ q, i64 q_stride, const KVT* __restrict__ k_cache,
                       const KVT* __restrict__ v_cache, const int* __restrict__ page_table, int pt_stride,
                       const int* __restrict__ kv_lens, int hkv, int split_keys, T* __restrict__ out,
                       float* __restrict__ part_o, float* __restrict__ part_lse, int* __restrict__ counters,
                       float scale_log2, float v_scale) {
  constexpr int DPL = D / 32;
  constexpr int GP = pow2_at_least(G);  // heads a block's scores are laid out for
  constexpr int N = KPW * GP;           // a block's scores
  constexpr int NL = N >= 32 ? N / 32 : 1;  // whole scores a lane holds after the reduction
  constexpr int NT = 32 * WARPS;
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(G >= 1 && G <= 16, "up to 16 query heads a kv head");
  static_assert((PAGE & (PAGE - 1)) == 0 && (KPW & (KPW - 1)) == 0 && KPW <= 32, "powers of two");
  static_assert(CL >= 1 && CL <= 8 && (CL & (CL - 1)) == 0, "a portable cluster: 1, 2, 4 or 8 splits");
  typedef lane_bits_t<KVT, DPL> Bits;

  __shared__ float s_m[WARPS][G], s_l[WARPS][G];
  __shared__ __align__(16) float s_o[WARPS][G][D];  // s_o[0]: the CTA's combined O, for the cluster
  __shared__ float s_cm[G], s_cl[G];                 // the CTA's combined max and sum, for the cluster
  __shared__ int s_last;

  const int h = blockIdx.x, split = blockIdx.y, b = blockIdx.z, S = gridDim.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hq = hkv * G;

  pdl_wait();  // q, the newest key and kv_lens come from the kernels before
  // A split's keys come from the launch (split_keys: the context bound's cut), so the first blocks'
  // page ids load beside the row's length; a row longer than the bound (an eager call) is re-cut.
  const int* pages = page_table + (i64)b * pt_stride;
  int kps = split_keys, k0 = split * kps;
  // lane i < KPW: the page id of key i of this warp's block j (any column of the row's table: the
  // keys past the row's length are masked when their K/V would load)
  auto page_at = [&](int j) {
    const int col = (k0 + (j * WARPS + warp) * KPW + lane) / PAGE;
    return lane < KPW && col < pt_stride ? pages[col] : 0;
  };
  int pga = page_at(0), pgb = page_at(1);
  const int len = kv_lens[b];
  if ((i64)kps * S < len) {
    kps = ((len + S - 1) / S + KPW - 1) / KPW * KPW;
    k0 = split * kps;
    pga = page_at(0);
    pgb = page_at(1);
  }
  const int nsplit = max(1, (len + kps - 1) / kps);
  if (CL == 1 && split >= nsplit) return;  // a cluster's CTAs all take part in its merge
  const int k1 = min(len, k0 + kps);
  const int nblk = (k1 - k0 + KPW - 1) / KPW;
  const int my_blocks = warp < nblk ? (nblk - warp + WARPS - 1) / WARPS : 0;
  auto block_start = [&](int j) { return k0 + (j * WARPS + warp) * KPW; };
  auto issue = [&](int j, int pg, Bits* kr, Bits* vr) {
    const int start = block_start(j);
#pragma unroll
    for (int i = 0; i < KPW; ++i) {
      const int pos = start + i;
      const int page = __shfl_sync(0xffffffffu, pg, i);
      const bool ok = j < my_blocks && pos < k1;
      const i64 off = ((((i64)page * PAGE + (pos & (PAGE - 1))) * hkv + h) * D) + lane * DPL;
      kr[i] = ok ? *reinterpret_cast<const Bits*>(k_cache + off) : Bits{};
      vr[i] = ok ? *reinterpret_cast<const Bits*>(v_cache + off) : Bits{};
    }
  };

  // two blocks in flight a warp: A holds even blocks, B odd ones
  Bits ka[KPW], va[KPW], kb[KPW], vb[KPW];
  issue(0, pga, ka, va);
  issue(1, pgb, kb, vb);
  pga = page_at(2);
  pgb = page_at(3);
  pdl_launch_dependents();

  // the group's query heads, this lane's dims, in the exp2 domain
  float qf[G][DPL];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const T* src = q + (i64)b * q_stride + (i64)(h * G + g) * D + lane * DPL;
    widen<T, DPL>(*reinterpret_cast<const lane_bits_t<T, DPL>*>(src), qf[g]);
#pragma unroll
    for (int d = 0; d < DPL; ++d) qf[g][d] *= scale_log2;
  }

  float m[G], lp[G], acc[G][DPL];  // running max (every lane), this lane's share of the sum, O
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    lp[g] = 0.f;
#pragma unroll
    for (int d = 0; d < DPL; ++d) acc[g][d] = 0.f;
  }

  auto compute = [&](const Bits* kr, const Bits* vr, int j) {
    const int start = block_start(j);
    float s[N];  // s[i * GP + g]: key i against head g, this lane's dims
#pragma unroll
    for (int i = 0; i < KPW; ++i) {
      float kf[DPL];
      widen<KVT, DPL>(kr[i], kf);
#pragma unroll
      for (int g = 0; g < GP; ++g) {
        float a = 0.f;
        if (g < G) {
#pragma unroll
          for (int d = 0; d < DPL; ++d) a = fmaf(qf[g][d], kf[d], a);
        }
        s[i * GP + g] = a;
      }
    }
    transpose_sum<N, 16>(s, lane);
    // the scores this lane now holds: index x = i * GP + g
    float p[NL];
    float bmax[G];
#pragma unroll
    for (int g = 0; g < G; ++g) bmax[g] = -INFINITY;
#pragma unroll
    for (int k = 0; k < NL; ++k) {
      const int x = N >= 32 ? lane * NL + k : lane >> (5 - ilog2(N));
      const int i = x / GP, g = x % GP;
      const bool ok = g < G && start + i < k1;
      p[k] = ok ? s[k] : -INFINITY;
#pragma unroll
      for (int gg = 0; gg < G; ++gg) bmax[gg] = gg == g ? fmaxf(bmax[gg], p[k]) : bmax[gg];
    }
    float mnew[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      mnew[g] = fmaxf(m[g], warp_max(bmax[g]));  // finite: every block holds a key
      const float corr = exp2f(m[g] - mnew[g]);
      m[g] = mnew[g];
      lp[g] *= corr;
#pragma unroll
      for (int d = 0; d < DPL; ++d) acc[g][d] *= corr;
    }
#pragma unroll
    for (int k = 0; k < NL; ++k) {
      const int x = N >= 32 ? lane * NL + k : lane >> (5 - ilog2(N));
      const int g = x % GP;
      float mg = -INFINITY;
#pragma unroll
      for (int gg = 0; gg < G; ++gg) mg = gg == g ? mnew[gg] : mg;
      p[k] = p[k] == -INFINITY ? 0.f : exp2f(p[k] - mg);
      // a lane whose index repeats on its neighbours (N < 32) counts its score once
      const bool owner = N >= 32 || (lane & ((1 << (5 - ilog2(N))) - 1)) == 0;
#pragma unroll
      for (int gg = 0; gg < G; ++gg) lp[gg] += gg == g && owner ? p[k] : 0.f;
    }
#pragma unroll
    for (int i = 0; i < KPW; ++i) {
      float vf[DPL];
      widen<KVT, DPL>(vr[i], vf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        constexpr int SH = N >= 32 ? 0 : 5 - ilog2(N);
        const int x = i * GP + g;
        const float pig = __shfl_sync(0xffffffffu, p[N >= 32 ? x % NL : 0], N >= 32 ? x / NL : x << SH);
#pragma unroll
        for (int d = 0; d < DPL; ++d) acc[g][d] = fmaf(pig, vf[d], acc[g][d]);
      }
    }
  };
  for (int j = 0; j < my_blocks; j += 2) {
    compute(ka, va, j);
    issue(j + 2, pga, ka, va);
    pga = page_at(j + 4);
    if (j + 1 < my_blocks) {
      compute(kb, vb, j + 1);
      issue(j + 3, pgb, kb, vb);
      pgb = page_at(j + 5);
    }
  }

  // ---- the warps' partial results into shared memory, combined per (head, dim) ----
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float l = lp[g];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (lane == 0) {
      s_m[warp][g] = m[g];
      s_l[warp][g] = l;
    }
#pragma unroll
    for (int d = 0; d < DPL; ++d) s_o[warp][g][lane * DPL + d] = acc[g][d];
  }
  __syncthreads();
  // the CTA's warps combined for head g, dim d: its max and sum (out), its O at that max (returned)
  auto combine_warps = [&](int g, int d, float& mx, float& l) {
    mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, s_m[w][g]);
    l = 0.f;
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const float c = s_m[w][g] == -INFINITY ? 0.f : exp2f(s_m[w][g] - mx);
      l = fmaf(s_l[w][g], c, l);
      o = fmaf(s_o[w][g][d], c, o);
    }
    return o;
  };
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (CL > 1) {
    for (int e = tid; e < G * D; e += NT) {  // each thread reads, then overwrites, its own (g, d)
      const int g = e / D, d = e % D;
      float mx, l;
      s_o[0][g][d] = combine_warps(g, d, mx, l);
      if (d == 0) {
        s_cm[g] = mx;
        s_cl[g] = l;
      }
    }
    cluster_sync();
    // rank r merges outputs r, r + CL, ... of the group's G * D across the cluster's CTAs
    for (int e = (int)cluster_rank() + CL * tid; e < G * D; e += CL * NT) {
      const int g = e / D, d = e % D;
      float cm[CL];
      float mx = -INFINITY;
#pragma unroll
      for (int r = 0; r < CL; ++r) {
        cm[r] = cluster_load(&s_cm[g], r);
        mx = fmaxf(mx, cm[r]);
      }
      float l = 0.f, o = 0.f;
#pragma unroll
      for (int r = 0; r < CL; ++r) {
        const float c = cm[r] == -INFINITY ? 0.f : exp2f(cm[r] - mx);
        l = fmaf(cluster_load(&s_cl[g], r), c, l);
        o = fmaf(cluster_load(&s_o[0][g][d], r), c, o);
      }
      out[((i64)b * hq + h * G + g) * D + d] = from_float<T>(l > 0.f ? o * v_scale / l : 0.f);
    }
    cluster_sync();  // no CTA leaves while another reads its shared memory
    return;
  }
#else
  if constexpr (CL > 1) __trap();  // the host forms clusters on sm_90 only
#endif
  const int pair = b * hkv + h;
  const bool alone = nsplit == 1;
  for (int e = tid; e < G * D; e += NT) {
    const int g = e / D, d = e % D;
    float mx, l;
    const float o = combine_warps(g, d, mx, l);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (alone) {
      out[((i64)b * hq + h * G + g) * D + d] = from_float<T>(o * inv * v_scale);
    } else {
      const i64 slot = (i64)pair * S + split;
      part_o[(slot * G + g) * D + d] = o * inv;
      if (d == 0) part_lse[slot * G + g] = l > 0.f ? mx + log2f(l) : -INFINITY;
    }
  }
  if (alone) return;

  // ---- the last split of the pair to finish merges every split's slot ----
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const int done = atomicAdd(&counters[pair], 1);
    s_last = done == nsplit - 1;
    if (s_last) counters[pair] = 0;  // every split has counted: ready for the next launch
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  for (int e = tid; e < G * D / 4; e += NT) {
    const int g = 4 * e / D, d = 4 * e % D;
    const float* lse = part_lse + (i64)pair * S * G + g;
    const float* po = part_o + ((i64)pair * S * G + g) * D + d;
    float mx = -INFINITY;
#pragma unroll 16
    for (int sp = 0; sp < nsplit; ++sp) mx = fmaxf(mx, __ldcg(lse + sp * G));
    float l = 0.f;
    float o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 16  // sixteen splits' loads in flight
    for (int sp = 0; sp < nsplit; ++sp) {
      const float4 x = __ldcg(reinterpret_cast<const float4*>(po + (i64)sp * G * D));
      const float w = exp2f(__ldcg(lse + sp * G) - mx);  // every split holds a key: finite
      l += w;
      o[0] = fmaf(w, x.x, o[0]);
      o[1] = fmaf(w, x.y, o[1]);
      o[2] = fmaf(w, x.z, o[2]);
      o[3] = fmaf(w, x.w, o[3]);
    }
    const float inv = l > 0.f ? v_scale / l : 0.f;
    T* dst = out + ((i64)b * hq + h * G + g) * D + d;
    *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<T>(o[0] * inv, o[1] * inv), pack2<T>(o[2] * inv, o[3] * inv));
  }
}

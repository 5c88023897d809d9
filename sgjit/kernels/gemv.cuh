// The GEMV's device code (see gemv.cu for the design): the weight widening, the inputs (plain or
// RMS-normalised in a prologue), the epilogues and the body. A header so that the decode megakernel
// (megakernel.cu) runs the very same GEMVs as the fused decode kernels, rounding for rounding.
#pragma once
#include "common.cuh"

using namespace sgjit;

namespace {

// 16 weight bytes -> floats: 8 halves / bf16s, or 16 fp8 e4m3 values.
template <typename W> struct Widen;
template <> struct Widen<__nv_bfloat16> {
  static constexpr int N = 8;
  static __device__ __forceinline__ void run(const uint4& v, float* f) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 p = __bfloat1622float2(h[i]);
      f[2 * i] = p.x;
      f[2 * i + 1] = p.y;
    }
  }
};
template <> struct Widen<__half> {
  static constexpr int N = 8;
  static __device__ __forceinline__ void run(const uint4& v, float* f) {
    const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 p = __half22float2(h[i]);
      f[2 * i] = p.x;
      f[2 * i + 1] = p.y;
    }
  }
};
template <> struct Widen<__nv_fp8_e4m3> {
  static constexpr int N = 16;
  static __device__ __forceinline__ void run(const uint4& v, float* f) {
    const unsigned short* pairs = reinterpret_cast<const unsigned short*>(&v);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(pairs[i], __NV_E4M3);
      float2 p = __half22float2(*reinterpret_cast<__half2*>(&raw));
      f[2 * i] = p.x;
      f[2 * i + 1] = p.y;
    }
  }
};

__device__ __forceinline__ uint4 load_streaming(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// Two T lanes of one 32-bit register, for the packed multiply of the norm weight.
template <typename T> struct Pair;
template <> struct Pair<__half> {
  typedef __half2 type;
  static __device__ __forceinline__ __half2 of(float a, float b) { return __floats2half2_rn(a, b); }
};
template <> struct Pair<__nv_bfloat16> {
  typedef __nv_bfloat162 type;
  static __device__ __forceinline__ __nv_bfloat162 of(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

// ---- inputs: where the inner loop reads row r of x ---------------------------------------------

template <typename T> struct XGlobal {
  static constexpr bool kPrologue = false;
  const T* x;
  i64 stride;
  template <int ROWS, int THREADS> __device__ __forceinline__ void prepare(int, float*) {}
  __device__ __forceinline__ Vec8<T> load(int r, int e) const { return load8(x + r * stride + e); }
};

// rmsnorm(x) * weight as the torch reference computes it (normalise in fp32, round to T, multiply
// by the weight in T), one block-wide pass into shared memory `xs` [m][k] before the weights stream.
template <typename T> struct XRmsNorm {
  static constexpr bool kPrologue = true;
  const T* x;
  i64 stride;
  const T* weight;
  float eps;
  int k;
  T* xs;

  template <int ROWS, int THREADS> __device__ __forceinline__ void prepare(int m, float* red) {
    constexpr int WARPS = THREADS / 32;
    typedef typename Pair<T>::type T2;
    const int vecs = k / 8, tid = threadIdx.x;
    float ss[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      ss[r] = 0.f;
      if (r >= m) continue;
      for (int v = tid; v < vecs; v += THREADS) {
        float f[8];
        to_floats(load8(x + r * stride + v * 8), f);
#pragma unroll
        for (int j = 0; j < 8; ++j) ss[r] += f[j] * f[j];
      }
      ss[r] = group_sum<32>(ss[r]);
    }
    if (tid % 32 == 0) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
        if (r < m) red[(tid / 32) * ROWS + r] = ss[r];
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      if (r >= m) break;
      float total = 0.f;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) total += red[w * ROWS + r];
      const float rstd = rsqrtf(total / (float)k + eps);
      for (int v = tid; v < vecs; v += THREADS) {
        float f[8];
        to_floats(load8(x + r * stride + v * 8), f);
        const Vec8<T> wv = load8(weight + v * 8);
        const T2* w2 = reinterpret_cast<const T2*>(&wv);
        Vec8<T> out;
        T2* o2 = reinterpret_cast<T2*>(&out);
#pragma unroll
        for (int i = 0; i < 4; ++i) o2[i] = __hmul2(w2[i], Pair<T>::of(f[2 * i] * rstd, f[2 * i + 1] * rstd));
        store8(xs + r * k + v * 8, out);
      }
    }
    __syncthreads();
  }

  __device__ __forceinline__ Vec8<T> load(int r, int e) const { return load8(xs + r * k + e); }
};

// ---- epilogues: which weight rows a block's channels are, and where the outputs go --------------
// weight_row(g, local, CPB): the weight row behind local channel `local` (0 <= local < CPB) of
// channel group g, or -1 past the end. Direct epilogues store each output from the warp that owns
// it; tile epilogues see the whole group's outputs (`tile[r][local]`, fp32 before any rounding).

template <typename T> struct EpiPlain {
  static constexpr bool kTile = false;
  T* y;
  i64 y_stride;
  int n;
  __device__ __forceinline__ int groups(int cpb) const { return (n + cpb - 1) / cpb; }
  __device__ __forceinline__ int weight_row(int g, int local, int cpb) const {
    const int c = g * cpb + local;
    return c < n ? c : -1;
  }
  __device__ __forceinline__ void store(int r, int row, float v) const { y[r * y_stride + row] = from_float<T>(v); }
};

// y = residual + x @ w.T, the linear output rounded to T before the add (as linear then add).
template <typename T> struct EpiResidual {
  static constexpr bool kTile = false;
  T* y;
  i64 y_stride;
  const T* residual;
  i64 res_stride;
  int n;
  __device__ __forceinline__ int groups(int cpb) const { return (n + cpb - 1) / cpb; }
  __device__ __forceinline__ int weight_row(int g, int local, int cpb) const {
    const int c = g * cpb + local;
    return c < n ? c : -1;
  }
  __device__ __forceinline__ void store(int r, int row, float v) const {
    y[r * y_stride + row] = from_float<T>(round_to<T>(v) + to_float(residual[r * res_stride + row]));
  }
};

// y[:, j] = silu(gate_j) * up_j for the fused gate|up weight [2I, K]: the first half of a group's
// channels are gate rows j0.., the second half the up rows I + j0.. .
template <typename T> struct EpiSiluMul {
  static constexpr bool kTile = true;
  T* y;
  i64 y_stride;
  int inter;
  __device__ __forceinline__ int groups(int cpb) const { return (inter + cpb / 2 - 1) / (cpb / 2); }
  __device__ __forceinline__ int weight_row(int g, int local, int cpb) const {
    const int half = cpb / 2, j = g * half + local % half;
    return j >= inter ? -1 : (local < half ? j : inter + j);
  }
  template <int ROWS, int CPB>
  __device__ __forceinline__ void store_tile(int g, const float (*tile)[CPB], int m) const {
    constexpr int HALF = CPB / 2;
    for (int i = threadIdx.x; i < m * HALF; i += blockDim.x) {
      const int r = i / HALF, c = i % HALF, j = g * HALF + c;
      if (j >= inter) continue;
      const float gate = round_to<T>(tile[r][c]), up = round_to<T>(tile[r][HALF + c]);
      y[r * y_stride + j] = from_float<T>(round_to<T>(__fdiv_rn(gate, 1.0f + expf(-gate))) * up);
    }
  }
};

// The q|k|v projection's outputs: rotate-half RoPE on the first `rot` dims of every q and k head,
// q written to q_out [m, hq, d], k and v to the paged pool at each row's slot (fp8 pools store
// value / scale). A group's channels are rotary pairs: the first half of its channels are the first
// members (dim j of a head), the second half the partners (dim j + rot/2); past the rotary dims the
// pairs are two neighbouring dims, passed through.
template <typename T, typename KVT> struct EpiRopeStoreKV {
  static constexpr bool kTile = true;
  T* q_out;
  KVT* k_cache;
  KVT* v_cache;
  const float* cos_sin;  // [m, rot]: cos for the first half, sin for the second
  const i64* slots;      // [m]
  int hq, hkv, d, rot;
  float k_scale, v_scale;

  __device__ __forceinline__ int pairs() const { return (hq + 2 * hkv) * (d / 2); }
  __device__ __forceinline__ int groups(int cpb) const { return (pairs() + cpb / 2 - 1) / (cpb / 2); }
  // Head-relative dims of pair j's two members.
  __device__ __forceinline__ int2 dims(int j) const {
    return j < rot / 2 ? make_int2(j, j + rot / 2) : make_int2(2 * j, 2 * j + 1);  // 2j = rot + 2(j - rot/2)
  }
  __device__ __forceinline__ int weight_row(int g, int local, int cpb) const {
    const int half = cpb / 2, p = g * half + local % half;
    if (p >= pairs()) return -1;
    const int head = p / (d / 2);
    const int2 dd = dims(p % (d / 2));
    return head * d + (local < half ? dd.x : dd.y);
  }
  __device__ __forceinline__ void store_kv(KVT* dst, float v, float scale) const {
    if constexpr (sizeof(KVT) == 1) {
      const float q = __fdiv_rn(v, scale);
      *reinterpret_cast<unsigned char*>(dst) = __nv_cvt_float2_to_fp8x2(make_float2(q, q), __NV_SATFINITE, __NV_E4M3) & 0xff;
    } else {
      *dst = from_float<T>(v);
    }
  }
  template <int ROWS, int CPB>
  __device__ __forceinline__ void store_tile(int g, const float (*tile)[CPB], int m) const {
    constexpr int HALF = CPB / 2;
    for (int i = threadIdx.x; i < m * HALF; i += blockDim.x) {
      const int r = i / HALF, c = i % HALF, p = g * HALF + c;
      if (p >= pairs()) continue;
      const int head = p / (d / 2), j = p % (d / 2);
      const int2 dd = dims(j);
      float a = round_to<T>(tile[r][c]), b = round_to<T>(tile[r][HALF + c]);
      if (head < hq + hkv && j < rot / 2) {  // products rounded separately, as torch computes them
        const float cs = cos_sin[r * rot + j], sn = cos_sin[r * rot + rot / 2 + j];
        const float a2 = round_to<T>(__fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn)));
        b = round_to<T>(__fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn)));
        a = a2;
      }
      if (head < hq) {
        T* dst = q_out + ((i64)r * hq + head) * d;
        dst[dd.x] = from_float<T>(a);
        dst[dd.y] = from_float<T>(b);
        continue;
      }
      const bool is_k = head < hq + hkv;
      const int kv_head = head - hq - (is_k ? 0 : hkv);
      KVT* dst = (is_k ? k_cache : v_cache) + (slots[r] * hkv + kv_head) * d;
      const float scale = is_k ? k_scale : v_scale;
      store_kv(dst + dd.x, a, scale);
      store_kv(dst + dd.y, b, scale);
    }
  }
};

// ---- the streaming loop both bodies run ----------------------------------------------------------
// A lane's (or warp's) units start, start + step, ... < end, each fetched and then consumed. The
// first unit's loads fly while the block waits for the kernel before it (a dependent launch, pdl.py:
// weights are never written) and prepares its rows (`prepare`, the block's first group only). The
// next kernel may start once the block's last group has issued its last loads, so its first loads
// are in flight while these land (H100, 8B b=1: 176.8 -> 182.1 tok/s against a trigger after the
// last consume, which left DRAM idle across every kernel boundary; at the block's start, its waiting
// blocks slowed the GEMVs down: docs/performance.md).
template <class Fetch, class Consume, class Prepare>
__device__ __forceinline__ void stream_units(int start, int end, int step, bool first, bool last, Fetch fetch,
                                             Consume consume, Prepare prepare) {
  fetch(start);
  if (first) {
    pdl_wait();
    prepare();
  }
  if (last && start + step >= end) pdl_launch_dependents();
  if (start < end) consume(start);
  for (int u = start + step; u < end; u += step) {
    fetch(u);
    if (last && u + step >= end) pdl_launch_dependents();
    consume(u);
  }
  if (last) pdl_launch_dependents();  // lanes or warps with no unit
}

// ---- the body -----------------------------------------------------------------------------------

// One group of WARPS * NPW output channels: stream their weight rows against the m input rows,
// reduce, finish through the epilogue. `first`: the block's first group (it prepares the input);
// `last`: its last (it lets the next kernel start).
template <typename T, typename W, int ROWS, int NPW, int UNROLL, int WARPS, class X, class Epi, typename Tile>
__device__ __forceinline__ void gemv_group(int g, bool first, bool last, X& xin, const W* __restrict__ w,
                                           const float* __restrict__ scale, const T* __restrict__ bias, int m, int k,
                                           const Epi& epi, float* red, Tile tile) {
  constexpr int EPV = Widen<W>::N;  // weight elements per 16-byte load
  constexpr int CPB = WARPS * NPW;  // channels per group
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int vecs = k / EPV;
  int wrow[NPW];
  const uint4* rows[NPW];
#pragma unroll
  for (int c = 0; c < NPW; ++c) {
    wrow[c] = epi.weight_row(g, warp * NPW + c, CPB);
    // a channel past the end re-reads row 0 and writes nothing
    rows[c] = reinterpret_cast<const uint4*>(w + (i64)max(wrow[c], 0) * k);
  }

  uint4 wv[UNROLL][NPW];
  auto fetch = [&](int base) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int idx = base + u * 32;
#pragma unroll
      for (int c = 0; c < NPW; ++c) wv[u][c] = idx < vecs ? load_streaming(rows[c] + idx) : make_uint4(0, 0, 0, 0);
    }
  };
  float acc[ROWS][NPW];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int c = 0; c < NPW; ++c) acc[r][c] = 0.f;
  auto consume = [&](int base) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int idx = base + u * 32;
      if (idx >= vecs) break;
      float wf[NPW][EPV];
#pragma unroll
      for (int c = 0; c < NPW; ++c) Widen<W>::run(wv[u][c], wf[c]);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        if (r >= m) break;
#pragma unroll
        for (int j = 0; j < EPV / 8; ++j) {
          float xf[8];
          to_floats(xin.load(r, idx * EPV + j * 8), xf);
#pragma unroll
          for (int c = 0; c < NPW; ++c)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[r][c] = fmaf(xf[e], wf[c][j * 8 + e], acc[r][c]);
        }
      }
    }
  };

  stream_units(lane, vecs, 32 * UNROLL, first, last, fetch, consume, [&] {
    if constexpr (X::kPrologue) xin.template prepare<ROWS, WARPS * 32>(m, red);
  });
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int c = 0; c < NPW; ++c)
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[r][c] += __shfl_xor_sync(0xffffffffu, acc[r][c], off);

  // Every lane holds every sum; lane (r * NPW + c) % 32 finishes output (r, c).
  float s[NPW], b[NPW];
#pragma unroll
  for (int c = 0; c < NPW; ++c) {
    const int row = max(wrow[c], 0);
    s[c] = scale != nullptr ? scale[row] : 1.f;
    b[c] = bias != nullptr ? to_float(bias[row]) : 0.f;
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    if (r >= m) break;
#pragma unroll
    for (int c = 0; c < NPW; ++c) {
      if (lane != (r * NPW + c) % 32) continue;
      const float v = fmaf(acc[r][c], s[c], b[c]);
      if constexpr (Epi::kTile) {
        tile[r][warp * NPW + c] = v;
      } else if (wrow[c] >= 0) {
        epi.store(r, wrow[c], v);
      }
    }
  }
  if constexpr (Epi::kTile) {
    __syncthreads();
    epi.template store_tile<ROWS, CPB>(g, tile, m);
    __syncthreads();
  }
}

// ---- the tensor-core body (NPW == 0) ------------------------------------------------------------
// A group is MMA_CPB = 16 output channels walked by all WARPS warps together, warp w taking K's
// 64-element blocks w, w + WARPS, ...: mma.sync m16n8k16 with the 16 channels' weight rows as A and
// the input rows as the 8 columns of B (columns past m are zero), so 16-bit weights reach the tensor
// cores as loaded, with no widening, and up to 8 rows cost what one does (more rows: one n8 tile of B
// per 8, up to 32). Lane (g, t) = (lane / 4, lane % 4) loads elements [16 t, 16 t + 16) of a block from
// channels g and g + 8 and from input rows g, g + 8, ...; k16 step j of the block takes elements
// 16 t + 4 j + {0, 1} where the instruction reads k = 2 t + {0, 1} and 16 t + 4 j + {2, 3} where it
// reads 2 t + 8 + {0, 1}, for A and B alike, so the four
// steps cover the block's 64 elements once each. The order of a dot product is then the tensor
// core's and the warp order, the same for every input row: a row's result does not depend on M. The
// warps' partial sums meet in shared memory and are added in warp order.
constexpr int MMA_CPB = 16;

template <typename T, typename W, int ROWS, int UNROLL, int WARPS, class X, class Epi, typename Tile>
__device__ __forceinline__ void gemv_mma_group(int g, bool first, bool last, X& xin, const W* __restrict__ w,
                                               const float* __restrict__ scale, const T* __restrict__ bias, int m,
                                               int k, const Epi& epi, float* red, float* part,
                                               Tile tile) {
  static_assert(sizeof(W) == 2 && sizeof(T) == 2, "the tensor-core body takes 16-bit weights");
  static_assert(ROWS <= 32, "up to four n8 tiles of input rows");
  constexpr int NT = (ROWS + 7) / 8;  // n8 tiles of input rows
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int gq = lane >> 2, tq = lane & 3;
  const int wrow[2] = {epi.weight_row(g, gq, MMA_CPB), epi.weight_row(g, gq + 8, MMA_CPB)};
  const uint4* rows[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) rows[h] = reinterpret_cast<const uint4*>(w + (i64)max(wrow[h], 0) * k);
  const int vecs = k / 8, blocks = (k + 63) / 64;
  constexpr int STEP = UNROLL * WARPS;  // blocks a round of the block's warps takes

  uint4 wv[UNROLL][2][2];  // [block of the round][channel g, g + 8][piece: elements 16 t + 8 p + [0, 8)]
  auto fetch = [&](int b0) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int b = b0 + u * WARPS;
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const int v = b * 8 + 2 * tq + p;
        const bool ok = b < blocks && v < vecs;
#pragma unroll
        for (int h = 0; h < 2; ++h) wv[u][h][p] = ok ? load_streaming(rows[h] + v) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  // c[nt]: channels g (c0, c1) and g + 8 (c2, c3) against input rows 8 nt + 2 t, 8 nt + 2 t + 1
  float c[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.f;
  auto consume = [&](int b0) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int b = b0 + u * WARPS;
      if (b >= blocks) break;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (8 * nt >= m) break;
        const int r = 8 * nt + gq;
        uint4 xv[2];
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          const int v = b * 8 + 2 * tq + p;
          if (r < m && v < vecs) {
            const Vec8<T> x8 = xin.load(r, v * 8);
            xv[p] = *reinterpret_cast<const uint4*>(&x8);
          } else {
            xv[p] = make_uint4(0, 0, 0, 0);
          }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const u32* w0 = reinterpret_cast<const u32*>(&wv[u][0][j >> 1]);
          const u32* w1 = reinterpret_cast<const u32*>(&wv[u][1][j >> 1]);
          const u32* xw = reinterpret_cast<const u32*>(&xv[j >> 1]);
          const int lo = 2 * (j & 1);
          const u32 a[4] = {w0[lo], w1[lo], w0[lo + 1], w1[lo + 1]};
          mma16816<T>(c[nt], a, xw[lo], xw[lo + 1]);
        }
      }
    }
  };

  stream_units(warp, blocks, STEP, first, last, fetch, consume, [&] {
    if constexpr (X::kPrologue) xin.template prepare<ROWS, WARPS * 32>(m, red);
  });

  // part[warp][channel][input row]
  constexpr int PR = 8 * NT;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float* p0 = part + (warp * MMA_CPB + gq) * PR + 8 * nt + 2 * tq;
    float* p1 = p0 + 8 * PR;  // channel g + 8
    p0[0] = c[nt][0];
    p0[1] = c[nt][1];
    p1[0] = c[nt][2];
    p1[1] = c[nt][3];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < m * MMA_CPB; e += WARPS * 32) {
    const int r = e / MMA_CPB, local = e % MMA_CPB;
    float acc = 0.f;
#pragma unroll
    for (int x = 0; x < WARPS; ++x) acc += part[(x * MMA_CPB + local) * PR + r];
    const int wr = epi.weight_row(g, local, MMA_CPB);
    const int row = max(wr, 0);
    const float v = fmaf(acc, scale != nullptr ? scale[row] : 1.f, bias != nullptr ? to_float(bias[row]) : 0.f);
    if constexpr (Epi::kTile) {
      tile[r][local] = v;
    } else if (wr >= 0) {
      epi.store(r, wr, v);
    }
  }
  if constexpr (Epi::kTile) {
    __syncthreads();
    epi.template store_tile<ROWS, MMA_CPB>(g, tile, m);
  }
  __syncthreads();  // `part` and `tile` are free for the block's next group
}

// A block serves one channel group, or, when it prepares its input in a prologue, one group after
// another (grid-strided) so the prologue is paid once per block rather than once per group.
// NPW == 0 selects the tensor-core body (groups of MMA_CPB channels, UNROLL blocks a warp in flight).
template <typename T, typename W, int ROWS, int NPW, int UNROLL, int WARPS, class X, class Epi>
__device__ __forceinline__ void gemv_body(X& xin, const W* __restrict__ w, const float* __restrict__ scale,
                                          const T* __restrict__ bias, int m, int k, const Epi& epi) {
  constexpr bool MMA = NPW == 0;
  constexpr int CPB = MMA ? MMA_CPB : WARPS * NPW;
  __shared__ float red[WARPS * ROWS];
  __shared__ float tile[Epi::kTile ? ROWS : 1][Epi::kTile ? CPB : 1];
  __shared__ float part[MMA ? WARPS * MMA_CPB * 8 * ((ROWS + 7) / 8) : 1];  // the tensor-core body's sums
  const int groups = epi.groups(CPB);
  auto group = [&](int g, bool first, bool last) {
    if constexpr (MMA) {
      gemv_mma_group<T, W, ROWS, UNROLL, WARPS>(g, first, last, xin, w, scale, bias, m, k, epi, red, part, tile);
    } else {
      gemv_group<T, W, ROWS, NPW, UNROLL, WARPS>(g, first, last, xin, w, scale, bias, m, k, epi, red, tile);
    }
  };
  if constexpr (X::kPrologue) {
    for (int g = blockIdx.x; g < groups; g += gridDim.x) group(g, g == (int)blockIdx.x, g + (int)gridDim.x >= groups);
  } else if ((int)blockIdx.x < groups) {
    group(blockIdx.x, true, true);
  }
}

}  // namespace

// Skinny GEMM (GEMV) for decode-sized batches: y[m, n] = sum_k x[m, k] * w[n, k] * scale[n] + bias[n]
// for M <= ROWS rows. The weight, the bytes that bound a decode step, is streamed from memory exactly
// once, in 16-byte loads that bypass L1 (x, small and reused by every warp, stays there). Each warp
// owns NPW output channels and walks their rows along K; each lane keeps UNROLL x NPW loads in
// flight before it consumes them, then widens the weights to fp32 and accumulates ROWS x NPW sums in
// fp32, reduced across the warp at the end. A row's result does not depend on M or on its neighbours.
//
// W is the weight element: the model dtype (scale == nullptr: no scaling) or fp8 e4m3 with one float
// scale per output channel, widened in registers.
#include "common.cuh"

using namespace sgjit;

namespace {

constexpr int GEMV_THREADS = 128;  // 4 warps a block

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

}  // namespace

template <typename T, typename W, int ROWS, int NPW, int UNROLL>
__global__ void __launch_bounds__(GEMV_THREADS)
    gemv_kernel(const T* __restrict__ x, const W* __restrict__ w, const float* __restrict__ scale,
                const T* __restrict__ bias, T* __restrict__ y, int m, int n, int k, i64 x_stride,
                i64 y_stride) {
  constexpr int EPV = Widen<W>::N;  // weight elements per 16-byte load
  const int lane = threadIdx.x % 32;
  const int col0 = (blockIdx.x * (GEMV_THREADS / 32) + threadIdx.x / 32) * NPW;
  if (col0 >= n) return;
  const int vecs = k / EPV;
  const uint4* rows[NPW];
#pragma unroll
  for (int c = 0; c < NPW; ++c) {
    const int col = min(col0 + c, n - 1);  // a ragged last warp re-reads a valid row, writes nothing
    rows[c] = reinterpret_cast<const uint4*>(w + (i64)col * k);
  }

  float acc[ROWS][NPW];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int c = 0; c < NPW; ++c) acc[r][c] = 0.f;

  for (int base = lane; base < vecs; base += 32 * UNROLL) {
    uint4 wv[UNROLL][NPW];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int idx = base + u * 32;
#pragma unroll
      for (int c = 0; c < NPW; ++c) wv[u][c] = idx < vecs ? load_streaming(rows[c] + idx) : make_uint4(0, 0, 0, 0);
    }
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
        const T* xr = x + r * x_stride + (i64)idx * EPV;
#pragma unroll
        for (int j = 0; j < EPV / 8; ++j) {
          float xf[8];
          to_floats(load8(xr + j * 8), xf);
#pragma unroll
          for (int c = 0; c < NPW; ++c)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[r][c] = fmaf(xf[e], wf[c][j * 8 + e], acc[r][c]);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int c = 0; c < NPW; ++c)
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[r][c] += __shfl_xor_sync(0xffffffffu, acc[r][c], off);

  if (lane != 0) return;
#pragma unroll
  for (int c = 0; c < NPW; ++c) {
    const int col = col0 + c;
    if (col >= n) break;
    const float s = scale != nullptr ? scale[col] : 1.f;
    const float b = bias != nullptr ? to_float(bias[col]) : 0.f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      if (r >= m) break;
      y[r * y_stride + col] = from_float<T>(fmaf(acc[r][c], s, b));
    }
  }
}

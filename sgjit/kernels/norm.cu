// RMSNorm, optionally with the residual add fused in front (x + r -> r', rmsnorm(r') -> y), in one
// pass over the row: each row is read once and kept in registers between the sum of squares and
// the scaling. Rounding follows the torch reference: the sum is rounded to T, normalised in fp32,
// rounded to T again, then multiplied by the weight in T.
#include "common.cuh"

using namespace sgjit;

// TPR threads cooperate on one row; each holds ITEMS 8-wide vectors of it in registers.
// A block is max(TPR, 256) threads and serves BLOCK / TPR rows.
template <typename T, int TPR, int ITEMS, bool ADD>
__global__ void __launch_bounds__(TPR >= 256 ? TPR : 256)
    rmsnorm_kernel(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ weight,
                   T* __restrict__ out, T* __restrict__ sum_out, int rows, int hidden, int inner,
                   i64 stride_outer, i64 stride_inner, float eps) {
  constexpr int BLOCK = TPR >= 256 ? TPR : 256;
  constexpr int RPB = BLOCK / TPR;
  constexpr int WPR = TPR >= 32 ? TPR / 32 : 1;  // warps per row
  __shared__ float partial[BLOCK / 32];

  const int row_in_block = threadIdx.x / TPR;
  const int t = threadIdx.x % TPR;
  const int row = blockIdx.x * RPB + row_in_block;
  const bool live = row < rows;
  const int vecs = hidden / 8;
  // Rows of a strided [outer, inner, hidden] view (per-head norms on q/k views of the qkv output).
  const i64 in_off = live ? (i64)(row / inner) * stride_outer + (i64)(row % inner) * stride_inner : 0;
  const i64 out_off = (i64)row * hidden;

  float v[ITEMS][8];
  float ss = 0.f;
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const int idx = t + it * TPR;
    if (live && idx < vecs) {
      if constexpr (ADD) {
        Vec8<T> a = load8(x + out_off + idx * 8), b = load8(residual + out_off + idx * 8);
        float fa[8], fb[8];
        to_floats(a, fa);
        to_floats(b, fb);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[it][j] = round_to<T>(fa[j] + fb[j]);
        store8(sum_out + out_off + idx * 8, from_floats<T>(v[it]));
      } else {
        to_floats(load8(x + in_off + idx * 8), v[it]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[it][j] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += v[it][j] * v[it][j];
  }

  ss = group_sum<TPR >= 32 ? 32 : TPR>(ss);
  if constexpr (WPR > 1) {
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) partial[warp] = ss;
    __syncthreads();
    ss = 0.f;
#pragma unroll
    for (int w = 0; w < WPR; ++w) ss += partial[row_in_block * WPR + w];
  }
  const float rstd = rsqrtf(ss / (float)hidden + eps);

#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const int idx = t + it * TPR;
    if (live && idx < vecs) {
      float w[8], y[8];
      to_floats(load8(weight + idx * 8), w);
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = w[j] * round_to<T>(v[it][j] * rstd);
      store8(out + out_off + idx * 8, from_floats<T>(y));
    }
  }
}

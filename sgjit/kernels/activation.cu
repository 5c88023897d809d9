// SiLU-and-mul of the fused gate|up projection: out = silu(x[:, :I]) * x[:, I:]. Pure streaming:
// 16-byte loads of gate and up, one 16-byte store, grid-stride so any row count fills the chip.
// Rounding follows torch: silu is rounded to T before the product.
#include "common.cuh"

using namespace sgjit;

template <typename T>
__global__ void __launch_bounds__(256)
    silu_mul_kernel(const T* __restrict__ x, T* __restrict__ out, i64 rows, int inter) {
  const int vecs_per_row = inter / 8;
  const i64 total = rows * vecs_per_row;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    const i64 row = i / vecs_per_row;
    const int col = (int)(i - row * vecs_per_row) * 8;
    const T* src = x + row * 2 * inter + col;
    float g[8], u[8], y[8];
    to_floats(load8(src), g);
    to_floats(load8(src + inter), u);
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] = round_to<T>(__fdiv_rn(g[j], 1.0f + expf(-g[j]))) * u[j];
    store8(out + row * inter + col, from_floats<T>(y));
  }
}

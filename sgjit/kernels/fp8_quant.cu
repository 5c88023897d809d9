// Dynamic per-token e4m3 of activations: one float32 scale a row (amax times the float32 reciprocal
// of 448, at least 1e-12) and the row divided by it, saturated and rounded to nearest even, in one
// launch. The bits equal those of the torch version (fp8.quantize_rows): the amax is exact in any
// order, the scale is one float32 product as there, the division is IEEE (__fdiv_rn, as torch's
// tensor division), and the clamp to +-448 before torch's cast is what .satfinite does.
//
// One block a row: the first pass reduces the row's absolute maximum, the second reads the row again
// (from L1/L2, the block has just read it) and writes e4m3. 8-wide vectors only: the glue sends rows
// whose width is not a multiple of 8, or that are not 16-byte aligned, to the torch version.
#include "common.cuh"

using namespace sgjit;

constexpr float INV_FP8_MAX = 1.f / 448.f;  // 448: the largest finite e4m3fn value
constexpr float MIN_SCALE = 1e-12f;  // a zero row keeps a finite scale (fp8.py's _TINY)

template <int BLOCK> __device__ __forceinline__ float block_max(float x) {
  __shared__ float partial[BLOCK / 32];
  x = warp_max(x);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = x;
  __syncthreads();
  x = partial[0];
#pragma unroll
  for (int w = 1; w < BLOCK / 32; ++w) x = fmaxf(x, partial[w]);
  return x;
}

// x [rows, k] with row stride `stride` (elements) -> out [rows, k] e4m3 (contiguous), scale [rows].
template <typename T, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
    quantize_rows_kernel(const T* __restrict__ x, fp8* __restrict__ out, float* __restrict__ scale,
                         int k, i64 stride) {
  const i64 row = blockIdx.x;
  const T* src = x + row * stride;
  const int vecs = k / 8;
  float amax = 0.f;
  for (int i = threadIdx.x; i < vecs; i += BLOCK) {
    float f[8];
    to_floats(load8(src + i * 8), f);
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(f[j]));
  }
  const float s = fmaxf(__fmul_rn(block_max<BLOCK>(amax), INV_FP8_MAX), MIN_SCALE);
  uint2* dst = reinterpret_cast<uint2*>(out + row * k);
  for (int i = threadIdx.x; i < vecs; i += BLOCK) {
    float f[8];
    to_floats(load8(src + i * 8), f);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = __fdiv_rn(f[j], s);
    dst[i] = floats_to_fp8x8(f);
  }
  if (threadIdx.x == 0) scale[row] = s;
}

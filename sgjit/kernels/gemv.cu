// Skinny GEMM (GEMV) for decode-sized batches: y[m, n] = sum_k x[m, k] * w[n, k] * scale[n] + bias[n]
// for M <= ROWS rows, and the same product fused with what surrounds it in a decoder layer. The
// weight, the bytes that bound a decode step, is streamed from memory exactly once, in 16-byte loads
// that bypass L1 (x, small and reused by every warp, stays on chip). Each warp owns NPW output
// channels and walks their weight rows along K; each lane keeps UNROLL x NPW loads in flight before
// it consumes them, then widens the weights to fp32 and accumulates ROWS x NPW sums in fp32, reduced
// across the warp at the end. A row's result does not depend on M or on its neighbours.
//
// W is the weight element: the model dtype (scale == nullptr: no scaling) or fp8 e4m3 with one float
// scale per output channel, widened in registers.
//
// NPW == 0 instantiates a second body for 16-bit weights (gemv.cuh, `gemv_mma_group`): the weights
// feed mma.sync m16n8k16 as A, 16 channels a block, the input rows as B's columns, so up to 8 rows
// cost what one does (32 at most). It is not in the default tile table (gemv.py's TILES: measured no
// faster than cuBLAS where the FMA body slows; gemv.py's MMA_TILES says by how much);
// `bench.kernels --only gemv_tiles` sweeps it.
//
// One body (`gemv_body`), two compile-time policies:
//  - the input X: read straight from global memory, or RMS-normalised by the block itself first
//    (each block reduces its <= ROWS rows, x is small) into shared memory, rounded as the torch
//    reference rounds, so the separate norm kernel goes away;
//  - the epilogue: which weight rows a block's channels are (so one block can own channel j of gate
//    and of up, or both halves of a head's rotary pair: rows are whole K-long lines, so picking them
//    costs nothing, no weight layout change), and what happens to the finished linear outputs:
//    plain store, residual add, SiLU-and-mul, or RoPE and the paged KV write.
// Each fused kernel rounds every intermediate the unfused ops materialise (linear output, residual
// sum, silu, rotated values) to T, so it computes what the sequence of unfused ops computes.
#include "gemv.cuh"

extern __shared__ uint4 gemv_smem[];

// ---- the kernels: the body with one input and one epilogue each --------------------------------

template <typename T, typename W, int ROWS, int NPW, int UNROLL, int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
    gemv_kernel(const T* __restrict__ x, const W* __restrict__ w, const float* __restrict__ scale,
                const T* __restrict__ bias, T* __restrict__ y, int m, int n, int k, i64 x_stride,
                i64 y_stride) {
  XGlobal<T> in{x, x_stride};
  gemv_body<T, W, ROWS, NPW, UNROLL, WARPS>(in, w, scale, bias, m, k, EpiPlain<T>{y, y_stride, n});
}

template <typename T, typename W, int ROWS, int NPW, int UNROLL, int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
    gemv_residual_kernel(const T* __restrict__ x, const W* __restrict__ w, const float* __restrict__ scale,
                         const T* __restrict__ residual, T* __restrict__ y, int m, int n, int k, i64 x_stride,
                         i64 res_stride, i64 y_stride) {
  XGlobal<T> in{x, x_stride};
  gemv_body<T, W, ROWS, NPW, UNROLL, WARPS>(in, w, scale, (const T*)nullptr, m, k,
                                            EpiResidual<T>{y, y_stride, residual, res_stride, n});
}

template <typename T, typename W, int ROWS, int NPW, int UNROLL, int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
    rmsnorm_gemv_kernel(const T* __restrict__ x, const T* __restrict__ norm_weight, float eps,
                        const W* __restrict__ w, const float* __restrict__ scale, const T* __restrict__ bias,
                        T* __restrict__ y, int m, int n, int k, i64 x_stride, i64 y_stride) {
  XRmsNorm<T> in{x, x_stride, norm_weight, eps, k, reinterpret_cast<T*>(gemv_smem)};
  gemv_body<T, W, ROWS, NPW, UNROLL, WARPS>(in, w, scale, bias, m, k, EpiPlain<T>{y, y_stride, n});
}

template <typename T, typename W, int ROWS, int NPW, int UNROLL, int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
    rmsnorm_gemv_silu_kernel(const T* __restrict__ x, const T* __restrict__ norm_weight, float eps,
                             const W* __restrict__ w, const float* __restrict__ scale, T* __restrict__ y, int m,
                             int inter, int k, i64 x_stride, i64 y_stride) {
  XRmsNorm<T> in{x, x_stride, norm_weight, eps, k, reinterpret_cast<T*>(gemv_smem)};
  gemv_body<T, W, ROWS, NPW, UNROLL, WARPS>(in, w, scale, (const T*)nullptr, m, k,
                                            EpiSiluMul<T>{y, y_stride, inter});
}

template <typename T, typename KVT, typename W, int ROWS, int NPW, int UNROLL, int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
    rmsnorm_gemv_rope_kernel(const T* __restrict__ x, const T* __restrict__ norm_weight, float eps,
                             const W* __restrict__ w, const float* __restrict__ scale, const T* __restrict__ bias,
                             const float* __restrict__ cos_sin, const i64* __restrict__ slots, T* __restrict__ q_out,
                             KVT* __restrict__ k_cache, KVT* __restrict__ v_cache, int m, int k, i64 x_stride, int hq,
                             int hkv, int d, int rot, float k_scale, float v_scale) {
  XRmsNorm<T> in{x, x_stride, norm_weight, eps, k, reinterpret_cast<T*>(gemv_smem)};
  EpiRopeStoreKV<T, KVT> epi{q_out, k_cache, v_cache, cos_sin, slots, hq, hkv, d, rot, k_scale, v_scale};
  gemv_body<T, W, ROWS, NPW, UNROLL, WARPS>(in, w, scale, bias, m, k, epi);
}

// Shared device helpers for every sgjit kernel family. Compiled both by NVRTC at run time (through
// CuPy, which inlines this file into each family's source) and by nvcc for `build --check`, so it
// uses nothing but the CUDA headers that both ship and marks every function __device__ explicitly.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

// NVRTC has no <math.h>; nvcc's host headers define INFINITY the same way.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

namespace sgjit {

typedef long long i64;
typedef unsigned int u32;
typedef __nv_fp8_e4m3 fp8;

// ---- programmatic dependent launch (kernels/cuda/pdl.py) ----------------------------------------
// A kernel launched to overlap the one before it calls pdl_wait() before it reads anything that
// kernel (or any before it) may still be writing, and before it writes anything at all; both are
// no-ops on a plain launch and below sm_90. pdl_launch_dependents() lets the next kernel's blocks
// start as this kernel's blocks retire.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ---- scalar conversions -------------------------------------------------------------------------
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(float x) { return x; }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Round through T and back: what torch does when an intermediate is materialised in the model dtype.
template <typename T> __device__ __forceinline__ float round_to(float x) { return to_float(from_float<T>(x)); }

// Two floats packed into one 32-bit register of T2 (the mma operand and 4-byte store format).
template <typename T> __device__ __forceinline__ u32 pack2(float lo, float hi);
template <> __device__ __forceinline__ u32 pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<u32*>(&h);
}
template <> __device__ __forceinline__ u32 pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<u32*>(&h);
}

// ---- 16-byte vectors ----------------------------------------------------------------------------
// Eight 2-byte elements: one 128-bit load or store, the access width that saturates the memory bus.
template <typename T> struct alignas(16) Vec8 {
  T v[8];
};

template <typename T> __device__ __forceinline__ Vec8<T> load8(const T* p) {
  Vec8<T> r;
  *reinterpret_cast<uint4*>(&r) = *reinterpret_cast<const uint4*>(p);
  return r;
}

template <typename T> __device__ __forceinline__ void store8(T* p, const Vec8<T>& x) {
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&x);
}

template <typename T> __device__ __forceinline__ void to_floats(const Vec8<T>& x, float* f) {
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = to_float(x.v[i]);
}

template <typename T> __device__ __forceinline__ Vec8<T> from_floats(const float* f) {
  Vec8<T> r;
#pragma unroll
  for (int i = 0; i < 8; ++i) r.v[i] = from_float<T>(f[i]);
  return r;
}

// Eight floats as fp8 e4m3 (round to nearest even, saturating), packed into 8 bytes.
__device__ __forceinline__ uint2 floats_to_fp8x8(const float* f) {
  u32 w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = __nv_cvt_float2_to_fp8x2(make_float2(f[2 * i], f[2 * i + 1]), __NV_SATFINITE, __NV_E4M3);
  }
  return make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));
}

// Two fp8 e4m3 values (low byte first) as a packed pair of T. Exact: every e4m3 value is
// representable in fp16 and in bf16.
template <typename T> __device__ __forceinline__ u32 fp8x2_to(unsigned short x);
template <> __device__ __forceinline__ u32 fp8x2_to<__half>(unsigned short x) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(x, __NV_E4M3);
  return *reinterpret_cast<u32*>(&h);
}
template <> __device__ __forceinline__ u32 fp8x2_to<__nv_bfloat16>(unsigned short x) {
  __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(x, __NV_E4M3);
  __half2 h = *reinterpret_cast<__half2*>(&hr);
  float2 f = __half22float2(h);
  return pack2<__nv_bfloat16>(f.x, f.y);
}

// ---- reductions ---------------------------------------------------------------------------------
template <int WIDTH> __device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o, WIDTH);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// ---- async copies (sm_80+) ----------------------------------------------------------------------
__device__ __forceinline__ u32 smem_addr(const void* p) {
  return static_cast<u32>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; src_bytes = 0 fills the destination with zeros.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---- tensor cores (sm_80+): ldmatrix and mma.sync m16n8k16, fp32 accumulation ---------------------
__device__ __forceinline__ void ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_t(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

template <typename T> __device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1);
// One specialisation a 16-bit type: the PTX differs only in the operand type name.
#define SGJIT_MMA16816(T, PTX_TYPE)                                                                \
  template <> __device__ __forceinline__ void mma16816<T>(float* c, const u32* a, u32 b0, u32 b1) { \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX_TYPE "." PTX_TYPE                      \
                 ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                     \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                    \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                    \
  }
SGJIT_MMA16816(__nv_bfloat16, "bf16")
SGJIT_MMA16816(__half, "f16")
#undef SGJIT_MMA16816

// The raw bits of a lane's DPL elements of type X of a row: one load of 2-8 bytes, kept as loaded and
// widened to floats where used (the decode kernels' K/V: half the registers of floats).
template <int BYTES> struct LaneBits;
template <> struct LaneBits<2> { typedef unsigned short type; };
template <> struct LaneBits<4> { typedef u32 type; };
template <> struct LaneBits<8> { typedef uint2 type; };
template <typename X, int DPL> using lane_bits_t = typename LaneBits<DPL * (int)sizeof(X)>::type;

}  // namespace sgjit

// Rotary embedding (rotate-half / NeoX layout) on q and k, fused with writing k and v into the
// paged KV pool at each token's slot. One pass: q, k and v are read once from the qkv projection,
// the rotated q is written once and k/v go straight to the pool (converted to fp8 e4m3 with the
// layer's scale when the pool is fp8). The rotation is done in fp32 with the products rounded
// separately (no FMA contraction), as torch computes it, then rounded to T.
#include "common.cuh"

using namespace sgjit;

// One "unit" is one head of one token: D/16 threads, each owning 8 elements of the first rotated
// half and the matching 8 of the second half (or two 8-wide vectors of the unrotated tail / of v).
template <typename T, typename KVT, int D, int R>
__global__ void __launch_bounds__(256)
    rope_store_kv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         i64 q_stride, i64 k_stride, i64 v_stride, const float* __restrict__ cos_sin,
                         const i64* __restrict__ slots, T* __restrict__ q_out, KVT* __restrict__ k_cache,
                         KVT* __restrict__ v_cache, int tokens, int hq, int hkv, float k_scale, float v_scale) {
  static_assert(D % 16 == 0 && R % 16 == 0 && R <= D, "head and rotary dims must be multiples of 16");
  constexpr int TPU = D / 16;
  constexpr int UPB = 256 / TPU;
  constexpr int HALF = R / 2;
  const int heads = hq + 2 * hkv;
  const i64 unit = (i64)blockIdx.x * UPB + threadIdx.x / TPU;
  if (unit >= (i64)tokens * heads) return;
  const int t = threadIdx.x % TPU;
  const int n = (int)(unit / heads);
  const int head = (int)(unit % heads);

  const T* src;
  bool rotate = true;
  if (head < hq) {
    src = q + n * q_stride + head * D;
  } else if (head < hq + hkv) {
    src = k + n * k_stride + (head - hq) * D;
  } else {
    src = v + n * v_stride + (head - hq - hkv) * D;
    rotate = false;
  }

  // The two 8-wide pieces this thread owns, as element offsets within the head.
  int off_a, off_b;
  float a[8], b[8];
  if (rotate && t < R / 16) {
    off_a = 8 * t;
    off_b = HALF + 8 * t;
    to_floats(load8(src + off_a), a);
    to_floats(load8(src + off_b), b);
    const float* cs = cos_sin + (i64)n * R;
    const float4 c0 = *reinterpret_cast<const float4*>(cs + off_a);
    const float4 c1 = *reinterpret_cast<const float4*>(cs + off_a + 4);
    const float4 s0 = *reinterpret_cast<const float4*>(cs + HALF + off_a);
    const float4 s1 = *reinterpret_cast<const float4*>(cs + HALF + off_a + 4);
    const float c[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
    const float s[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float x1 = a[j], x2 = b[j];
      a[j] = round_to<T>(__fsub_rn(__fmul_rn(x1, c[j]), __fmul_rn(x2, s[j])));
      b[j] = round_to<T>(__fadd_rn(__fmul_rn(x2, c[j]), __fmul_rn(x1, s[j])));
    }
  } else {
    if (rotate) {  // unrotated tail [R, D): two consecutive vectors
      off_a = R + 16 * (t - R / 16);
      off_b = off_a + 8;
    } else {  // v: two coalesced passes over the head
      off_a = 8 * t;
      off_b = 8 * (t + TPU);
    }
    to_floats(load8(src + off_a), a);
    to_floats(load8(src + off_b), b);
  }

  if (head < hq) {
    T* dst = q_out + ((i64)n * hq + head) * D;
    store8(dst + off_a, from_floats<T>(a));
    store8(dst + off_b, from_floats<T>(b));
    return;
  }
  const bool is_k = head < hq + hkv;
  const int kv_head = is_k ? head - hq : head - hq - hkv;
  KVT* dst = (is_k ? k_cache : v_cache) + (slots[n] * hkv + kv_head) * D;
  if constexpr (sizeof(KVT) == 1) {
    // stored = value / scale, the value already rounded to T as the reference stores it.
    const float scale = is_k ? k_scale : v_scale;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      a[j] = __fdiv_rn(a[j], scale);
      b[j] = __fdiv_rn(b[j], scale);
    }
    *reinterpret_cast<uint2*>(dst + off_a) = floats_to_fp8x8(a);
    *reinterpret_cast<uint2*>(dst + off_b) = floats_to_fp8x8(b);
  } else {
    store8(dst + off_a, from_floats<T>(a));
    store8(dst + off_b, from_floats<T>(b));
  }
}

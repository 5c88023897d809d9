// Shared by the CPU kernels: the instruction-set tier this build targets, bf16 conversion, and F16,
// sixteen float lanes with the same per-lane IEEE arithmetic on every tier (AVX-512: one register,
// AVX2: two, otherwise an array), so the AVX-512, AVX2 and portable builds agree bit for bit.
// Every reduction has a fixed order that depends only on its own row: no result depends on how
// many rows a call holds or how the work is split between threads (batch invariance).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define SGJIT_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__)
#define SGJIT_AVX2 1
#include <immintrin.h>
#endif

namespace sgjit {

inline const char* isa_name() {
#if defined(SGJIT_AVX512) && defined(__AVX512VNNI__)
  return "avx512vnni";
#elif defined(SGJIT_AVX512)
  return "avx512";
#elif defined(SGJIT_AVX2)
  return "avx2";
#else
  return "portable";
#endif
}

inline float bf16_to_float(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, NaN kept quiet: what torch's float -> bfloat16 conversion does.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Activations and KV come as float (fp32) or bfloat16; both are read into float.
template <typename T>
inline float to_float(T v);
template <>
inline float to_float<float>(float v) { return v; }
template <>
inline float to_float<uint16_t>(uint16_t v) { return bf16_to_float(v); }

template <typename T>
inline T from_float(float v);
template <>
inline float from_float<float>(float v) { return v; }
template <>
inline uint16_t from_float<uint16_t>(float v) { return float_to_bf16(v); }

// exp on float with one fixed sequence of operations (range reduction by ln 2, a degree-6
// polynomial, the exponent set by integer add); ~2 ulp; 0 below -87.
constexpr float kExpLo = -87.0f, kExpHi = 88.3f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP[7] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};

inline float exp_scalar(float x) {
  bool zero = !(x >= kExpLo);  // NaN and -inf too
  x = std::min(std::max(x, kExpLo), kExpHi);
  float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kP[0];
  for (int i = 1; i < 7; ++i) p = std::fma(p, r, kP[i]);
  uint32_t bits = uint32_t(int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return zero ? 0.0f : p * scale;
}

struct F16 {
#if defined(SGJIT_AVX512)
  __m512 v;
#elif defined(SGJIT_AVX2)
  __m256 lo, hi;
#else
  float a[16];
#endif
};

#if defined(SGJIT_AVX512)
inline F16 f16_set1(float x) { return {_mm512_set1_ps(x)}; }
inline F16 f16_load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline F16 f16_load(const uint16_t* p) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(w, 16))};
}
inline void f16_store(float* p, F16 x) { _mm512_storeu_ps(p, x.v); }
inline F16 f16_add(F16 a, F16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline F16 f16_sub(F16 a, F16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline F16 f16_mul(F16 a, F16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline F16 f16_div(F16 a, F16 b) { return {_mm512_div_ps(a.v, b.v)}; }
inline F16 f16_max(F16 a, F16 b) { return {_mm512_max_ps(a.v, b.v)}; }
inline F16 f16_fma(F16 a, F16 b, F16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline F16 f16_exp(F16 x) {
  __mmask16 zero = _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(kExpLo), _CMP_NGE_UQ);
  __m512 c = _mm512_min_ps(_mm512_max_ps(x.v, _mm512_set1_ps(kExpLo)), _mm512_set1_ps(kExpHi));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(c, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Hi), c);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kP[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP[i]));
  __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
  return {_mm512_maskz_mov_ps(static_cast<__mmask16>(~zero), y)};
}
inline void f16_to_array(F16 x, float* out) { _mm512_storeu_ps(out, x.v); }
#elif defined(SGJIT_AVX2)
inline F16 f16_set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline F16 f16_load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline __m256 bf16x8(const uint16_t* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline F16 f16_load(const uint16_t* p) { return {bf16x8(p), bf16x8(p + 8)}; }
inline void f16_store(float* p, F16 x) {
  _mm256_storeu_ps(p, x.lo);
  _mm256_storeu_ps(p + 8, x.hi);
}
#define SGJIT_F16_BINARY(name, op) \
  inline F16 name(F16 a, F16 b) { return {op(a.lo, b.lo), op(a.hi, b.hi)}; }
SGJIT_F16_BINARY(f16_add, _mm256_add_ps)
SGJIT_F16_BINARY(f16_sub, _mm256_sub_ps)
SGJIT_F16_BINARY(f16_mul, _mm256_mul_ps)
SGJIT_F16_BINARY(f16_div, _mm256_div_ps)
SGJIT_F16_BINARY(f16_max, _mm256_max_ps)
#undef SGJIT_F16_BINARY
inline F16 f16_fma(F16 a, F16 b, F16 c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline __m256 exp8(__m256 x) {
  __m256 zero = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLo), _CMP_NGE_UQ);
  __m256 c = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpLo)), _mm256_set1_ps(kExpHi));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), c);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kP[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP[i]));
  __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(zero, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}
inline F16 f16_exp(F16 x) { return {exp8(x.lo), exp8(x.hi)}; }
inline void f16_to_array(F16 x, float* out) { f16_store(out, x); }
#else
inline F16 f16_set1(float x) {
  F16 r;
  for (int i = 0; i < 16; ++i) r.a[i] = x;
  return r;
}
inline F16 f16_load(const float* p) {
  F16 r;
  std::memcpy(r.a, p, sizeof(r.a));
  return r;
}
inline F16 f16_load(const uint16_t* p) {
  F16 r;
  for (int i = 0; i < 16; ++i) r.a[i] = bf16_to_float(p[i]);
  return r;
}
inline void f16_store(float* p, F16 x) { std::memcpy(p, x.a, sizeof(x.a)); }
#define SGJIT_F16_BINARY(name, expr)               \
  inline F16 name(F16 a, F16 b) {                  \
    F16 r;                                         \
    for (int i = 0; i < 16; ++i) r.a[i] = (expr);  \
    return r;                                      \
  }
SGJIT_F16_BINARY(f16_add, a.a[i] + b.a[i])
SGJIT_F16_BINARY(f16_sub, a.a[i] - b.a[i])
SGJIT_F16_BINARY(f16_mul, a.a[i] * b.a[i])
SGJIT_F16_BINARY(f16_div, a.a[i] / b.a[i])
SGJIT_F16_BINARY(f16_max, a.a[i] > b.a[i] ? a.a[i] : b.a[i])
#undef SGJIT_F16_BINARY
inline F16 f16_fma(F16 a, F16 b, F16 c) {
  F16 r;
  for (int i = 0; i < 16; ++i) r.a[i] = std::fma(a.a[i], b.a[i], c.a[i]);
  return r;
}
inline F16 f16_exp(F16 x) {
  F16 r;
  for (int i = 0; i < 16; ++i) r.a[i] = exp_scalar(x.a[i]);
  return r;
}
inline void f16_to_array(F16 x, float* out) { f16_store(out, x); }
#endif

// Lanes 0..n-1 from p, the rest 0 (row tails).
template <typename T>
inline F16 f16_load_n(const T* p, int64_t n) {
  if (n >= 16) return f16_load(p);
  T tmp[16] = {};
  std::copy(p, p + n, tmp);
  return f16_load(tmp);
}

inline void f16_store_n(float* p, F16 x, int64_t n) {
  if (n >= 16) return f16_store(p, x);
  float tmp[16];
  f16_store(tmp, x);
  std::copy(tmp, tmp + n, p);
}

inline void f16_store_n(uint16_t* p, F16 x, int64_t n) {
  float tmp[16];
  f16_store(tmp, x);
  for (int64_t i = 0; i < std::min<int64_t>(n, 16); ++i) p[i] = float_to_bf16(tmp[i]);
}

// The sum of the 16 lanes in one fixed tree: lane i + lane i+8, then +4, +2, +1.
inline float f16_sum(F16 x) {
#if defined(SGJIT_AVX512) || defined(SGJIT_AVX2)
#if defined(SGJIT_AVX512)
  __m256 t = _mm256_add_ps(_mm512_castps512_ps256(x.v), _mm512_extractf32x8_ps(x.v, 1));
#else
  __m256 t = _mm256_add_ps(x.lo, x.hi);
#endif
  __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
#else
  float a[16];
  f16_to_array(x, a);
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] = a[i] + a[i + w];
  return a[0];
#endif
}

inline float f16_hmax(F16 x) {
  float a[16];
  f16_to_array(x, a);
  float m = a[0];
  for (int i = 1; i < 16; ++i) m = std::max(m, a[i]);
  return m;
}

}  // namespace sgjit

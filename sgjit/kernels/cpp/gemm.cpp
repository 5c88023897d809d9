// GEMMs on GGUF weights repacked into panels (sgjit/kernels/cpp/panels.py builds them):
//   y[m, n] = sum over groups g of 32 inputs:  ws[n,g] * xd[m,g] * isum  +  wm[n,g] * xs[m,g]
// where isum = sum of q[n,k] * xq[m,k] over the group, exact in int32. The weights are 4-bit
// (q in 0..15, w = ws q + wm: Q4_0, Q4_1, Q4_K) or 8-bit (q in -127..127, w = ws q: Q8_0); each
// activation row is quantized to int16 per group of 32 (xq = rint(x / xd), xd = amax / 32767,
// xs = xd * sum xq), which keeps ~15 bits where llama.cpp's int8 keeps ~7. The float part runs
// group by group in one order for every row, whatever M is and however the panels are split
// between threads, so a row's result depends on that row alone.
//
// A panel is 16 output rows; its record for group g holds the weights as int16 pairs ready for
// vpdpwssd / vpmaddwd (lane r = output row r, two inputs a lane), then the scales, fp16 where the
// format's own are (Q4_0, Q4_1, Q8_0: exact), else fp32 (Q4_K):
//   4-bit: 8 chunks of 32 bytes; chunk c byte 2r+e = q[r][4c+e] | q[r][4c+2+e] << 4;
//          then ws[16], wm[16]                                  (320 bytes with fp16, 384 with fp32)
//   8-bit: 16 chunks of 32 bytes; chunk c byte 2r+e = q[r][2c+e]; then ws[16]     (544 bytes, fp16)
#include "common.h"

#include <ATen/Parallel.h>

#include <utility>
#include <vector>

namespace sgjit {

// f(integral_constant<int, 0>) ... f(integral_constant<int, N - 1>), unrolled by the compiler
template <typename F, int... I>
inline void static_for_impl(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, typename F>
inline void static_for(F&& f) {
  static_for_impl(f, std::make_integer_sequence<int, N>{});
}

constexpr int64_t kGroup = 32, kPanel = 16, kMBlock = 64;

template <int BITS, typename S>
constexpr int64_t kQBytes = BITS == 4 ? 256 : 512;
template <int BITS, typename S>
constexpr int64_t kRecord = kQBytes<BITS, S> + (BITS == 4 ? 2 : 1) * 16 * int64_t(sizeof(S));

// IEEE half to float, exact (subnormals, inf and NaN included).
inline float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while (!(man & 0x400u));
    bits = sign | (uint32_t(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Records this many groups ahead are asked for early: the hardware prefetchers alone left ~10% of
// the single-core read rate unused on the development machine (AMD EPYC, docs/performance.md).
constexpr int64_t kPrefetch = 4;
inline void prefetch_record(const uint8_t* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off);
}

inline float scale_at(const float* p, int64_t i) { return p[i]; }
inline float scale_at(const uint16_t* p, int64_t i) { return half_to_float(p[i]); }

// One activation row quantized: xq [K], xd [G], xs [G]. The AVX-512 path computes the same
// values as the loop below it (max, one multiply, round to nearest even, exact integer sum).
template <typename T>
static void quantize_row(const T* x, int64_t K, int16_t* xq, float* xd, float* xs) {
  for (int64_t g = 0; g < K / kGroup; ++g) {
    const T* xg = x + g * kGroup;
    int16_t* qg = xq + g * kGroup;
#if defined(SGJIT_AVX512)
    __m512 v0 = f16_load(xg).v, v1 = f16_load(xg + 16).v;
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    float d = amax / 32767.0f, inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
    const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    __m512i q0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v0, _mm512_set1_ps(inv)), rnd));
    __m512i q1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v1, _mm512_set1_ps(inv)), rnd));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qg), _mm512_cvtsepi32_epi16(q0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qg + 16), _mm512_cvtsepi32_epi16(q1));
    int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
#else
    float v[kGroup];
    float amax = 0.0f;
    for (int64_t i = 0; i < kGroup; ++i) {
      v[i] = to_float(xg[i]);
      amax = std::max(amax, std::fabs(v[i]));
    }
    float d = amax / 32767.0f, inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int64_t i = 0; i < kGroup; ++i) {
      float r = std::nearbyint(v[i] * inv);
      qg[i] = int16_t(std::min(std::max(r, -32767.0f), 32767.0f));
      sum += qg[i];
    }
#endif
    xd[g] = d;
    xs[g] = d * float(sum);
  }
}

struct Activations {
  const int16_t* q;
  const float* d;
  const float* s;
  int64_t K, G;
};

// Accumulators of one tile (MT rows x NP panels), turned into output rows.
template <typename Y>
static void store_rows(const float* acc, int mt, int np, int64_t m0, int64_t n0, int64_t N, const float* bias,
                       Y* y, int64_t ldy) {
  for (int m = 0; m < mt; ++m) {
    for (int p = 0; p < np; ++p) {
      int64_t n = n0 + p * kPanel, valid = std::min<int64_t>(kPanel, N - n);
      if (valid <= 0) continue;
      const float* a = acc + (m * np + p) * kPanel;
      Y* out = y + (m0 + m) * ldy + n;
      for (int64_t r = 0; r < valid; ++r) out[r] = from_float<Y>(bias ? a[r] + bias[n + r] : a[r]);
    }
  }
}

#if defined(SGJIT_AVX512)
inline __m512i dot_pairs(__m512i acc, __m512i w, __m512i x) {
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, w, x);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(w, x));
#endif
}

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

// MT activation rows x NP panels; CH independent integer chains per (row, panel) for latency.
// Every loop is unrolled at compile time (static_for) so the accumulators stay in registers.
template <int BITS, typename S, int MT, int NP, int CH>
static void tile(const uint8_t* w, int64_t pstride, const Activations& a, int64_t m0, float* out) {
  constexpr int64_t rec = kRecord<BITS, S>, qbytes = kQBytes<BITS, S>;
  __m512 acc[MT][NP];
  static_for<MT>([&](auto m) { static_for<NP>([&](auto p) { acc[m][p] = _mm512_setzero_ps(); }); });
  const __m512i low4 = _mm512_set1_epi16(0x0f);
  for (int64_t g = 0; g < a.G; ++g) {
    __m512i s[CH][MT][NP];
    static_for<CH>([&](auto c) {
      static_for<MT>([&](auto m) { static_for<NP>([&](auto p) { s[c][m][p] = _mm512_setzero_si512(); }); });
    });
    const int32_t* xp[MT];
    static_for<MT>([&](auto m) { xp[m] = reinterpret_cast<const int32_t*>(a.q + (m0 + m) * a.K + g * kGroup); });
    static_for<NP>([&](auto p) { prefetch_record(w + p * pstride + (g + kPrefetch) * rec, rec); });
    if constexpr (BITS == 4) {
      static_for<8>([&](auto c) {
        constexpr int lo = (2 * c) % CH, hi = (2 * c + 1) % CH;
        __m512i xl[MT], xh[MT];
        static_for<MT>([&](auto m) {
          xl[m] = _mm512_set1_epi32(xp[m][2 * c]);
          xh[m] = _mm512_set1_epi32(xp[m][2 * c + 1]);
        });
        static_for<NP>([&](auto p) {
          const uint8_t* r = w + p * pstride + g * rec + c * 32;
          __m512i wv = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r)));
          __m512i wl = _mm512_and_si512(wv, low4), wh = _mm512_srli_epi16(wv, 4);
          static_for<MT>([&](auto m) {
            s[lo][m][p] = dot_pairs(s[lo][m][p], wl, xl[m]);
            s[hi][m][p] = dot_pairs(s[hi][m][p], wh, xh[m]);
          });
        });
      });
    } else {
      static_for<16>([&](auto c) {
        constexpr int k = c % CH;
        __m512i xv[MT];
        static_for<MT>([&](auto m) { xv[m] = _mm512_set1_epi32(xp[m][c]); });
        static_for<NP>([&](auto p) {
          const uint8_t* r = w + p * pstride + g * rec + c * 32;
          __m512i wv = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r)));
          static_for<MT>([&](auto m) { s[k][m][p] = dot_pairs(s[k][m][p], wv, xv[m]); });
        });
      });
    }
    static_for<NP>([&](auto p) {
      const S* sc = reinterpret_cast<const S*>(w + p * pstride + g * rec + qbytes);
      __m512 ws = load16(sc);
      static_for<MT>([&](auto m) {
        __m512i isum = s[0][m][p];
        static_for<CH - 1>([&](auto c) { isum = _mm512_add_epi32(isum, s[c + 1][m][p]); });
        __m512 t = _mm512_mul_ps(ws, _mm512_set1_ps(a.d[(m0 + m) * a.G + g]));
        acc[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), t, acc[m][p]);
        if constexpr (BITS == 4)
          acc[m][p] = _mm512_fmadd_ps(load16(sc + kPanel), _mm512_set1_ps(a.s[(m0 + m) * a.G + g]), acc[m][p]);
      });
    });
  }
  static_for<MT>([&](auto m) {
    static_for<NP>([&](auto p) { _mm512_storeu_ps(out + (m * NP + p) * kPanel, acc[m][p]); });
  });
}

#elif defined(SGJIT_AVX2)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// One panel (two halves of 8 rows) x MT rows: vpmaddwd + vpaddd, the same integer sums.
template <int BITS, typename S, int MT, int NP, int CH>
static void tile(const uint8_t* w, int64_t pstride, const Activations& a, int64_t m0, float* out) {
  static_assert(NP == 1, "the AVX2 tile holds one panel");
  constexpr int64_t rec = kRecord<BITS, S>, qbytes = kQBytes<BITS, S>;
  __m256 acc[MT][2];
  for (int m = 0; m < MT; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi16(0x0f);
  for (int64_t g = 0; g < a.G; ++g) {
    __m256i s[MT][2];
    for (int m = 0; m < MT; ++m) s[m][0] = s[m][1] = _mm256_setzero_si256();
    const int32_t* xp[MT];
    for (int m = 0; m < MT; ++m) xp[m] = reinterpret_cast<const int32_t*>(a.q + (m0 + m) * a.K + g * kGroup);
    const uint8_t* r = w + g * rec;
    prefetch_record(r + kPrefetch * rec, rec);
    for (int c = 0; c < (BITS == 4 ? 8 : 16); ++c) {
      for (int h = 0; h < 2; ++h) {
        __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + c * 32 + h * 16));
        if constexpr (BITS == 4) {
          __m256i wv = _mm256_cvtepu8_epi16(bytes);
          __m256i lo = _mm256_and_si256(wv, low4), hi = _mm256_srli_epi16(wv, 4);
          for (int m = 0; m < MT; ++m) {
            s[m][h] = _mm256_add_epi32(s[m][h], _mm256_madd_epi16(lo, _mm256_set1_epi32(xp[m][2 * c])));
            s[m][h] = _mm256_add_epi32(s[m][h], _mm256_madd_epi16(hi, _mm256_set1_epi32(xp[m][2 * c + 1])));
          }
        } else {
          __m256i wv = _mm256_cvtepi8_epi16(bytes);
          for (int m = 0; m < MT; ++m)
            s[m][h] = _mm256_add_epi32(s[m][h], _mm256_madd_epi16(wv, _mm256_set1_epi32(xp[m][c])));
        }
      }
    }
    const S* sc = reinterpret_cast<const S*>(r + qbytes);
    for (int h = 0; h < 2; ++h) {
      __m256 ws = load8(sc + 8 * h);
      for (int m = 0; m < MT; ++m) {
        __m256 t = _mm256_mul_ps(ws, _mm256_set1_ps(a.d[(m0 + m) * a.G + g]));
        acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[m][h]), t, acc[m][h]);
        if constexpr (BITS == 4)
          acc[m][h] = _mm256_fmadd_ps(load8(sc + kPanel + 8 * h), _mm256_set1_ps(a.s[(m0 + m) * a.G + g]),
                                      acc[m][h]);
      }
    }
  }
  for (int m = 0; m < MT; ++m) {
    _mm256_storeu_ps(out + m * kPanel, acc[m][0]);
    _mm256_storeu_ps(out + m * kPanel + 8, acc[m][1]);
  }
}

#else
// Portable: the record decoded weight by weight; the same integer sums and float steps.
template <int BITS, typename S, int MT, int NP, int CH>
static void tile(const uint8_t* w, int64_t pstride, const Activations& a, int64_t m0, float* out) {
  static_assert(NP == 1, "the portable tile holds one panel");
  constexpr int64_t rec = kRecord<BITS, S>, qbytes = kQBytes<BITS, S>;
  float acc[MT][kPanel] = {};
  for (int64_t g = 0; g < a.G; ++g) {
    const uint8_t* r = w + g * rec;
    const S* sc = reinterpret_cast<const S*>(r + qbytes);
    float ws[kPanel], wm[kPanel];
    for (int64_t i = 0; i < kPanel; ++i) {
      ws[i] = scale_at(sc, i);
      wm[i] = BITS == 4 ? scale_at(sc, kPanel + i) : 0.0f;
    }
    for (int m = 0; m < MT; ++m) {
      const int16_t* xq = a.q + (m0 + m) * a.K + g * kGroup;
      for (int64_t row = 0; row < kPanel; ++row) {
        int32_t isum = 0;
        for (int64_t k = 0; k < kGroup; ++k) {
          int32_t q;
          if (BITS == 4) {  // k = 4c + j: j < 2 in the low nibble of byte (c, 2 row + j), else the high one
            int64_t c = k / 4, j = k % 4;
            uint8_t byte = r[c * 32 + 2 * row + (j & 1)];
            q = j < 2 ? (byte & 15) : (byte >> 4);
          } else {
            q = int8_t(r[(k / 2) * 32 + 2 * row + (k & 1)]);
          }
          isum += q * int32_t(xq[k]);
        }
        float t = ws[row] * a.d[(m0 + m) * a.G + g];
        acc[m][row] = std::fma(float(isum), t, acc[m][row]);
        if (BITS == 4) acc[m][row] = std::fma(wm[row], a.s[(m0 + m) * a.G + g], acc[m][row]);
      }
    }
  }
  std::memcpy(out, acc, sizeof(acc));
}
#endif

#if defined(SGJIT_AVX512)
constexpr int kDecodePanels = 4, kTilePanels = 2;
#else
constexpr int kDecodePanels = 1, kTilePanels = 1;
#endif

template <int BITS, typename S, typename Y>
static void run_tiles(const uint8_t* w, int64_t pstride, const Activations& a, int64_t M, int64_t N,
                      const float* bias, Y* y, int64_t ldy, int64_t p0, int64_t p1) {
  float acc[4 * 4 * kPanel];
  if (M == 1) {  // decode: more panels at once for independent chains
    int64_t p = p0;
    for (; p + kDecodePanels <= p1; p += kDecodePanels) {
      tile<BITS, S, 1, kDecodePanels, 4>(w + p * pstride, pstride, a, 0, acc);
      store_rows(acc, 1, kDecodePanels, 0, p * kPanel, N, bias, y, ldy);
    }
    for (; p < p1; ++p) {
      tile<BITS, S, 1, 1, 4>(w + p * pstride, pstride, a, 0, acc);
      store_rows(acc, 1, 1, 0, p * kPanel, N, bias, y, ldy);
    }
    return;
  }
  for (int64_t mb = 0; mb < M; mb += kMBlock) {
    int64_t me = std::min(M, mb + kMBlock);
    for (int64_t p = p0; p < p1; p += kTilePanels) {
      int np = int(std::min<int64_t>(kTilePanels, p1 - p));
      const uint8_t* wp = w + p * pstride;
      for (int64_t m = mb; m < me;) {
        int mt = int(std::min<int64_t>(4, me - m));
        if (np == kTilePanels) {
          switch (mt) {
            case 4: tile<BITS, S, 4, kTilePanels, 1>(wp, pstride, a, m, acc); break;
            case 3: tile<BITS, S, 3, kTilePanels, 1>(wp, pstride, a, m, acc); break;
            case 2: tile<BITS, S, 2, kTilePanels, 1>(wp, pstride, a, m, acc); break;
            default: tile<BITS, S, 1, kTilePanels, 1>(wp, pstride, a, m, acc); break;
          }
        } else {
          switch (mt) {
            case 4: tile<BITS, S, 4, 1, 1>(wp, pstride, a, m, acc); break;
            case 3: tile<BITS, S, 3, 1, 1>(wp, pstride, a, m, acc); break;
            case 2: tile<BITS, S, 2, 1, 1>(wp, pstride, a, m, acc); break;
            default: tile<BITS, S, 1, 1, 1>(wp, pstride, a, m, acc); break;
          }
        }
        store_rows(acc, mt, np, m, p * kPanel, N, bias, y, ldy);
        m += mt;
      }
    }
  }
}

template <typename X, typename Y>
static void linear_panels_t(const X* x, int64_t M, int64_t K, int64_t ldx, const uint8_t* w, int bits,
                            bool half_scales, int64_t N, const float* bias, Y* y, int64_t ldy) {
  const int64_t G = K / kGroup, panels = (N + kPanel - 1) / kPanel;
  thread_local std::vector<int16_t> xq;
  thread_local std::vector<float> xd, xs;
  xq.resize(M * K);
  xd.resize(M * G);
  xs.resize(M * G);
  // the buffers belong to this thread: the workers get their addresses, not the thread_local names
  int16_t* q = xq.data();
  float *d = xd.data(), *s = xs.data();
  at::parallel_for(0, M, std::max<int64_t>(1, 4096 / K), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) quantize_row(x + m * ldx, K, q + m * K, d + m * G, s + m * G);
  });
  Activations a{q, d, s, K, G};
  // a second thread pays for waking it from ~1000 (panel, group, row) products, ~20 us of work
  int64_t grain = std::max<int64_t>(kDecodePanels, 1000 / std::max<int64_t>(1, M * G));
  at::parallel_for(0, panels, grain, [&](int64_t p0, int64_t p1) {
    if (bits == 4 && half_scales)
      run_tiles<4, uint16_t>(w, G * kRecord<4, uint16_t>, a, M, N, bias, y, ldy, p0, p1);
    else if (bits == 4)
      run_tiles<4, float>(w, G * kRecord<4, float>, a, M, N, bias, y, ldy, p0, p1);
    else if (half_scales)
      run_tiles<8, uint16_t>(w, G * kRecord<8, uint16_t>, a, M, N, bias, y, ldy, p0, p1);
    else
      run_tiles<8, float>(w, G * kRecord<8, float>, a, M, N, bias, y, ldy, p0, p1);
  });
}

// x: [M, K] rows ldx apart (float or bf16); w: panels; y: [M, N] rows ldy apart (float or bf16).
void linear_panels(int64_t x, bool x_bf16, int64_t M, int64_t K, int64_t ldx, int64_t w, int bits,
                   bool half_scales, int64_t N, int64_t bias, int64_t y, bool y_bf16, int64_t ldy) {
  auto wp = reinterpret_cast<const uint8_t*>(w);
  auto bp = reinterpret_cast<const float*>(bias);
  if (x_bf16 && y_bf16)
    linear_panels_t(reinterpret_cast<const uint16_t*>(x), M, K, ldx, wp, bits, half_scales, N, bp, reinterpret_cast<uint16_t*>(y), ldy);
  else if (x_bf16)
    linear_panels_t(reinterpret_cast<const uint16_t*>(x), M, K, ldx, wp, bits, half_scales, N, bp, reinterpret_cast<float*>(y), ldy);
  else if (y_bf16)
    linear_panels_t(reinterpret_cast<const float*>(x), M, K, ldx, wp, bits, half_scales, N, bp, reinterpret_cast<uint16_t*>(y), ldy);
  else
    linear_panels_t(reinterpret_cast<const float*>(x), M, K, ldx, wp, bits, half_scales, N, bp, reinterpret_cast<float*>(y), ldy);
}

}  // namespace sgjit

namespace sgjit {
const char* build_isa() { return isa_name(); }
}  // namespace sgjit

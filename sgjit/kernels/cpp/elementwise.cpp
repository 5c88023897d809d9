// RMSNorm, add + RMSNorm, SiLU(gate) * up, and RoPE fused with the paged KV store, for float or
// bf16 activations (T). Rows are independent; the sum of squares runs in F16's fixed lane order.
// In bf16 the roundings follow the reference ops (sgjit/kernels/reference.py): normalise in float,
// round, then scale; silu rounded before the product.
#include "common.h"

#include <ATen/Parallel.h>

namespace sgjit {

inline int64_t row_grain(int64_t width) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, width)); }

template <typename T>
static void norm_row(const T* x, const T* w, int64_t D, float eps, T* out) {
  F16 ss = f16_set1(0.0f);
  for (int64_t i = 0; i < D; i += 16) {
    F16 v = f16_load_n(x + i, D - i);
    ss = f16_fma(v, v, ss);
  }
  float r = 1.0f / std::sqrt(f16_sum(ss) / float(D) + eps);
  for (int64_t i = 0; i < D; ++i) {
    float n = to_float(x[i]) * r;
    if constexpr (sizeof(T) == 2) n = bf16_to_float(float_to_bf16(n));
    out[i] = from_float<T>(n * to_float(w[i]));
  }
}

template <typename T>
static void rmsnorm_t(const T* x, int64_t rows, int64_t D, int64_t ldx, const T* w, float eps, T* out) {
  at::parallel_for(0, rows, row_grain(D), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) norm_row(x + r * ldx, w, D, eps, out + r * D);
  });
}

// summed = x + residual (rounded to T), out = rmsnorm(summed)
template <typename T>
static void add_rmsnorm_t(const T* x, const T* res, int64_t rows, int64_t D, const T* w, float eps, T* out,
                          T* summed) {
  at::parallel_for(0, rows, row_grain(D), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      T* s = summed + r * D;
      for (int64_t i = 0; i < D; ++i) s[i] = from_float<T>(to_float(x[r * D + i]) + to_float(res[r * D + i]));
      norm_row(s, w, D, eps, out + r * D);
    }
  });
}

// x [rows, 2I] = gate | up -> out [rows, I]
template <typename T>
static void silu_mul_t(const T* x, int64_t rows, int64_t I, T* out) {
  at::parallel_for(0, rows, row_grain(I), [&](int64_t b, int64_t e) {
    float g[16], u[16], y[16];
    for (int64_t r = b; r < e; ++r) {
      const T* gate = x + r * 2 * I;
      const T* up = gate + I;
      for (int64_t i = 0; i < I; i += 16) {
        int64_t n = std::min<int64_t>(16, I - i);
        F16 gv = f16_load_n(gate + i, n);
        F16 s = f16_div(gv, f16_add(f16_set1(1.0f), f16_exp(f16_sub(f16_set1(0.0f), gv))));
        f16_to_array(s, g);
        f16_to_array(f16_load_n(up + i, n), u);
        for (int64_t j = 0; j < n; ++j) {
          float sj = sizeof(T) == 2 ? bf16_to_float(float_to_bf16(g[j])) : g[j];
          y[j] = sj * u[j];
        }
        for (int64_t j = 0; j < n; ++j) out[r * I + i + j] = from_float<T>(y[j]);
      }
    }
  });
}

// Rotate-half RoPE over the first R dims of a head (float math, as the reference).
template <typename T, typename O>
static void rope_head(const T* x, const float* cs, int64_t R, int64_t D, O* out) {
  int64_t half = R / 2;
  for (int64_t i = 0; i < half; ++i) {
    float x1 = to_float(x[i]), x2 = to_float(x[i + half]), c = cs[i], s = cs[half + i];
    float a = x1 * c, b = x2 * s, e = x2 * c, f = x1 * s;
    out[i] = from_float<O>(a - b);
    out[i + half] = from_float<O>(e + f);
  }
  for (int64_t i = R; i < D; ++i) out[i] = from_float<O>(to_float(x[i]));
}

// q/k/v: [N, H, D] with heads contiguous and tokens sq/sk/sv elements apart; cos_sin [N, R] float;
// slots [N] int64; pools [slots, Hkv, D] of T; out [N, Hq, D].
template <typename T>
static void rope_store_kv_t(const T* q, int64_t sq, const T* k, int64_t sk, const T* v, int64_t sv,
                            const float* cos_sin, int64_t R, const int64_t* slots, int64_t N, int64_t Hq,
                            int64_t Hkv, int64_t D, T* kpool, T* vpool, T* out) {
  at::parallel_for(0, N, row_grain((Hq + 2 * Hkv) * D), [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const float* cs = cos_sin + n * R;
      for (int64_t h = 0; h < Hq; ++h) rope_head(q + n * sq + h * D, cs, R, D, out + (n * Hq + h) * D);
      T* kd = kpool + slots[n] * Hkv * D;
      T* vd = vpool + slots[n] * Hkv * D;
      for (int64_t h = 0; h < Hkv; ++h) {
        rope_head(k + n * sk + h * D, cs, R, D, kd + h * D);
        std::copy(v + n * sv + h * D, v + n * sv + (h + 1) * D, vd + h * D);
      }
    }
  });
}

template <typename F>
static void by_dtype(bool bf16, F&& f) {
  if (bf16)
    f(uint16_t{});
  else
    f(float{});
}

void rmsnorm(int64_t x, bool bf16, int64_t rows, int64_t D, int64_t ldx, int64_t w, double eps, int64_t out) {
  by_dtype(bf16, [&](auto t) {
    using T = decltype(t);
    rmsnorm_t(reinterpret_cast<const T*>(x), rows, D, ldx, reinterpret_cast<const T*>(w), float(eps),
              reinterpret_cast<T*>(out));
  });
}

void add_rmsnorm(int64_t x, int64_t res, bool bf16, int64_t rows, int64_t D, int64_t w, double eps, int64_t out,
                 int64_t summed) {
  by_dtype(bf16, [&](auto t) {
    using T = decltype(t);
    add_rmsnorm_t(reinterpret_cast<const T*>(x), reinterpret_cast<const T*>(res), rows, D,
                  reinterpret_cast<const T*>(w), float(eps), reinterpret_cast<T*>(out), reinterpret_cast<T*>(summed));
  });
}

void silu_mul(int64_t x, bool bf16, int64_t rows, int64_t I, int64_t out) {
  by_dtype(bf16, [&](auto t) {
    using T = decltype(t);
    silu_mul_t(reinterpret_cast<const T*>(x), rows, I, reinterpret_cast<T*>(out));
  });
}

void rope_store_kv(int64_t q, int64_t sq, int64_t k, int64_t sk, int64_t v, int64_t sv, bool bf16, int64_t cos_sin,
                   int64_t R, int64_t slots, int64_t N, int64_t Hq, int64_t Hkv, int64_t D, int64_t kpool,
                   int64_t vpool, int64_t out) {
  by_dtype(bf16, [&](auto t) {
    using T = decltype(t);
    rope_store_kv_t(reinterpret_cast<const T*>(q), sq, reinterpret_cast<const T*>(k), sk,
                    reinterpret_cast<const T*>(v), sv, reinterpret_cast<const float*>(cos_sin), R,
                    reinterpret_cast<const int64_t*>(slots), N, Hq, Hkv, D, reinterpret_cast<T*>(kpool),
                    reinterpret_cast<T*>(vpool), reinterpret_cast<T*>(out));
  });
}

}  // namespace sgjit

// Causal attention of ragged query rows over the paged KV pool, decode and prefill alike. Work
// items are (row, kv head, 16 query lanes), a lane being one (query token, q head of the group).
// Each lane's result is computed in one order that depends on its own query and keys only:
//   s_t = scale * tree(P),  P_j = sum over c of q[16c+j] k_t[16c+j]  (an fma chain over c), for t <= its
//         position, tree = f16_sum's fixed pairing of the 16 P_j
//   p_t = exp(s_t - max s), l = sum_t p_t (t ascending)
//   out = (sum over even t of p_t v_t + sum over odd t of p_t v_t) / l
// so a query gives the same output alone, in a batch, or in a prefill chunk of any size. The scores
// come two ways with that same arithmetic: decode items (a few lanes) run each query's P as one
// vector against a key at a time; wider items keep the 16 P_j in 16 registers, each a vector over
// the lanes, so one key row serves 16 queries. Slots
// past a row's length are never read (the CPU pool is not zeroed; see kv_pool.py).
#include "common.h"

#include <ATen/Parallel.h>

#include <limits>
#include <vector>

namespace sgjit {

constexpr int64_t kMaxChunks = 16;  // head_dim <= 256, in vectors of 16
constexpr int64_t kNarrowLanes = 4;  // items this narrow (decode: one query per head) score one lane at a time

struct AttnItem {
  int32_t row, head, lane0;
};

template <typename T>
struct PagedKV {
  const T* k;
  const T* v;
  const int32_t* table;
  int64_t table_stride, page_size, hkv, D;
  const T* key(int64_t row, int64_t t, int64_t h) const { return k + offset(row, t, h); }
  const T* value(int64_t row, int64_t t, int64_t h) const { return v + offset(row, t, h); }
  int64_t offset(int64_t row, int64_t t, int64_t h) const {
    int64_t page = table[row * table_stride + t / page_size];
    return ((page * page_size + t % page_size) * hkv + h) * D;
  }
};

template <typename T>
static void attend_item(const AttnItem& it, const T* q, int64_t sq, const PagedKV<T>& kv, const int32_t* qo,
                        const int32_t* kv_lens, int64_t Hq, float scale, T* out, std::vector<float>& buf) {
  const int64_t D = kv.D, grp = Hq / kv.hkv, b = it.row;
  const int64_t q_len = qo[b + 1] - qo[b], kv_len = kv_lens[b];
  const int64_t lanes = std::min<int64_t>(16, q_len * grp - it.lane0);
  int64_t pos[16], tok[16], head[16];
  int64_t tmax = 0;
  for (int64_t j = 0; j < 16; ++j) {
    pos[j] = -1;
    if (j >= lanes) continue;
    int64_t l = it.lane0 + j, i = l / grp;
    tok[j] = qo[b] + i;
    head[j] = it.head * grp + l % grp;
    pos[j] = kv_len - q_len + i;
    tmax = std::max(tmax, pos[j]);
  }
  const int64_t keys = tmax + 1, nc = D / 16;
  buf.resize(D * 16 + keys * 16);
  float* qT = buf.data();  // [D][16 lanes] (wide items) or [lanes][D] (narrow ones)
  float* sc = qT + D * 16;  // [keys][16 lanes]: scores, then probabilities
  const float neg_inf = -std::numeric_limits<float>::infinity();
  F16 mx = f16_set1(neg_inf);
  if (lanes <= kNarrowLanes) {
    std::fill(sc, sc + keys * 16, neg_inf);
    for (int64_t j = 0; j < lanes; ++j) {
      const T* qr = q + tok[j] * sq + head[j] * D;
      F16 qv[kMaxChunks];
      for (int64_t c = 0; c < nc; ++c) qv[c] = f16_load(qr + c * 16);
      for (int64_t t = 0; t <= pos[j]; ++t) {
        const T* k = kv.key(b, t, it.head);
        F16 p = f16_mul(qv[0], f16_load(k));
        for (int64_t c = 1; c < nc; ++c) p = f16_fma(qv[c], f16_load(k + c * 16), p);
        sc[t * 16 + j] = f16_sum(p) * scale;
      }
    }
    for (int64_t t = 0; t < keys; ++t) mx = f16_max(mx, f16_load(sc + t * 16));
  } else {
    std::fill(qT, qT + D * 16, 0.0f);
    for (int64_t j = 0; j < lanes; ++j)
      for (int64_t d = 0; d < D; ++d) qT[d * 16 + j] = to_float(q[tok[j] * sq + head[j] * D + d]);
    const F16 vscale = f16_set1(scale);
    for (int64_t t = 0; t < keys; ++t) {
      const T* k = kv.key(b, t, it.head);
      F16 p[16];
      for (int64_t j = 0; j < 16; ++j) p[j] = f16_mul(f16_load(qT + j * 16), f16_set1(to_float(k[j])));
      for (int64_t c = 1; c < nc; ++c)
        for (int64_t j = 0; j < 16; ++j)
          p[j] = f16_fma(f16_load(qT + (16 * c + j) * 16), f16_set1(to_float(k[16 * c + j])), p[j]);
      for (int64_t w = 8; w >= 1; w /= 2)
        for (int64_t j = 0; j < w; ++j) p[j] = f16_add(p[j], p[j + w]);
      float s[16];
      f16_to_array(f16_mul(p[0], vscale), s);
      for (int64_t j = 0; j < 16; ++j)
        if (pos[j] < t) s[j] = neg_inf;
      F16 sv = f16_load(s);
      f16_store(sc + t * 16, sv);
      mx = f16_max(mx, sv);
    }
  }
  F16 l = f16_set1(0.0f);
  for (int64_t t = 0; t < keys; ++t) {
    F16 p = f16_exp(f16_sub(f16_load(sc + t * 16), mx));
    l = f16_add(l, p);
    f16_store(sc + t * 16, p);
  }
  float lsum[16];
  f16_to_array(l, lsum);
  for (int64_t j = 0; j < lanes; ++j) {
    F16 even[kMaxChunks], odd[kMaxChunks];
    const int64_t nv = D / 16;
    for (int64_t c = 0; c < nv; ++c) even[c] = odd[c] = f16_set1(0.0f);
    int64_t t = 0;
    for (; t + 1 <= pos[j]; t += 2) {
      const T* v0 = kv.value(b, t, it.head);
      const T* v1 = kv.value(b, t + 1, it.head);
      F16 p0 = f16_set1(sc[t * 16 + j]), p1 = f16_set1(sc[(t + 1) * 16 + j]);
      for (int64_t c = 0; c < nv; ++c) {
        even[c] = f16_fma(p0, f16_load(v0 + c * 16), even[c]);
        odd[c] = f16_fma(p1, f16_load(v1 + c * 16), odd[c]);
      }
    }
    if (t == pos[j]) {
      const T* v0 = kv.value(b, t, it.head);
      F16 p0 = f16_set1(sc[t * 16 + j]);
      for (int64_t c = 0; c < nv; ++c) even[c] = f16_fma(p0, f16_load(v0 + c * 16), even[c]);
    }
    T* o = out + (tok[j] * Hq + head[j]) * D;
    F16 denom = f16_set1(lsum[j]);
    for (int64_t c = 0; c < nv; ++c) f16_store_n(o + c * 16, f16_div(f16_add(even[c], odd[c]), denom), 16);
  }
}

template <typename T>
static void attention_t(const T* q, int64_t sq, const PagedKV<T>& kv, const int32_t* qo, const int32_t* kv_lens,
                        int64_t B, int64_t Hq, float scale, T* out) {
  const int64_t grp = Hq / kv.hkv;
  std::vector<AttnItem> items;
  int64_t work = 0;
  for (int64_t b = 0; b < B; ++b) {
    int64_t lanes = int64_t(qo[b + 1] - qo[b]) * grp;
    for (int64_t h = 0; h < kv.hkv; ++h)
      for (int64_t l0 = 0; l0 < lanes; l0 += 16) items.push_back({int32_t(b), int32_t(h), int32_t(l0)});
    work += kv.hkv * ((lanes + 15) / 16) * kv_lens[b];
  }
  const int64_t n = int64_t(items.size());
  // below ~2k keys of work one thread is quicker than waking a second
  int64_t grain = work < 2048 ? std::max<int64_t>(1, n) : 1;
  at::parallel_for(0, n, grain, [&](int64_t s, int64_t e) {
    thread_local std::vector<float> buf;
    for (int64_t i = s; i < e; ++i) attend_item(items[i], q, sq, kv, qo, kv_lens, Hq, scale, out, buf);
  });
}

void attention(int64_t q, int64_t sq, bool bf16, int64_t kpool, int64_t vpool, int64_t page_size, int64_t hkv,
               int64_t D, int64_t table, int64_t table_stride, int64_t qo, int64_t kv_lens, int64_t B, int64_t Hq,
               double scale, int64_t out) {
  auto run = [&](auto tag) {
    using T = decltype(tag);
    PagedKV<T> kv{reinterpret_cast<const T*>(kpool), reinterpret_cast<const T*>(vpool),
                  reinterpret_cast<const int32_t*>(table), table_stride, page_size, hkv, D};
    attention_t(reinterpret_cast<const T*>(q), sq, kv, reinterpret_cast<const int32_t*>(qo),
                reinterpret_cast<const int32_t*>(kv_lens), B, Hq, float(scale), reinterpret_cast<T*>(out));
  };
  if (bf16)
    run(uint16_t{});
  else
    run(float{});
}

}  // namespace sgjit

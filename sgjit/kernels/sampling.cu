// On-device sampling: grammar bitmask application, and one kernel that turns a row of logits into
// a token with greedy / temperature / top-k / top-p / min-p and per-request Philox seeds, reading
// every parameter from device memory so a step never syncs with the host.
//
// Sampling works on e_i = exp((l_i - max) / T) in (0, 1] (the softmax numerators). The three
// filters of the reference (sort; drop rank >= k; drop where the mass before a token exceeds
// top_p; drop p < min_p * p_max) each keep a prefix of the sorted order, so together they keep
// {e_i >= tau} with tau the largest of the three thresholds. Each threshold is found without a
// sort by a 4-pass radix select over the bits of e_i (non-negative floats order like their bits).
// The token is then drawn by the exponential race argmax(e_i / E_i), E_i ~ Exp(1) from Philox,
// which samples proportionally to e_i over the kept set.
#include "common.cuh"

using namespace sgjit;

// bit v of row b clear => logits[b, v] = -inf; columns past the mask are -inf too.
__global__ void __launch_bounds__(256)
    apply_bitmask_kernel(float* __restrict__ logits, const int* __restrict__ mask, int vocab, int words,
                         i64 row_stride) {
  const int b = blockIdx.y;
  float* row = logits + b * row_stride;
  const int* m = mask + (i64)b * words;
  for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < vocab; v += gridDim.x * blockDim.x) {
    const int w = v >> 5;
    const bool allowed = w < words && ((m[w] >> (v & 31)) & 1);
    if (!allowed) row[v] = -INFINITY;
  }
}

namespace {

constexpr int SAMPLE_THREADS = 512;
constexpr int NWARPS = SAMPLE_THREADS / 32;
constexpr float TOP_P_PROBE_FLOOR = 1.0f / 65536.0f;  // e_i relative to the top token

// Philox4x32-10 (Salmon et al. 2011), the counter-based generator curand and torch use.
__device__ __forceinline__ u32 philox(u32 c0, u32 c1, u32 c2, u32 c3, u32 k0, u32 k1) {
#pragma unroll
  for (int i = 0; i < 10; ++i) {
    const u32 lo0 = 0xD2511F53u * c0, hi0 = __umulhi(0xD2511F53u, c0);
    const u32 lo1 = 0xCD9E8D57u * c2, hi1 = __umulhi(0xCD9E8D57u, c2);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c0;
}

struct ArgMax {
  float v;
  int i;
};

// Larger value wins; on ties the lower index (torch.argmax returns the first maximum).
__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
  return a;
}

__device__ ArgMax block_argmax(ArgMax x, ArgMax* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ArgMax y{__shfl_xor_sync(0xffffffffu, x.v, o), __shfl_xor_sync(0xffffffffu, x.i, o)};
    x = better(x, y);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < NWARPS ? scratch[lane] : ArgMax{-INFINITY, 0x7fffffff};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ArgMax y{__shfl_xor_sync(0xffffffffu, x.v, o), __shfl_xor_sync(0xffffffffu, x.i, o)};
    x = better(x, y);
  }
  return x;  // valid in every thread
}

__device__ float block_sum(float x, float* scratch) {
  x = group_sum<32>(x);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < NWARPS ? scratch[lane] : 0.f;
  return group_sum<32>(x);
}

struct Hist {
  float val[256];  // count (as float, exact below 2^24) or mass per bucket
  u32 prefix;
  float above;
  int found;
};

// Radix select of the threshold in one row: the bit pattern of the element at which, walking the
// values from the largest down, the running total first reaches `target` (by count: >= target;
// by mass: > target). Only values >= `floor` take part (a threshold below the floor would be
// overridden by it anyway), which keeps the histograms small. Returns 0 when the candidates'
// total never gets there (the threshold is below the floor, or everything stays).
template <bool BY_MASS>
__device__ float radix_threshold(const float* row, int vocab, float m, float inv_t, float target, float floor,
                                 Hist* h) {
  u32 prefix = 0, known = 0;
  float above = 0.f;
  const int lane = threadIdx.x % 32;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += SAMPLE_THREADS) h->val[i] = 0.f;
    __syncthreads();
    for (int base = 0; base < vocab; base += SAMPLE_THREADS) {
      const int i = base + threadIdx.x;
      float e = 0.f;
      bool in = false;
      int bucket = 0;
      if (i < vocab) {
        e = expf((row[i] - m) * inv_t);
        const u32 bits = __float_as_uint(e);
        in = (bits & known) == prefix && e >= floor;
        bucket = (bits >> shift) & 255;
      }
      // Aggregate within the warp per bucket: most values share a few buckets, and one atomic
      // per distinct bucket avoids serialising the whole warp on one shared address.
      const u32 active = __ballot_sync(0xffffffffu, in);
      if (in) {
        const u32 peers = __match_any_sync(active, bucket);
        float s = BY_MASS ? e : 1.f;
        if (BY_MASS) {
          float total = 0.f;
          for (u32 p = peers; p; p &= p - 1) total += __shfl_sync(peers, s, __ffs(p) - 1);
          s = total;
        } else {
          s = (float)__popc(peers);
        }
        if (lane == __ffs(peers) - 1) atomicAdd(&h->val[bucket], s);
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane L owns buckets 255-8L .. 248-8L (largest first); scan lane totals, then the first
      // lane whose running total crosses walks its own eight buckets.
      float mine[8], lane_total = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        mine[j] = h->val[255 - 8 * lane - j];
        lane_total += mine[j];
      }
      float incl = lane_total;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      const float excl = incl - lane_total;
      const bool cross = BY_MASS ? (above + incl > target) : (above + incl >= target);
      const u32 crossing = __ballot_sync(0xffffffffu, cross);
      const u32 nonempty = __ballot_sync(0xffffffffu, lane_total > 0.f);
      // No crossing in a refining pass can only come from rounding of the float sums: then the
      // floor of the lowest non-empty bucket is the threshold (the whole candidate range stays).
      const int owner = crossing ? __ffs(crossing) - 1 : (nonempty ? 31 - __clz(nonempty) : 0);
      if (lane == owner) {
        float acc = above + excl;
        int pick = -1, last = -1;
        float last_val = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (pick < 0 && mine[j] > 0.f) {
            last = j;
            last_val = mine[j];
            const bool c = BY_MASS ? (acc + mine[j] > target) : (acc + mine[j] >= target);
            if (c) pick = j;
            else acc += mine[j];
          }
        }
        if (pick < 0 && last >= 0) {  // the lane total crossed but the walk's rounding did not
          pick = last;
          acc -= last_val;
        }
        h->found = crossing ? 1 : (shift == 24 ? 0 : 2);
        h->prefix = prefix | ((u32)(255 - 8 * lane - (pick < 0 ? 0 : pick)) << shift);
        h->above = acc;
      }
    }
    __syncthreads();
    if (h->found != 1) return h->found ? __uint_as_float(h->prefix) : 0.f;
    prefix = h->prefix;
    above = h->above;
    known |= 255u << shift;
    __syncthreads();
  }
  return __uint_as_float(prefix);
}

}  // namespace

// One block per row. `draw` is one 64-bit value from the runtime's torch generator, the Philox key
// of rows without a seed; seeded rows use (seed, step) so their noise is independent of the batch.
__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(const float* __restrict__ logits, i64 row_stride, int vocab, const float* __restrict__ temperature,
                  const float* __restrict__ top_p, const int* __restrict__ top_k, const float* __restrict__ min_p,
                  const i64* __restrict__ seeds, const i64* __restrict__ steps, const i64* __restrict__ draw,
                  i64* __restrict__ out) {
  __shared__ ArgMax amax_scratch[NWARPS];
  __shared__ float sum_scratch[NWARPS];
  __shared__ Hist hist;
  const int b = blockIdx.x;
  const float* row = logits + b * row_stride;

  ArgMax best{-INFINITY, 0x7fffffff};
  for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) best = better(best, ArgMax{row[i], i});
  best = block_argmax(best, amax_scratch);
  const float temp = temperature[b];
  if (temp <= 0.f) {  // a greedy row of a sampled batch (all-greedy batches use argmax_kernel)
    if (threadIdx.x == 0) out[b] = best.i;
    return;
  }

  const float m = best.v;
  const float inv_t = 1.0f / fmaxf(temp, 1e-6f);
  const float p = top_p[b];
  const int k = top_k[b];
  float tau = fmaxf(min_p[b], 0.f);  // e_max = 1, so p_i >= min_p * p_max <=> e_i >= min_p
  if (k > 0 && k < vocab) tau = fmaxf(tau, radix_threshold<false>(row, vocab, m, inv_t, (float)k, tau, &hist));
  if (p < 1.f) {
    float z = 0.f;
    for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) z += expf((row[i] - m) * inv_t);
    z = block_sum(z, sum_scratch);
    // A top-p cut usually lies among values far above the tail: look there first, and over the
    // whole row only when the mass above the probe floor does not reach p.
    float tp = radix_threshold<true>(row, vocab, m, inv_t, p * z, fmaxf(tau, TOP_P_PROBE_FLOOR), &hist);
    if (tp == 0.f && tau < TOP_P_PROBE_FLOOR) tp = radix_threshold<true>(row, vocab, m, inv_t, p * z, tau, &hist);
    tau = fmaxf(tau, tp);
  }
  tau = fminf(tau, 1.f);  // the top token always stays

  const i64 seed = seeds[b];
  u32 k0, k1, c1, c2, c3;
  if (seed >= 0) {
    const i64 step = steps[b];
    k0 = (u32)seed;
    k1 = (u32)((unsigned long long)seed >> 32);
    c1 = (u32)step;
    c2 = (u32)((unsigned long long)step >> 32);
    c3 = 0x53474a54u;  // stream id of seeded draws
  } else {
    const i64 d = draw[0];
    k0 = (u32)d;
    k1 = (u32)((unsigned long long)d >> 32);
    c1 = (u32)b;
    c2 = 0u;
    c3 = 0x52414e44u;  // stream id of unseeded draws
  }
  ArgMax win{-INFINITY, 0x7fffffff};
  for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) {
    const float e = expf((row[i] - m) * inv_t);
    if (e >= tau && e > 0.f) {
      const float u = ((float)(philox((u32)i, c1, c2, c3, k0, k1) >> 8) + 0.5f) * (1.0f / 16777216.0f);
      win = better(win, ArgMax{e / -logf(u), i});
    }
  }
  win = block_argmax(win, amax_scratch);
  if (threadIdx.x == 0) out[b] = win.i < vocab ? win.i : best.i;
}

// Greedy rows: argmax, with each row split over gridDim.x blocks so that a batch smaller than the
// GPU still streams the logits at full bandwidth (one block per row fills half an H200 at B=64).
// A candidate is one 64-bit key, the value's bits made to order like the float above ~index, so the
// larger value wins and on ties the lower index (torch.argmax's first maximum); a NaN wins, as in
// torch. Blocks fold their key into keys[b] with atomicMax; the last block of a row to arrive
// (counted in arrived[b]) writes the index and resets both, so the buffers are ready for the next
// launch and the kernel replays inside a CUDA graph.
constexpr int ARGMAX_THREADS = 256;

__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
  u32 u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ((unsigned long long)u << 32) | (unsigned long long)(~(u32)i);
}

__device__ __forceinline__ unsigned long long key_max(unsigned long long a, unsigned long long b) {
  return a > b ? a : b;
}

// `chunk`: columns per block, a multiple of 4; `vec`: rows are 16-byte aligned (float4 loads).
__global__ void __launch_bounds__(ARGMAX_THREADS)
    argmax_kernel(const float* __restrict__ logits, i64 row_stride, int vocab, int chunk, int vec,
                  unsigned long long* __restrict__ keys, u32* __restrict__ arrived, i64* __restrict__ out) {
  __shared__ unsigned long long warp_best[ARGMAX_THREADS / 32];
  const int b = blockIdx.y;
  const float* row = logits + b * row_stride;
  const int lo = blockIdx.x * chunk, hi = min(lo + chunk, vocab);
  unsigned long long best = 0;
  int tail = lo;
  if (vec) {
    const int n4 = max(hi - lo, 0) / 4;
    const float4* row4 = reinterpret_cast<const float4*>(row + lo);
#pragma unroll 4
    for (int j = threadIdx.x; j < n4; j += ARGMAX_THREADS) {
      const float4 x = __ldg(row4 + j);
      const int i = lo + 4 * j;
      best = key_max(best, key_max(key_max(argmax_key(x.x, i), argmax_key(x.y, i + 1)),
                                   key_max(argmax_key(x.z, i + 2), argmax_key(x.w, i + 3))));
    }
    tail = lo + 4 * n4;
  }
  for (int i = tail + threadIdx.x; i < hi; i += ARGMAX_THREADS) best = key_max(best, argmax_key(row[i], i));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) best = key_max(best, __shfl_xor_sync(0xffffffffu, best, o));
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x != 0) return;
#pragma unroll
  for (int w = 1; w < ARGMAX_THREADS / 32; ++w) best = key_max(best, warp_best[w]);
  if (gridDim.x == 1) {
    out[b] = (i64)(~(u32)best);
    return;
  }
  atomicMax(keys + b, best);
  __threadfence();
  if (atomicAdd(arrived + b, 1u) == gridDim.x - 1) {
    const unsigned long long win = atomicExch(keys + b, 0ull);
    arrived[b] = 0u;
    out[b] = (i64)(~(u32)win);
  }
}

// A multi-step decode graph's bookkeeping after step `step` drew `tokens` (ops.AdvanceDecode), one
// thread a row: the token out and fed back, the row done at an EOS it stops at or at its budget,
// its position and key count one on, and the slot the next step writes (the scratch slot once done).
__global__ void __launch_bounds__(128)
    advance_decode_kernel(const i64* __restrict__ tokens, int step, i64* __restrict__ out, i64* __restrict__ input_ids,
                          i64* __restrict__ positions, i64* __restrict__ slots, int* __restrict__ kv_lens,
                          const int* __restrict__ page_table, i64 table_stride, int table_width,
                          const i64* __restrict__ budgets, const i64* __restrict__ stop_on_eos, bool* __restrict__ done,
                          const i64* __restrict__ eos, int n_eos, int page_size, i64 scratch_slot, int rows) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  const i64 t = tokens[i];
  out[i] = t;
  bool end = done[i] || budgets[i] <= step + 1;
  if (stop_on_eos[i] != 0)
    for (int e = 0; e < n_eos; ++e) end = end || t == eos[e];
  done[i] = end;
  input_ids[i] = t;
  const i64 pos = positions[i] + 1;
  positions[i] = pos;
  kv_lens[i] += 1;
  const i64 col = min(pos / page_size, (i64)table_width - 1);
  slots[i] = end ? scratch_slot : (i64)page_table[i * table_stride + col] * page_size + pos % page_size;
}

// The whole decode step of a small Llama-family model in one launch: embedding, every layer's
// rmsnorm + q|k|v GEMV + RoPE + paged KV write, attention over the paged pool, o_proj + residual,
// rmsnorm + gate|up GEMV + SiLU-and-mul, down + residual, then the final norm and the LM head into
// float32 logits. A small model's layer streams its weights in ~1-2 us, less than the launch and
// tail of the ~5 kernels a layer otherwise takes, so one persistent kernel that walks the layers
// with grid-wide barriers in between is what makes its decode fast.
//
// Persistent grid: exactly the CTAs the device holds at once (the host sizes the grid with the
// occupancy calculator: SMs x resident CTAs of this kernel at its shared memory), so every CTA is
// resident while any CTA waits at a barrier. A CTA waits only for CTAs of this launch; those not yet
// resident wait for whatever occupies their SM (an earlier kernel, which does not wait on this one),
// so nothing can wait in a cycle: deadlock-free by construction, given the grid is one wave (the op
// refuses to launch a grid larger than the occupancy it measured).
//
// The schedule, the same in every CTA: phase 0 gathers the rows' embeddings and rotary tables; then
// per layer five phases (qkv, attention, o_proj, gate|up, down) with a grid barrier after each; then
// the LM head. A GEMV phase hands channel groups out grid-strided, CTA c taking groups c, c + grid,
// ... and runs the fused decode GEMVs' own body and epilogues (gemv.cuh) on them, so it rounds as the
// fused ops (and therefore the unfused ops) do. Weights never depend on activations: while it waits
// after a layer's q|k|v phase, each CTA asks L2 to prefetch a 1/grid slice of the next layer's weight
// matrices (cp.async.bulk.prefetch on sm_90), and after its down phase the K/V pages its attention
// units of the next layer read, so the phases read L2 rather than wait on HBM after each barrier.
//
// Barriers: one 64-bit counter in global memory that only ever grows. Every CTA arrives once at each
// of a launch's `barriers` barriers and a launch starts only after the last one ended (one stream), so
// a launch starts with the counter at e * barriers * grid, and a CTA reading it at its start finds e
// by a floor however late it starts (no barrier of its launch completes without it). Barrier i of the
// launch releases at (e * barriers + i + 1) * grid. Nothing is reset, so a CUDA graph replays the
// launch as it is (2^64 arrivals outlast any server). Arrival (`arrive`): __syncthreads, then one
// thread's red.release (every thread's writes ordered before it, as CUTLASS's barriers do); the wait
// (`wait`): that thread's ld.acquire poll, then __syncthreads, before any thread reads what other CTAs
// wrote. Between the two, a CTA issues the L2 prefetches of what comes next (weights, K/V pages):
// they cost the waiting CTA nothing; and a GEMV phase's CTA issues its first channel group's weight
// loads into registers before it waits (XAfterBarrier), so they land during the wait, not after the
// release (SmolLM2 b=1 on an H100: 511 vs 561 us a step). Data written in this launch is never read through the
// non-coherent path (ld.global.nc is only used for weights).
//
// Attention: each (row, kv head) is cut into splits of its keys (a static cap from the grid, at least
// MIN_SPLIT_KEYS keys each; the plan is made once a launch, from kv_lens, in shared memory), units
// (row, head, split) handed out grid-strided. A unit's warps take keys in turn, each lane DPL = D / 32
// dims, with an online softmax in the exp2 domain; the warps combine through shared memory, and each
// unit writes its normalised output and log2-sum-exp to its slot. The o_proj phase's prologue merges
// the slots (the input of every o_proj CTA), so attention ends at its barrier with no atomics.
#include "gemv.cuh"

namespace {

constexpr int MIN_SPLIT_KEYS = 32;

// One decoder layer's tensors, packed by the host as 9 int64s a layer in this order.
template <typename T> struct MegaLayer {
  const T* attn_norm;
  const T* qkv;
  const T* qkv_bias;  // nullptr: none
  const T* o_proj;
  const T* ffn_norm;
  const T* gate_up;
  const T* down;
  T* k_cache;
  T* v_cache;
};

__device__ __forceinline__ unsigned long long ld_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

}  // namespace

#ifdef SGJIT_MEGA_TRACE
// The profiling build (python -m sgjit.bench.megakernel_trace), globaltimer ns: per barrier i of a
// launch, [i][0] the first CTA's arrival, [i][1] the last's, [i][2] when CTA 0 saw the release; slot
// MEGA_TRACE_SLOTS - 1: [0] the first CTA's start, [1] the last CTA's end. The tool resets it before
// each launch it reads.
constexpr int MEGA_TRACE_SLOTS = 1024;
__device__ unsigned long long mega_trace[MEGA_TRACE_SLOTS][3];
// One CTA's own view, per barrier i: [i][0] its arrival, [i][1] when it saw the release, [i][2] when
// its next phase's input was ready (a GEMV phase's prologue done; 0 where the phase has none).
constexpr int MEGA_TRACE_CTA = 1;
__device__ unsigned long long mega_cta_trace[MEGA_TRACE_SLOTS][3];
__device__ __forceinline__ unsigned long long mega_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif

namespace {

// The launch's grid barriers (see the header comment): a CTA's state, in shared memory so that it
// takes no registers from the phases, used by thread 0.
struct GridBarrier {
  unsigned long long* counter;
  unsigned long long next;  // the count that releases the next barrier
#ifdef SGJIT_MEGA_TRACE
  unsigned long long first;  // the launch's first count
  __device__ __forceinline__ int index() const { return (int)((next - first) / gridDim.x) - 1; }
#endif

  __device__ __forceinline__ void init(unsigned long long* c, int barriers) {
    if (threadIdx.x == 0) {
      const unsigned long long per_launch = (unsigned long long)barriers * gridDim.x;
      counter = c;
      next = ld_acquire(c) / per_launch * per_launch + gridDim.x;
#ifdef SGJIT_MEGA_TRACE
      first = next - gridDim.x;
#endif
    }
  }
  __device__ __forceinline__ void arrive() {
    __syncthreads();
    if (threadIdx.x == 0) {
#ifdef SGJIT_MEGA_TRACE
      const int i = min(index(), MEGA_TRACE_SLOTS - 2);
      const unsigned long long t = mega_now();
      atomicMin(&mega_trace[i][0], t);
      atomicMax(&mega_trace[i][1], t);
      if (blockIdx.x == MEGA_TRACE_CTA) mega_cta_trace[i][0] = t;
#endif
      asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(counter) : "memory");
    }
  }
  __device__ __forceinline__ void wait() {
    if (threadIdx.x == 0) {
      while (ld_acquire(counter) < next) __nanosleep(32);
#ifdef SGJIT_MEGA_TRACE
      if (blockIdx.x == 0) mega_trace[min(index(), MEGA_TRACE_SLOTS - 2)][2] = mega_now();
      if (blockIdx.x == MEGA_TRACE_CTA) mega_cta_trace[min(index(), MEGA_TRACE_SLOTS - 2)][1] = mega_now();
#endif
      next += gridDim.x;
    }
    __syncthreads();
  }
};

// Ask L2 to fetch `bytes` (a multiple of 16, 16-byte aligned) at p.
__device__ __forceinline__ void prefetch_l2(const void* p, int bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  for (int off = 0; off < bytes; off += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"((const char*)p + off));
#endif
}

// Ask L2 for this CTA's share of a weight matrix: one 1/grid byte slice of it, whoever streams those
// rows (L2 is the device's). One warp asks (one bulk prefetch on sm_90, its lanes' lines below), so
// a layer costs a CTA next to nothing; prefetching each CTA's own rows from every thread cost ~2.5 us
// of the CTA's time a layer (H100).
__device__ __forceinline__ void prefetch_share(const void* w, i64 bytes) {
  const i64 share = (bytes / gridDim.x + 15) / 16 * 16, begin = share * blockIdx.x;
  const i64 n = min(share, bytes - begin);
  if (n <= 0) return;
  const char* p = (const char*)w + begin;
#if __CUDA_ARCH__ >= 900
  if (threadIdx.x % 32 == 0) prefetch_l2(p, (int)n);
#else
  for (i64 off = (threadIdx.x % 32) * 128; off < n; off += 32 * 128) prefetch_l2(p + off, 16);  // a line a lane
#endif
}

// A phase's input behind the barrier that opens the phase: the GEMV body calls `prepare` on a CTA's
// first group after issuing that group's first weight loads (stream_units), so waiting here lets those
// loads (L2 hits: the weights were prefetched a phase or more earlier) fly while the CTA waits for the
// others, instead of starting after the release (weights never depend on activations).
template <class X, bool EARLY> struct XAfterBarrier : X {
  static constexpr bool kPrologue = true;
  GridBarrier* bar;

  template <int R, int THREADS> __device__ __forceinline__ void prepare(int m, float* red) {
    if constexpr (EARLY) bar->wait();
    if constexpr (X::kPrologue) X::template prepare<R, THREADS>(m, red);
#ifdef SGJIT_MEGA_TRACE
    if (blockIdx.x == MEGA_TRACE_CTA && threadIdx.x == 0)
      mega_cta_trace[min(bar->index() - 1, MEGA_TRACE_SLOTS - 2)][2] = mega_now();
#endif
  }
};
// Early loads keep a layer's tensors and a group's first weights in registers across the wait. At 8
// rows (the GEMV's accumulators) or with more than 256 query dims a kv head (the attention's queries
// and outputs, D=128 at G=4 or 7) the kernel then no longer fits the 128-register cap (ptxas spills
// 28-128 bytes), so there it waits right after each arrival, as a plain grid barrier does (EARLY false).
template <int ROWS, int D, int G> __host__ __device__ constexpr bool early_loads() {
  return ROWS <= 4 && D * G <= 256;
}
template <bool EARLY, class X> __device__ __forceinline__ XAfterBarrier<X, EARLY> after(GridBarrier& bar, const X& x) {
  return XAfterBarrier<X, EARLY>{x, &bar};
}

// One GEMV of the step: this CTA's channel groups, the first one preparing the input rows (and, with
// early loads, passing the phase's barrier; a CTA with no group just waits there). `tile`: ROWS x WARPS x
// max(NPW, WIDE_NPW) floats.
template <typename T, int ROWS, int NPW, int UNROLL, int WARPS, class X, bool EARLY, class Epi>
__device__ __forceinline__ void gemv_groups(XAfterBarrier<X, EARLY>& xin, const T* w, const T* bias, int m, int k,
                                            const Epi& epi, float* red, float* tile) {
  const int groups = epi.groups(WARPS * NPW);
  if (EARLY && (int)blockIdx.x >= groups) xin.bar->wait();
  for (int g = blockIdx.x; g < groups; g += gridDim.x)
    gemv_group<T, T, ROWS, NPW, UNROLL, WARPS>(g, g == (int)blockIdx.x, false, xin, w, (const float*)nullptr, bias,
                                               m, k, epi, red, reinterpret_cast<float (*)[WARPS * NPW]>(tile));
}

// A one-row step's phase with more channel groups than CTAs (gate|up, the LM head: WIDE) gives each
// warp two channels instead, so a CTA streams its rows in one round rather than one group after
// another (a lane's summation order, hence every output's bits, is the same either way). Only those
// phases get the second instantiation: each doubles the phase's compile time.
template <int ROWS, int NPW> __host__ __device__ constexpr int wide_npw() { return ROWS == 1 && NPW == 1 ? 2 : NPW; }

template <typename T, int ROWS, int NPW, int UNROLL, int WARPS, bool WIDE = false, class X, bool EARLY, class Epi>
__device__ __forceinline__ void gemv_phase(XAfterBarrier<X, EARLY> xin, const T* w, const T* bias, int m, int k,
                                           const Epi& epi, float* red, float* tile) {
  constexpr int WNPW = WIDE ? wide_npw<ROWS, NPW>() : NPW;
  if (WNPW != NPW && epi.groups(WARPS * NPW) > (int)gridDim.x)
    gemv_groups<T, ROWS, WNPW, UNROLL, WARPS>(xin, w, bias, m, k, epi, red, tile);
  else
    gemv_groups<T, ROWS, NPW, UNROLL, WARPS>(xin, w, bias, m, k, epi, red, tile);
}

// The LM head's epilogue: logits in float32, the linear output rounded to T first (what the layered
// path's rmsnorm_linear(...).float() gives).
template <typename T> struct EpiLogits {
  static constexpr bool kTile = false;
  float* y;
  int n;
  __device__ __forceinline__ int groups(int cpb) const { return (n + cpb - 1) / cpb; }
  __device__ __forceinline__ int weight_row(int g, int local, int cpb) const {
    const int c = g * cpb + local;
    return c < n ? c : -1;
  }
  __device__ __forceinline__ void store(int r, int row, float v) const { y[(i64)r * n + row] = round_to<T>(v); }
};

// ---- attention ----------------------------------------------------------------------------------

// How a step's keys are cut: row r of m has len[r] keys (at least 1) in splits[r] pieces of keys[r]
// keys per kv head, and units (row, head, split) start[r] .. start[r + 1] - 1. Made once a launch by
// thread 0 into shared memory (the kv lengths are the launch's).
template <int ROWS> struct AttnPlan {
  int len[ROWS], splits[ROWS], keys[ROWS], start[ROWS + 1];

  __device__ void make(const int* kv_lens, int m, int hkv, int max_splits) {
    const int cap = max(1, min(max_splits, ((int)gridDim.x + m * hkv - 1) / (m * hkv)));
    start[0] = 0;
    for (int r = 0; r < ROWS; ++r) {
      const int n = r < m ? max(kv_lens[r], 1) : 0;
      int s = max(1, min(cap, n / MIN_SPLIT_KEYS));
      const int k = n > 0 ? (n + s - 1) / s : 1;
      s = n > 0 ? (n + k - 1) / k : 0;  // no empty split
      len[r] = n;
      splits[r] = s;
      keys[r] = k;
      start[r + 1] = start[r] + hkv * s;
    }
  }
  // Unit u's row, kv head, split and keys [k0, k1).
  __device__ __forceinline__ void unit(int u, int& r, int& h, int& s, int& k0, int& k1) const {
    r = 0;
    while (u >= start[r + 1]) ++r;
    const int local = u - start[r];
    h = local / splits[r];
    s = local % splits[r];
    k0 = s * keys[r];
    k1 = min(len[r], k0 + keys[r]);
  }
};

// Where units leave their results (the part buffer): per (row, kv head) pair, max_splits slots of
// [G][D] normalised outputs, then max_splits slots of [G] log2-sum-exps.
template <int G, int D> struct Slots {
  float* part;
  int max_splits;
  __device__ __forceinline__ float* out(int pair, int s) const {
    return part + (i64)pair * max_splits * (G * D + G) + s * G * D;
  }
  __device__ __forceinline__ float* lse(int pair, int s) const {
    return part + (i64)pair * max_splits * (G * D + G) + (i64)max_splits * G * D + s * G;
  }
};

// DPL consecutive elements of T as one load's raw bits (lane_bits_t), read through L2 (the pool was
// written by other CTAs this launch), and widened to floats where used.
template <typename T, int DPL> __device__ __forceinline__ lane_bits_t<T, DPL> load_raw(const T* p) {
  return __ldcg(reinterpret_cast<const lane_bits_t<T, DPL>*>(p));
}
template <typename T, int DPL> __device__ __forceinline__ void widen(const lane_bits_t<T, DPL>& u, float* f) {
  const T* t = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < DPL; ++i) f[i] = to_float(t[i]);
}
template <typename T, int DPL> __device__ __forceinline__ void load_dims(const T* p, float* f) {
  widen<T, DPL>(load_raw<T, DPL>(p), f);
}

// How a warp takes a unit's keys: a key a group of LPK lanes, DPL dims a lane (an 8-byte load), where
// the G query heads' dims a lane fit in registers (D * G <= 256: SmolLM2's 64 x 3), else a key a warp.
// (8 dims a lane spilled at SmolLM2's heads.)
// A lane group's dot product then sums over LPK lanes, not 32, and a warp takes 32 / LPK keys at once:
// a warp's keys are what costs an attention phase (a key after the next in each warp's online softmax).
template <int D, int G> struct KeyLanes {
  static constexpr int DPL = D * G <= 256 ? 4 : D / 32;  // dims a lane
  static constexpr int LPK = D / DPL;                     // lanes a key
  static constexpr int KPW = 32 / LPK;                    // keys a warp at once
  static constexpr int U = KPW > 1 ? 2 : 4;               // rounds of keys a lane loads before it computes
};

// Merge the online-softmax state (m, l, o) of the lane `off` away into this lane's.
template <int G, int DPL>
__device__ __forceinline__ void merge_lanes(float (&o)[G][DPL], float (&mx)[G], float (&l)[G], int off) {
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const float m_o = __shfl_xor_sync(0xffffffffu, mx[g], off), l_o = __shfl_xor_sync(0xffffffffu, l[g], off);
    const float m_new = fmaxf(mx[g], m_o);
    const float a = mx[g] == -INFINITY ? 0.f : exp2f(mx[g] - m_new), b = m_o == -INFINITY ? 0.f : exp2f(m_o - m_new);
    l[g] = l[g] * a + l_o * b;
#pragma unroll
    for (int i = 0; i < DPL; ++i) o[g][i] = o[g][i] * a + __shfl_xor_sync(0xffffffffu, o[g][i], off) * b;
    mx[g] = m_new;
  }
}

// One unit: keys [k0, k1) of row r's kv head h against its G query heads. Lane group j of warp w takes
// keys k0 + w * KPW + j, then every WARPS * KPW-th after it (KeyLanes); the warp's groups merge, then
// the warps. Leaves, in shared memory `sm` ([G][D] output then [G] log2-sum-exp), the unit's
// normalised output and its log2-sum-exp.
template <typename T, int D, int G, int WARPS>
__device__ __forceinline__ void attn_unit(const T* q, const T* k_cache, const T* v_cache, const int* pages,
                                          int page_size, int hkv, int r, int h, int k0, int k1, float scale_log2,
                                          float* sm) {
  using KL = KeyLanes<D, G>;
  constexpr int DPL = KL::DPL, LPK = KL::LPK, KPW = KL::KPW, U = KL::U, STRIDE = WARPS * KPW;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, sub = lane % LPK, grp = lane / LPK;
  const int hq = hkv * G;
  float qf[G][DPL], o[G][DPL], mx[G], l[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    load_dims<T, DPL>(q + ((i64)r * hq + h * G + g) * D + sub * DPL, qf[g]);
    mx[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) o[g][i] = 0.f;
  }
  // the loop runs while any of the warp's groups has a key (its shuffles need every lane)
  for (int base = k0 + warp * KPW; base < k1; base += STRIDE * U) {
    // the U keys' pages first, then their keys and values: each load waits on one round trip (with
    // a page load after each key's loads, the keys' pages came one round trip after another)
    int page[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int pos = base + grp + u * STRIDE;
      page[u] = pos < k1 ? pages[pos / page_size] : 0;
    }
    lane_bits_t<T, DPL> kr[U], vr[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int pos = base + grp + u * STRIDE;
      kr[u] = vr[u] = {};  // a group with no key this round computes on zeros and keeps nothing
      if (pos >= k1) continue;
      const i64 slot = (i64)page[u] * page_size + pos % page_size;
      const i64 off = (slot * hkv + h) * D + sub * DPL;
      kr[u] = load_raw<T, DPL>(k_cache + off);
      vr[u] = load_raw<T, DPL>(v_cache + off);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (base + u * STRIDE >= k1) break;  // no group of the warp has a key this round
      const bool mine = base + grp + u * STRIDE < k1;
      float kf[DPL], vf[DPL];
      widen<T, DPL>(kr[u], kf);
      widen<T, DPL>(vr[u], vf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) s = fmaf(qf[g][i], kf[i], s);
        s = group_sum<LPK>(s) * scale_log2;
        if (!mine) continue;
        const float m_new = fmaxf(mx[g], s);
        const float alpha = exp2f(mx[g] - m_new), p = exp2f(s - m_new);
        l[g] = l[g] * alpha + p;
#pragma unroll
        for (int i = 0; i < DPL; ++i) o[g][i] = fmaf(p, vf[i], o[g][i] * alpha);
        mx[g] = m_new;
      }
    }
  }
#pragma unroll
  for (int off = LPK; off < 32; off *= 2) merge_lanes<G, DPL>(o, mx, l, off);  // the warp's groups
  // the warps' pieces -> shared memory [WARPS][G][D] and [WARPS][G][2], combined by the block
  float* wo = sm + G * D + G;  // after the unit's result
  float* wml = wo + WARPS * G * D;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (grp == 0) {
#pragma unroll
      for (int i = 0; i < DPL; ++i) wo[(warp * G + g) * D + sub * DPL + i] = o[g][i];
    }
    if (lane == 0) {
      wml[(warp * G + g) * 2] = mx[g];
      wml[(warp * G + g) * 2 + 1] = l[g];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
    const int g = idx / D, d = idx % D;
    float m_all = -INFINITY;
    for (int w = 0; w < WARPS; ++w) m_all = fmaxf(m_all, wml[(w * G + g) * 2]);
    float sum = 0.f, acc = 0.f;
    for (int w = 0; w < WARPS; ++w) {
      const float mw = wml[(w * G + g) * 2];
      if (mw == -INFINITY) continue;  // a warp that got no key
      const float f = exp2f(mw - m_all);
      sum += wml[(w * G + g) * 2 + 1] * f;
      acc += wo[(w * G + g) * D + d] * f;
    }
    sm[idx] = acc / sum;
    if (d == 0) sm[G * D + g] = m_all + log2f(sum);
  }
  __syncthreads();
}

// The attention phase: every unit of this CTA, each into its slot.
template <typename T, int ROWS, int D, int G, int WARPS>
__device__ __forceinline__ void attention_phase(const T* q, const MegaLayer<T>& layer, const AttnPlan<ROWS>& plan,
                                                const int* page_table, int pt_stride, int page_size, int m, int hkv,
                                                float scale_log2, const Slots<G, D>& slots, float* sm) {
  for (int u = blockIdx.x; u < plan.start[m]; u += gridDim.x) {
    int r, h, s, k0, k1;
    plan.unit(u, r, h, s, k0, k1);
    attn_unit<T, D, G, WARPS>(q, layer.k_cache, layer.v_cache, page_table + (i64)r * pt_stride, page_size, hkv, r,
                              h, k0, k1, scale_log2, sm);
    const int pair = r * hkv + h;
    float* out = slots.out(pair, s);
    float* lse = slots.lse(pair, s);
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) out[idx] = sm[idx];
    for (int g = threadIdx.x; g < G; g += blockDim.x) lse[g] = sm[G * D + g];
    __syncthreads();  // sm is the next unit's scratch
  }
}

// Ask L2 for the K and V pages this CTA's units of the next attention phase read (a page's slots of
// every kv head: one contiguous block). Keys never change within a launch but for the step's own,
// which the q|k|v phase writes through L2 anyway.
template <typename T, int ROWS>
__device__ __forceinline__ void prefetch_pages(const AttnPlan<ROWS>& plan, const T* k_cache, const T* v_cache,
                                               const int* page_table, int pt_stride, int page_size, int m, int hkv,
                                               int d) {
  const int page_bytes = page_size * hkv * d * (int)sizeof(T);
  for (int u = blockIdx.x; u < plan.start[m]; u += gridDim.x) {
    int r, h, s, k0, k1;
    plan.unit(u, r, h, s, k0, k1);
    const int p0 = k0 / page_size, p1 = (k1 - 1) / page_size;
    // warps 1.. only: thread 0 waits at the barrier meanwhile, not behind the page-table load
    const int t = (int)threadIdx.x - 32, nt = (int)blockDim.x - 32;
    for (int p = p0 + t / 2; t >= 0 && p <= p1; p += nt / 2) {
      const i64 page = __ldcg(page_table + (i64)r * pt_stride + p);
      prefetch_l2((t % 2 ? v_cache : k_cache) + page * page_size * hkv * d, page_bytes);
    }
  }
}

// o_proj's input: the attention output of every row and query head, merged here from the units'
// slots (each CTA of the phase merges them all into shared memory `xs` [m][hq * D], rounded to T as
// the layered attention's output is).
template <typename T, int ROWS, int D, int G> struct XMergeSplits {
  static constexpr bool kPrologue = true;
  const AttnPlan<ROWS>* plan;
  Slots<G, D> slots;
  int hkv;
  T* xs;

  // A thread loads J splits' slots of its output together, before it uses any: with the splits'
  // runtime count as a plain loop's bound, the compiler issued each split's loads only after the
  // previous split's arithmetic, a memory round trip a split (SmolLM2 b=1 at 5 splits on an H100:
  // o_proj 3.39 -> 2.88 us). The merge runs in the splits' order either way, so the bits do not
  // change. (Two outputs a thread at once spilled.)
  static constexpr int J = 8;

  template <int R, int THREADS> __device__ __forceinline__ void prepare(int m, float*) {
    const int hq = hkv * G, width = hq * D;
    for (int i = threadIdx.x; i < m * width; i += THREADS) {
      const int r = i / width, c = i % width, head = c / D, g = head % G, pair = r * hkv + head / G;
      const int splits = plan->splits[r];
      float m_all = -INFINITY, sum = 0.f, acc = 0.f;
      for (int j0 = 0; j0 < splits; j0 += J) {
        float lse[J], o[J];
#pragma unroll
        for (int j = 0; j < J; ++j) {
          const bool in = j0 + j < splits;
          lse[j] = in ? __ldcg(slots.lse(pair, j0 + j) + g) : -INFINITY;
          o[j] = in ? __ldcg(slots.out(pair, j0 + j) + g * D + c % D) : 0.f;
        }
#pragma unroll
        for (int j = 0; j < J; ++j) {  // one pass, the running max rescaling the sums
          if (j0 + j >= splits) break;
          const float m_new = fmaxf(m_all, lse[j]), shrink = exp2f(m_all - m_new), f = exp2f(lse[j] - m_new);
          sum = sum * shrink + f;
          acc = acc * shrink + f * o[j];
          m_all = m_new;
        }
      }
      xs[i] = from_float<T>(acc / sum);
    }
    __syncthreads();
  }
  __device__ __forceinline__ Vec8<T> load(int r, int e) const { return load8(xs + r * hkv * G * D + e); }
};

}  // namespace

extern __shared__ float mega_smem[];

// ids, positions, slots [m]: the step's tokens; kv_lens [m] and page_table [m, pt_stride]: the rows'
// keys (this step's included); rope [max_positions, rot]: the model's cos|sin table. Scratch owned
// by the launch: h [m, hidden] (the residual stream), q [m, hq, D], act [m, inter],
// part (attention slots). Owned by the op across launches: barrier (the monotonic counter).
template <typename T, int ROWS, int NPW, int UNROLL, int WARPS, int D, int G>
__global__ void __launch_bounds__(WARPS * 32, 1)
    decode_megakernel(const i64* __restrict__ ids, const i64* __restrict__ positions, const i64* __restrict__ slots,
                      const int* __restrict__ kv_lens, const int* __restrict__ page_table, int pt_stride,
                      int page_size, const T* __restrict__ embed, const MegaLayer<T>* __restrict__ layers,
                      int num_layers, const T* __restrict__ final_norm, const T* __restrict__ lm_head,
                      const float* __restrict__ rope, int m, int hidden, int inter, int hkv, int rot, int vocab,
                      float eps, float scale_log2, int max_splits, T* h, T* q, T* act, float* part,
                      float* logits, unsigned long long* barrier) {
  constexpr int CPB = WARPS * NPW;
  constexpr bool EARLY = early_loads<ROWS, D, G>();
  __shared__ float red[WARPS * ROWS];
  __shared__ float tile[ROWS * WARPS * wide_npw<ROWS, NPW>()];
  __shared__ AttnPlan<ROWS> plan;
  // the rows' rotary cos|sin (rot <= D) and KV slots, which every layer's q|k|v epilogue reads: each
  // CTA's own copy, so that epilogue waits on no memory round trip
  __shared__ float cs[ROWS * D];
  __shared__ i64 slot[ROWS];
  T* xs = reinterpret_cast<T*>(mega_smem);
  const int hq = hkv * G;
  __shared__ GridBarrier bar;
  bar.init(barrier, 1 + 5 * num_layers);  // published to the CTA by the first arrival's __syncthreads

#ifdef SGJIT_MEGA_TRACE
  if (threadIdx.x == 0) atomicMin(&mega_trace[MEGA_TRACE_SLOTS - 1][0], mega_now());
#endif
  // L2 prefetches of a layer's weight matrices and of its attention's K/V pages (prefetching the
  // norm weights too measured no faster: bench.megakernel_trace, H100)
  auto prefetch_weights = [&](const MegaLayer<T>& L) {
    if (threadIdx.x / 32 == 1) {  // not warp 0, whose thread 0 waits at the barriers
      const int bytes = (int)sizeof(T), qkv_rows = (hq + 2 * hkv) * D;
      prefetch_share(L.qkv, (i64)qkv_rows * hidden * bytes);
      prefetch_share(L.o_proj, (i64)hidden * hq * D * bytes);
      prefetch_share(L.gate_up, (i64)2 * inter * hidden * bytes);
      prefetch_share(L.down, (i64)hidden * inter * bytes);
    }
  };
  auto prefetch_kv = [&](const MegaLayer<T>& L) {
    prefetch_pages<T, ROWS>(plan, L.k_cache, L.v_cache, page_table, pt_stride, page_size, m, hkv, D);
  };

  // ---- phase 0: the rows' embeddings and rotary rows, the attention plan ----
  if (num_layers > 0) prefetch_weights(layers[0]);
  if (threadIdx.x == 0) plan.make(kv_lens, m, hkv, max_splits);
  const int gtid = blockIdx.x * blockDim.x + threadIdx.x, gthreads = gridDim.x * blockDim.x;
  for (int i = gtid; i < m * hidden / 8; i += gthreads) {
    const int r = i / (hidden / 8), v = i % (hidden / 8);
    store8(h + (i64)r * hidden + v * 8, load8(embed + ids[r] * hidden + v * 8));
  }
  for (int i = threadIdx.x; i < m * rot; i += blockDim.x) cs[i] = rope[positions[i / rot] * rot + i % rot];
  if (threadIdx.x < m) slot[threadIdx.x] = slots[threadIdx.x];
  bar.arrive();  // (its __syncthreads publishes the plan to the CTA)
  if (num_layers > 0) prefetch_kv(layers[0]);
  if constexpr (!EARLY) bar.wait();

  // Each GEMV phase starts right after the previous phase's arrival: its first weight loads are
  // issued before it waits at the barrier (XAfterBarrier).
  for (int l = 0; l < num_layers; ++l) {
    const MegaLayer<T> L = layers[l];
    const bool next = l + 1 < num_layers;

    XRmsNorm<T> attn_in{h, hidden, L.attn_norm, eps, hidden, xs};
    EpiRopeStoreKV<T, T> rope_kv{q, L.k_cache, L.v_cache, cs, slot, hq, hkv, D, rot, 1.f, 1.f};
    gemv_phase<T, ROWS, NPW, UNROLL, WARPS>(after<EARLY>(bar, attn_in), L.qkv, L.qkv_bias, m, hidden, rope_kv, red,
                                            tile);
    bar.arrive();
    if (next) prefetch_weights(layers[l + 1]);
    bar.wait();

    attention_phase<T, ROWS, D, G, WARPS>(q, L, plan, page_table, pt_stride, page_size, m, hkv, scale_log2,
                                          Slots<G, D>{part, max_splits}, mega_smem);
    bar.arrive();
    if constexpr (!EARLY) bar.wait();

    XMergeSplits<T, ROWS, D, G> o_in{&plan, Slots<G, D>{part, max_splits}, hkv, xs};
    gemv_phase<T, ROWS, NPW, UNROLL, WARPS>(after<EARLY>(bar, o_in), L.o_proj, (const T*)nullptr, m, hq * D,
                                            EpiResidual<T>{h, hidden, h, hidden, hidden}, red, tile);
    bar.arrive();
    if constexpr (!EARLY) bar.wait();

    XRmsNorm<T> ffn_in{h, hidden, L.ffn_norm, eps, hidden, xs};
    gemv_phase<T, ROWS, NPW, UNROLL, WARPS, true>(after<EARLY>(bar, ffn_in), L.gate_up, (const T*)nullptr, m, hidden,
                                                  EpiSiluMul<T>{act, inter, inter}, red, tile);
    bar.arrive();
    if constexpr (!EARLY) bar.wait();

    XGlobal<T> down_in{act, inter};
    gemv_phase<T, ROWS, NPW, UNROLL, WARPS>(after<EARLY>(bar, down_in), L.down, (const T*)nullptr, m, inter,
                                            EpiResidual<T>{h, hidden, h, hidden, hidden}, red, tile);
    bar.arrive();
    if (next) prefetch_kv(layers[l + 1]);
    if constexpr (!EARLY) bar.wait();
  }

  XRmsNorm<T> head_in{h, hidden, final_norm, eps, hidden, xs};
  gemv_phase<T, ROWS, NPW, UNROLL, WARPS, true>(after<EARLY>(bar, head_in), lm_head, (const T*)nullptr, m, hidden,
                                                EpiLogits<T>{logits, vocab}, red, tile);
#ifdef SGJIT_MEGA_TRACE
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(&mega_trace[MEGA_TRACE_SLOTS - 1][1], mega_now());
#endif
}

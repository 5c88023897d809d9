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
// fused ops (and therefore the unfused ops) do. Weights never depend on activations: at each layer's
// start a CTA asks L2 to prefetch the next layer's rows it will stream (cp.async.bulk.prefetch on
// sm_90), so the GEMVs read L2 rather than wait on HBM after each barrier.
//
// Barriers: one 64-bit counter in global memory that only ever grows. A CTA adds 1 on arrival and
// waits until the counter reaches the next multiple of the grid size above the value it saw: every
// CTA arrives once at every barrier and a launch starts only after the last one ended (one stream), so
// between launches the counter is a multiple of the grid and barrier i of a launch releases at
// (e * barriers + i + 1) * grid. Nothing is reset, so a CUDA graph replays the launch as it is
// (2^64 arrivals outlast any server). Release: every CTA's writes are ordered before its arrival by
// __syncthreads + __threadfence; acquire: the waiting thread's ld.acquire and __threadfence, then
// __syncthreads, before any thread reads what other CTAs wrote. Data written in this launch is never
// read through the non-coherent path (ld.global.nc is only used for weights).
//
// Attention: each (row, kv head) is cut into splits of its keys (a static cap from the grid, at least
// MIN_SPLIT_KEYS keys each), units (row, head, split) handed out grid-strided. A unit's warps take
// keys in turn, each lane DPL = D / 32 dims, with an online softmax in the exp2 domain; the warps
// combine through shared memory. A (row, head) of one split writes its output; otherwise each split
// writes its normalised output and log2-sum-exp to a slot and counts itself in, and the CTA that
// counts last merges the slots and sets the count back to 0 (so the next layer and launch find 0).
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

__device__ __forceinline__ void grid_barrier(unsigned long long* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long n = gridDim.x;
    __threadfence();
    const unsigned long long seen = atomicAdd(counter, 1ull);
    const unsigned long long target = (seen / n + 1) * n;
    while (ld_acquire(counter) < target) __nanosleep(32);
    __threadfence();
  }
  __syncthreads();
}

// Ask L2 to fetch `bytes` (a multiple of 16, 16-byte aligned) at p.
__device__ __forceinline__ void prefetch_l2(const void* p, int bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  for (int off = 0; off < bytes; off += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"((const char*)p + off));
#endif
}

// The weight rows this CTA's channel groups of a GEMV phase stream (the phase's grid-strided groups).
template <int CPB, class Epi, typename W> __device__ __forceinline__ void prefetch_rows(const Epi& epi, const W* w, int k) {
  const int groups = epi.groups(CPB);
  for (int i = threadIdx.x;; i += blockDim.x) {
    const int g = blockIdx.x + (i / CPB) * gridDim.x;
    if (g >= groups) break;
    const int row = epi.weight_row(g, i % CPB, CPB);
    if (row >= 0) prefetch_l2(w + (i64)row * k, k * (int)sizeof(W));
  }
}

// One GEMV of the step: this CTA's channel groups, the first one preparing the input rows.
template <typename T, int ROWS, int NPW, int UNROLL, int WARPS, class X, class Epi>
__device__ __forceinline__ void gemv_phase(X& xin, const T* w, const T* bias, int m, int k, const Epi& epi,
                                           float* red, float (*tile)[WARPS * NPW]) {
  const int groups = epi.groups(WARPS * NPW);
  for (int g = blockIdx.x; g < groups; g += gridDim.x)
    gemv_group<T, T, ROWS, NPW, UNROLL, WARPS>(g, g == (int)blockIdx.x, xin, w, (const float*)nullptr, bias, m, k,
                                               epi, red, tile);
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

// How a step's keys are cut: row r of m has splits[r] pieces of keys[r] keys per kv head, and
// units (row, head, split) start[r] .. start[r + 1] - 1. Every thread computes the same plan.
template <int ROWS> struct AttnPlan {
  int splits[ROWS], keys[ROWS], start[ROWS + 1];
};

template <int ROWS>
__device__ __forceinline__ AttnPlan<ROWS> attn_plan(const int* kv_lens, int m, int hkv, int max_splits) {
  AttnPlan<ROWS> p;
  const int cap = max(1, min(max_splits, ((int)gridDim.x + m * hkv - 1) / (m * hkv)));
  p.start[0] = 0;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int len = r < m ? max(kv_lens[r], 1) : 0;
    int s = max(1, min(cap, len / MIN_SPLIT_KEYS));
    const int keys = len > 0 ? (len + s - 1) / s : 1;
    s = len > 0 ? (len + keys - 1) / keys : 0;  // no empty split
    p.splits[r] = s;
    p.keys[r] = keys;
    p.start[r + 1] = p.start[r] + hkv * s;
  }
  return p;
}

// DPL consecutive elements of T, read through L2 (the pool was written by other CTAs this launch).
template <typename T, int DPL> __device__ __forceinline__ void load_dims(const T* p, float* f) {
  static_assert(DPL == 2 || DPL == 4, "head_dim 64 or 128");
  if constexpr (DPL == 2) {
    const unsigned int u = __ldcg(reinterpret_cast<const unsigned int*>(p));
    const T* t = reinterpret_cast<const T*>(&u);
    f[0] = to_float(t[0]);
    f[1] = to_float(t[1]);
  } else {
    const uint2 u = __ldcg(reinterpret_cast<const uint2*>(p));
    const T* t = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = to_float(t[i]);
  }
}

// One unit: keys [k0, k1) of row r's kv head h against its G query heads. Leaves, in shared memory
// `sm` ([G][D] output then [G] log2-sum-exp), the unit's normalised output and its log2-sum-exp.
template <typename T, int D, int G, int WARPS>
__device__ __forceinline__ void attn_unit(const T* q, const T* k_cache, const T* v_cache, const int* pages,
                                          int page_size, int hkv, int r, int h, int k0, int k1, float scale_log2,
                                          float* sm) {
  constexpr int DPL = D / 32, U = 4;  // dims a lane; keys a warp loads before it computes
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int hq = hkv * G;
  float qf[G][DPL], o[G][DPL], mx[G], l[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    load_dims<T, DPL>(q + ((i64)r * hq + h * G + g) * D + lane * DPL, qf[g]);
    mx[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) o[g][i] = 0.f;
  }
  for (int base = k0 + warp; base < k1; base += WARPS * U) {
    float kf[U][DPL], vf[U][DPL];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int pos = base + u * WARPS;
      if (pos >= k1) break;
      const i64 slot = (i64)pages[pos / page_size] * page_size + pos % page_size;
      const i64 off = (slot * hkv + h) * D + lane * DPL;
      load_dims<T, DPL>(k_cache + off, kf[u]);
      load_dims<T, DPL>(v_cache + off, vf[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (base + u * WARPS >= k1) break;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) s = fmaf(qf[g][i], kf[u][i], s);
        s = group_sum<32>(s) * scale_log2;
        const float m_new = fmaxf(mx[g], s);
        const float alpha = exp2f(mx[g] - m_new), p = exp2f(s - m_new);
        l[g] = l[g] * alpha + p;
#pragma unroll
        for (int i = 0; i < DPL; ++i) o[g][i] = fmaf(p, vf[u][i], o[g][i] * alpha);
        mx[g] = m_new;
      }
    }
  }
  // the warps' pieces -> shared memory [WARPS][G][D] and [WARPS][G][2], combined by the block
  float* wo = sm + G * D + G;  // after the unit's result
  float* wml = wo + WARPS * G * D;
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int i = 0; i < DPL; ++i) wo[(warp * G + g) * D + lane * DPL + i] = o[g][i];
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

// The attention phase: every unit of this CTA, each written out or merged by the last of its splits.
template <typename T, int ROWS, int D, int G, int WARPS>
__device__ __forceinline__ void attention_phase(const T* q, const MegaLayer<T>& layer, const int* kv_lens,
                                                const int* page_table, int pt_stride, int page_size, int m, int hkv,
                                                float scale_log2, int max_splits, T* out, float* part,
                                                int* merge_count, float* sm) {
  const AttnPlan<ROWS> plan = attn_plan<ROWS>(kv_lens, m, hkv, max_splits);
  const int hq = hkv * G;
  __shared__ int last;
  for (int u = blockIdx.x; u < plan.start[m]; u += gridDim.x) {
    int r = 0;
    while (u >= plan.start[r + 1]) ++r;
    const int local = u - plan.start[r], splits = plan.splits[r];
    const int h = local / splits, s = local % splits;
    const int len = max(kv_lens[r], 1);
    const int k0 = s * plan.keys[r], k1 = min(len, k0 + plan.keys[r]);
    attn_unit<T, D, G, WARPS>(q, layer.k_cache, layer.v_cache, page_table + (i64)r * pt_stride, page_size, hkv, r,
                              h, k0, k1, scale_log2, sm);
    T* dst = out + ((i64)r * hq + h * G) * D;
    if (splits == 1) {
      for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) dst[idx] = from_float<T>(sm[idx]);
      __syncthreads();
      continue;
    }
    const int pair = r * hkv + h;
    float* slot_o = part + ((i64)pair * max_splits) * (G * D + G);  // [max_splits][G * D], then [max_splits][G]
    float* slot_lse = slot_o + (i64)max_splits * G * D;
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) slot_o[s * G * D + idx] = sm[idx];
    for (int g = threadIdx.x; g < G; g += blockDim.x) slot_lse[s * G + g] = sm[G * D + g];
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(merge_count + pair, 1) == splits - 1;
    __syncthreads();
    if (last) {
      __threadfence();
      for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int g = idx / D;
        float m_all = -INFINITY;
        for (int j = 0; j < splits; ++j) m_all = fmaxf(m_all, __ldcg(slot_lse + j * G + g));
        float sum = 0.f, acc = 0.f;
        for (int j = 0; j < splits; ++j) {
          const float f = exp2f(__ldcg(slot_lse + j * G + g) - m_all);
          sum += f;
          acc += f * __ldcg(slot_o + j * G * D + idx);
        }
        dst[idx] = from_float<T>(acc / sum);
      }
      if (threadIdx.x == 0) atomicExch(merge_count + pair, 0);
    }
    __syncthreads();
  }
}

}  // namespace

extern __shared__ float mega_smem[];

// ids, positions, slots [m]: the step's tokens; kv_lens [m] and page_table [m, pt_stride]: the rows'
// keys (this step's included); rope [max_positions, rot]: the model's cos|sin table. Scratch owned
// by the launch: h [m, hidden] (the residual stream), cs [m, rot], q [m, hq, D], attn [m, hq * D],
// act [m, inter], part (attention slots). Owned by the op across launches: merge_count [m * hkv]
// (zero between launches) and barrier (the monotonic counter).
template <typename T, int ROWS, int NPW, int UNROLL, int WARPS, int D, int G>
__global__ void __launch_bounds__(WARPS * 32, 1)
    decode_megakernel(const i64* __restrict__ ids, const i64* __restrict__ positions, const i64* __restrict__ slots,
                      const int* __restrict__ kv_lens, const int* __restrict__ page_table, int pt_stride,
                      int page_size, const T* __restrict__ embed, const MegaLayer<T>* __restrict__ layers,
                      int num_layers, const T* __restrict__ final_norm, const T* __restrict__ lm_head,
                      const float* __restrict__ rope, int m, int hidden, int inter, int hkv, int rot, int vocab,
                      float eps, float scale_log2, int max_splits, T* h, float* cs, T* q, T* attn, T* act,
                      float* part, int* merge_count, float* logits, unsigned long long* barrier) {
  constexpr int CPB = WARPS * NPW;
  __shared__ float red[WARPS * ROWS];
  __shared__ float tile[ROWS][CPB];
  T* xs = reinterpret_cast<T*>(mega_smem);
  const int hq = hkv * G;

  auto prefetch_layer = [&](const MegaLayer<T>& L) {
    prefetch_rows<CPB>(EpiRopeStoreKV<T, T>{q, L.k_cache, L.v_cache, cs, slots, hq, hkv, D, rot, 1.f, 1.f}, L.qkv,
                       hidden);
    prefetch_rows<CPB>(EpiResidual<T>{h, hidden, h, hidden, hidden}, L.o_proj, hq * D);
    prefetch_rows<CPB>(EpiSiluMul<T>{act, inter, inter}, L.gate_up, hidden);
    prefetch_rows<CPB>(EpiResidual<T>{h, hidden, h, hidden, hidden}, L.down, inter);
  };

  // ---- phase 0: the rows' embeddings and rotary rows ----
  if (num_layers > 0) prefetch_layer(layers[0]);
  const int gtid = blockIdx.x * blockDim.x + threadIdx.x, gthreads = gridDim.x * blockDim.x;
  for (int i = gtid; i < m * hidden / 8; i += gthreads) {
    const int r = i / (hidden / 8), v = i % (hidden / 8);
    store8(h + (i64)r * hidden + v * 8, load8(embed + ids[r] * hidden + v * 8));
  }
  for (int i = gtid; i < m * rot; i += gthreads) cs[i] = rope[positions[i / rot] * rot + i % rot];
  grid_barrier(barrier);

  for (int l = 0; l < num_layers; ++l) {
    const MegaLayer<T> L = layers[l];
    if (l + 1 < num_layers) prefetch_layer(layers[l + 1]);

    XRmsNorm<T> attn_in{h, hidden, L.attn_norm, eps, hidden, xs};
    EpiRopeStoreKV<T, T> rope_kv{q, L.k_cache, L.v_cache, cs, slots, hq, hkv, D, rot, 1.f, 1.f};
    gemv_phase<T, ROWS, NPW, UNROLL, WARPS>(attn_in, L.qkv, L.qkv_bias, m, hidden, rope_kv, red, tile);
    grid_barrier(barrier);

    attention_phase<T, ROWS, D, G, WARPS>(q, L, kv_lens, page_table, pt_stride, page_size, m, hkv, scale_log2,
                                          max_splits, attn, part, merge_count, mega_smem);
    grid_barrier(barrier);

    XGlobal<T> o_in{attn, (i64)hq * D};
    gemv_phase<T, ROWS, NPW, UNROLL, WARPS>(o_in, L.o_proj, (const T*)nullptr, m, hq * D,
                                            EpiResidual<T>{h, hidden, h, hidden, hidden}, red, tile);
    grid_barrier(barrier);

    XRmsNorm<T> ffn_in{h, hidden, L.ffn_norm, eps, hidden, xs};
    gemv_phase<T, ROWS, NPW, UNROLL, WARPS>(ffn_in, L.gate_up, (const T*)nullptr, m, hidden,
                                            EpiSiluMul<T>{act, inter, inter}, red, tile);
    grid_barrier(barrier);

    XGlobal<T> down_in{act, inter};
    gemv_phase<T, ROWS, NPW, UNROLL, WARPS>(down_in, L.down, (const T*)nullptr, m, inter,
                                            EpiResidual<T>{h, hidden, h, hidden, hidden}, red, tile);
    grid_barrier(barrier);
  }

  XRmsNorm<T> head_in{h, hidden, final_norm, eps, hidden, xs};
  gemv_phase<T, ROWS, NPW, UNROLL, WARPS>(head_in, lm_head, (const T*)nullptr, m, hidden,
                                          EpiLogits<T>{logits, vocab}, red, tile);
}

// Prefill attention for Hopper (sm_90a), in the manner of FlashAttention-3: warpgroup MMAs
// (wgmma.mma_async) fed from shared memory, a producer warpgroup streaming K/V tiles into a
// multi-stage ring signalled with mbarriers, and two consumer warpgroups that each own 64 of the
// CTA's 128 packed query rows. Only sm_90a has these instructions; attention.cu (mma.sync) keeps
// decode, fp8 pools and every other architecture.
//
// Rows are packed as in attention.cu: packed row p of a CTA is token p / G and q head
// kv_head * G + p % G, so each K/V tile streamed from the pool serves the whole GQA group.
//
// S = Q K^T takes Q and K from shared memory (both K-major: head_dim contiguous); O += P V takes
// P from registers (the accumulator of S, rounded to T, is already laid out as the A fragment)
// and V from shared memory as an MN-major operand (transposed by the instruction). Every tile
// is stored in the 128-byte swizzle the descriptors name: [head_dim / 64][rows][128 bytes], the
// 16-byte chunk index XOR row % 8, each 8-row atom 1024-byte aligned.
//
// The pool interleaves kv heads ([page, slot, kv head, D]), so a head's rows are 2*D-byte pieces
// at a stride and pages are not contiguous. The producer fills a stage one of two ways (SCHED_TMA):
// 128 threads of 16-byte cp.async, each row's page looked up in the page table, the copies'
// completion arriving on the stage's mbarrier (cp.async.mbarrier.arrive.noinc); or one warp
// issuing tensor-memory-accelerator copies (cp.async.bulk.tensor), one a page and 64-element half
// of head_dim (a lane a page), or one a tile's half where its pages are consecutive ids, through
// tensor maps over the whole pool (attention_sm90.py builds them), which land
// in the same swizzle and complete the stage's mbarrier by bytes. K and V of a stage have separate barriers, so
// Q K^T starts before V lands, and consumers release K and V once their MMAs on them are done.
// How the consumers order their GEMMs and softmax is the SCHEDULE (below): serial, or FA-3's
// overlap of one tile's softmax with the next tile's GEMMs, within a warpgroup and/or between
// the two warpgroups (ping-pong).
//
// Splits of a row's keys (few long rows) write partial O and lse like attention.cu and are merged
// by its merge_splits_kernel.
//
// The grid is persistent where no row is split: a CTA a SM walks its share of the host's work list
// (below), the producer running on into the next item's K/V while the consumers finish the last
// one, and the next item's Q loading under the last tile's P V. Otherwise a CTA takes one item.
#include "common.cuh"

using namespace sgjit;

namespace sgjit {

typedef unsigned long long u64;

#define SGJIT_WGMMA_SS_N64(PTX_TYPE)                                                                                     \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                              \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX_TYPE "." PTX_TYPE " {"                                  \
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                  \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                       \
               "%32, %33, p, 1, 1, 0, 0;\n}\n"                                                                           \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),         \
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),   \
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])  \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d))

#define SGJIT_WGMMA_RS_N64(PTX_TYPE)                                                                                     \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                              \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX_TYPE "." PTX_TYPE " {"                                  \
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                  \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                       \
               "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                                             \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),         \
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),   \
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))

#define SGJIT_WGMMA_SS_N128(PTX_TYPE)                                                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                              \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX_TYPE "." PTX_TYPE " {"                                 \
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                  \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                        \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                        \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "                       \
               "%64, %65, p, 1, 1, 0, 0;\n}\n"                                                                           \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),         \
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),   \
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
                 "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
                 "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
                 "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
                 "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])  \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d))

#define SGJIT_WGMMA_RS_N128(PTX_TYPE)                                                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                              \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX_TYPE "." PTX_TYPE " {"                                 \
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                  \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                        \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                        \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "                       \
               "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                                             \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),         \
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),   \
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
                 "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
                 "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
                 "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
                 "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))

template <typename T, int N> __device__ __forceinline__ void wgmma_ss(float* d, u64 desc_a, u64 desc_b, int scale_d);
template <typename T, int N> __device__ __forceinline__ void wgmma_rs(float* d, const u32* a, u64 desc_b, int scale_d);
// The four shapes (S with 64 or 128 keys, O with head_dim 64 or 128) for one 16-bit type.
#define SGJIT_WGMMA_DEFS(T, PTX_TYPE)                                                                         \
  template <> __device__ __forceinline__ void wgmma_ss<T, 64>(float* d, u64 desc_a, u64 desc_b, int scale_d) {  \
    SGJIT_WGMMA_SS_N64(PTX_TYPE);                                                                             \
  }                                                                                                           \
  template <> __device__ __forceinline__ void wgmma_ss<T, 128>(float* d, u64 desc_a, u64 desc_b, int scale_d) { \
    SGJIT_WGMMA_SS_N128(PTX_TYPE);                                                                            \
  }                                                                                                           \
  template <> __device__ __forceinline__ void wgmma_rs<T, 64>(float* d, const u32* a, u64 desc_b, int scale_d) { \
    SGJIT_WGMMA_RS_N64(PTX_TYPE);                                                                             \
  }                                                                                                           \
  template <> __device__ __forceinline__ void wgmma_rs<T, 128>(float* d, const u32* a, u64 desc_b, int scale_d) { \
    SGJIT_WGMMA_RS_N128(PTX_TYPE);                                                                            \
  }
SGJIT_WGMMA_DEFS(__nv_bfloat16, "bf16")
SGJIT_WGMMA_DEFS(__half, "f16")
#undef SGJIT_WGMMA_DEFS
#undef SGJIT_WGMMA_SS_N64
#undef SGJIT_WGMMA_SS_N128
#undef SGJIT_WGMMA_RS_N64
#undef SGJIT_WGMMA_RS_N128

// Orders the warpgroup's register writes before the next wgmma reads them (accumulators, P).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of an accumulator across the asynchronous MMA that owns it.
template <int N> __device__ __forceinline__ void pin(float* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle (mode 1 in bits 62-63): start address, leading
// and stride byte offsets, each in 16-byte units.
__device__ __forceinline__ u64 sw128_desc(u32 addr, u32 lbo, u32 sbo) {
  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) | (1ull << 62);
}

// Byte offset of 16-byte chunk c of row r in a [ROWS, D] tile of 2-byte values stored for the
// 128-byte swizzle: D / 64 column blocks of [ROWS][128 B], chunk index XOR row % 8.
template <int ROWS> __device__ __forceinline__ u32 sw128_off(int r, int c) {
  return (u32)((c >> 3) * (ROWS * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void mbar_init(u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives once this thread's earlier cp.async copies have landed (the barrier counts the arrival).
__device__ __forceinline__ void mbar_arrive_on_copies(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Arrives and raises the phase's expected transaction bytes: the phase completes once the bulk copies
// that name this barrier have delivered that many bytes (and every expected arrival is in).
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// A tensor map written to global memory by the host (a copy before the launch) is read by the tensor
// map proxy: acquire it there before the first copy that names it, and bring it into the
// descriptor cache early.
__device__ __forceinline__ void tensormap_acquire(u64 map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;\n" ::"l"(map) : "memory");
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}
// One tile-mode box of a 5-D tensor map (coordinates innermost first, in elements) into shared
// memory at dst, its bytes counted on bar. The .shared::cluster destination takes this CTA's own
// shared address (a launch without clusters is a cluster of one).
__device__ __forceinline__ void tma_load_5d(u32 dst, u64 map, u32 bar, int c0, int c1, int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, "
      "%7}], [%2];\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}
// The same through a 4-D map (the run map: column, head, slot of the whole pool, layer).
__device__ __forceinline__ void tma_load_4d(u32 dst, u64 map, u32 bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(u32 bar, int parity) {
  u32 done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// What a thread waits for, named by the watchdog.
enum WaitSite { WAIT_EMPTY_K = 0, WAIT_EMPTY_V = 1, WAIT_FULL_K = 2, WAIT_FULL_V = 3 };
__device__ __forceinline__ const char* wait_site_name(WaitSite site) {
  return site == WAIT_EMPTY_K ? "empty_k" : site == WAIT_EMPTY_V ? "empty_v" : site == WAIT_FULL_K ? "full_k" : "full_v";
}
__device__ __forceinline__ u64 globaltimer_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
// Waits for the completion of the barrier's phase of this parity. Built with
// SGJIT_SM90_WATCHDOG=<ms> (debug runs only), a wait longer than that prints who waited on what and
// traps, so a synchronization bug fails the launch instead of hanging the process.
__device__ __forceinline__ void mbar_wait(u32 bar, int parity, WaitSite site, int tile) {
#ifdef SGJIT_SM90_WATCHDOG
  const u64 t0 = globaltimer_ns();
  while (!mbar_try_wait(bar, parity)) {
    if (globaltimer_ns() - t0 > (u64)(SGJIT_SM90_WATCHDOG) * 1000000ull) {
      if (threadIdx.x % 32 == 0) {
        printf("sgjit sm90 watchdog: block (%d,%d,%d) warp %d waited %d ms on %s of tile %d (parity %d)\n",
               blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x / 32, (int)(SGJIT_SM90_WATCHDOG),
               wait_site_name(site), tile, parity);
      }
      __trap();
    }
  }
#else
  (void)site, (void)tile;
  while (!mbar_try_wait(bar, parity)) {
  }
#endif
  __syncwarp();  // the warp leaves the spin together: the wgmma that follows is .aligned
}
// Named barriers (0 is __syncthreads): 1 and 2 order each consumer warpgroup's Q copy before its
// MMAs; 3 + w is consumer warpgroup w's turn to issue GEMMs (SCHED_PINGPONG), 128 threads of w
// waiting and 128 of the other warpgroup arriving.
constexpr int BAR_Q = 1;
constexpr int BAR_TURN = 3;
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The two consumer warpgroups' turns at the tensor cores, strictly alternating and starting with
// warpgroup 0; both take the same number of turns. Every wait is matched by one arrival of the
// other warpgroup: warpgroup 1 lets warpgroup 0 start (at construction) and, after each of its
// turns but the last, lets it go again; warpgroup 0 lets warpgroup 1 go after each of its turns.
// Nothing is left arrived at the end. With ON false every call is empty.
template <bool ON> struct Turns {
  int cw;
  __device__ __forceinline__ Turns(int cw_, int turns) : cw(cw_) {
    if (ON && cw == 1 && turns > 0) named_arrive(BAR_TURN + 0, 256);
  }
  __device__ __forceinline__ void begin() {
    if (ON) named_sync(BAR_TURN + cw, 256);
  }
  // last: this was the warpgroup's last turn (the caller counts them: no register kept for it).
  __device__ __forceinline__ void end(bool last) {
    if (ON && (cw == 0 || !last)) named_arrive(BAR_TURN + 1 - cw, 256);
  }
};

// 2^x by the MUFU unit (ex2.approx.ftz: subnormal results flush to 0, exp2(-inf) = 0); exp2f adds
// a range check and two multiplies a call, in the loop the softmax is bound by.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Lane 0 of each warp arrives once the whole warp is done with a stage's tile.
__device__ __forceinline__ void release(u32 bar, int lane) {
  __syncwarp();
  if (lane == 0) mbar_arrive(bar);
}

// S (64 x BN, the accumulator layout) = the warpgroup's 64 Q rows x the K tile, both from shared.
// The descriptors of a tile's k16 steps differ from its first only in the start address (bits 0-13,
// in 16-byte units), and shared addresses stay under 2^18 bytes: a step's descriptor is the first
// plus a constant, with no carry out of the field (one add, not the masks and shifts of sw128_desc).
template <typename T, int D, int BN>
__device__ __forceinline__ void issue_qk(float* sacc, u32 q_rows, u32 sk) {
  const u64 da0 = sw128_desc(q_rows, 16, 1024), db0 = sw128_desc(sk, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const u32 koff = (kk % 4) * 32u;  // k16 step within a 128-byte row: 32 bytes
    const u64 da = da0 + (((kk / 4) * (128 * 128) + koff) >> 4);
    const u64 db = db0 + (((kk / 4) * (BN * 128) + koff) >> 4);
    wgmma_ss<T, BN>(sacc, da, db, kk > 0);
  }
}

// O += P V (O = P V with acc 0: a new item's first tile, without writing O first, which made ptxas
// serialize the MMAs): P from registers (k16 step j = the n8 blocks 2j, 2j+1 of S), V from shared.
template <typename T, int D, int BN>
__device__ __forceinline__ void issue_pv(float* o, const u32 (*p)[4], u32 sv, int acc = 1) {
  // Keys 16j .. 16j+15: two 8-row atoms (SBO 1024 B); head_dim blocks of 64 at LBO.
  const u64 db0 = sw128_desc(sv, BN * 128, 1024);
#pragma unroll
  for (int j = 0; j < BN / 16; ++j) wgmma_rs<T, D>(o, p[j], db0 + ((j * 2048) >> 4), j > 0 || acc);
}

// How far (log2 units) a tile's max may pass the running max before the running max moves. Below
// it the old max stays: the tile's probabilities reach at most 2^8 (exact in T and in the float
// sums), corr is exactly 1, and the output, normalised by the sum taken against the same max, is
// unchanged; O's rescale is then skipped where no row of the warp moved (rescale_if_moved).
constexpr float MAX_SLACK_LOG2 = 8.f;

// Masks a tile's scores (MASK: keys past kv_end, or past the row's query position), folds them into
// the running max and sum (log2 domain, scaled), and leaves the probabilities in sacc; corr is the
// factor the running output must be scaled by before this tile's P V is added. The max and the sum
// run as four independent chains each (a serial chain of 64 adds is latency the warp waits out).
template <int BN, bool MASK>
__device__ __forceinline__ void softmax_tile(float* sacc, float* m_run, float* l_run, float* corr, int tile0,
                                             int kv_end, const int* qpos, int lane, float scale_log2) {
  constexpr int CHAINS = 4;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float mxs[CHAINS];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) mxs[c] = -INFINITY;
#pragma unroll
    for (int nb = 0; nb < BN / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float x = sacc[nb * 4 + hf * 2 + e];
        if (MASK) {
          const int j = tile0 + nb * 8 + 2 * (lane % 4) + e;
          if (j >= kv_end || j > qpos[hf]) x = -INFINITY;
        }
        sacc[nb * 4 + hf * 2 + e] = x;
        mxs[(2 * nb + e) % CHAINS] = fmaxf(mxs[(2 * nb + e) % CHAINS], x);
      }
    }
    float mx = fmaxf(fmaxf(mxs[0], mxs[1]), fmaxf(mxs[2], mxs[3]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_tile = mx * scale_log2;  // scale_log2 > 0: the max commutes
    // -inf + slack is -inf: the first tile with a finite score always sets the max.
    const float m_new = m_tile > m_run[hf] + MAX_SLACK_LOG2 ? m_tile : m_run[hf];
    const float mb = m_new == -INFINITY ? 0.f : m_new;
    corr[hf] = m_new == m_run[hf] ? 1.f : fast_exp2(m_run[hf] - mb);
    float rss[CHAINS] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int nb = 0; nb < BN / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = fast_exp2(fmaf(sacc[nb * 4 + hf * 2 + e], scale_log2, -mb));
        sacc[nb * 4 + hf * 2 + e] = p;
        rss[(2 * nb + e) % CHAINS] += p;
      }
    }
    l_run[hf] = l_run[hf] * corr[hf] + ((rss[0] + rss[1]) + (rss[2] + rss[3]));
    m_run[hf] = m_new;
  }
}

// The masked body only where a tile needs it (the last tiles of a causal row, a row's partial last
// tile): ptxas turns a runtime mask test inside one body into predicated compares and selects on
// every score of every tile, a third of the consumers' instructions in the main loop. need_mask
// is the same for the whole warpgroup, so the branch does not diverge.
template <int BN>
__device__ __forceinline__ void online_softmax(float* sacc, float* m_run, float* l_run, float* corr,
                                               bool need_mask, int tile0, int kv_end, const int* qpos,
                                               int lane, float scale_log2) {
  if (need_mask) {
    softmax_tile<BN, true>(sacc, m_run, l_run, corr, tile0, kv_end, qpos, lane, scale_log2);
  } else {
    softmax_tile<BN, false>(sacc, m_run, l_run, corr, tile0, kv_end, qpos, lane, scale_log2);
  }
}

// O *= corr by row, skipped where no row of the warp moved its max (the usual case past the first
// tiles, MAX_SLACK_LOG2): the vote keeps the branch uniform, so the warp saves the D / 2 multiplies.
template <int D> __device__ __forceinline__ void rescale_if_moved(float* o, const float* corr) {
  if (!__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) return;
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] *= corr[(i % 4) / 2];
}

// P in T, already in the A-fragment layout of the P V product.
template <typename T, int BN> __device__ __forceinline__ void pack_p(u32 (*p)[4], const float* sacc) {
#pragma unroll
  for (int j = 0; j < BN / 16; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) p[j][i] = pack2<T>(sacc[8 * j + 2 * i], sacc[8 * j + 2 * i + 1]);
  }
}


// Consumer schedules (the kernel's SCHEDULE, a set of these bits; Sm90Tile.schedule in the glue).
// 0: each warpgroup runs S = Q K^T, softmax, O += P V of a tile back to back, waiting on each GEMM.
// SCHED_OVERLAP: S of tile j+1 and P V of tile j are issued together and the softmax of tile j+1
// runs while P V is in flight (a second score accumulator; the rescale of O waits for P V).
// SCHED_PINGPONG: the two consumer warpgroups take turns issuing their GEMMs (named barriers), so
// one's softmax runs while the tensor cores serve the other's GEMMs.
// SCHED_TMA (the producer, not the consumers): K/V tiles by the tensor memory accelerator.
constexpr int SCHED_OVERLAP = 1;
constexpr int SCHED_PINGPONG = 2;
constexpr int SCHED_TMA = 4;

}  // namespace sgjit

// Registers a thread of each role gets after the split (setmaxnreg). setmaxnreg only moves registers
// within the CTA's own allocation: the CTA starts with LAUNCH_REGS a thread (65536 / 384 rounded down
// to a multiple of 8 = 168, which ptxas gives every instantiation under these launch bounds;
// Sm90Prefill checks it), the producer's .dec puts 128 * (168 - PRODUCER) into the CTA's pool, and
// each consumer warp's .inc spins until it can take 32 * (CONSUMER - 168) from it. A split the pool
// cannot cover leaves a consumer warp in setmaxnreg.inc forever (80 / 216 did: 11264 released,
// 12288 asked). ptxas holds each role's code to its count (it spills past it). The producer's code
// fits 56 registers at D = 128 (not at D = 64, whose copy loop unrolls over more rows): 56 / 224 uses
// the whole pool, for the overlapped schedules at D = 128, which hold the next tile's scores, O and
// this tile's P (read by its P V in flight) at once; the serial schedules keep the 72 / 216 they
// were measured with, and so does D = 64. The TMA producer (one thread issuing a few copies a tile)
// takes the minimum, 24, and the overlapped schedules at D = 128 get the rest: 24 / 240.
constexpr int SM90_THREADS = 384;
constexpr int LAUNCH_REGS = 65536 / SM90_THREADS / 8 * 8;
template <int SCHEDULE, int D> struct RegSplit {
  static constexpr bool WIDE = (SCHEDULE & SCHED_OVERLAP) && D == 128;
  static constexpr bool TMA = (SCHEDULE & SCHED_TMA) != 0;
  static constexpr int PRODUCER = TMA ? 24 : WIDE ? 56 : 72;
  static constexpr int CONSUMER = WIDE ? (TMA ? 240 : 224) : 216;
  static_assert(128 * PRODUCER + 256 * CONSUMER <= SM90_THREADS * LAUNCH_REGS,
                "setmaxnreg split larger than the CTA's registers: consumers would wait forever");
};


// One work item of the kernel: a CTA's 128 packed rows (row, m tile) of one kv head, over one split
// of the row's keys. The host lists the (row, m tile) pairs heaviest first; work index w reads as
// kv head (fastest), then pair, then split: the order a grid of one CTA an item would run them in.
struct WorkItem {
  int row, h, split;
  int qo_start, q_len, kv_len;
  int pr0;                         // first packed row (token pr0 / G)
  int kv_begin, kv_end, kv_stop;   // the split's keys, and where its last query position stops them
  int num_tiles;
};
template <int BM, int BN, int G>
__device__ __forceinline__ WorkItem work_item(int w, const int* __restrict__ work, const int* __restrict__ qo_indptr,
                                              const int* __restrict__ kv_lens, int hkv, int items, int num_splits) {
  WorkItem it;
  it.h = w % hkv;
  const int pair = (w / hkv) % items;
  it.split = w / hkv / items;
  it.row = work[2 * pair];
  const int mt = work[2 * pair + 1];
  it.qo_start = qo_indptr[it.row];
  it.q_len = qo_indptr[it.row + 1] - it.qo_start;
  it.kv_len = kv_lens[it.row];
  it.pr0 = mt * BM;  // < q_len * G: the host lists only m tiles with rows
  // Keys this item covers: its split of the row, cut at the last query position of its rows.
  const int pos_last = it.kv_len - it.q_len + min(it.q_len - 1, (it.pr0 + BM - 1) / G);
  const int chunk = ((it.kv_len + num_splits - 1) / num_splits + BN - 1) / BN * BN;
  it.kv_begin = it.split * chunk;
  it.kv_end = min(it.kv_len, it.kv_begin + chunk);
  it.kv_stop = min(it.kv_end, pos_last + 1);
  it.num_tiles = it.kv_stop > it.kv_begin ? (it.kv_stop - it.kv_begin + BN - 1) / BN : 0;
  return it;
}

// The CTA's k-th work index. A grid of one CTA an item takes one each; a persistent grid (a CTA a
// SM) walks the list in rounds of gridDim.x, snaking (even rounds left to right, odd ones right to
// left) so that over a list sorted heaviest first each CTA's sum of work comes out even.
__device__ __forceinline__ int work_index(int k) {
  const int p = (k & 1) ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  return k * gridDim.x + p;
}

template <typename T, int D, int G, int PAGE, int BN, int STAGES, int SCHEDULE>
__global__ void __launch_bounds__(SM90_THREADS, 1)
    attention_sm90_kernel(const T* __restrict__ q, i64 q_stride, const T* __restrict__ k_cache,
                          const T* __restrict__ v_cache, const int* __restrict__ page_table, int pt_stride,
                          const int* __restrict__ qo_indptr, const int* __restrict__ kv_lens,
                          const int* __restrict__ work, int items, int num_splits, T* __restrict__ out,
                          float* __restrict__ part_o, float* __restrict__ part_lse, int num_tokens, int hkv,
                          float scale_log2, const void* tmaps, int layer) {
  constexpr int BM = 128;                  // packed rows per CTA: 64 per consumer warpgroup
  constexpr int CPR = D / 8;               // 16-byte chunks per row
  constexpr int PSTEPS = BN / 16;          // k16 steps of O += P V
  constexpr int ROWS_PER_PASS = 128 / CPR; // rows the producer warpgroup copies at once
  constexpr u32 Q_BYTES = BM * D * 2;
  constexpr u32 TILE_BYTES = BN * D * 2;
  constexpr int TILE_PAGES = BN / PAGE > 1 ? BN / PAGE : 1;  // pages one key tile spans
  constexpr bool OVERLAP = (SCHEDULE & SCHED_OVERLAP) != 0;
  constexpr bool PINGPONG = (SCHEDULE & SCHED_PINGPONG) != 0;
  constexpr bool TMA = (SCHEDULE & SCHED_TMA) != 0;
  // TMA: one box a page (or the tile's part of a page bigger than the tile) and 64-column block,
  // BOX_ROWS rows of 128 bytes. The hardware swizzles a box by its shared address (16-byte chunk
  // XOR address bits 7-9), which is sw128_off's chunk XOR row % 8 only where every box starts on
  // a 1024-byte atom: BOX_ROWS a multiple of 8. Pages smaller than a tile also have the run maps
  // (attention_sm90.py builds them exactly then), which read (page, slot) as one dimension.
  constexpr int BOX_ROWS = PAGE < BN ? PAGE : BN;
  constexpr bool RUN_MAPS = TMA && TILE_PAGES > 1;
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(BN == 64 || BN == 128, "64 or 128 keys a tile");
  static_assert(STAGES >= 2, "a ring of at least two stages");
  static_assert((PAGE & (PAGE - 1)) == 0 && TILE_PAGES <= 32, "page size a power of two, >= BN / 32");
  static_assert(SCHEDULE >= 0 && SCHEDULE <= (SCHED_OVERLAP | SCHED_PINGPONG | SCHED_TMA), "unknown schedule");
  static_assert(!TMA || BOX_ROWS % 8 == 0, "TMA boxes of whole 8-row swizzle atoms: pages of >= 8 slots");

  extern __shared__ unsigned char smem_raw[];
  const u32 base = (smem_addr(smem_raw) + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment
  const u32 sq = base;
  const u32 sring = base + Q_BYTES;  // stage s: K tile at sring + 2 s TILE_BYTES, V tile after it
  const u32 bars = sring + STAGES * 2 * TILE_BYTES;
  auto full_k = [&](int s) { return bars + 8u * s; };
  auto full_v = [&](int s) { return bars + 8u * (STAGES + s); };
  auto empty_k = [&](int s) { return bars + 8u * (2 * STAGES + s); };
  auto empty_v = [&](int s) { return bars + 8u * (3 * STAGES + s); };

  const int tid = threadIdx.x, wg = tid / 128, lt = tid % 128;
  const int hq = hkv * G;
  const int total_work = hkv * items * num_splits;
  auto item_at = [&](int k) { return work_item<BM, BN, G>(work_index(k), work, qo_indptr, kv_lens, hkv, items, num_splits); };
  auto has_item = [&](int k) { return work_index(k) < total_work; };

  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      // cp.async: one arrival per producer thread, when its copies land (.noinc arrivals do not
      // raise the expected count, so these 128 are the whole of each phase). TMA: the issuing
      // thread's one arrival with the tile's bytes, then the copies' bytes.
      mbar_init(full_k(s), TMA ? 1 : 128);
      mbar_init(full_v(s), TMA ? 1 : 128);
      // One arrival per consumer warp for every tile, also from a warpgroup whose rows skip it
      // (causal, or no rows at all): the producer waits for all 8 before refilling K (V) of the
      // stage. A warp arrives for a tile only after waiting for that tile's full barrier, which
      // completes only once the producer saw the stage's previous phase complete: an early
      // warp cannot complete a phase for a late one.
      mbar_init(empty_k(s), 8);
      mbar_init(empty_v(s), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // Both roles walk the same items and count the ring's fills across them: fill f of the CTA goes to
  // stage f % STAGES, phase f / STAGES. The producer runs ahead into the next item's tiles while the
  // consumers finish the last ones of this item.
  if (wg == 0) {
    // ---- producer: K and V tiles of the rows' pages -> the ring ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(RegSplit<SCHEDULE, D>::PRODUCER));
    if (TMA && lt >= 32) return;  // TMA: one warp reads the page table and issues the copies
    const int part = lt % CPR, tok0 = lt / CPR, lane = lt % 32;
    const u64 kmap = reinterpret_cast<u64>(tmaps), vmap = kmap + 128;  // K's map, then V's
    if (TMA && lane == 0) {
      tensormap_acquire(kmap);
      tensormap_acquire(vmap);
      if (RUN_MAPS) {  // the run maps follow
        tensormap_acquire(kmap + 2 * 128);
        tensormap_acquire(vmap + 2 * 128);
      }
    }
    int fills = 0;
    for (int k = 0; has_item(k); ++k) {
      const WorkItem it = item_at(k);
      const int* pages = page_table + (i64)it.row * pt_stride;
      // TMA copies whole pages (or the tile's part of one), so it also loads keys at and past kv_stop
      // that cp.async zero-fills: the rest of the item's last page as the pool holds it, and for the
      // tile's pages past that page, the last page again (a valid page of the row: never a table
      // entry past the row's pages, nor a page no row owns). No consumer reads those keys but
      // through the softmax, which masks every key past kv_stop for every row (past kv_end, or past
      // pos_last, the item's last query position, so past each row's own) to P = 0 exactly, and the
      // P V product then adds 0 x V. Rows without a query (Q zero) get S = 0 and are never written.
      // Both assume finite pool values (garbage x 0 = 0; NaN or Inf x 0 is NaN): the pool is zeroed
      // at allocation and written only by the kernels, with finite values of a finite model.
      const int last_page = (it.kv_stop - 1) / PAGE;
      for (int t = 0; t < it.num_tiles; ++t, ++fills) {
        const int s = fills % STAGES, empty_parity = ((fills / STAGES) + 1) & 1;
        const bool refill = fills >= STAGES;
        const int tile0 = it.kv_begin + t * BN;
        // The tile's pages (tile0 is a multiple of BN, so it spans max(1, BN / PAGE) of them), one
        // lane each, looked up before the stage frees up; each copy takes its page by shuffle.
        const int first_page = tile0 / PAGE;
        int lane_page = 0;
        if (TMA && lane < TILE_PAGES) lane_page = pages[min(first_page + lane, last_page)];
        if (!TMA && lane < TILE_PAGES && (first_page + lane) * PAGE < it.kv_stop) lane_page = pages[first_page + lane];
        // Where the tile's pages are consecutive ids, one box a 64-column block through the run
        // maps (slots of consecutive pages are consecutive rows).
        const int page0 = __shfl_sync(0xffffffffu, lane_page, 0);
        const bool run = RUN_MAPS && __all_sync(0xffffffffu, lane >= TILE_PAGES || lane_page == page0 + lane);
#pragma unroll
        for (int kv = 0; kv < 2; ++kv) {
          // The overlapped schedule frees K (after Q K^T) a softmax before V (after P V), and each is
          // refilled once freed. The serial ones free both at once and the producer waits for both
          // before K: a warpgroup that skips a tile arrives after waiting for its K alone, so its
          // arrival must not count towards V's previous phase.
          if (refill && kv == 0) mbar_wait(empty_k(s), empty_parity, WAIT_EMPTY_K, fills);
          if (refill && kv == (OVERLAP ? 1 : 0)) mbar_wait(empty_v(s), empty_parity, WAIT_EMPTY_V, fills);
          const u32 full = kv == 0 ? full_k(s) : full_v(s);
          const u32 dst = sring + (2 * s + kv) * TILE_BYTES;
          if constexpr (TMA) {
            // Box (64 columns, head h, BOX_ROWS slots from slot0, one page, the layer) -> rows
            // j * BOX_ROWS.. of column block hf: TILE_PAGES * BOX_ROWS = BN rows, D / 64 blocks,
            // TILE_BYTES in all, announced before the copies that count them.
            if (lane == 0) mbar_arrive_expect_tx(full, TILE_BYTES);
            const u64 map = kv == 0 ? kmap : vmap;
            const int slot0 = tile0 & (PAGE - 1);  // 0 unless a page holds more than one tile
            if (run) {
              if (lane == 0) {
#pragma unroll
                for (int hf = 0; hf < D / 64; ++hf) {
                  tma_load_4d(dst + hf * (BN * 128), map + 2 * 128, full, hf * 64, it.h, page0 * PAGE, layer);
                }
              }
            } else {
              // A box a page, each lane issuing its own page's (after lane 0 announced the bytes).
              __syncwarp();
              if (lane < TILE_PAGES) {
#pragma unroll
                for (int hf = 0; hf < D / 64; ++hf) {
                  tma_load_5d(dst + hf * (BN * 128) + lane * (BOX_ROWS * 128), map, full, hf * 64, it.h, slot0,
                              lane_page, layer);
                }
              }
            }
          } else {
            const T* cache = kv == 0 ? k_cache : v_cache;
#pragma unroll 8
            for (int j = 0; j < BN / ROWS_PER_PASS; ++j) {
              const int tok = tok0 + j * ROWS_PER_PASS;
              const int pos = tile0 + tok;
              const bool ok = pos < it.kv_stop;
              const int page = __shfl_sync(0xffffffffu, lane_page, pos / PAGE - first_page);
              const i64 off = ok ? (((i64)page * PAGE + (pos & (PAGE - 1))) * hkv + it.h) * D + part * 8 : 0;
              cp_async16(dst + sw128_off<BN>(tok, part), cache + off, ok ? 16 : 0);
            }
            mbar_arrive_on_copies(full);
          }
        }
      }
    }
    if constexpr (TMA) {
      // The CTA must not end with copies still landing in its shared memory: wait for each stage's
      // last fill (the consumers wait for every fill too; this keeps that out of their hands).
      for (int s = 0; s < STAGES && s < fills; ++s) {
        const int f_last = s + (fills - 1 - s) / STAGES * STAGES;
        mbar_wait(full_k(s), (f_last / STAGES) & 1, WAIT_FULL_K, f_last);
        mbar_wait(full_v(s), (f_last / STAGES) & 1, WAIT_FULL_V, f_last);
      }
    } else {
      asm volatile("cp.async.wait_all;\n" ::: "memory");
    }
    return;
  }

  // ---- consumers: warpgroup cw owns packed rows cw * 64 .. cw * 64 + 63 of each item ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(RegSplit<SCHEDULE, D>::CONSUMER));
  const int cw = wg - 1, warp = lt / 32, lane = lt % 32;
  const u32 q_rows = sq + cw * 64 * 128;
  auto stage_k = [&](int s) { return sring + 2 * s * TILE_BYTES; };

  // The warpgroup's Q rows of an item -> shared (zero past the row's queries), asynchronously, once
  // the last MMA that reads the previous item's Q is done; wait_q makes them visible to the async
  // proxy before any MMA. A fixed trip count, not unrolled (ptxas would keep each copy's address
  // live through the main loop, and spill).
  auto load_q = [&](int k) {
    named_sync(BAR_Q + cw, 128);  // every warp of the warpgroup is past its MMAs on the old Q
    if (!has_item(k)) return;
    const WorkItem it = item_at(k);
#pragma unroll 1
    for (int j = 0; j < 64 * CPR / 128; ++j) {
      const int c = warp * 32 + lane + j * 128;
      const int r = cw * 64 + c / CPR, part = c % CPR;
      const int pr = it.pr0 + r, i = pr / G;
      const bool ok = i < it.q_len;
      const T* src = ok ? q + (i64)(it.qo_start + i) * q_stride + (it.h * G + pr % G) * D + part * 8 : q;
      cp_async16(sq + sw128_off<BM>(r, part), src, ok ? 16 : 0);
    }
    cp_async_commit();
  };
  auto wait_q = [&] {
    cp_async_wait<0>();
    fence_proxy_async();
    named_sync(BAR_Q + cw, 128);
  };

  // What the main loop needs of item k: this thread's rows' query positions (rows r and r + 8 of its
  // warp's 16, the wgmma accumulator layout), the warpgroup's first and last, the item's keys.
  struct Rows {
    int qpos[2], wg_pos_first, wg_pos_last, kv_begin, kv_end, num_tiles;
  };
  auto rows_of = [&](int k) {
    const WorkItem it = item_at(k);
    Rows r;
    const int r_cta = cw * 64 + warp * 16 + lane / 4;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = (it.pr0 + r_cta + 8 * hf) / G;
      r.qpos[hf] = i < it.q_len ? it.kv_len - it.q_len + i : -1;
    }
    const int wg_tok_first = (it.pr0 + cw * 64) / G;
    r.wg_pos_first = it.kv_len - it.q_len + wg_tok_first;
    r.wg_pos_last =
        wg_tok_first < it.q_len ? it.kv_len - it.q_len + min(it.q_len - 1, (it.pr0 + cw * 64 + 63) / G) : -1;
    r.kv_begin = it.kv_begin, r.kv_end = it.kv_end, r.num_tiles = it.num_tiles;
    return r;
  };
  // Tiles past the warpgroup's first query position (or a split's end) take the masked softmax.
  auto need_mask = [&](const Rows& r, int tile0) { return __all_sync(0xffffffffu, tile0 + BN > r.kv_end || tile0 + BN - 1 > r.wg_pos_first); };

  // ---- an item's output: row sums across the quad, normalise, write (or the split's partial result) ----
  auto finish = [&](int k, const float* o, const float* m_run, const float* l_run) {
    const WorkItem it = item_at(k);
    const int r_cta = cw * 64 + warp * 16 + lane / 4;
    const bool split_out = num_splits > 1;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float l = l_run[hf];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int pr = it.pr0 + r_cta + 8 * hf, i = pr / G;
      if (i >= it.q_len) continue;
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const i64 head_row = (i64)(it.qo_start + i) * hq + it.h * G + pr % G;
#pragma unroll
      for (int db = 0; db < D / 8; ++db) {
        const int d = db * 8 + 2 * (lane % 4);
        const float v0 = o[db * 4 + hf * 2] * inv, v1 = o[db * 4 + hf * 2 + 1] * inv;
        if (split_out) {
          *reinterpret_cast<float2*>(part_o + ((i64)it.split * num_tokens * hq + head_row) * D + d) =
              make_float2(v0, v1);
        } else {
          *reinterpret_cast<u32*>(out + head_row * D + d) = pack2<T>(v0, v1);
        }
      }
      if (split_out && lane % 4 == 0) {
        part_lse[(i64)it.split * num_tokens * hq + head_row] = l > 0.f ? m_run[hf] + log2f(l) : -INFINITY;
      }
    }
  };

  float o[D / 2];
  float m_run[2], l_run[2], sacc[BN / 2], corr[2];
  u32 p[PSTEPS][4];
  auto reset = [&] {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    m_run[0] = m_run[1] = -INFINITY;
    l_run[0] = l_run[1] = 0.f;
  };

  if constexpr (!OVERLAP) {
    // Item by item. A warpgroup skips the tiles past its last row, except under SCHED_PINGPONG: there
    // both run every tile of the CTA (masking covers rows that end before it), two turns a tile (Q K^T,
    // then P V), and no MMA sits on a path ptxas must treat as divergent (it serializes them then).
    load_q(0);
    int used = 0;  // ring fills consumed by earlier items
    for (int k = 0; has_item(k); ++k) {
      wait_q();
      const Rows r = rows_of(k);
      reset();
      Turns<PINGPONG> turns(cw, 2 * r.num_tiles);
      for (int t = 0; t < r.num_tiles; ++t) {
        const int f = used + t, s = f % STAGES, parity = (f / STAGES) & 1;
        const int tile0 = r.kv_begin + t * BN;
        const u32 sk = stage_k(s), sv = sk + TILE_BYTES;
        const bool active = PINGPONG || tile0 <= r.wg_pos_last;
        mbar_wait(full_k(s), parity, WAIT_FULL_K, f);
        if (!TMA && active) fence_proxy_async();  // cp.async wrote the tile by the generic proxy; TMA need not
        turns.begin();
        if (active) {
          wgmma_fence();
          issue_qk<T, D, BN>(sacc, q_rows, sk);
          wgmma_commit();
        }
        turns.end(false);
        if (active) {
          wgmma_wait<0>();
          pin<BN / 2>(sacc);
          online_softmax<BN>(sacc, m_run, l_run, corr, need_mask(r, tile0), tile0, r.kv_end, r.qpos, lane, scale_log2);
          rescale_if_moved<D>(o, corr);
          pack_p<T, BN>(p, sacc);
          mbar_wait(full_v(s), parity, WAIT_FULL_V, f);
          if (!TMA) fence_proxy_async();
        }
        turns.begin();
        if (active) {
          wgmma_fence();
          issue_pv<T, D, BN>(o, p, sv);
          wgmma_commit();
        }
        turns.end(t == r.num_tiles - 1);
        if (active) {
          wgmma_wait<0>();
          pin<D / 2>(o);
        }
        release(empty_k(s), lane);
        release(empty_v(s), lane);
      }
      used += r.num_tiles;
      load_q(k + 1);
      finish(k, o, m_run, l_run);
    }
  } else {
    // One flat loop over the tiles of all the CTA's items, fill f of the ring being tile f of the
    // walk (a loop nested in an item loop made ptxas build the MMA descriptors outside the uniform
    // registers: ~60 more instructions a tile). Both warpgroups run every tile (masking covers rows
    // that end before it), so their turns pair up, one a fill after the first; each issues Q K^T of
    // fill f with P V of fill f - 1, also where f starts a new item: that item's Q was loaded once the
    // old item's last Q K^T was done, its softmax starts afresh, and the old item's output is written
    // once its last P V is.
    int fills = 0;  // every item of a persistent walk has keys (the host splits no rows then)
    for (int k = 0; has_item(k); ++k) fills += item_at(k).num_tiles;
    Turns<PINGPONG> turns(cw, fills > 0 ? fills - 1 : 0);
    int k = 0;
    Rows r = rows_of(0);
    int item_start = 0;  // the item's first fill
    load_q(0);
    wait_q();
    reset();
    if (fills > 0) {
      mbar_wait(full_k(0), 0, WAIT_FULL_K, 0);
      if (!TMA) fence_proxy_async();
      wgmma_fence();
      issue_qk<T, D, BN>(sacc, q_rows, stage_k(0));
      wgmma_commit();
      wgmma_wait<0>();
      pin<BN / 2>(sacc);
      release(empty_k(0), lane);
      if (r.num_tiles == 1) load_q(1);
      online_softmax<BN>(sacc, m_run, l_run, corr, need_mask(r, r.kv_begin), r.kv_begin, r.kv_end, r.qpos, lane,
                         scale_log2);
      pack_p<T, BN>(p, sacc);  // O is still zero: no rescale
    }
    bool fresh = false;  // the P V to issue is its item's first
    for (int f = 1; f < fills; ++f) {
      const int s = f % STAGES, parity = (f / STAGES) & 1;
      const int sp = (f - 1) % STAGES, parity_p = ((f - 1) / STAGES) & 1;
      const bool first = __all_sync(0xffffffffu, f == item_start + r.num_tiles);  // f starts item k + 1
      float m_old[2], l_old[2];
      if (first) {
        m_old[0] = m_run[0], m_old[1] = m_run[1], l_old[0] = l_run[0], l_old[1] = l_run[1];
        m_run[0] = m_run[1] = -INFINITY;
        l_run[0] = l_run[1] = 0.f;
        ++k;
        item_start = f;
        r = rows_of(k);
        wait_q();
      }
      const int tile0 = r.kv_begin + (f - item_start) * BN;
      mbar_wait(full_k(s), parity, WAIT_FULL_K, f);
      mbar_wait(full_v(sp), parity_p, WAIT_FULL_V, f - 1);
      if (!TMA) fence_proxy_async();
      turns.begin();
      wgmma_fence();  // after the last writes of O (rescale) and P (pack)
      issue_qk<T, D, BN>(sacc, q_rows, stage_k(s));
      wgmma_commit();
      issue_pv<T, D, BN>(o, p, stage_k(sp) + TILE_BYTES, !fresh);
      wgmma_commit();
      turns.end(f == fills - 1);
      wgmma_wait<1>();  // S of fill f; P V of fill f - 1 may still run
      pin<BN / 2>(sacc);
      release(empty_k(s), lane);
      if (__all_sync(0xffffffffu, f == item_start + r.num_tiles - 1)) load_q(k + 1);  // the item's last Q K^T is done
      online_softmax<BN>(sacc, m_run, l_run, corr, need_mask(r, tile0), tile0, r.kv_end, r.qpos, lane, scale_log2);
      pin<BN / 2>(sacc);  // the softmax stays ahead of the wait below
      wgmma_wait<0>();
      pin<D / 2>(o);
      release(empty_v(sp), lane);
      if (first) {
        finish(k - 1, o, m_old, l_old);  // O's next P V starts it afresh (fresh)
      } else {
        rescale_if_moved<D>(o, corr);
      }
      fresh = first;
      pack_p<T, BN>(p, sacc);
    }
    if (fills > 0) {
      const int f = fills - 1, sp = f % STAGES, parity_p = (f / STAGES) & 1;
      mbar_wait(full_v(sp), parity_p, WAIT_FULL_V, f);
      if (!TMA) fence_proxy_async();
      wgmma_fence();
      issue_pv<T, D, BN>(o, p, stage_k(sp) + TILE_BYTES, !fresh);
      wgmma_commit();
      wgmma_wait<0>();
      pin<D / 2>(o);
      release(empty_v(sp), lane);
    }
    if (has_item(0)) finish(k, o, m_run, l_run);
  }
}

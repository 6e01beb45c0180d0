// Our typed layer over the sm90 (Hopper) PTX: the bulk async copy engine (reduce-add, TMA tensor
// loads, multicast to a cluster), mbarriers (also another CTA's of the cluster), cluster barriers,
// wgmma (descriptors, fences, groups), stmatrix, setmaxnreg and named barriers.
// Names say who runs them: thread_* per thread, warp_* all 32 lanes of a warp, warpgroup_* all 128
// threads of a warpgroup (4 consecutive warps starting at a multiple of 4). The wgmma instructions
// themselves (one per N) are generated into wgmma.cuh. tests/gpu/ptx_test.cu checks each wrapper on
// the GPU.
// Facts and sources: shared/design/kernel-primer.md section 2.
#pragma once

#include <cstdint>

#include "cuda/ptx/sm80.cuh"  // smem_addr, align_shared_1024

namespace flashattn::cuda::ptx {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// Shared-memory writes made by ordinary stores become visible to the async proxy (bulk copies,
// TMA, wgmma) only after this fence (then a barrier orders the other threads).
__device__ __forceinline__ void thread_fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// gmem[i] += smem[i] for `bytes` / 4 floats, performed by the copy engine (one instruction instead
// of one atomic per element). Both addresses 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void thread_bulk_reduce_add_f32(float* gmem, const float* smem, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem),
               "r"(smem_addr(smem)), "r"(bytes)
               : "memory");
}

// Turns between CTAs on the Hopper path (its ordered dQ additions, bulk reductions at d <= 128): as
// in sm80.cuh, with the async proxy (bulk reductions this thread issues next) ordered after the
// wait, and this thread's completed bulk operations covered by the pass. The wait keeps its own
// loop rather than calling sm80.cuh's thread_wait_turn: built on that, the Hopper kernels compiled
// differently, and racecheck once reported hazards in the d = 256 ordered kernel (2026-12-02).
__device__ __forceinline__ void thread_wait_turn_bulk(const int* turn, int value) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(turn) : "memory");
  } while (seen != value);
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
// The pass: the fence and a relaxed add form the release pattern (a release add after the fence
// was a second MEMBAR.GPU in the machine code, on the deterministic backward's chain of turns).
__device__ __forceinline__ void thread_pass_turn_bulk(int* turn) {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
  asm volatile("red.relaxed.gpu.global.add.s32 [%0], 1;\n" ::"l"(turn) : "memory");
}

__device__ __forceinline__ void thread_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until this thread's committed bulk operations have finished READING shared memory (so it
// may be overwritten); their global writes may still be in flight.
__device__ __forceinline__ void thread_bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// As above, but returns while at most N of the most recently committed groups are still reading
// (so the buffer of an older group may be refilled while the newest is in flight).
template <int N>
__device__ __forceinline__ void thread_bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// Waits until this thread's committed bulk operations have completed, global writes included.
__device__ __forceinline__ void thread_bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// ---- mbarrier: arrival counts plus expected transaction bytes -------------------------------
// A phase completes when `count` threads arrived and every expected byte landed; waiting on
// parity P returns once the phase with that parity has completed (a fresh barrier is in phase 0,
// so waiting on parity 1 returns at once: how a producer's first wait on an empty slot passes).

__device__ __forceinline__ void thread_mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// Makes this thread's mbarrier.init visible to the other threads and the async proxy; a CTA-wide
// barrier must follow before anyone uses the barriers.
__device__ __forceinline__ void thread_fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void thread_mbarrier_arrive(uint64_t* bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_addr(bar)) : "memory");
}

// Announces `bytes` more to arrive through the copy engine, and arrives (count 1).
__device__ __forceinline__ void thread_mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(
                   smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void thread_mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      " .reg .pred done;\n"
      "wait_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra wait_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// Copies `bytes` contiguous bytes global -> shared through the copy engine and completes them on
// `bar` (announced with arrive_expect_tx). Both addresses 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void thread_bulk_load(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(smem)),
               "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// ---- TMA: tensor tiles global -> shared through the copy engine -----------------------------

// The map is a __grid_constant__ kernel parameter (its generic address is what the copy engine
// takes). One thread prefetches it before first use.
__device__ __forceinline__ void thread_prefetch_tensormap(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}

// Loads the box at element coordinates (c0 innermost .. c3) into smem and completes `bytes` on
// `bar` (the caller announced them with arrive_expect_tx). Elements outside the tensor read as 0.
__device__ __forceinline__ void thread_tma_load_4d(void* smem, const void* tmap, uint64_t* bar, int c0, int c1, int c2,
                                                   int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_addr(smem)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
      : "memory");
}

// An L2 eviction policy for data read once (streamed K/V): its lines are the first evicted.
__device__ __forceinline__ uint64_t thread_l2_policy_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// thread_tma_load_4d with an L2 cache policy (thread_l2_policy_evict_first).
__device__ __forceinline__ void thread_tma_load_4d_hint(void* smem, const void* tmap, uint64_t* bar, int c0, int c1,
                                                        int c2, int c3, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
      "%3, %4, %5}], [%6], %7;\n" ::"r"(smem_addr(smem)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}

// A 5-D box (c0 innermost .. c4), otherwise as thread_tma_load_4d: the decode kernel's K/V maps
// make a key row's 64-column blocks a dimension of their own, so that one copy brings all of a box's
// blocks.
__device__ __forceinline__ void thread_tma_load_5d(void* smem, const void* tmap, uint64_t* bar, int c0, int c1, int c2,
                                                   int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, "
      "%6}], [%7];\n" ::"r"(smem_addr(smem)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_addr(bar))
      : "memory");
}

// thread_tma_load_5d with an L2 cache policy (thread_l2_policy_evict_first).
__device__ __forceinline__ void thread_tma_load_5d_hint(void* smem, const void* tmap, uint64_t* bar, int c0, int c1,
                                                        int c2, int c3, int c4, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
      "%3, %4, %5, %6}], [%7], %8;\n" ::"r"(smem_addr(smem)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_addr(bar)),
      "l"(policy)
      : "memory");
}

// As thread_tma_load_4d, but the box lands at smem's offset in the shared memory of every CTA of
// the cluster named in cta_mask (bit i: rank i), each completing the bytes on its own mbarrier at
// bar's offset. The receivers announce them on their own barriers; bytes may land before that.
__device__ __forceinline__ void thread_tma_load_4d_multicast(void* smem, const void* tmap, uint64_t* bar, int c0,
                                                             int c1, int c2, int c3, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
      "{%2, %3, %4, %5}], [%6], %7;\n" ::"r"(smem_addr(smem)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar)), "h"(cta_mask)
      : "memory");
}

// ---- thread-block clusters: CTAs that share tiles through each other's shared memory ----------

// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t thread_cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// Every non-exited thread of the cluster's CTAs meets here. Writes before it (mbarrier inits after
// their fence included) are visible cluster-wide after it; a CTA that passes it last before exit
// keeps its shared memory alive for what the others still send it.
__device__ __forceinline__ void thread_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// Arrives (count 1) on the mbarrier at bar's offset in the shared memory of the cluster's CTA of
// rank `cta` (this CTA's own rank arrives locally). A consumer frees a stage with it once its
// wgmma reads of the stage are complete (wgmma.wait_group); the default .release.cta semantics
// suffice for that, as in CUTLASS's cluster pipelines, where .release.cluster costs a GPU-wide
// memory barrier (MEMBAR.ALL.GPU in SASS) per arrival.
__device__ __forceinline__ void thread_mbarrier_arrive_cluster(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n"
      " .reg .b32 remote;\n"
      " mapa.shared::cluster.u32 remote, %0, %1;\n"
      " mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(cta)
      : "memory");
}

#endif

// wgmma and setmaxnreg exist only on the sm_90a target (not plain sm_90, not later archs).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Stores the box at element coordinates (c0 innermost .. c3) from smem (the layout the map's
// swizzle describes) into the tensor; elements outside the tensor are not written. Completion is
// tracked by bulk groups (thread_bulk_commit, thread_bulk_wait_*), in the issuing thread only.
__device__ __forceinline__ void thread_tma_store_4d(const void* tmap, const void* smem, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(tmap)),
               "r"(smem_addr(smem)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

// ---- wgmma: warpgroup matrix multiply-accumulate --------------------------------------------

// A shared-memory matrix descriptor for a tile stored in 128-byte swizzled rows (the layout TMA's
// SWIZZLE_128B writes; the tile base must be 1024-byte aligned, so the base-offset field is 0).
//   K-major (rows of the M/N dimension, 64 16-bit elements of K per 128-byte row):
//       lbo unused, sbo = 1024 (the next group of 8 rows); advance start by 32 B per k16 step.
//   MN-major (rows of K, 64 elements of M/N per 128-byte row):
//       lbo = byte stride between 64-element column blocks, sbo = 1024 (the next 8 K rows);
//       advance start by 2048 B per k16 step.
__device__ __forceinline__ uint64_t make_smem_desc_sw128(const void* start, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  uint64_t d = 0;
  d |= uint64_t((smem_addr(start) & 0x3FFFF) >> 4);
  d |= uint64_t((lbo_bytes & 0x3FFFF) >> 4) << 16;
  d |= uint64_t((sbo_bytes & 0x3FFFF) >> 4) << 32;
  d |= uint64_t(1) << 62;  // 128-byte swizzle
  return d;
}

// Orders this warpgroup's register writes (accumulators, A fragments) before the wgmmas that read
// them; required before the first wgmma of a batch.
__device__ __forceinline__ void warpgroup_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void warpgroup_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed wgmma groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void warpgroup_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// warpgroup_wait<N>, placed in the machine code after the instructions that computed `after`.
// ptxas hoists a wgmma wait to the top of its basic block, ahead of independent work the source
// puts before it: the softmax meant to run while P V is on the tensor cores ran after the P V wait
// in every sm90 kernel (bench/sass_overlap.py). It does not move the wait above a shared-memory
// store, so lane 0 of each warp first stores `after` (a value that depends on all of that work) to
// the warp's own word `warp_slot`, which nothing reads.
template <int N>
__device__ __forceinline__ void warpgroup_wait_after(float after, float* warp_slot) {
  if (threadIdx.x % 32 == 0) asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(smem_addr(warp_slot)), "f"(after) : "memory");
  warpgroup_wait<N>();
}

// Keeps the compiler from moving reads or writes of an accumulator across an asynchronous wgmma
// (it cannot see that the hardware owns the registers until the wait).
template <int N>
__device__ __forceinline__ void thread_pin(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void thread_pin(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// ---- warp specialization --------------------------------------------------------------------

// Moves registers between warpgroups: the producer gives up what it does not need, consumers take
// it. Every warp of the warpgroup executes the same call.
template <int N>
__device__ __forceinline__ void warpgroup_reg_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void warpgroup_reg_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// ---- stmatrix: registers in mma fragment layout -> shared -----------------------------------

// Four 8x8 b16 matrices as they are: register j holds matrix j in the accumulator layout (lane L:
// row L/4, elements 2(L%4) and 2(L%4)+1), and lane L passes the address of row (L & 7) of matrix
// (L >> 3) (8 contiguous b16, 16 bytes): ldmatrix.x4's lane addresses, the other way. One
// instruction for what took four 32-bit stores per lane (the portable backward's P^T and dS^T).
__device__ __forceinline__ void warp_stmatrix_x4(const uint32_t (&r)[4], void* smem_row) {
  uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}

// Four 8x8 b16 matrices, each stored transposed: register j holds matrix j in the accumulator
// layout (lane L: row L/4, elements 2(L%4) and 2(L%4)+1), and lane L passes the address of stored
// row (L & 7) of matrix (L >> 3), i.e. of the matrix's column L & 7 (8 contiguous b16, 16 bytes).
// The backward writes dS^T accumulators as dS rows this way.
__device__ __forceinline__ void warp_stmatrix_x4_trans(const uint32_t (&r)[4], void* smem_row) {
  uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// Named barriers (thread_named_sync and thread_named_arrive, sm80.cuh) done only where `pred`
// holds, as a predicated instruction: no branch for the compiler to treat as divergent (a branch
// around a barrier ahead of wgmma code can make ptxas serialize the wgmmas, C7520).
__device__ __forceinline__ void thread_named_sync_if(bool pred, int id, int threads) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %0, 0;\n @p bar.sync %1, %2;\n}\n" ::"r"(int(pred)), "r"(id),
               "r"(threads)
               : "memory");
}
__device__ __forceinline__ void thread_named_arrive_if(bool pred, int id, int threads) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %0, 0;\n @p bar.arrive %1, %2;\n}\n" ::"r"(int(pred)), "r"(id),
               "r"(threads)
               : "memory");
}

// True in exactly one lane of the (converged) warp.
__device__ __forceinline__ bool warp_elect_one() {
  uint32_t pred = 0;
  asm volatile(
      "{\n"
      " .reg .b32 lane;\n"
      " .reg .pred p;\n"
      " elect.sync lane|p, 0xffffffff;\n"
      " selp.b32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(pred));
  return pred != 0;
}

#endif

}  // namespace flashattn::cuda::ptx

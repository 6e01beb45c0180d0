// The Hopper backward kernel (sm_90a): FlashAttention-3's backward in our own CUDA C++.
//
// A CTA works on one (key tile of kBlockN = 128 keys, KV head, batch) at a time, keeping K_j and V_j
// in shared memory and dK_j, dV_j in registers, and streams the query tiles (kBlockM rows) of every
// query head that shares the KV head, so GQA needs no reduction afterwards. In the default mode the
// CTAs are persistent and draw their next work tile (BwdSchedule, bwd_schedule.cuh). Warp
// specialization:
//   * producer warpgroup, warp 0: one elected thread issues TMA loads of K and V (once per key
//     tile) and, per query step, of Q and dO plus bulk copies of that tile's lse2 and delta rows
//     (the tiled workspace layout of src/cuda/bwd_layout.h) into a ring of stages on mbarriers;
//   * producer warpgroup, warp 1: the dQ writer. Per step it waits for the consumers' fp32 dQ tile
//     in shared memory and adds it to the global accumulator with one bulk reduce-add (the copy
//     engine; no per-element atomics), through kDqBuffers buffers handed over by named barriers;
//   * two consumer warpgroups, 64 keys each. Per step, with the operands in the layout that needs
//     no transposes:
//       S^T = K Q^T and dP^T = V dO^T     (wgmma, both operands in shared memory, N = kBlockM)
//       P^T = exp2(S^T c - lse2), dS^T = P^T o (dP^T - delta) (softcap derivative; the softmax
//                                           scale is applied once to dK and dQ at the end)
//       dV += P^T dO, dK += dS^T Q        (wgmma with P^T, dS^T from registers: the accumulator
//                                           layout is the A-fragment layout; dO, Q MN-major; with
//                                           80-row tiles dS^T from the dS tile in shared memory)
//       dQ = dS K                          (wgmma with dS^T from shared memory read transposed, K
//                                           MN-major; the two warpgroups take turns by step, one
//                                           computing all of it (kDqAlternate); with 80-row tiles
//                                           (the deterministic mode at d = 128), not a multiple of
//                                           wgmma's M, dQ^T = K^T dS^T with dS stored [query][key],
//                                           each warpgroup its 64 columns)
//     dQ leaves in "fragment order": float4 c of every thread's accumulators, then float4 c + 1,
//     so a warp's shared-memory writes are 512 contiguous bytes (conflict-free) and the bulk
//     reduce-add is one contiguous block; the convert kernel (bwd_convert.cuh) knows the order
//     and writes dq rows.
// dK and dV are written once per key tile, straight from the accumulators.
// Determinism: one CTA per work tile; the writer adds a step's dQ tile only when the key tiles whose
//     turn comes before this one's have added theirs, waits for its addition to complete and passes
//     the turn (a counter per dQ tile in the workspace). KeySteps orders the walk and the turns so
//     that key tiles reach each dQ tile in turn order rather than waiting: downward in key-tile
//     order without a right bound, upward from the last key tile down with one, and without a mask
//     (on few enough key tiles) from each key tile's diagonal round.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/block_range.h"
#include "core/params.h"
#include "core/softmax_state.h"
#include "cuda/bwd_common.cuh"
#include "cuda/ptx/sm80.cuh"
#include "cuda/ptx/sm90.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/bwd_schedule.cuh"
#include "cuda/sm90/swizzle.cuh"

namespace flashattn::cuda::sm90 {

template <int kHeadDim_, class Element_, int kBlockM_, int kStages_, int kDqBuffers_, bool kDqAlternate_ = false>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per step
  static constexpr int kBlockN = 128;       // keys per CTA: 64 per consumer warpgroup
  static constexpr int kStages = kStages_;  // Q/dO tiles in flight
  static constexpr int kDqBuffers = kDqBuffers_;
  static constexpr int kThreads = 384;
  static constexpr int kColBlocks = kHeadDim / 64;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;
  static constexpr int kDqBytes = kBlockM * kHeadDim * 4;
  // A 128-row tile's dQ is two M = 64 row blocks (kDqParts), laid out in the writer's buffer by
  // row block (bwd_convert.cuh), as if each warpgroup had computed one; otherwise by columns.
  static constexpr bool kDqSplitRows = kBlockM == 128;
  // A query tile that is not a multiple of wgmma's M = 64 (80 rows) takes dQ^T = K^T dS^T instead:
  // M = the warpgroup's 64 head-dim columns, N = the tile's query rows; dS is then stored
  // [query][key], the K-major B operand.
  static constexpr bool kDqTransposed = kBlockM % 64 != 0;
  // dQ (the whole tile: all kHeadDim columns, and both 64-row blocks of a 128-row tile) computed by
  // one warpgroup per step, the two taking turns (the first on even steps), as cuDNN's kernel does
  // (its SASS, ncu source counters, bench/results/h200_session30_2026-12-04.txt): the other one
  // passes the step's dS barrier and goes straight on to its next step, so the two fall half a step
  // apart and one's elementwise work runs under the other's GEMMs, where in lock-step both waited
  // for their halves of dQ. The tile table says where it runs and what it measured.
  static constexpr bool kDqAlternate = kDqAlternate_;
  static constexpr int kDqN = kDqTransposed ? kBlockM : kHeadDim;
  // M = 64 row blocks of dQ the warpgroup whose turn it is computes per step.
  static constexpr int kDqParts = kDqSplitRows ? 2 : 1;
  // Threads at a dQ buffer's barriers: the warpgroups that store dQ each step, and the writer warp.
  static constexpr int kDqSyncThreads = (kDqAlternate ? 128 : 256) + 32;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  // Named barriers (0 is __syncthreads): dQ buffer full / empty (consumers + writer warp), then
  // the consumers' "dS^T is in shared memory".
  static constexpr int kDqFullBarrier = 1;
  static constexpr int kDqEmptyBarrier = kDqFullBarrier + kDqBuffers;
  static constexpr int kDsBarrier = kDqEmptyBarrier + kDqBuffers;
  // kDqTransposed: each consumer warpgroup's own "my dS is in shared memory" (ids + 0, + 1).
  static constexpr int kOwnDsBarrier = kDsBarrier + 1;
  // Roles that read the producer's drawn tile indices: the consumers and the dQ writer warp.
  static constexpr int kTileReaders = 256 + 32;
  // mbarriers: K/V full and empty, then Q full, dO full, Q/dO empty per stage, then the tile
  // handoff's full and empty (2 slots each) and its two slots.
  static constexpr int kBarrierBytes = 8 * (2 + 3 * kStages + 4) + 8;
  static constexpr int kSmemBytes = 1024 + 2 * kKVBytes + 2 * kStages * kQBytes + 2 * kDsBytes + kDqBuffers * kDqBytes +
                                    2 * kStages * kBlockM * 4 + kBarrierBytes;
  static_assert(kHeadDim % 64 == 0 && kHeadDim <= 128, "dK, dV accumulators: d/2 + d/2 fp32 per thread");
  static_assert(kBlockM == 64 || kBlockM == 80 || kBlockM == 128,
                "query tile (a boundary step's mask is one 64-bit set)");
  static_assert(!kDqTransposed || kHeadDim == 128, "dQ^T: one 64-column block per consumer warpgroup");
  static_assert(kDqAlternate != kDqTransposed, "dQ: in turns on M = 64 row blocks, or transposed");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Boundary steps (a partial query tile, or keys a row must not see): bit i set when accumulator i
// of this thread (key row `key` + 8 ((i >> 1) & 1), query column 8 (i >> 2) + 2t + (i & 1) of the
// tile at query row m0) is visible, from the mask's band around the thread's first element
// (core::MaskBand: a few 32-bit compares per element).
template <int BM>
__device__ __forceinline__ uint64_t visible_set(const core::MaskSpec& mask, int64_t m0, int64_t key, int t) {
  const core::MaskBand band = core::mask_band(mask, m0 + 2 * t, key);
  uint64_t vis = 0;
#pragma unroll
  for (int j = 0; j < BM / 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr)
        if (band.visible(8 * j + e, 8 * rr)) vis |= uint64_t(1) << (4 * j + 2 * rr + e);
  return vis;
}

// The same set from MaskSpec's lo and hi per element (64-bit), as the d = 256 kernel
// (bwd_wide_kernel.cuh) computes it: in its previous version (64 keys per CTA), visible_set made it
// spill more (112 bytes against 60) and run 7-10% slower on the H200, non-causal too
// (bench/ab_compare.py, 2026-12-01); the current one was not tried with it. The two functions agree
// on every input a host check tried (3M random masks, tiles and threads).
template <int BM>
__device__ __forceinline__ uint64_t visible_set_wide(const core::MaskSpec& mask, int64_t m0, int64_t key, int t) {
  uint64_t vis = 0;
#pragma unroll
  for (int j = 0; j < BM / 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t qrow = m0 + 8 * j + 2 * t + e;
      const int64_t lo = mask.lo(qrow), hi = mask.hi(qrow);
#pragma unroll
      for (int rr = 0; rr < 2; ++rr)
        if (qrow < mask.seqlen_q && key + 8 * rr >= lo && key + 8 * rr < hi) vis |= uint64_t(1) << (4 * j + 2 * rr + e);
    }
  return vis;
}

// In a masked step, the elements of the accumulator arrays `xs` (N each) that `vis` hides become 0:
// a pass of its own behind the step's branch (uniform across the CTA), so unmasked steps run no
// per-element select (1.015-1.038x in the d = 256 kernel against a select per element in every
// step, bench/results/h200_session31_2026-12-04.txt, call 7). Rows past the sequence have no lse2
// or delta, so hidden elements are selected to 0, never multiplied.
template <int N, class... Xs>
__device__ __forceinline__ void thread_zero_hidden(bool masked, uint64_t vis, Xs&... xs) {
  if (masked) {
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (!((vis >> i) & 1)) ((xs[i] = 0.f), ...);
  }
}

// This warp's 16 keys of dS^T (dsf: 16-bit pairs in accumulator layout, BM query columns) stored as
// they are, [key][query], in a tile of kRows key rows (one swizzled column block of 64 queries):
// dsf[j] is the 8 x 8 block (keys 8 (j & 1), queries 8 (j >> 1)), four stored per stmatrix; lane L
// addresses key row L & 7 of block 4 q + (L >> 3). key_row0: the warp's first key row in the tile.
template <int kRows, int BM>
__device__ __forceinline__ void warp_store_ds_t(const uint32_t (&dsf)[BM / 4], unsigned char* tile, int key_row0,
                                                int lane) {
  const int jb = lane >> 3;
#pragma unroll
  for (int q = 0; q < BM / 16; ++q)
    ptx::warp_stmatrix_x4(*reinterpret_cast<const uint32_t(*)[4]>(&dsf[4 * q]),
                          tile + swizzled_offset<kRows>(key_row0 + 8 * (jb & 1) + (lane & 7), 16 * q + 8 * (jb >> 1)));
}

// acc = A B^T over the head dim on wgmma, one commit group: A a consumer warpgroup's 64 rows of
// the K or V tile (T::kBlockN rows), B a Q or dO stage (T::kBlockM rows), both K-major: k16 steps
// walk 32 bytes inside a 128-byte row, then the next column block.
template <class T>
__device__ __forceinline__ void warpgroup_product_over_d(float (&acc)[T::kBlockM / 2], uint64_t a_desc,
                                                         uint64_t b_desc) {
  constexpr int BM = T::kBlockM, BN = T::kBlockN;
#pragma unroll
  for (int k = 0; k < T::kHeadDim / 16; ++k) {
    const int cb = k / 4, kk = k % 4;
    ptx::Wgmma<typename T::Element, BM>::template ss<0>(acc, a_desc + uint64_t((cb * BN * 128 + kk * 32) >> 4),
                                                        b_desc + uint64_t((cb * BM * 128 + kk * 32) >> 4),
                                                        k > 0 ? 1 : 0);
  }
  ptx::warpgroup_commit();
}

// acc (N columns) += A B over the step's query rows, A from registers: dV += P^T dO and dK += dS^T
// Q in both kernels (the accumulator layout of P^T, dS^T is wgmma's A-fragment layout), B the dO or
// Q stage MN-major, 16 query rows (2048 bytes) per k16. The caller pins, fences and commits.
template <class T, int N>
__device__ __forceinline__ void warpgroup_issue_acc_rs(float (&acc)[N / 2], const uint32_t (&a)[T::kBlockM / 4],
                                                       uint64_t b_desc) {
#pragma unroll
  for (int k = 0; k < T::kBlockM / 16; ++k)
    ptx::Wgmma<typename T::Element, N>::template rs<1>(acc, *reinterpret_cast<const uint32_t(*)[4]>(&a[4 * k]),
                                                       b_desc + uint64_t((k * 2048) >> 4), 1);
}

// dQ = dS K for `N` columns, one commit group: A = dS^T read transposed from shared memory (M =
// queries, K = the tile's keys), B = K MN-major; both step 16 key rows (2048 bytes) per k16.
template <class T, int N>
__device__ __forceinline__ void warpgroup_issue_dq(float (&dq)[N / 2], uint64_t ds_desc, uint64_t kmn_desc) {
  ptx::thread_pin(dq);
  ptx::warpgroup_fence();
#pragma unroll
  for (int k = 0; k < T::kBlockN / 16; ++k)
    ptx::Wgmma<typename T::Element, N>::template ss<1, 1>(dq, ds_desc + uint64_t((k * 2048) >> 4),
                                                          kmn_desc + uint64_t((k * 2048) >> 4), k > 0 ? 1 : 0);
  ptx::warpgroup_commit();
}

// dQ^T = K^T dS^T for this warpgroup's 64 head-dim columns, one commit group: A = K MN-major (the
// warpgroup's column block; 16 key rows, 2048 bytes, per k16), B = dS stored [query][key] K-major
// (32 bytes inside a 128-byte row, then the next column block of keys).
template <class T>
__device__ __forceinline__ void warpgroup_issue_dq_t(float (&dq)[T::kBlockM / 2], uint64_t kmn_desc,
                                                     uint64_t ds_desc) {
  constexpr int BM = T::kBlockM;
  ptx::thread_pin(dq);
  ptx::warpgroup_fence();
#pragma unroll
  for (int k = 0; k < T::kBlockN / 16; ++k) {
    const int cb = k / 4, kk = k % 4;
    ptx::Wgmma<typename T::Element, BM>::template ss<0, 1>(dq, kmn_desc + uint64_t((k * 2048) >> 4),
                                                           ds_desc + uint64_t((cb * BM * 128 + kk * 32) >> 4),
                                                           k > 0 ? 1 : 0);
  }
  ptx::warpgroup_commit();
}

// dK += dS^T Q for this warpgroup's 64 keys (80-row tiles): A = dS^T read transposed from the
// warpgroup's column block of the [query][key] dS tile at `ds` (16 query rows, 2048 bytes, per
// k16), B = Q MN-major. Joins the caller's commit group (after dV); the caller fences.
template <class T>
__device__ __forceinline__ void warpgroup_issue_dk_t(float (&dk)[T::kHeadDim / 2], const unsigned char* ds, int cwg,
                                                     uint64_t q_mn) {
  constexpr int BM = T::kBlockM;
  const uint64_t ds_desc = ptx::make_smem_desc_sw128(ds + cwg * BM * 128, BM * 128, 1024);
#pragma unroll
  for (int k = 0; k < BM / 16; ++k)
    ptx::Wgmma<typename T::Element, T::kHeadDim>::template ss<1, 1>(dk, ds_desc + uint64_t((k * 2048) >> 4),
                                                                   q_mn + uint64_t((k * 2048) >> 4), 1);
}

// Every consumer thread releases a Q/dO stage after its own reads of it (lse2 and delta too) and
// once the products on it are done: an mbarrier arrive releases the arriving thread's own accesses
// only, and the proxy fence orders those generic reads before the copy engine's next writes.
// `regs`: the registers those products used (accumulators, A fragments), pinned here, after the
// caller's warpgroup_wait, so that the compiler leaves them alone while the wgmmas ran. `empty`:
// the barrier that frees what was read (the d = 256 kernel frees dO and Q apart).
template <class... Regs>
__device__ __forceinline__ void thread_release_stage_at(uint64_t* empty, Regs&... regs) {
  (ptx::thread_pin(regs), ...);
  ptx::thread_fence_proxy_async_smem();
  ptx::thread_mbarrier_arrive(empty);
}
// The same for a ring stage's Q and dO together.
template <class... Regs>
__device__ __forceinline__ void thread_release_stage(const BwdRing& r, int stage, Regs&... regs) {
  thread_release_stage_at(&r.qdo_empty[stage], regs...);
}

// dK (times the softmax scale) and dV of one key tile, written once from a thread's accumulators:
// rows key_a and key_a + 8 of the tile's keys, columns col0 + 8 (i >> 2) + 2t (+1); rows past the
// sequence's keys and columns past the head dim are not written. Keys no query sees get zeros.
template <class E, int N>
__device__ __forceinline__ void thread_store_dk_dv(const core::BackwardParams& p, const BwdCta& cta, int64_t key0,
                                                   int block_n, int key_a, int col0, int t, const float (&dk)[N],
                                                   const float (&dv)[N]) {
  const int keys_valid = int(cta.sk - key0 < block_n ? cta.sk - key0 : block_n);
#pragma unroll
  for (int i = 0; i < N; i += 2) {
    const int row = key_a + 8 * ((i >> 1) & 1);
    const int col = col0 + 8 * (i >> 2) + 2 * t;
    if (row >= keys_valid || col >= p.head_dim) continue;
    const int64_t key = cta.k0 + key0 + row;
    *reinterpret_cast<uint32_t*>(static_cast<E*>(p.dk) + p.dk_s.offset(cta.b, key, cta.hk) + col) =
        ptx::thread_pack2<E>(dk[i] * p.scale, dk[i + 1] * p.scale);
    *reinterpret_cast<uint32_t*>(static_cast<E*>(p.dv) + p.dv_s.offset(cta.b, key, cta.hk) + col) =
        ptx::thread_pack2<E>(dv[i], dv[i + 1]);
  }
}

#endif

template <class T, bool kSoftcap, bool kOrdered>
__global__ void __launch_bounds__(T::kThreads, 1) backward_kernel(const __grid_constant__ BwdParams P) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using E = typename T::Element;
  constexpr int D = T::kHeadDim, BM = T::kBlockM, BN = T::kBlockN, S = T::kStages, NB = T::kDqBuffers;
  const core::BackwardParams& p = P.p;
  const BwdWorkspace& ws = P.ws;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = ptx::align_shared_1024(smem_raw);
  unsigned char* sdS = smem + 2 * T::kKVBytes + 2 * S * T::kQBytes;  // [2]: dS^T, [BN keys][BM queries]
  float* sdQ = reinterpret_cast<float*>(sdS + 2 * T::kDsBytes);       // [NB][BM * D], fragment order
  const BwdRing ring = bwd_ring<T>(smem, sdQ + NB * BM * D);
  __syncthreads();

  const int wg = int(threadIdx.x) / 128;

  if (wg == 0) {
    ptx::warpgroup_reg_dealloc<T::kProducerRegs>();
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    if (warp == 0 && ptx::warp_elect_one()) {
      thread_load_walk<T, kOrdered>(P, ring);
    } else if (warp == 1) {
      // ---- dQ writer ----
      int it = 0;
      for (int j = 0, idx = 0;; ++j) {
        BwdTile tl;
        BwdCta cta;
        if (!read_work_tile<BM, BN, kOrdered>(P, ring, j, idx, &tl, &cta)) break;
        const core::MaskSpec& mask = cta.mask;
        const int64_t n = tl.n;
        if (n >= cta.n_blocks) continue;
        const auto ks = key_steps<BM, BN, kOrdered>(mask, n, cta.group, P.sched.turns);
        if constexpr (kOrdered) {
          // Key tile n adds into query tile m after the key tiles before it (from the first that
          // visits m) and passes the turn once its addition completed. What stands between two key
          // tiles' additions is kept short, and off the consumers' path: the turn is awaited while
          // the consumers compute the step's dQ, and their buffer is released as soon as the
          // reduction has read it, before its global writes complete.
          if (ks.steps > 0) ptx::thread_named_arrive(T::kDqEmptyBarrier + it % NB, T::kDqSyncThreads);
          for (int s = 0; s < ks.steps; ++s, ++it) {
            const int64_t tile = dq_tile(ws, cta, ks, s);
            const int buf = it % NB;
            if (lane == 0) ptx::thread_wait_turn_bulk(ws.dq_turn + tile, ordered_turn<BM, BN>(mask, n, ks.m_of(s), P.sched.turns));
            ptx::thread_named_sync(T::kDqFullBarrier + buf, T::kDqSyncThreads);
            if (lane == 0) {
              ptx::thread_bulk_reduce_add_f32(ws.dq_accum + tile * BM * D, sdQ + buf * BM * D, T::kDqBytes);
              ptx::thread_bulk_commit();
              ptx::thread_bulk_wait_read_all();
            }
            __syncwarp();
            if (s + 1 < ks.steps) ptx::thread_named_arrive(T::kDqEmptyBarrier + (it + 1) % NB, T::kDqSyncThreads);
            if (lane == 0) {
              ptx::thread_bulk_wait_all();
              ptx::thread_pass_turn_bulk(ws.dq_turn + tile);
            }
          }
        } else {
          for (int s = 0; s < ks.steps; ++s, ++it) {
            const int h = cta.hk * cta.group + ks.head(s);
            const int64_t m = ks.m_of(s);
            const int buf = it % NB;
            // The add that last read this buffer (NB steps ago) has finished reading it.
            if (lane == 0) ptx::thread_bulk_wait_read<NB - 1>();
            __syncwarp();
            ptx::thread_named_arrive(T::kDqEmptyBarrier + buf, T::kDqSyncThreads);
            ptx::thread_named_sync(T::kDqFullBarrier + buf, T::kDqSyncThreads);
            if (lane == 0) {
              const int64_t tile = int64_t(h) * ws.tiles_per_head + cta.tile0 + m;
              ptx::thread_bulk_reduce_add_f32(ws.dq_accum + tile * BM * D, sdQ + buf * BM * D, T::kDqBytes);
              ptx::thread_bulk_commit();
            }
          }
        }
      }
      if (lane == 0) ptx::thread_bulk_wait_all();
    }
    return;
  }

  // ---- consumers ----
  ptx::warpgroup_reg_alloc<T::kConsumerRegs>();
  const int cwg = wg - 1;  // keys [64 cwg, 64 cwg + 64) of the tile
  const int tid = int(threadIdx.x) % 128;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int key_a = 64 * cwg + 16 * warp + g;  // this thread's key rows: key_a, key_a + 8
  const float c_log2 = float(core::kLog2e) * (kSoftcap ? p.softcap : p.scale);
  const float tanh_scale = kSoftcap ? p.scale / p.softcap : 0.f;

  // K-major descriptors of this warpgroup's K and V rows (S^T, dP^T: A operands), stepped by
  // constant byte offsets / 16 as in the forward kernel.
  const uint64_t k_desc = ptx::make_smem_desc_sw128(ring.k + cwg * 64 * 128, 16, 1024);
  const uint64_t v_desc = ptx::make_smem_desc_sw128(ring.v + cwg * 64 * 128, 16, 1024);
  // dQ = dS K: A = dS^T read transposed (M = queries, 64 per 128-byte row; of a 128-row tile the
  // row blocks at 0 and BN * 128), B = K MN-major, all its columns; dQ^T = K^T dS^T reads this
  // warpgroup's 64 columns of K as A.
  const uint64_t kmn_desc = ptx::make_smem_desc_sw128(ring.k + (T::kDqAlternate ? 0 : cwg * BN * 128), BN * 128, 1024);

  // Per step `it`: S^T and dP^T into st, dp, each as soon as its query-side tile has landed.
  auto issue_sdp = [&](float(&st)[BM / 2], float(&dp)[BM / 2], int it) {
    const int stage = it % S;
    const uint32_t phase = uint32_t(it / S) & 1u;
    const uint64_t q_desc = ptx::make_smem_desc_sw128(ring.q + stage * T::kQBytes, 16, 1024);
    const uint64_t do_desc = ptx::make_smem_desc_sw128(ring.dout + stage * T::kQBytes, 16, 1024);
    ptx::thread_mbarrier_wait(&ring.q_full[stage], phase);
    ptx::thread_pin(st);
    ptx::thread_pin(dp);
    ptx::warpgroup_fence();
    warpgroup_product_over_d<T>(st, k_desc, q_desc);
    ptx::thread_mbarrier_wait(&ring.do_full[stage], phase);
    warpgroup_product_over_d<T>(dp, v_desc, do_desc);
  };
  // dQ of step `it` to the writer warp's buffer: float4 c of thread tid of warpgroup cwg at
  // ((c * 2 + cwg) * 128 + tid) * 4 (backward_convert_dq_kernel inverts this); a warpgroup that
  // computed the whole tile (kDqAlternate) puts each float4 where the warpgroup owning those rows
  // (kDqSplitRows: part) or columns (64 (c / 8) on: its c % 8) would have.
  auto store_dq = [&](const float(&dq)[T::kDqParts * T::kDqN / 2], int it) {
    const int buf = it % NB;
    float* sdQb = sdQ + buf * BM * D;
    ptx::thread_named_sync(T::kDqEmptyBarrier + buf, T::kDqSyncThreads);
#pragma unroll
    for (int part = 0; part < T::kDqParts; ++part)
#pragma unroll
      for (int c = 0; c < T::kDqN / 8; ++c) {
        // The warpgroup whose half (rows or columns) this float4 is, and its index there.
        const int owner = !T::kDqAlternate ? cwg : T::kDqSplitRows ? part : c / 8;
        const int cw = T::kDqAlternate && !T::kDqSplitRows ? c % 8 : c;
        const float* v = dq + part * T::kDqN / 2 + 4 * c;
        *reinterpret_cast<float4*>(sdQb + ((cw * 2 + owner) * 128 + tid) * 4) = make_float4(v[0], v[1], v[2], v[3]);
      }
    ptx::thread_fence_proxy_async_smem();
    ptx::thread_named_arrive(T::kDqFullBarrier + buf, T::kDqSyncThreads);
  };

  int kt = 0, it = 0;
  for (int j = 0, idx = 0;; ++j) {
    BwdTile tl;
    BwdCta cta;
    if (!read_work_tile<BM, BN, kOrdered>(P, ring, j, idx, &tl, &cta)) break;
    const core::MaskSpec& mask = cta.mask;
    const int64_t n = tl.n;
    if (n >= cta.n_blocks) continue;
    const auto ks = key_steps<BM, BN, kOrdered>(mask, n, cta.group, P.sched.turns);
    const int64_t key0 = n * BN;
    float dk[D / 2], dv[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;

    if (ks.steps > 0) {
      // Steps do not overlap within a warpgroup: issuing step s+1's S^T and dP^T before storing
      // step s's dQ keeps 224 accumulator registers live, and ptxas then spilled inside the loop.
      ptx::thread_mbarrier_wait(ring.kv_full, uint32_t(kt) & 1u);
      for (int s = 0; s < ks.steps; ++s, ++it) {
        float st[BM / 2], dp[BM / 2];
        issue_sdp(st, dp, it);
        const int64_t m0 = ks.m_of(s) * BM;
        const int rows = int(cta.sq - m0 < BM ? cta.sq - m0 : BM);
        // Boundary steps (a partial tile, or keys a row must not see) mask element-wise; the test
        // is uniform across the CTA, so the branches below stay warp-uniform.
        const bool masked = rows < BM || core::tile_range(mask, m0, m0 + rows, BN).needs_mask(n);
        const int stage = it % S;
        unsigned char* sQs = ring.q + stage * T::kQBytes;
        unsigned char* sdOs = ring.dout + stage * T::kQBytes;

        // Accumulator i of this thread: key row key_a + 8 ((i >> 1) & 1), query column
        // 8 (i >> 2) + 2t + (i & 1); columns 2t and 2t + 1 of a group of 8 come in one 8-byte load.
        const float2* lse2 = reinterpret_cast<const float2*>(ring.lse + stage * BM) + t;
        const float2* delta = reinterpret_cast<const float2*>(ring.delta + stage * BM) + t;
        const uint64_t vis = masked ? visible_set<BM>(mask, m0, key0 + key_a, t) : ~uint64_t(0);
        auto zero_hidden = [&](auto&... xs) { thread_zero_hidden<BM / 2>(masked, vis, xs...); };
        const uint64_t do_mn = ptx::make_smem_desc_sw128(sdOs, BM * 128, 1024);
        const uint64_t q_mn = ptx::make_smem_desc_sw128(sQs, BM * 128, 1024);
        uint32_t pf[BM / 4], dsf[BM / 4];
        ptx::warpgroup_wait<1>();
        ptx::thread_pin(st);
        if constexpr (!kSoftcap) {
          // P^T while dP^T is still on the tensor cores. ptxas places the dP^T wait before the
          // exps (SASS, bench/sass_overlap.py), so only their scaling FMAs run under dP^T; keeping
          // the exps there (sessions 28 and 42, the latter by ptx::warpgroup_wait_after) measured
          // no gain: docs/performance.md, Backward.
#pragma unroll
          for (int j = 0; j < BM / 8; ++j) {
            const float2 l = lse2[4 * j];
#pragma unroll
            for (int i = 4 * j; i < 4 * j + 4; ++i)
              st[i] = ptx::thread_exp2(fmaf(st[i], c_log2, -((i & 1) ? l.y : l.x)));
          }
        }
        ptx::warpgroup_wait<0>();
        ptx::thread_pin(dp);
#pragma unroll
        for (int j = 0; j < BM / 8; ++j) {
          const float2 dl = delta[4 * j];
#pragma unroll
          for (int i = 4 * j; i < 4 * j + 4; ++i) {
            const float di = (i & 1) ? dl.y : dl.x;
            if constexpr (kSoftcap) {
              const float2 l = lse2[4 * j];
              const float u = ptx::thread_tanh(st[i] * tanh_scale);
              st[i] = ptx::thread_exp2(fmaf(u, c_log2, -((i & 1) ? l.y : l.x)));
              dp[i] = st[i] * (dp[i] - di) * (1.f - u * u);
            } else {
              dp[i] = st[i] * (dp[i] - di);
            }
          }
        }
        zero_hidden(st, dp);
#pragma unroll
        for (int j = 0; j < BM / 4; ++j) {
          pf[j] = ptx::thread_pack2<E>(st[2 * j], st[2 * j + 1]);
          dsf[j] = ptx::thread_pack2<E>(dp[2 * j], dp[2 * j + 1]);
        }
        // dS^T to shared memory for dQ (both warpgroups' keys are needed there). Buffers alternate
        // by step: a warpgroup reaches this step's barrier only after its previous dQ product
        // completed, so the buffer written now is no longer read by anyone. With alternating dQ,
        // the one product that read it (two steps ago) completed before its warpgroup arrived at
        // the last step's barrier, which this warpgroup has passed (both meet at every step's).
        unsigned char* sdSs = sdS + (it % 2) * T::kDsBytes;
        if constexpr (T::kDqTransposed) {
          // As dS, [query][key]: dsf[j] is the 8 x 8 block (keys 8 (j & 1), queries 8 (j >> 1)) of
          // the warp's 16 keys in accumulator layout, stored transposed four blocks at a time; lane
          // L addresses query row L & 7 of block 4 q + (L >> 3).
          const int jb = lane >> 3;
#pragma unroll
          for (int q = 0; q < BM / 16; ++q)
            ptx::warp_stmatrix_x4_trans(*reinterpret_cast<const uint32_t(*)[4]>(&dsf[4 * q]),
                                        sdSs + swizzled_offset<BM>(16 * q + 8 * (jb >> 1) + (lane & 7),
                                                                   key_a - g + 8 * (jb & 1)));
        } else {
          warp_store_ds_t<BN, BM>(dsf, sdSs, key_a - g, lane);
        }
        ptx::thread_fence_proxy_async_smem();

        ptx::thread_pin(pf);
        ptx::thread_pin(dv);
        ptx::thread_pin(dk);
        float dq[T::kDqParts * T::kDqN / 2];
        if constexpr (T::kDqTransposed) {
          // dV from P's fragments and dK = dS^T Q with dS^T read (transposed) from this
          // warpgroup's keys of the [query][key] tile dQ^T reads, once all four of its warps
          // stored theirs: with no dS fragments held for dK, dV, dK and dQ^T fit in registers in
          // flight together, so dV and dK run on while the warpgroups meet at the dS barrier and
          // dQ^T follows them (with dK from registers ptxas serialized every wgmma unless dV and
          // dK completed first; measurements in src/cuda/tile_size.h).
          ptx::thread_named_sync(T::kOwnDsBarrier + cwg, 128);
          ptx::warpgroup_fence();
          warpgroup_issue_acc_rs<T, D>(dv, pf, do_mn);
          warpgroup_issue_dk_t<T>(dk, sdSs, cwg, q_mn);
          ptx::warpgroup_commit();
          ptx::thread_named_sync(T::kDsBarrier, 256);
          warpgroup_issue_dq_t<T>(dq, kmn_desc, ptx::make_smem_desc_sw128(sdSs, 16, 1024));
          ptx::warpgroup_wait<0>();
          thread_release_stage(ring, stage, dv, dk, pf, dq);
        } else {
          ptx::thread_pin(dsf);
          ptx::warpgroup_fence();
          warpgroup_issue_acc_rs<T, D>(dv, pf, do_mn);
          warpgroup_issue_acc_rs<T, D>(dk, dsf, q_mn);
          ptx::warpgroup_commit();
          // Whose turn dQ is, through a shuffle so that ptxas sees a warp-uniform branch (with cwg
          // from threadIdx it took the branch as divergent and serialized every wgmma, C7520).
          const bool dq_mine = __shfl_sync(0xffffffffu, (it & 1) == cwg, 0);
          // Both warpgroups wait at the dS barrier, the one whose turn it is not as well: it arrives
          // there last anyway (it computed the previous step's dQ), and then a dQ buffer that the
          // two write in turns (one buffer at d = 64) is ordered by a barrier both pass, not only
          // through the writer warp's two (racecheck took such writes, with a mere arrival here,
          // for a race).
          if (!dq_mine) {
            ptx::thread_named_sync(T::kDsBarrier, 256);
            ptx::warpgroup_wait<0>();
            thread_release_stage(ring, stage, dv, dk, pf, dsf);
            continue;
          }
          const uint64_t ds_desc = ptx::make_smem_desc_sw128(sdSs, BN * 128, 1024);
          // dV and dK complete first: their A fragments in flight beside dQ's 64 accumulators are
          // more registers than a consumer has (ptxas serialized every wgmma).
          ptx::warpgroup_wait<0>();
          thread_release_stage(ring, stage, dv, dk, pf, dsf);
          ptx::thread_named_sync(T::kDsBarrier, 256);
#pragma unroll
          for (int part = 0; part < T::kDqParts; ++part)
            warpgroup_issue_dq<T, T::kDqN>(*reinterpret_cast<float(*)[T::kDqN / 2]>(dq + part * T::kDqN / 2),
                                           T::kDqParts > 1 ? ptx::make_smem_desc_sw128(sdSs + part * BN * 128, BN * 128, 1024)
                                                           : ds_desc,
                                           kmn_desc);
          ptx::warpgroup_wait<0>();
        }
        ptx::thread_pin(dq);
        store_dq(dq, it);
      }
      if (tid == 0) ptx::thread_mbarrier_arrive(ring.kv_empty);
      ++kt;
    }

    thread_store_dk_dv<E>(p, cta, key0, BN, key_a, 0, t, dk, dv);
  }
#endif
}

}  // namespace flashattn::cuda::sm90

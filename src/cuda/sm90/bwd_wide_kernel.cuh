// The Hopper backward for wide heads (d = 256), beside the d <= 128 kernel of bwd_kernel.cuh, whose
// header describes what both share (the producer's ring of bwd_schedule.cuh, the softmax scale
// folded into dK and dQ, the fragment-order dQ workspace, the deterministic mode's turns) and
// whose warpgroup steps this one calls (warpgroup_product_over_d, warpgroup_issue_acc_rs,
// warpgroup_issue_dq, thread_zero_hidden, warp_store_ds_t, thread_release_stage_at,
// thread_store_dk_dv).
//
// dK and dV of 64 keys over all 256 columns would take 256 fp32 registers per thread of a
// warpgroup, more than a consumer has. So CTAs split the head dim, as cuDNN's kernel does (its SASS,
// read with ncu's source counters on the H200: tiles 64 x 64 x 256, two CTAs per 128 keys). A CTA
// owns 128 keys (64 per consumer warpgroup) and one half of the columns of dK, dV and dQ; the CTA
// beside it (blockIdx.x ^ 1) owns the other half. Each warpgroup's dK and dV (64 keys x 128
// columns: 64 + 64 registers) stay in its registers, and a query step adds a 64 x 128 fp32 dQ tile
// for 128 keys. The price: both CTAs of a key tile compute S^T = K Q^T and dP^T = V dO^T over the
// whole head dim, 1.4 times the matrix work of a split by keys. In exchange each warpgroup computes
// S^T, P^T, dP^T and dS^T of its own keys in its own registers, and the two meet once per step,
// when both halves of dS^T are in shared memory for dQ.
// The kernel before this one (64 keys per CTA, all 256 columns, its warpgroups dividing S^T and
// dP^T and passing P^T, dS^T and dP^T through shared memory) added a 64 x 256 dQ tile per step, per
// FLOP twice this kernel's additions, and ncu put 17% of its warp samples on those reductions and
// on waiting for them to drain (docs/performance.md, session 31). Staging its dQ in the step's Q
// and dO tiles for bulk reductions instead was 14-16% slower: the reductions then queued in the copy
// engine ahead of the next loads.
//
// A consumer warpgroup's query step (the ring has one stage: K and V of 128 keys take what a second
// would need):
//   dP^T = V dO^T, S^T = K Q^T (wgmma, both operands in shared memory; dO is loaded first and
//   freed first, see below);
//   P^T = exp2(S^T c - lse2); dV[:, cols] += P^T dO[:, cols] (A from registers) while
//   dS^T = P^T o (dP^T - delta) is computed; dK[:, cols] += dS^T Q[:, cols] (A from registers);
//   dO freed once dV completed; dS^T to shared memory (stmatrix), one buffer per step parity; the
//   step's barrier (both halves of dS^T are in); Q freed once dK completed;
//   dQ[:, 64 columns] = dS K[:, those columns] over all 128 keys, each warpgroup its 64 of the
//   CTA's 128 columns, added to the fp32 workspace by red.v4.
// A buffer of dS^T is rewritten two steps later, after both warpgroups passed the barrier in
// between, which each reaches only once its dQ product completed.
// Measured on the H200 (bench/ab_compare.py, bf16, 16k tokens, hidden 2048, 2k-16k, causal and
// not; bench/results/h200_session31_2026-12-04.txt): dO loaded and freed apart from Q, with dP^T
// first, 1.003-1.015x against one Q/dO stage freed at once (call 4); dQ by both warpgroups every step
// 0.992-1.004x against the warpgroups in turns with all 128 columns (call 6; bwd_kernel.cuh's
// kDqAlternate); masked elements zeroed in a pass of their own behind the step's uniform branch,
// not by a select per element in every step, 1.015-1.038x (call 7). Not kept: lse2 and delta read
// as float2 (0.965-0.993x, call 5), a warpgroup skipping the steps its 64 keys are hidden from
// (0.972-0.999x, call 7).
// Deterministic mode: the dQ turns are per query tile and column half (two counters per tile), kept
// by a thread of the producer warpgroup (WideBars), so the consumers neither poll nor wait on a
// memory fence.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/bwd_kernel.cuh"

namespace flashattn::cuda::sm90 {

template <int kHeadDim_, class Element_>
struct WideBwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 64;   // query rows per step
  static constexpr int kBlockN = 128;  // keys per CTA, 64 per consumer warpgroup
  static constexpr int kStages = 1;
  static constexpr int kThreads = 384;
  static constexpr int kColBlocks = kHeadDim / 64;
  static constexpr int kHalf = kHeadDim / 2;  // dK, dV, dQ columns per CTA
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;  // dS^T [keys][queries], one swizzled column block
  // The dQ workspace as backward_convert_dq_kernel reads it: fragment order, split by columns.
  static constexpr bool kDqSplitRows = false;
  static constexpr bool kDqTransposed = false;
  static constexpr int kDqN = kHalf;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static constexpr int kDsBarrier = 1;    // + step parity: both halves of that step's dS^T are stored
  static constexpr int kTileReaders = 0;  // one tile per CTA: no tile handoff
  // The ring's barriers, then "dO free" (the ring's Q/dO barrier frees Q alone here) and the
  // ordered mode's turn handshake ("turn granted", "dQ added"; WideBars).
  static constexpr int kBarrierBytes = 8 * (2 + 3 * kStages + 3);
  static constexpr int kSmemBytes = 1024 + 2 * kKVBytes + 2 * kStages * kQBytes + 2 * kDsBytes +
                                    2 * kStages * kBlockM * 4 + kBarrierBytes;
  static_assert(kHalf % 64 == 0, "a CTA's columns are whole 64-column blocks");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// acc += A B as one committed wgmma group, A = `vals` (fp32 accumulators of a 64 x kBlockM product,
// fragment order) packed to 16 bits into `frag`, which the wgmma reads from registers until it
// completes (the caller waits before reusing or releasing it).
template <class T, int N>
__device__ __forceinline__ void warpgroup_pack_issue_acc_rs(float (&acc)[N / 2], uint32_t (&frag)[T::kBlockM / 4],
                                                           const float (&vals)[T::kBlockM / 2], uint64_t b_desc) {
#pragma unroll
  for (int j = 0; j < T::kBlockM / 4; ++j)
    frag[j] = ptx::thread_pack2<typename T::Element>(vals[2 * j], vals[2 * j + 1]);
  ptx::thread_pin(frag);
  ptx::thread_pin(acc);
  ptx::warpgroup_fence();
  warpgroup_issue_acc_rs<T, N>(acc, frag, b_desc);
  ptx::warpgroup_commit();
}
#endif

// The barriers this kernel adds after the ring's: dO freed apart from Q, and in the ordered mode
// the handshake between the consumers and the thread that keeps the CTA's dQ turns.
struct WideBars {
  uint64_t* at;
  __device__ __forceinline__ uint64_t* do_empty() const { return at; }
  __device__ __forceinline__ uint64_t* granted() const { return at + 1; }
  __device__ __forceinline__ uint64_t* added() const { return at + 2; }
};

template <class T, bool kSoftcap, bool kOrdered>
__global__ void __launch_bounds__(T::kThreads, 1) backward_wide_kernel(const __grid_constant__ BwdParams P) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using E = typename T::Element;
  constexpr int D = T::kHeadDim, BM = T::kBlockM, BN = T::kBlockN, H = T::kHalf;
  const core::BackwardParams& p = P.p;
  const BwdWorkspace& ws = P.ws;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = ptx::align_shared_1024(smem_raw);
  unsigned char* sdS = smem + 2 * T::kKVBytes + 2 * T::kStages * T::kQBytes;  // [step parity][BN keys][BM queries]
  const BwdRing ring = bwd_ring<T>(smem, reinterpret_cast<float*>(sdS + 2 * T::kDsBytes));
  // dO is freed apart from Q (ring.qdo_empty): its last product, dV, completes before Q's, dK, and
  // the next step starts with dP^T, so dO(s + 1) loads while step s's dK and dQ finish.
  const WideBars bars{ring.qdo_empty + T::kStages};
  uint64_t* do_empty = bars.do_empty();
  if (threadIdx.x == 0) {
    ptx::thread_mbarrier_init(do_empty, 256);  // every consumer thread
    if constexpr (kOrdered) {
      ptx::thread_mbarrier_init(bars.granted(), 1);
      ptx::thread_mbarrier_init(bars.added(), 256);
    }
    ptx::thread_fence_mbarrier_init();
  }
  __syncthreads();

  // The grid is (2 x key tiles, KV heads, batch): the two CTAs of a key tile are neighbours, so they
  // start together and share their loads of K, V, Q and dO in L2.
  const BwdCta cta = bwd_cta<BM, BN>(p, int(blockIdx.y), int(blockIdx.z));
  // Ordered deterministic mode: key tiles in the launch order the turns need (descending in the
  // `up` order, so that each waits only for key tiles launched before it; bwd_layout.h). With more
  // than one (KV head, batch) pair, the grid's last pair walks `down` instead, key tiles ascending,
  // so that the launch ends with that pair's shortest key tiles rather than a longest one; its key
  // tiles wait only for its lower ones, launched before them, so the grid still always finishes.
  BwdSchedule sched = P.sched;
  if constexpr (kOrdered)
    if (sched.turns == TurnOrder::up && gridDim.y * gridDim.z > 1 && blockIdx.y == gridDim.y - 1 &&
        blockIdx.z == gridDim.z - 1)
      sched.turns = TurnOrder::down;
  const int64_t n = kOrdered && sched.keys_descending() ? gridDim.x / 2 - 1 - blockIdx.x / 2 : blockIdx.x / 2;
  const int col_half = int(blockIdx.x % 2);  // columns [H col_half, H col_half + H) of dK, dV and dQ
  if (n >= cta.n_blocks) return;
  const auto ks = key_steps<BM, BN, kOrdered>(cta.mask, n, cta.group, sched.turns);
  const int wg = int(threadIdx.x) / 128;
  if (wg == 0) {
    ptx::warpgroup_reg_dealloc<T::kProducerRegs>();
    if (threadIdx.x / 32 == 0 && ptx::warp_elect_one() && ks.steps > 0) {
      // As thread_load_tile (bwd_schedule.cuh) with one stage, dO before Q.
      thread_prefetch_maps(P);
      const int tma_b = cta.varlen ? 0 : cta.b;
      ptx::thread_mbarrier_arrive_expect_tx(ring.kv_full, 2 * T::kKVBytes);
      thread_tma_load_tile<BN, T::kColBlocks>(ring.k, &P.tk, ring.kv_full, int(cta.k0 + n * BN), cta.hk, tma_b);
      thread_tma_load_tile<BN, T::kColBlocks>(ring.v, &P.tv, ring.kv_full, int(cta.k0 + n * BN), cta.hk, tma_b);
      for (int s = 0; s < ks.steps; ++s) {
        const uint32_t free_phase = (uint32_t(s) & 1u) ^ 1u;
        const int h = cta.hk * cta.group + ks.head(s);
        const int64_t m = ks.m_of(s);
        const int row = int(cta.q0 + m * BM);
        const int64_t w = (int64_t(h) * ws.tiles_per_head + cta.tile0 + m) * BM;
        ptx::thread_mbarrier_wait(do_empty, free_phase);
        ptx::thread_mbarrier_arrive_expect_tx(ring.do_full, T::kQBytes + BM * 4);
        thread_tma_load_tile<BM, T::kColBlocks>(ring.dout, &P.tdo, ring.do_full, row, h, tma_b);
        ptx::thread_bulk_load(ring.delta, ws.delta + w, BM * 4, ring.do_full);
        ptx::thread_mbarrier_wait(ring.qdo_empty, free_phase);
        ptx::thread_mbarrier_arrive_expect_tx(ring.q_full, T::kQBytes + BM * 4);
        thread_tma_load_tile<BM, T::kColBlocks>(ring.q, &P.tq, ring.q_full, row, h, tma_b);
        ptx::thread_bulk_load(ring.lse, ws.lse2 + w, BM * 4, ring.q_full);
      }
    }
    if constexpr (kOrdered) {
      // The CTA's dQ turns (one counter per query tile and column half), kept by one thread off
      // the consumers' path: per step, await the turn, grant it to both warpgroups, wait until
      // their 256 threads arrived after their reductions (their mbarrier arrivals release those to
      // this thread, and its gpu-scope release passes them on), and pass it.
      if (threadIdx.x / 32 == 1 && ptx::warp_elect_one())
        for (int s = 0; s < ks.steps; ++s) {
          int* turn = ws.dq_turn + 2 * dq_tile(ws, cta, ks, s) + col_half;
          ptx::thread_wait_turn_bulk(turn, ordered_turn<BM, BN>(cta.mask, n, ks.m_of(s), sched.turns));
          ptx::thread_mbarrier_arrive(bars.granted());
          ptx::thread_mbarrier_wait(bars.added(), uint32_t(s) & 1u);
          ptx::thread_pass_turn_bulk(turn);
        }
    }
    return;
  }

  ptx::warpgroup_reg_alloc<T::kConsumerRegs>();
  const int cwg = wg - 1;  // keys [64 cwg, 64 cwg + 64) of the CTA's
  const int tid = int(threadIdx.x) % 128;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // Accumulator i of a 64 x BM product (S^T, dP^T): key row key_a + 8 ((i >> 1) & 1) of the
  // warpgroup's 64, query column 8 (i >> 2) + 2t + (i & 1); of a dK / dV product: the same rows,
  // column 8 (i >> 2) + 2t + (i & 1) of the CTA's half.
  const int key_a = 16 * warp + g;
  const int64_t key0 = n * BN + 64 * cwg;  // the warpgroup's first key
  const float c_log2 = float(core::kLog2e) * (kSoftcap ? p.softcap : p.scale);
  const float tanh_scale = kSoftcap ? p.scale / p.softcap : 0.f;

  // S^T, dP^T: A = the warpgroup's 64 rows of K or V, B = Q or dO, all K-major.
  const uint64_t k_desc = ptx::make_smem_desc_sw128(ring.k + cwg * 64 * 128, 16, 1024);
  const uint64_t v_desc = ptx::make_smem_desc_sw128(ring.v + cwg * 64 * 128, 16, 1024);
  const uint64_t q_desc = ptx::make_smem_desc_sw128(ring.q, 16, 1024);
  const uint64_t do_desc = ptx::make_smem_desc_sw128(ring.dout, 16, 1024);
  // The CTA's columns of Q and dO (dK's and dV's MN-major B), and of K (dQ's).
  const int half_off = col_half * (H / 64) * BM * 128;
  const uint64_t q_mn = ptx::make_smem_desc_sw128(ring.q + half_off, BM * 128, 1024);
  const uint64_t do_mn = ptx::make_smem_desc_sw128(ring.dout + half_off, BM * 128, 1024);
  const uint64_t kmn_desc = ptx::make_smem_desc_sw128(ring.k + col_half * (H / 64) * BN * 128, BN * 128, 1024);

  float dk[H / 2], dv[H / 2];
#pragma unroll
  for (int i = 0; i < H / 2; ++i) dk[i] = dv[i] = 0.f;

  if (ks.steps > 0) {
    ptx::thread_mbarrier_wait(ring.kv_full, 0);
    for (int s = 0; s < ks.steps; ++s) {
      const uint32_t phase = uint32_t(s) & 1u;
      const int h = cta.hk * cta.group + ks.head(s);
      const int64_t m0 = ks.m_of(s) * BM;
      const int tile = int(int64_t(h) * ws.tiles_per_head + cta.tile0 + ks.m_of(s));
      unsigned char* sdSs = sdS + (s & 1) * T::kDsBytes;

      float st[BM / 2], dp[BM / 2];
      ptx::thread_mbarrier_wait(ring.do_full, phase);
      ptx::thread_pin(dp);
      ptx::warpgroup_fence();
      warpgroup_product_over_d<T>(dp, v_desc, do_desc);
      ptx::thread_mbarrier_wait(ring.q_full, phase);
      ptx::thread_pin(st);
      warpgroup_product_over_d<T>(st, k_desc, q_desc);
      // The step's mask while the products run (see bwd_kernel.cuh).
      const int rows = int(cta.sq - m0 < BM ? cta.sq - m0 : BM);
      const bool masked = rows < BM || core::tile_range(cta.mask, m0, m0 + rows, 64).needs_mask(key0 / 64);
      const uint64_t vis = masked ? visible_set_wide<BM>(cta.mask, m0, key0 + key_a, t) : ~uint64_t(0);
      const float* lse2 = ring.lse;
      const float* delta = ring.delta;
      ptx::warpgroup_wait<0>();
      ptx::thread_pin(st);
      ptx::thread_pin(dp);
      float dtanh[kSoftcap ? BM / 2 : 1];  // softcap: d tanh(x) / dx = 1 - tanh^2
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) {
        const float l = lse2[8 * (i >> 2) + 2 * t + (i & 1)];
        if constexpr (kSoftcap) {
          const float u = ptx::thread_tanh(st[i] * tanh_scale);
          dtanh[i] = 1.f - u * u;
          st[i] = ptx::thread_exp2(fmaf(u, c_log2, -l));
        } else {
          st[i] = ptx::thread_exp2(fmaf(st[i], c_log2, -l));
        }
      }
      thread_zero_hidden<BM / 2>(masked, vis, st);
      uint32_t pf[BM / 4], dsf[BM / 4];
      // dV[:, cols] += P^T dO[:, cols] while dS^T is computed.
      warpgroup_pack_issue_acc_rs<T, H>(dv, pf, st, do_mn);
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) {
        float ds = st[i] * (dp[i] - delta[8 * (i >> 2) + 2 * t + (i & 1)]);
        if constexpr (kSoftcap) ds *= dtanh[i];
        dp[i] = ds;
      }
      thread_zero_hidden<BM / 2>(masked, vis, dp);
      warpgroup_pack_issue_acc_rs<T, H>(dk, dsf, dp, q_mn);
      // dV has completed: dO and delta are free.
      ptx::warpgroup_wait<1>();
      thread_release_stage_at(do_empty, dv, pf);
      // dS^T to this warpgroup's 64 rows of the step's buffer.
      warp_store_ds_t<BN, BM>(dsf, sdSs, 64 * cwg + 16 * warp, lane);
      ptx::thread_fence_proxy_async_smem();
      ptx::thread_named_sync(T::kDsBarrier + (s & 1), 256);
      // dK has completed: Q and lse2 are free.
      ptx::warpgroup_wait<0>();
      thread_release_stage_at(ring.qdo_empty, dk, dsf);
      {
        // dQ for this warpgroup's 64 of the CTA's columns (its column block cwg of K), over both
        // warpgroups' keys: dq[i] is accumulator 32 cwg + i of the CTA's 128-column fragment order.
        float dq[H / 4];
        warpgroup_issue_dq<T, H / 2>(dq, ptx::make_smem_desc_sw128(sdSs, BN * 128, 1024),
                                     kmn_desc + uint64_t((cwg * BN * 128) >> 4));
        ptx::warpgroup_wait<0>();
        ptx::thread_pin(dq);
        // The CTA's float4 c = 8 cwg + j of this thread sits at ((c * 2 + col_half) * 128 + tid) * 4
        // of the workspace tile (the column-split order backward_convert_dq_kernel reads).
        float* dst = ws.dq_accum + int64_t(tile) * BM * D + ((8 * cwg * 2 + col_half) * 128 + tid) * 4;
        if constexpr (kOrdered) ptx::thread_mbarrier_wait(bars.granted(), phase);
#pragma unroll
        for (int j = 0; j < H / 16; ++j)
          ptx::thread_red_add_f32x4(dst + j * 2 * 128 * 4,
                                    make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]));
        if constexpr (kOrdered) ptx::thread_mbarrier_arrive(bars.added());
      }
    }
    if (tid == 0) ptx::thread_mbarrier_arrive(ring.kv_empty);
  }
  thread_store_dk_dv<E>(p, cta, key0, 64, key_a, col_half * H, t, dk, dv);
#endif
}

}  // namespace flashattn::cuda::sm90

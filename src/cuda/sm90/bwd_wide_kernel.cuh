// The Hopper backward for wide heads (d = 256), beside the d <= 128 kernel of bwd_kernel.cuh, whose
// header describes what both share: one CTA per (key tile, KV head, batch) streaming the query
// tiles of the GQA group, the producer warp and its ring (thread_load_cta in bwd_schedule.cuh),
// the softmax scale folded into dK and dQ, and the fragment-order dQ workspace. The warpgroup
// steps both run are in bwd_kernel.cuh too: warpgroup_product_over_d, warpgroup_issue_dq,
// thread_release_stage, thread_store_dk_dv.
//
// At d = 256, dK and dV of 64 keys take 256 fp32 registers per thread of one warpgroup, more than a
// consumer has. So the two consumer warpgroups split the head dim instead of the keys: the CTA
// owns kBlockN = 64 keys and each warpgroup accumulates dK, dV (and dQ) for 128 of the columns.
// The score and gradient products are not split; each warpgroup computes one of them:
//   * the score warpgroup (consumer 0): S^T = K Q^T (wgmma, both operands in shared memory),
//     P^T = exp2(S^T c - lse2) in registers; once the other warpgroup's dP^T is in shared memory,
//     dS^T = P^T o (dP^T - delta). P^T and dS^T go to shared memory (bf16) for the other warpgroup;
//     this one uses them from registers.
//   * the gradient warpgroup (consumer 1): dP^T = V dO^T into shared memory (fp32, fragment order).
//   * each warpgroup for its columns c: dV[:, c] += P^T dO[:, c], dK[:, c] += dS^T Q[:, c] (the score
//     warpgroup with A from registers, the other from shared memory), dQ[:, c] = dS K[:, c] (dS^T
//     read transposed from shared memory).
// dQ goes from the accumulators to the fp32 workspace with vector reductions (red.v4, 512
// contiguous bytes per warp instruction): a 64 x 256 fp32 staging buffer does not fit beside K, V
// and two stages of Q and dO. The workspace order is the d <= 128 kernel's, dQ split by columns, so
// backward_convert_dq_kernel reads it unchanged.
// Determinism: turns as in bwd_kernel.cuh, per warpgroup half of a dQ tile (two turn counters per
// tile), each half's kept by a thread of the producer warpgroup (thread_keep_turns), off the
// consumers' path.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/bwd_kernel.cuh"

namespace flashattn::cuda::sm90 {

template <int kHeadDim_, class Element_, int kStages_>
struct WideBwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 64;  // query rows per step
  static constexpr int kBlockN = 64;  // keys per CTA
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 384;
  static constexpr int kColBlocks = kHeadDim / 64;
  static constexpr int kHalf = kHeadDim / 2;  // dK, dV, dQ columns per consumer warpgroup
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kPBytes = kBlockN * kBlockM * 2;  // P^T or dS^T: bf16, one swizzled column block
  static constexpr int kDpBytes = kBlockN * kBlockM * 4;  // dP^T: fp32, fragment order
  // The dQ workspace as backward_convert_dq_kernel reads it: fragment order, split by columns.
  static constexpr bool kDqSplitRows = false;
  static constexpr bool kDqTransposed = false;
  static constexpr int kDqN = kHalf;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  // Named barriers (0 is __syncthreads): "dP^T is in shared memory" (gradient -> score
  // warpgroup), "P^T and dS^T are" (score -> gradient), and the score warpgroup's own "dS^T is"
  // (its dQ reads what all four of its warps wrote). Each is arrived at on one side and waited on
  // on the other, or used by one warpgroup alone.
  static constexpr int kDpBarrier = 1;
  static constexpr int kPBarrier = 2;
  static constexpr int kDsBarrier = 3;
  static constexpr int kTileReaders = 0;  // one tile per CTA: no tile handoff
  // mbarriers: the ring's (K/V full and empty, Q full, dO full, Q/dO empty per stage), then the
  // ordered mode's turn handshake per consumer warpgroup: "turn granted", "dQ added" (TurnBars).
  static constexpr int kBarrierBytes = 8 * (2 + 3 * kStages + 4);
  static constexpr int kSmemBytes = 1024 + 2 * kKVBytes + 2 * kStages * kQBytes + 2 * kPBytes + kDpBytes +
                                    2 * kStages * kBlockM * 4 + kBarrierBytes;
  static_assert(kHalf % 64 == 0, "a warpgroup's columns are whole 64-column blocks");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

// Ordered mode: the handshake between consumer warpgroup c and the thread keeping its turns, two
// mbarriers per warpgroup after the ring's (this kernel has no tile handoff there).
struct TurnBars {
  uint64_t* at;  // granted[2], then added[2]
  __device__ __forceinline__ uint64_t* granted(int c) const { return at + c; }
  __device__ __forceinline__ uint64_t* added(int c) const { return at + 2 + c; }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Ordered mode: the turns of consumer warpgroup c's half of each step's dQ tile, kept by one
// thread of the producer warpgroup, so the consumers neither poll nor wait on a memory fence. Per
// step (the consumers' walk): await the turn, grant it to the warpgroup, wait until its 128
// threads arrived after their reductions, and pass the turn. Their mbarrier arrivals release
// their reductions to this thread, and its gpu-scope release passes them on (cumulativity).
template <class T>
__device__ __forceinline__ void thread_keep_turns(const BwdParams& P, const BwdSchedule& sched, const BwdCta& cta,
                                                  const TurnBars& bars, int c) {
  constexpr int BM = T::kBlockM, BN = T::kBlockN;
  const BwdWorkspace& ws = P.ws;
  uint32_t phase = 0;
  for (int64_t n = grid_key_tile<true>(sched); n < cta.n_blocks; n += gridDim.x) {
    const auto ks = key_steps<BM, BN, true>(cta.mask, n, cta.group, sched.turns);
    for (int s = 0; s < ks.steps; ++s, phase ^= 1u) {
      int* turn = ws.dq_turn + 2 * dq_tile(ws, cta, ks, s) + c;
      ptx::thread_wait_turn_bulk(turn, ordered_turn<BM, BN>(cta.mask, n, ks.m_of(s), sched.turns));
      ptx::thread_mbarrier_arrive(bars.granted(c));
      ptx::thread_mbarrier_wait(bars.added(c), phase);
      ptx::thread_pass_turn_bulk(turn);
    }
  }
}
#endif

template <class T, bool kSoftcap, bool kOrdered>
__global__ void __launch_bounds__(T::kThreads, 1) backward_wide_kernel(const __grid_constant__ BwdParams P) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using E = typename T::Element;
  constexpr int D = T::kHeadDim, BM = T::kBlockM, BN = T::kBlockN, S = T::kStages, H = T::kHalf;
  const core::BackwardParams& p = P.p;
  const BwdWorkspace& ws = P.ws;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = ptx::align_shared_1024(smem_raw);
  unsigned char* sP = smem + 2 * T::kKVBytes + 2 * S * T::kQBytes;  // P^T, [BN keys][BM queries]
  unsigned char* sdS = sP + T::kPBytes;                                // dS^T, same layout
  float* sdP = reinterpret_cast<float*>(sdS + T::kPBytes);             // dP^T, fragment order
  const BwdRing ring = bwd_ring<T>(smem, sdP + BN * BM);
  const TurnBars turn_bars{ring.qdo_empty + S};
  if constexpr (kOrdered)
    if (threadIdx.x == 0) {
      for (int c = 0; c < 2; ++c) {
        ptx::thread_mbarrier_init(turn_bars.granted(c), 1);
        ptx::thread_mbarrier_init(turn_bars.added(c), 128);
      }
      ptx::thread_fence_mbarrier_init();
    }
  __syncthreads();

  // The grid is (key tiles, KV heads, batch) and this kernel decodes no tile index: the tile walk of
  // the d <= 128 kernel (persistent CTAs, tiles decoded from an index) cost this kernel registers
  // in its step loop (spill loads there, compiled here) and 7-10% of its speed on the H200.
  const BwdCta cta = bwd_cta<BM, BN>(p, int(blockIdx.y), int(blockIdx.z));
  const core::MaskSpec& mask = cta.mask;
  // Ordered mode in the `up` order, with more than one (KV head, batch) pair: the grid's last pair
  // walks `down` instead, key tiles ascending, so that the launch ends with that pair's shortest
  // key tiles rather than a longest one (bwd_layout.h). Its key tiles wait only for its lower ones,
  // launched before them, so the grid still always finishes.
  BwdSchedule sched = P.sched;
  if constexpr (kOrdered)
    if (sched.turns == TurnOrder::up && gridDim.y * gridDim.z > 1 && blockIdx.y == gridDim.y - 1 &&
        blockIdx.z == gridDim.z - 1)
      sched.turns = TurnOrder::down;
  const int wg = int(threadIdx.x) / 128;
  if (wg == 0) {
    ptx::warpgroup_reg_dealloc<T::kProducerRegs>();
    if (threadIdx.x / 32 == 0 && ptx::warp_elect_one()) thread_load_cta<T, kOrdered>(P, sched, cta, ring);
    if constexpr (kOrdered) {
      const int warp = int(threadIdx.x) / 32;
      if ((warp == 1 || warp == 2) && ptx::warp_elect_one())
        thread_keep_turns<T>(P, sched, cta, turn_bars, warp - 1);
    }
    return;
  }

  ptx::warpgroup_reg_alloc<T::kConsumerRegs>();
  const int cwg = wg - 1;  // 0: the score warpgroup, 1: the gradient one; columns [H cwg, H cwg + H)
  const int tid = int(threadIdx.x) % 128;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // Accumulator i of a BN x BM product (S^T, dP^T): key row key_a + 8 ((i >> 1) & 1), query
  // column 8 (i >> 2) + 2t + (i & 1); of a dK / dV product: the same rows, column 8 (i >> 2) + 2t
  // + (i & 1) of this warpgroup's half.
  const int key_a = 16 * warp + g;
  const float c_log2 = float(core::kLog2e) * (kSoftcap ? p.softcap : p.scale);
  const float tanh_scale = kSoftcap ? p.scale / p.softcap : 0.f;
  // The dQ accumulator, addressed as a per-CTA slice in a deterministic call of this kernel. No
  // call is (deterministic mode runs the ordered kernel), but without this offset ptxas allocates
  // this kernel's registers otherwise and the default backward ran 3-5% slower (H200,
  // bench/results/h200_bwd_det_up_2026-12-02.txt).
  const bool sliced = !kOrdered && p.deterministic;
  float* slice = ws.dq_accum + (sliced ? int64_t(blockIdx.x) * p.heads_q * ws.tiles_per_head * BM * D : 0);

  // S^T (score) or dP^T (gradient): A = this warpgroup's K or V rows, K-major.
  const uint64_t kv_desc = ptx::make_smem_desc_sw128(cwg == 0 ? ring.k : ring.v, 16, 1024);
  // dS^T read transposed: dQ's A operand.
  const uint64_t dst_desc = ptx::make_smem_desc_sw128(sdS, BN * 128, 1024);
  // This warpgroup's columns of K as dQ's MN-major B operand, and the offset of its columns in a
  // Q or dO tile.
  const uint64_t kmn_desc = ptx::make_smem_desc_sw128(ring.k + cwg * (H / 64) * BN * 128, BN * 128, 1024);
  const int half_off = cwg * (H / 64) * BM * 128;

  // dQ[:, half] (warpgroup_issue_dq) into workspace tile `tile` (query head, query tile), once it
  // landed. Ordered deterministic mode: once this warpgroup's turn keeper (thread_keep_turns)
  // granted the turn at the tile, each thread then arriving after its reductions.
  uint32_t turn_phase = 0;  // ordered mode: the handshake's phase (one per step)
  auto add_dq = [&](float(&dq)[H / 2], int tile) {
    ptx::thread_pin(dq);
    if constexpr (kOrdered) ptx::thread_mbarrier_wait(turn_bars.granted(cwg), turn_phase);
    // float4 c of this thread at ((c * 2 + cwg) * 128 + tid) * 4: constant steps from one base
    // address (immediate offsets, not one 64-bit address per instruction).
    float* dst = slice + int64_t(tile) * BM * D + (cwg * 128 + tid) * 4;
#pragma unroll
    for (int c = 0; c < H / 8; ++c)
      ptx::thread_red_add_f32x4(dst + c * 2 * 128 * 4, make_float4(dq[4 * c], dq[4 * c + 1], dq[4 * c + 2], dq[4 * c + 3]));
    if constexpr (kOrdered) {
      ptx::thread_mbarrier_arrive(turn_bars.added(cwg));
      turn_phase ^= 1u;
    }
  };

  // One query step: its ring stage, its workspace tile, and where its operands sit.
  struct Step {
    int stage;
    uint32_t phase;
    // Query tile, key tile, first key, workspace tile: int32, as sequence lengths are, and a tile
    // index past that would address a workspace too large to allocate.
    int m, n, key0, tile;
    unsigned char *q, *dout;  // the stage's Q and dO tiles
    uint64_t q_mn, do_mn;     // this warpgroup's columns of them, MN-major
  };

  auto score_step = [&](const Step& at, float(&dk)[H / 2], float(&dv)[H / 2]) {
    const int stage = at.stage;
    const int m = at.m, n = at.n, key0 = at.key0;
    const uint64_t q_mn = at.q_mn, do_mn = at.do_mn;
    float st[BM / 2];
    ptx::thread_mbarrier_wait(&ring.q_full[stage], at.phase);
    ptx::thread_pin(st);
    ptx::warpgroup_fence();
    warpgroup_product_over_d<T>(st, kv_desc, ptx::make_smem_desc_sw128(at.q, 16, 1024));
    // The step's mask while S^T is on the tensor cores (see the d <= 128 kernel).
    const int64_t m0 = int64_t(m) * BM;
    const int rows = int(cta.sq - m0 < BM ? cta.sq - m0 : BM);
    const bool masked = rows < BM || core::tile_range(mask, m0, m0 + rows, BN).needs_mask(n);
    const uint64_t vis = masked ? visible_set_wide<BM>(mask, m0, key0 + key_a, t) : ~uint64_t(0);
    const float* lse2 = ring.lse + stage * BM;
    const float* delta = ring.delta + stage * BM;
    ptx::warpgroup_wait<0>();
    ptx::thread_pin(st);
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
      if (masked && !((vis >> i) & 1)) st[i] = 0.f;
    }
    uint32_t pf[BM / 4], dsf[BM / 4];
#pragma unroll
    for (int j = 0; j < BM / 4; ++j) pf[j] = ptx::thread_pack2<E>(st[2 * j], st[2 * j + 1]);
    // dV[:, half] += P^T dO[:, half] while the gradient warpgroup finishes dP^T. This reads the dO
    // tile, so this warpgroup waits for it too (only the gradient warpgroup did: dV then read dO
    // before it landed in some runs, wrong dV at causal 4k-8k on the H200).
    ptx::thread_mbarrier_wait(&ring.do_full[stage], at.phase);
    ptx::thread_pin(pf);
    ptx::thread_pin(dv);
    ptx::warpgroup_fence();
#pragma unroll
    for (int k = 0; k < BM / 16; ++k)
      ptx::Wgmma<E, H>::template rs<1>(dv, *reinterpret_cast<const uint32_t(*)[4]>(&pf[4 * k]),
                                       do_mn + uint64_t((k * 2048) >> 4), 1);
    ptx::warpgroup_commit();
    // dP^T has landed, and the gradient warpgroup is done with the previous step's P^T and
    // dS^T, so both buffers may be rewritten.
    ptx::thread_named_sync(T::kDpBarrier, 256);
#pragma unroll
    for (int c = 0; c < BM / 8; ++c) {
      const float4 d4 = *reinterpret_cast<const float4*>(sdP + (c * 128 + tid) * 4);
      const float dpc[4] = {d4.x, d4.y, d4.z, d4.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 4 * c + e;
        float ds = st[i] * (dpc[e] - delta[8 * c + 2 * t + (e & 1)]);
        if constexpr (kSoftcap) ds *= dtanh[i];
        // Rows past the sequence have no lse2 / delta: select, never multiply.
        st[i] = masked && !((vis >> i) & 1) ? 0.f : ds;
      }
    }
#pragma unroll
    for (int j = 0; j < BM / 4; ++j) dsf[j] = ptx::thread_pack2<E>(st[2 * j], st[2 * j + 1]);
    // P^T and dS^T as they are, [key][query]: pf[j], dsf[j] are the 8 x 8 blocks (keys 8 (j & 1),
    // queries 8 (j >> 1)) of the warp's 16 keys in accumulator layout, stored four blocks at a
    // time; lane L addresses key row L & 7 of block 4 q + (L >> 3).
    const int jb = lane >> 3;
#pragma unroll
    for (int q = 0; q < BM / 16; ++q) {
      const uint32_t row_at = swizzled_offset<BN>(key_a - g + 8 * (jb & 1) + (lane & 7), 16 * q + 8 * (jb >> 1));
      ptx::warp_stmatrix_x4(*reinterpret_cast<const uint32_t(*)[4]>(&pf[4 * q]), sP + row_at);
      ptx::warp_stmatrix_x4(*reinterpret_cast<const uint32_t(*)[4]>(&dsf[4 * q]), sdS + row_at);
    }
    ptx::thread_pin(dsf);
    ptx::thread_pin(dk);
    ptx::warpgroup_fence();
#pragma unroll
    for (int k = 0; k < BM / 16; ++k)
      ptx::Wgmma<E, H>::template rs<1>(dk, *reinterpret_cast<const uint32_t(*)[4]>(&dsf[4 * k]),
                                       q_mn + uint64_t((k * 2048) >> 4), 1);
    ptx::warpgroup_commit();
    ptx::thread_fence_proxy_async_smem();
    ptx::thread_named_arrive(T::kPBarrier, 256);
    ptx::thread_named_sync(T::kDsBarrier, 128);
    // dQ after dV and dK completed: P^T and dS^T then leave the registers, and the 64 dQ
    // accumulators fit beside dK and dV. Taking dK's dS^T from the shared-memory tile instead (as
    // the gradient warpgroup does, and as the 80-row d <= 128 kernel does for up to 2.5%), with dQ
    // queued behind dK, ran 0.984-1.001x here (bench/results/h200_session28_2026-12-04.txt, call 9).
    ptx::warpgroup_wait<0>();
    thread_release_stage(ring, stage, dv, dk, pf, dsf);
    float dq[H / 2];
    warpgroup_issue_dq<T, H>(dq, dst_desc, kmn_desc);
    ptx::warpgroup_wait<0>();
    add_dq(dq, at.tile);
  };

  auto gradient_step = [&](const Step& at, float(&dk)[H / 2], float(&dv)[H / 2]) {
    const int stage = at.stage;
    const uint64_t q_mn = at.q_mn, do_mn = at.do_mn;
    // P^T and dS^T as K-major A operands (keys x queries).
    const uint64_t p_desc = ptx::make_smem_desc_sw128(sP, 16, 1024);
    const uint64_t ds_desc = ptx::make_smem_desc_sw128(sdS, 16, 1024);
    float dp[BM / 2];
    ptx::thread_mbarrier_wait(&ring.do_full[stage], at.phase);
    ptx::thread_pin(dp);
    ptx::warpgroup_fence();
    warpgroup_product_over_d<T>(dp, kv_desc, ptx::make_smem_desc_sw128(at.dout, 16, 1024));
    ptx::warpgroup_wait<0>();
    ptx::thread_pin(dp);
    // The score warpgroup read the previous step's dP^T before the last P barrier.
#pragma unroll
    for (int c = 0; c < BM / 8; ++c)
      *reinterpret_cast<float4*>(sdP + (c * 128 + tid) * 4) = make_float4(dp[4 * c], dp[4 * c + 1], dp[4 * c + 2], dp[4 * c + 3]);
    ptx::thread_named_arrive(T::kDpBarrier, 256);
    ptx::thread_named_sync(T::kPBarrier, 256);
    ptx::thread_pin(dv);
    ptx::thread_pin(dk);
    ptx::warpgroup_fence();
#pragma unroll
    for (int k = 0; k < BM / 16; ++k)
      ptx::Wgmma<E, H>::template ss<1>(dv, p_desc + uint64_t((k * 32) >> 4), do_mn + uint64_t((k * 2048) >> 4), 1);
#pragma unroll
    for (int k = 0; k < BM / 16; ++k)
      ptx::Wgmma<E, H>::template ss<1>(dk, ds_desc + uint64_t((k * 32) >> 4), q_mn + uint64_t((k * 2048) >> 4), 1);
    ptx::warpgroup_commit();
    float dq[H / 2];
    warpgroup_issue_dq<T, H>(dq, dst_desc, kmn_desc);
    ptx::warpgroup_wait<1>();
    thread_release_stage(ring, stage, dv, dk);
    ptx::warpgroup_wait<0>();
    add_dq(dq, at.tile);
  };

  // The CTA's key tiles and their query steps. (One loop with the role's branch inside: one loop
  // per role kept more values live and spilled several times as much. The default instantiation
  // starts at blockIdx.x spelled out: through grid_key_tile, which returns the same, ptxas
  // allocated its registers otherwise and spilled 112 / 388 bytes against 68 / 100.)
  int kt = 0, it = 0;
  for (int64_t n = kOrdered ? grid_key_tile<kOrdered>(sched) : blockIdx.x; n < cta.n_blocks; n += gridDim.x) {
    const auto ks = key_steps<BM, BN, kOrdered>(mask, n, cta.group, sched.turns);
    const int64_t key0 = n * BN;
    float dk[H / 2], dv[H / 2];
#pragma unroll
    for (int i = 0; i < H / 2; ++i) dk[i] = dv[i] = 0.f;

    if (ks.steps > 0) {
      ptx::thread_mbarrier_wait(ring.kv_full, uint32_t(kt) & 1u);
      for (int s = 0; s < ks.steps; ++s, ++it) {
        Step at;
        at.stage = it % S;
        at.phase = uint32_t(it / S) & 1u;
        const int h = cta.hk * cta.group + ks.head(s);
        at.m = int(ks.m_of(s));
        at.n = int(n);
        at.key0 = int(key0);
        at.tile = int(int64_t(h) * ws.tiles_per_head + cta.tile0 + at.m);
        at.q = ring.q + at.stage * T::kQBytes;
        at.dout = ring.dout + at.stage * T::kQBytes;
        at.q_mn = ptx::make_smem_desc_sw128(at.q + half_off, BM * 128, 1024);
        at.do_mn = ptx::make_smem_desc_sw128(at.dout + half_off, BM * 128, 1024);
        if (cwg == 0)
          score_step(at, dk, dv);
        else
          gradient_step(at, dk, dv);
      }
      if (tid == 0) ptx::thread_mbarrier_arrive(ring.kv_empty);
      ++kt;
    }
    thread_store_dk_dv<E>(p, cta, key0, BN, key_a, cwg * H, t, dk, dv);
  }
#endif
}

}  // namespace flashattn::cuda::sm90

// The portable backward (sm80+): FlashAttention-2's recomputation in our own CUDA C++.
//
// Three kernels per call:
//   1. preprocess (src/cuda/bwd_common.cuh): per query row, D = rowsum(dO o O) and
//      lse2 = lse * log2(e) (fp32, +inf for rows that saw nothing, src/core/softmax_state.h), into
//      a workspace with dense rows;
//   2. main: one CTA per (key tile, KV head, batch) keeps K_j, V_j and the fp32 dK_j, dV_j
//      accumulators on chip and streams the query tiles of every query head that shares the KV
//      head (so GQA needs no reduction afterwards): recompute S^T = K Q^T and P^T = exp2(S^T c -
//      lse2), dP^T = V dO^T, dS^T = P^T o (dP^T - D) (times the softcap derivative and the scale),
//      dV += P^T dO, dK += dS^T Q, and dQ += dS K into an fp32 accumulator in global memory;
//   3. convert: dq = dq_accum in the input dtype.
// dQ accumulation: on sm90 the warps stage their dQ tile in shared memory and one bulk reduce-add
// per row (the copy engine) replaces 64 x head_dim scalar atomics, which bound the kernel on L2
// throughput; elsewhere red.global.add per element. Either way the order of additions varies
// between runs. In deterministic mode the grid has `splits` CTAs per (KV head, batch), each walking
// key tiles split, split + splits, ... and adding its dQ into its own fp32 slice, which no other
// CTA touches: within one key tile each slice element gets one addition, and the CTA waits for its
// bulk adds to complete (or, without the copy engine, uses plain loads and stores) before the next
// key tile, so the order is fixed; the convert kernel sums the slices in index order.
//
// Warp layouts: phases 1 (S^T, dP^T) and 2 (dV, dK) put kBlockN/16 warps along the keys and the
// rest (kWarpsX12) along the queries (phase 1) or the head dim (phase 2); phase 3 (dQ) puts 4 warps
// along the 64 query rows and the rest (kWarpsX3) along the head dim. P^T and dS^T pass between
// phases through shared memory as 16-bit values, as FlashAttention-2 does.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/block_range.h"
#include "core/params.h"
#include "core/softmax_state.h"
#include "cuda/bwd_common.cuh"
#include "cuda/ptx/sm80.cuh"
#include "cuda/ptx/sm90.cuh"
#include "cuda/sm80/smem_tile.cuh"

namespace flashattn::cuda::sm80 {

template <int kHeadDim_, class Element_, int kBlockN_, int kWarps_, int kStages_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;  // keys per CTA
  static constexpr int kWarps = kWarps_;
  static constexpr int kStages = kStages_;  // Q/dO tiles in flight
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockM = 64;  // query rows per step
  static constexpr int kWarpsN = kBlockN / 16;
  static constexpr int kWarpsX12 = kWarps / kWarpsN;
  static constexpr int kWarpsX3 = kWarps / 4;
  static constexpr int kColsS = kBlockM / kWarpsX12;   // query columns of S^T per warp
  static constexpr int kColsD12 = kHeadDim / kWarpsX12;  // head-dim columns of dK, dV per warp
  static constexpr int kColsD3 = kHeadDim / kWarpsX3;    // head-dim columns of dQ per warp
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kChunksP = kBlockM / 8;
  static constexpr int kTileQ = kBlockM * kHeadDim;
  static constexpr int kTileKV = kBlockN * kHeadDim;
  static constexpr int kTileP = kBlockN * kBlockM;
  // Each stage holds Q then dO: 2 * kTileQ 16-bit values = one fp32 [kBlockM][kHeadDim] tile, which
  // phase 3 reuses to stage dQ for the bulk reduce once phase 2 is done with Q and dO.
  static constexpr int kSmemBytes =
      (2 * kTileKV + 2 * kStages * kTileQ + 2 * kTileP) * int(sizeof(Element)) + 2 * kStages * kBlockM * 4;
  static_assert(kWarps % kWarpsN == 0 && kWarps % 4 == 0, "warp layouts must tile the CTA");
  static_assert(kColsD12 % 16 == 0 && kColsD3 % 16 == 0 && kColsS % 16 == 0, "ldmatrix.x4 covers two n8 tiles");
};

// ---- 3. convert ---------------------------------------------------------------------------------

// One thread per 8 head-dim columns of one (row, head); sums the splits in index order.
template <class E>
__global__ void __launch_bounds__(128) backward_convert_dq_kernel(const __grid_constant__ core::BackwardParams p,
                                                                  BwdWorkspace ws) {
  const int h = blockIdx.y, b = blockIdx.z;
  int64_t q0, sq;
  query_rows(p, b, &q0, &sq);
  const int chunks = int(p.head_dim / 8);
  const int64_t idx = int64_t(blockIdx.x) * 128 + threadIdx.x;
  const int64_t row = idx / chunks;
  const int x = int(idx % chunks) * 8;
  if (row >= sq) return;
  const int64_t slice = p.total_q * p.heads_q * p.head_dim;
  const float* acc = ws.dq_accum + ((workspace_row0(p, b) + row) * p.heads_q + h) * p.head_dim + x;
  float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int s = 0; s < ws.splits; ++s)
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] += acc[s * slice + i];
  E* dq = static_cast<E*>(p.dq) + p.dq_s.offset(b, q0 + row, h) + x;
#pragma unroll
  for (int i = 0; i < 8; i += 2) *reinterpret_cast<uint32_t*>(dq + i) = ptx::thread_pack2<E>(v[i], v[i + 1]);
}

// ---- 2. main ------------------------------------------------------------------------------------

template <class T, bool kSoftcap>
__global__ void __launch_bounds__(T::kThreads) backward_kernel(const __grid_constant__ core::BackwardParams p,
                                                               BwdWorkspace ws) {
  using E = typename T::Element;
  using Mma = ptx::Mma<E>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  E* sK = reinterpret_cast<E*>(smem_raw);
  E* sV = sK + T::kTileKV;
  E* sStage = sV + T::kTileKV;                  // [kStages][Q | dO]
  E* sP = sStage + 2 * T::kStages * T::kTileQ;  // P^T  [keys][queries]
  E* sdS = sP + T::kTileP;                      // dS^T [keys][queries]
  float* sLse = reinterpret_cast<float*>(sdS + T::kTileP);  // [kStages][kBlockM]
  float* sDelta = sLse + T::kStages * T::kBlockM;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3, mi = lane >> 3;
  const int warp_n = warp % T::kWarpsN, warp_x = warp / T::kWarpsN;  // phases 1 and 2
  const int warp_m = warp % 4, warp_d = warp / 4;                    // phase 3
  const int hk = blockIdx.y, b = blockIdx.z;
  const int group = int(p.heads_q / p.heads_kv);

  int64_t q0 = 0, k0 = 0, sq = p.seqlen_q, sk = p.seqlen_k;
  if (p.cu_seqlens_q != nullptr) {
    q0 = p.cu_seqlens_q[b];
    sq = p.cu_seqlens_q[b + 1] - q0;
    k0 = p.cu_seqlens_k[b];
    sk = p.cu_seqlens_k[b + 1] - k0;
  }
  const int64_t wrow0 = workspace_row0(p, b);
  const int chunks_valid = int(p.head_dim / 8);
  const core::MaskSpec mask{sq, sk, p.window_left, p.window_right};
  const float c = float(core::kLog2e) * (kSoftcap ? p.softcap : p.scale);
  const float tanh_scale = kSoftcap ? p.scale / p.softcap : 0.f;
  const bool deterministic = ws.splits > 1 || p.deterministic;
  float* dq_slice = ws.dq_accum + (deterministic ? int64_t(blockIdx.x) * p.total_q * p.heads_q * p.head_dim : 0);

  // Lane address plans (smem_tile.cuh): A fragments of K, V (phase 1) and of P^T, dS^T (phase 2),
  // the rows of this warp; B fragments of Q, dO (phase 1, non-transposed); transposed B fragments
  // of dO, Q (phase 2) and K (phase 3); transposed A fragments of dS^T (phase 3).
  const LaneRows<T::kChunks> kv_a(16 * warp_n + (lane & 15), lane >> 4);
  const LaneRows<T::kChunksP> p_a(16 * warp_n + (lane & 15), lane >> 4);
  const LaneRows<T::kChunks> qdo_b(T::kColsS * warp_x + 8 * (mi >> 1) + (lane & 7), mi & 1);
  const LaneRows<T::kChunks> trans_b(8 * (mi & 1) + (lane & 7), mi >> 1);
  const LaneRows<T::kChunksP> ds_a_trans(8 * (mi >> 1) + (lane & 7), mi & 1);
  const int d_chunk12 = T::kColsD12 / 8 * warp_x;  // first head-dim chunk of this warp (even)
  const int d_chunk3 = T::kColsD3 / 8 * warp_d;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const bool bulk_dq = true;
#else
  const bool bulk_dq = false;
#endif

  const int64_t n_blocks = (sk + T::kBlockN - 1) / T::kBlockN;
  for (int64_t n = blockIdx.x; n < n_blocks; n += gridDim.x) {
    const int64_t key0 = n * T::kBlockN;
    const int keys_valid = int(sk - key0 < T::kBlockN ? sk - key0 : T::kBlockN);
    const core::QueryTiles q_tiles = core::query_tiles_seeing(mask, key0, key0 + keys_valid, T::kBlockM);
    const int64_t m_begin = q_tiles.m_begin, m_end = q_tiles.m_end;
    const int64_t steps = (m_end - m_begin) * group;  // (query head, query tile) pairs

    float acc_dk[T::kColsD12 / 8][4], acc_dv[T::kColsD12 / 8][4];
#pragma unroll
    for (int j = 0; j < T::kColsD12 / 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc_dk[j][i] = acc_dv[j][i] = 0.f;

    const E* kg = static_cast<const E*>(p.k) + p.k_s.offset(b, k0 + key0, hk);
    const E* vg = static_cast<const E*>(p.v) + p.v_s.offset(b, k0 + key0, hk);
    block_load_tile<T, T::kBlockN>(sK, kg, p.k_s.row, keys_valid, chunks_valid);
    block_load_tile<T, T::kBlockN>(sV, vg, p.v_s.row, keys_valid, chunks_valid);

    auto load_step = [&](int64_t step, int stage) {
      const int h = hk * group + int(step / (m_end - m_begin));
      const int64_t m0 = (m_begin + step % (m_end - m_begin)) * T::kBlockM;
      const int rows = int(sq - m0 < T::kBlockM ? sq - m0 : T::kBlockM);
      block_load_tile<T, T::kBlockM>(sStage + 2 * stage * T::kTileQ,
                                     static_cast<const E*>(p.q) + p.q_s.offset(b, q0 + m0, h), p.q_s.row, rows,
                                     chunks_valid);
      block_load_tile<T, T::kBlockM>(sStage + (2 * stage + 1) * T::kTileQ,
                                     static_cast<const E*>(p.dout) + p.do_s.offset(b, q0 + m0, h), p.do_s.row, rows,
                                     chunks_valid);
      if (threadIdx.x < T::kBlockM) {
        int64_t w = int64_t(h) * p.total_q + wrow0 + m0 + threadIdx.x;
        bool valid = int(threadIdx.x) < rows;
        ptx::thread_cp_async_4(sLse + stage * T::kBlockM + threadIdx.x, valid ? ws.lse2 + w : ws.lse2, valid);
        ptx::thread_cp_async_4(sDelta + stage * T::kBlockM + threadIdx.x, valid ? ws.delta + w : ws.delta, valid);
      }
    };
    // K/V join the first group; every stage commits a group (empty past the end) so that
    // "kStages - 1 groups pending" always means "step `it` has landed".
#pragma unroll
    for (int s = 0; s < T::kStages; ++s) {
      if (s < steps) load_step(s, s);
      ptx::thread_cp_async_commit();
    }

    auto step_fn = [&](int64_t it, auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      ptx::thread_cp_async_wait<T::kStages - 1>();
      __syncthreads();
      const int stage = int(it % T::kStages);
      const int h = hk * group + int(it / (m_end - m_begin));
      const int64_t m0 = (m_begin + it % (m_end - m_begin)) * T::kBlockM;
      E* sQs = sStage + 2 * stage * T::kTileQ;
      const E* sdOs = sQs + T::kTileQ;
      const float* lse2 = sLse + stage * T::kBlockM;
      const float* delta = sDelta + stage * T::kBlockM;

      // Phase 1: S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys x kColsS queries.
      float acc_s[T::kColsS / 8][4], acc_dp[T::kColsS / 8][4];
#pragma unroll
      for (int j = 0; j < T::kColsS / 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc_s[j][i] = acc_dp[j][i] = 0.f;
#pragma unroll
      for (int ks = 0; ks < T::kHeadDim / 16; ++ks) {
        uint32_t a_k[4], a_v[4];
        ptx::warp_ldmatrix_x4(a_k, sK + kv_a.at(0, 2 * ks));
        ptx::warp_ldmatrix_x4(a_v, sV + kv_a.at(0, 2 * ks));
#pragma unroll
        for (int jn = 0; jn < T::kColsS / 8; jn += 2) {
          uint32_t bq[4], bdo[4];
          ptx::warp_ldmatrix_x4(bq, sQs + qdo_b.at(8 * jn, 2 * ks));
          ptx::warp_ldmatrix_x4(bdo, sdOs + qdo_b.at(8 * jn, 2 * ks));
          Mma::warp_m16n8k16(acc_s[jn], a_k, bq[0], bq[1]);
          Mma::warp_m16n8k16(acc_s[jn + 1], a_k, bq[2], bq[3]);
          Mma::warp_m16n8k16(acc_dp[jn], a_v, bdo[0], bdo[1]);
          Mma::warp_m16n8k16(acc_dp[jn + 1], a_v, bdo[2], bdo[3]);
        }
      }

      // P^T and dS^T per element (key row r, query column q), stored to shared memory as 16 bits.
#pragma unroll
      for (int j = 0; j < T::kColsS / 8; ++j) {
        const int col = T::kColsS * warp_x + 8 * j + 2 * t;
        const float2 l2 = *reinterpret_cast<const float2*>(lse2 + col);
        const float2 dl = *reinterpret_cast<const float2*>(delta + col);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int row = 16 * warp_n + g + 8 * rr;
          float pv[2], dsv[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float u = acc_s[j][2 * rr + e];
            if constexpr (kSoftcap) u = ptx::thread_tanh(u * tanh_scale);
            float pe = ptx::thread_exp2(fmaf(u, c, -(e ? l2.y : l2.x)));
            if constexpr (kMasked) {
              int64_t qrow = m0 + col + e, key = key0 + row;
              if (qrow >= sq || !mask.visible(qrow, key)) pe = 0.f;
            }
            float ds = pe * (acc_dp[j][2 * rr + e] - (e ? dl.y : dl.x)) * p.scale;
            if constexpr (kSoftcap) ds *= 1.f - u * u;
            pv[e] = pe;
            dsv[e] = ds;
          }
          const int off = Swizzle<T::kChunksP>::offset(row, col / 8) + (col % 8);
          *reinterpret_cast<uint32_t*>(sP + off) = ptx::thread_pack2<E>(pv[0], pv[1]);
          *reinterpret_cast<uint32_t*>(sdS + off) = ptx::thread_pack2<E>(dsv[0], dsv[1]);
        }
      }
      __syncthreads();

      // Phase 2: dV += P^T dO and dK += dS^T Q for this warp's 16 keys x kColsD12 columns.
#pragma unroll
      for (int kk = 0; kk < T::kBlockM / 16; ++kk) {
        uint32_t a_p[4], a_ds[4];
        ptx::warp_ldmatrix_x4(a_p, sP + p_a.at(0, 2 * kk));
        ptx::warp_ldmatrix_x4(a_ds, sdS + p_a.at(0, 2 * kk));
#pragma unroll
        for (int jd = 0; jd < T::kColsD12 / 8; jd += 2) {
          uint32_t bdo[4], bq[4];
          ptx::warp_ldmatrix_x4_trans(bdo, sdOs + trans_b.at(16 * kk, d_chunk12 + jd));
          ptx::warp_ldmatrix_x4_trans(bq, sQs + trans_b.at(16 * kk, d_chunk12 + jd));
          Mma::warp_m16n8k16(acc_dv[jd], a_p, bdo[0], bdo[1]);
          Mma::warp_m16n8k16(acc_dv[jd + 1], a_p, bdo[2], bdo[3]);
          Mma::warp_m16n8k16(acc_dk[jd], a_ds, bq[0], bq[1]);
          Mma::warp_m16n8k16(acc_dk[jd + 1], a_ds, bq[2], bq[3]);
        }
      }

      // Phase 3: dQ += dS K for this warp's 16 query rows x kColsD3 columns, into fp32 global memory.
      {
        float acc_dq[T::kColsD3 / 8][4];
#pragma unroll
        for (int j = 0; j < T::kColsD3 / 8; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc_dq[j][i] = 0.f;
#pragma unroll
        for (int kk = 0; kk < T::kBlockN / 16; ++kk) {
          uint32_t a_ds[4];
          ptx::warp_ldmatrix_x4_trans(a_ds, sdS + ds_a_trans.at(16 * kk, 2 * warp_m));
#pragma unroll
          for (int jd = 0; jd < T::kColsD3 / 8; jd += 2) {
            uint32_t bk[4];
            ptx::warp_ldmatrix_x4_trans(bk, sK + trans_b.at(16 * kk, d_chunk3 + jd));
            Mma::warp_m16n8k16(acc_dq[jd], a_ds, bk[0], bk[1]);
            Mma::warp_m16n8k16(acc_dq[jd + 1], a_ds, bk[2], bk[3]);
          }
        }
        const int rows = int(sq - m0 < T::kBlockM ? sq - m0 : T::kBlockM);
        if (bulk_dq) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
          // Stage the CTA's dQ tile as fp32 [kBlockM][kHeadDim] in this step's Q|dO buffer (free once
          // every warp has finished phase 2), then one bulk reduce-add per valid row.
          float* sdQ = reinterpret_cast<float*>(sQs);
          __syncthreads();
#pragma unroll
          for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int j = 0; j < T::kColsD3 / 8; ++j)
              *reinterpret_cast<float2*>(sdQ + (16 * warp_m + g + 8 * rr) * T::kHeadDim + 8 * (d_chunk3 + j) + 2 * t) =
                  make_float2(acc_dq[j][2 * rr], acc_dq[j][2 * rr + 1]);
          ptx::thread_fence_proxy_async_smem();
          __syncthreads();
          if (int(threadIdx.x) < rows) {
            float* dst = dq_slice + ((wrow0 + m0 + threadIdx.x) * p.heads_q + h) * p.head_dim;
            ptx::thread_bulk_reduce_add_f32(dst, sdQ + threadIdx.x * T::kHeadDim, uint32_t(p.head_dim * 4));
            ptx::thread_bulk_commit();
            ptx::thread_bulk_wait_read_all();
          }
#endif
        } else {
#pragma unroll
          for (int rr = 0; rr < 2; ++rr) {
            const int row = 16 * warp_m + g + 8 * rr;
            if (row >= rows) continue;
            float* dst = dq_slice + ((wrow0 + m0 + row) * p.heads_q + h) * p.head_dim;
#pragma unroll
            for (int j = 0; j < T::kColsD3 / 8; ++j) {
              const int col = 8 * (d_chunk3 + j) + 2 * t;
              if (col >= p.head_dim) continue;
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                if (deterministic)
                  dst[col + e] += acc_dq[j][2 * rr + e];
                else
                  atomicAdd(dst + col + e, acc_dq[j][2 * rr + e]);
              }
            }
          }
        }
      }

      // All warps are done with P^T, dS^T and this Q/dO stage before they are overwritten.
      __syncthreads();
      if (it + T::kStages < steps) load_step(it + T::kStages, stage);
      ptx::thread_cp_async_commit();
    };

    for (int64_t it = 0; it < steps; ++it) {
      const int64_t m0 = (m_begin + it % (m_end - m_begin)) * T::kBlockM;
      const int rows = int(sq - m0 < T::kBlockM ? sq - m0 : T::kBlockM);
      const core::TileRange tr = core::tile_range(mask, m0, m0 + rows, T::kBlockN);
      if (rows < T::kBlockM || tr.needs_mask(n))
        step_fn(it, std::true_type{});
      else
        step_fn(it, std::false_type{});
    }
    // Drain the (empty) trailing groups before the next key tile reuses K/V memory; in
    // deterministic mode also let this tile's dQ additions land before the next tile's.
    ptx::thread_cp_async_wait<0>();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (deterministic) ptx::thread_bulk_wait_all();
#endif
    __syncthreads();

    // dK, dV of this key tile, written once (all query heads of the group are in).
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int row = 16 * warp_n + g + 8 * rr;
      if (row >= keys_valid) continue;
      E* dk = static_cast<E*>(p.dk) + p.dk_s.offset(b, k0 + key0 + row, hk);
      E* dv = static_cast<E*>(p.dv) + p.dv_s.offset(b, k0 + key0 + row, hk);
#pragma unroll
      for (int j = 0; j < T::kColsD12 / 8; ++j) {
        const int col = 8 * (d_chunk12 + j) + 2 * t;
        if (col >= p.head_dim) continue;
        *reinterpret_cast<uint32_t*>(dk + col) = ptx::thread_pack2<E>(acc_dk[j][2 * rr], acc_dk[j][2 * rr + 1]);
        *reinterpret_cast<uint32_t*>(dv + col) = ptx::thread_pack2<E>(acc_dv[j][2 * rr], acc_dv[j][2 * rr + 1]);
      }
    }
  }
}

}  // namespace flashattn::cuda::sm80

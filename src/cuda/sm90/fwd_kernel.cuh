// The Hopper forward kernel (sm_90a): FlashAttention-3's design in our own CUDA C++.
//
// One CTA per (query tile, head, batch) with warp specialization:
//   * warpgroup 0 is the producer: one elected thread issues TMA loads of the Q tile (once) and of
//     K and V tiles into a ring of shared-memory stages, each completing on an mbarrier ("full");
//     it waits on the matching "empty" barrier before refilling a stage. It gives its registers to
//     the consumers (setmaxnreg).
//   * warpgroups 1.. are consumers, 64 query rows each: S = Q K^T on wgmma with both operands in
//     shared memory, the online softmax in registers (src/core/softmax_state.h, exp2 domain, lazy
//     rescale), O += P V on wgmma with P from registers (the S accumulator re-packed, never stored)
//     and V read MN-major from shared memory.
//   * intra-warpgroup overlap: step i issues S_i = Q K_i^T and then O += P_{i-1} V_{i-1}; the
//     softmax of S_i runs while the P V product is still on the tensor cores, and O is rescaled
//     after that product lands. Key tiles are visited from the last to the first, so the masked
//     (diagonal) tiles of a causal row come first and the mask test is a uniform branch per tile.
//   * epilogue: O / l through shared memory (the Q tile's space, swizzled so the stores are free of
//     bank conflicts) to 16-byte global stores bounded by the sequence; lse written once.
// Shared-memory tiles use the 128-byte swizzle that TMA writes and wgmma reads: a row of head_dim
// elements is split into 64-element (128-byte) column blocks stored one after the other.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/block_range.h"
#include "core/params.h"
#include "core/softmax_state.h"
#include "cuda/ptx/sm80.cuh"
#include "cuda/ptx/sm90.cuh"
#include "cuda/ptx/wgmma.cuh"

namespace flashattn::cuda::sm90 {

// Kernel parameters: the plain forward params plus the TMA maps of Q, K and V (passed by value as
// a __grid_constant__, where the copy engine reads them).
struct FwdParams {
  CUtensorMap tq, tk, tv;
  core::ForwardParams p;
};

template <int kHeadDim_, class Element_, int kBlockN_, int kConsumerWGs_, int kStages_>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kConsumerWGs = kConsumerWGs_;
  static constexpr int kStages = kStages_;
  static constexpr int kBlockM = 64 * kConsumerWGs;
  static constexpr int kThreads = 128 * (kConsumerWGs + 1);
  static constexpr int kColBlocks = kHeadDim / 64;  // 128-byte swizzle spans per row
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kPvN = kHeadDim < 128 ? kHeadDim : 128;  // O columns per P V wgmma
  static constexpr int kPvParts = kHeadDim / kPvN;
  // setmaxnreg budgets (FlashAttention-3's): 128*24 + 256*240 and 128*32 + 384*160 <= 64K.
  static constexpr int kProducerRegs = kConsumerWGs == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kConsumerWGs == 2 ? 240 : 160;
  static constexpr int kBarrierBytes = 8 * (1 + 4 * kStages);
  // Tiles start 1024-byte aligned (the swizzle pattern repeats every 8 rows of 128 bytes and the
  // descriptors assume it starts on such a boundary); the slack covers aligning the dynamic base.
  static constexpr int kSmemBytes = 1024 + kQBytes + 2 * kStages * kKVBytes + kBarrierBytes;
  static_assert(kHeadDim % 64 == 0 && kBlockN % 16 == 0 && kBlockN <= 192, "tile shape");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

// Byte offset of element (row, col) of a tile stored as 128-byte swizzled column blocks of `rows`
// rows each (what TMA's SWIZZLE_128B writes): the 16-byte chunk index is XORed with row % 8.
template <int kRows>
__device__ __forceinline__ uint32_t swizzled_offset(int row, int col) {
  int block = col / 64, byte = (col % 64) * 2;
  return uint32_t(block * kRows * 128 + row * 128 + ((((byte >> 4) ^ (row & 7)) << 4) | (byte & 15)));
}

template <class T, bool kSoftcap>
__global__ void __launch_bounds__(T::kThreads, 1) forward_kernel(const __grid_constant__ FwdParams P) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using E = typename T::Element;
  constexpr int D = T::kHeadDim, BM = T::kBlockM, BN = T::kBlockN, S = T::kStages;
  const core::ForwardParams& p = P.p;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* sQ = smem;
  unsigned char* sK = sQ + T::kQBytes;
  unsigned char* sV = sK + S * T::kKVBytes;
  uint64_t* bar = reinterpret_cast<uint64_t*>(sV + S * T::kKVBytes);
  uint64_t* q_full = bar;
  uint64_t* k_full = bar + 1;
  uint64_t* k_empty = k_full + S;
  uint64_t* v_full = k_empty + S;
  uint64_t* v_empty = v_full + S;

  const int h = blockIdx.y, b = blockIdx.z;
  // With a right bound (causal), later query tiles see more keys: launching them first shortens
  // the tail of the grid.
  const int m_block = p.window_right >= 0 ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  int64_t q0 = 0, k0 = 0, sq = p.seqlen_q, sk = p.seqlen_k;
  if (p.cu_seqlens_q != nullptr) {
    q0 = p.cu_seqlens_q[b];
    sq = p.cu_seqlens_q[b + 1] - q0;
    k0 = p.cu_seqlens_k[b];
    sk = p.cu_seqlens_k[b + 1] - k0;
  }
  const int64_t r0 = int64_t(m_block) * BM;
  if (r0 >= sq) return;  // uniform across the CTA, before any barrier exists
  const int rows_valid = int(sq - r0 < BM ? sq - r0 : BM);
  const int hk = int(h / (p.heads_q / p.heads_kv));
  const core::MaskSpec mask{sq, sk, p.window_left, p.window_right};
  const core::TileRange tiles = core::tile_range(mask, r0, r0 + rows_valid, BN);
  const int count = int(tiles.n_end - tiles.n_begin);
  // TMA coordinates: varlen tensors are mapped as one packed sequence (batch 1).
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int tma_b = varlen ? 0 : b;

  if (threadIdx.x == 0) {
    ptx::thread_mbarrier_init(q_full, 1);
    for (int s = 0; s < S; ++s) {
      ptx::thread_mbarrier_init(&k_full[s], 1);
      ptx::thread_mbarrier_init(&v_full[s], 1);
      ptx::thread_mbarrier_init(&k_empty[s], T::kConsumerWGs);
      ptx::thread_mbarrier_init(&v_empty[s], T::kConsumerWGs);
    }
    ptx::thread_fence_mbarrier_init();
  }
  __syncthreads();

  const int wg = int(threadIdx.x) / 128;
  if (wg == 0) {
    // ---- producer ----
    ptx::warpgroup_reg_dealloc<T::kProducerRegs>();
    if (threadIdx.x / 32 == 0 && ptx::warp_elect_one() && count > 0) {
      ptx::thread_prefetch_tensormap(&P.tq);
      ptx::thread_prefetch_tensormap(&P.tk);
      ptx::thread_prefetch_tensormap(&P.tv);
      ptx::thread_mbarrier_arrive_expect_tx(q_full, T::kQBytes);
#pragma unroll
      for (int c = 0; c < T::kColBlocks; ++c)
        ptx::thread_tma_load_4d(sQ + c * BM * 128, &P.tq, q_full, 64 * c, int(q0 + r0), h, tma_b);
      for (int i = 0; i < count; ++i) {
        const int stage = i % S;
        const uint32_t phase = uint32_t(i / S) & 1u;
        const int key0 = int(k0 + (tiles.n_end - 1 - i) * BN);
        ptx::thread_mbarrier_wait(&k_empty[stage], phase ^ 1u);
        ptx::thread_mbarrier_arrive_expect_tx(&k_full[stage], T::kKVBytes);
#pragma unroll
        for (int c = 0; c < T::kColBlocks; ++c)
          ptx::thread_tma_load_4d(sK + stage * T::kKVBytes + c * BN * 128, &P.tk, &k_full[stage], 64 * c, key0, hk, tma_b);
        ptx::thread_mbarrier_wait(&v_empty[stage], phase ^ 1u);
        ptx::thread_mbarrier_arrive_expect_tx(&v_full[stage], T::kKVBytes);
#pragma unroll
        for (int c = 0; c < T::kColBlocks; ++c)
          ptx::thread_tma_load_4d(sV + stage * T::kKVBytes + c * BN * 128, &P.tv, &v_full[stage], 64 * c, key0, hk, tma_b);
      }
    }
    return;
  }

  // ---- consumers ----
  ptx::warpgroup_reg_alloc<T::kConsumerRegs>();
  const int cwg = wg - 1;                       // consumer warpgroup: rows [64 cwg, 64 cwg + 64)
  const int tid = int(threadIdx.x) % 128;       // thread in the warpgroup
  const int w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row_a = 64 * cwg + 16 * w + g;      // this thread's rows in the tile: row_a, row_a + 8

  // Scores enter exp2 as fma(u, c, -base) with u the raw q.k (or tanh of it under softcap).
  const float c_log2 = float(core::kLog2e) * (kSoftcap ? p.softcap : p.scale);
  const float tanh_scale = kSoftcap ? p.scale / p.softcap : 0.f;

  float o[T::kPvParts][T::kPvN / 2];
#pragma unroll
  for (int part = 0; part < T::kPvParts; ++part)
#pragma unroll
    for (int i = 0; i < T::kPvN / 2; ++i) o[part][i] = 0.f;
  float row_max[2] = {core::neg_inf<float>(), core::neg_inf<float>()};
  float row_sum[2] = {0.f, 0.f};  // thread-partial, quad-reduced at the end
  uint32_t pf[BN / 4];            // P as 16-bit pairs: the A fragments of P V

  // S = Q K^T: both operands K-major in shared memory; k16 steps walk 32 bytes inside a 128-byte
  // row, then jump to the next column block.
  auto issue_s = [&](float(&s)[BN / 2], int stage) {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const int cb = ks / 4, kk = ks % 4;
      uint64_t da = ptx::make_smem_desc_sw128(sQ + cb * BM * 128 + cwg * 64 * 128 + kk * 32, 16, 1024);
      uint64_t db = ptx::make_smem_desc_sw128(sK + stage * T::kKVBytes + cb * BN * 128 + kk * 32, 16, 1024);
      ptx::Wgmma<E, BN>::template ss<0>(s, da, db, ks > 0 ? 1 : 0);
    }
  };
  // O += P V: V is [key][d], i.e. MN-major for B; a k16 step is 16 key rows (2048 bytes), and
  // the next 64-column block of d sits BN * 128 bytes further (the descriptor's leading offset).
  auto issue_pv = [&](int stage) {
#pragma unroll
    for (int kt = 0; kt < BN / 16; ++kt) {
      const uint32_t(&a)[4] = *reinterpret_cast<const uint32_t(*)[4]>(&pf[4 * kt]);
#pragma unroll
      for (int part = 0; part < T::kPvParts; ++part) {
        uint64_t db = ptx::make_smem_desc_sw128(
            sV + stage * T::kKVBytes + part * (T::kPvN / 64) * BN * 128 + kt * 2048, BN * 128, 1024);
        ptx::Wgmma<E, T::kPvN>::template rs<1>(o[part], a, db, 1);
      }
    }
  };
  // Softcap, mask, new (lazy) max, P = exp2(u*c - base) into s, row sums; returns the factors the
  // old O and l must be multiplied by.
  auto softmax = [&](float(&s)[BN / 2], int64_t n, float(&factor)[2]) {
    if constexpr (kSoftcap) {
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) s[i] = ptx::thread_tanh(s[i] * tanh_scale);
    }
    if (tiles.needs_mask(n)) {
      const int64_t key0 = n * BN;
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int64_t row = r0 + row_a + 8 * rr;
        const int lo = int(max(min(mask.lo(row) - key0, int64_t(BN)), int64_t(0)));
        const int hi = int(max(min(mask.hi(row) - key0, int64_t(BN)), int64_t(0)));
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
          if (((i >> 1) & 1) != rr) continue;
          const int col = 8 * (i >> 2) + 2 * t + (i & 1);
          if (col < lo || col >= hi) s[i] = core::neg_inf<float>();
        }
      }
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float mx = core::neg_inf<float>();
#pragma unroll
      for (int i = 0; i < BN / 2; ++i)
        if (((i >> 1) & 1) == rr) mx = fmaxf(mx, s[i]);
      mx = ptx::quad_max(mx);
      const float m_new = core::lazy_max(row_max[rr], mx * c_log2);
      factor[rr] = core::rescale_factor(row_max[rr], m_new);
      row_max[rr] = m_new;
      row_sum[rr] *= factor[rr];
      const float base = core::exponent_base(m_new);
#pragma unroll
      for (int i = 0; i < BN / 2; ++i)
        if (((i >> 1) & 1) == rr) {
          s[i] = ptx::thread_exp2(fmaf(s[i], c_log2, -base));
          row_sum[rr] += s[i];
        }
    }
  };
  auto pack_p = [&](const float(&s)[BN / 2]) {
#pragma unroll
    for (int j = 0; j < BN / 4; ++j) pf[j] = ptx::thread_pack2<E>(s[2 * j], s[2 * j + 1]);
  };
  auto rescale_o = [&](const float(&factor)[2]) {
    if (__any_sync(0xffffffffu, factor[0] != 1.f || factor[1] != 1.f)) {
#pragma unroll
      for (int part = 0; part < T::kPvParts; ++part)
#pragma unroll
        for (int i = 0; i < T::kPvN / 2; ++i) o[part][i] *= factor[(i >> 1) & 1];
    }
  };
  // One thread per consumer warpgroup releases a stage once the warpgroup's wgmmas on it are done.
  auto release = [&](uint64_t* empty) {
    if (tid == 0) ptx::thread_mbarrier_arrive(empty);
  };

  if (count > 0) {
    ptx::thread_mbarrier_wait(q_full, 0);
    {
      // Prologue: the first (last-in-order) key tile's scores and softmax; O is still empty.
      float s[BN / 2];
      ptx::thread_mbarrier_wait(&k_full[0], 0);
      ptx::warpgroup_fence();
      issue_s(s, 0);
      ptx::warpgroup_commit();
      ptx::warpgroup_wait<0>();
      ptx::thread_pin(s);
      release(&k_empty[0]);
      float factor[2];
      softmax(s, tiles.n_end - 1, factor);
      pack_p(s);
    }
    for (int i = 1; i < count; ++i) {
      const int stage = i % S, prev = (i - 1) % S;
      const uint32_t phase = uint32_t(i / S) & 1u, prev_phase = uint32_t((i - 1) / S) & 1u;
      float s[BN / 2];
      ptx::thread_mbarrier_wait(&k_full[stage], phase);
      ptx::warpgroup_fence();
      issue_s(s, stage);
      ptx::warpgroup_commit();
      ptx::thread_mbarrier_wait(&v_full[prev], prev_phase);
      issue_pv(prev);
      ptx::warpgroup_commit();
      ptx::warpgroup_wait<1>();  // S_i landed; P_{i-1} V_{i-1} may still run
      ptx::thread_pin(s);
      release(&k_empty[stage]);
      float factor[2];
      softmax(s, tiles.n_end - 1 - i, factor);
      ptx::warpgroup_wait<0>();
      ptx::thread_pin(pf);
#pragma unroll
      for (int part = 0; part < T::kPvParts; ++part) ptx::thread_pin(o[part]);
      release(&v_empty[prev]);
      rescale_o(factor);
      pack_p(s);
    }
    {
      const int last = (count - 1) % S;
      ptx::thread_mbarrier_wait(&v_full[last], uint32_t((count - 1) / S) & 1u);
      ptx::warpgroup_fence();
      issue_pv(last);
      ptx::warpgroup_commit();
      ptx::warpgroup_wait<0>();
      ptx::thread_pin(pf);
#pragma unroll
      for (int part = 0; part < T::kPvParts; ++part) ptx::thread_pin(o[part]);
      release(&v_empty[last]);
    }
  }

  // ---- epilogue: O = o~ / l (0 for rows that saw nothing) staged in this warpgroup's rows of the
  // Q tile (its own S products are done with them), then 16-byte stores bounded by the sequence.
  float inv[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const float l = ptx::quad_sum(row_sum[rr]);
    inv[rr] = core::finalize_scale(l);
    const int row = row_a + 8 * rr;
    if (p.lse != nullptr && t == 0 && row < rows_valid)
      static_cast<float*>(p.lse)[p.lse_s.offset(b, q0 + r0 + row, h)] = core::finalize_lse(row_max[rr], l);
  }
#pragma unroll
  for (int part = 0; part < T::kPvParts; ++part)
#pragma unroll
    for (int i = 0; i < T::kPvN / 2; i += 2) {
      const int row = row_a + 8 * ((i >> 1) & 1);
      const int col = part * T::kPvN + 8 * (i >> 2) + 2 * t;
      const float f = inv[(i >> 1) & 1];
      *reinterpret_cast<uint32_t*>(sQ + swizzled_offset<BM>(row, col)) =
          ptx::thread_pack2<E>(o[part][i] * f, o[part][i + 1] * f);
    }
  ptx::thread_named_sync(1 + cwg, 128);
  E* out = static_cast<E*>(p.out);
  constexpr int kChunksPerRow = D / 8;
#pragma unroll 4
  for (int idx = tid; idx < 64 * kChunksPerRow; idx += 128) {
    const int row = 64 * cwg + idx / kChunksPerRow, chunk = idx % kChunksPerRow;
    if (row >= rows_valid) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(sQ + swizzled_offset<BM>(row, chunk * 8));
    *reinterpret_cast<uint4*>(out + p.o_s.offset(b, q0 + r0 + row, h) + chunk * 8) = v;
  }
#endif
}

}  // namespace flashattn::cuda::sm90

// The portable forward kernel (sm80+): FlashAttention-2's design in our own CUDA C++.
//
// One CTA per (query tile, head, batch). The Q tile is split across warps by rows (no inter-warp
// reduction); K/V tiles stream through a ring of shared-memory stages filled by cp.async; S = Q K^T
// and O += P V run on mma.sync m16n8k16 with fp32 accumulators; the online softmax (src/core/
// softmax_state.h) runs in registers in the exp2 domain with the scale folded into one FMA; P never
// leaves registers (the S accumulator is re-packed as the A operand of P V); O is divided by l once
// at the end and O and lse are written once.
//
// Split head dim (kDSplit = 2, tile_size.h says where): the warps work in pairs on the same rows.
// Each warp of a pair computes S for half of every key tile, the two exchange their row maxima
// through shared memory (one pair barrier), write their halves of P to shared memory, and each
// computes O += P V for half of the head dim over all the tile's keys. Per key tile a pair then
// reads K and V once between them where two warps of their own rows would each read all of both,
// and each warp holds O for 32 rows in the registers of 16 rows at the full head dim: at d = 256,
// about a quarter less shared-memory traffic for the same MMAs (ldmatrix.x4 per warp and key tile:
// 104 against 144).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/block_range.h"
#include "core/params.h"
#include "core/softmax_state.h"
#include "cuda/ptx/sm80.cuh"
#include "cuda/sm80/smem_tile.cuh"
#include "cuda/tile_scheduler.h"
#include "cuda/tile_size.h"

namespace flashattn::cuda::sm80 {

template <int kHeadDim_, class Element_, int kBlockN_, int kWarps_, int kMTiles_, int kStages_, bool kQInRegs_,
          int kMinCtas_ = 1, int kDSplit_ = 1, bool kStageO_ = false>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kMTiles = kMTiles_;
  static constexpr int kStages = kStages_;
  static constexpr bool kQInRegs = kQInRegs_;
  // CTAs per SM the registers are capped for: a sweep knob (bench/tile_sweep.cu); the table's tiles
  // leave it at 1 (capping spilled where tried).
  static constexpr int kMinCtas = kMinCtas_;
  static constexpr int kDSplit = kDSplit_;  // warps per row block: 1, or 2 splitting keys in S and the head dim in O
  // O leaves through the Q tile's shared memory in 16-byte chunks of rows (tile_size.h says where)
  // instead of each quad's 4-byte pairs.
  static constexpr bool kStageO = kStageO_;
  static constexpr int kRowWarps = kWarps / kDSplit;
  static constexpr int kBlockM = 16 * kRowWarps * kMTiles;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kKSteps = kHeadDim / 16;
  static constexpr int kWarpKeys = kBlockN / kDSplit;  // keys of S per warp
  static constexpr int kNTiles = kWarpKeys / 8;        // n8 tiles of S per warp
  static constexpr int kDTiles = kHeadDim / 8 / kDSplit;  // n8 tiles of O per warp
  static constexpr int kTileQ = kBlockM * kHeadDim;
  static constexpr int kTileKV = kBlockN * kHeadDim;
  // One stage: FlashAttention-2's single-buffer schedule, K and V in separate cp.async groups (V(n)
  // loads under S = Q K^T, K(n+1) under P V), for tiles whose shared memory must stay small enough
  // for two CTAs per SM.
  static constexpr bool kSplitKV = kStages == 1;
  // kDSplit = 2: P [kBlockM][kBlockN] in 16 bits, then a float per (row, warp of the pair).
  static constexpr int kTileP = kDSplit > 1 ? kBlockM * kBlockN : 0;
  static constexpr int kSmemBytes =
      (kTileQ + 2 * kStages * kTileKV + kTileP) * int(sizeof(Element)) + (kDSplit > 1 ? kBlockM * kDSplit * 4 : 0);
  static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0, "mma k16 steps");
  static_assert(kDSplit == 1 || kDSplit == 2, "one warp per row block, or a pair");
  static_assert(kWarpKeys % 16 == 0 && kDTiles % 2 == 0, "each warp's keys and columns in whole ldmatrix.x4 steps");
  static_assert(kDSplit == 1 || (kBlockN == 64 && kDTiles % 8 == 0),
                "a pair's halves start at whole swizzle periods: of P's 8 chunks and of the head dim's");
};

// kSoftcap is a template flag (the launcher picks one of two kernels) and the boundary mask a
// per-tile template branch: as run-time tests inside the tile loop the compiler if-converts them
// into predicated code that costs issue slots on every tile.
template <class T, bool kSoftcap>
__global__ void __launch_bounds__(T::kThreads, T::kMinCtas)
    forward_kernel(const __grid_constant__ core::ForwardParams p, const TileScheduler sched) {
  using E = typename T::Element;
  using Mma = ptx::Mma<E>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  E* sQ = reinterpret_cast<E*>(smem_raw);
  E* sK = sQ + T::kTileQ;
  E* sV = sK + T::kStages * T::kTileKV;
  [[maybe_unused]] E* sP = sV + T::kStages * T::kTileKV;                  // kDSplit > 1: [kBlockM][kBlockN]
  [[maybe_unused]] float* sRow = reinterpret_cast<float*>(sP + T::kTileP);  // [kBlockM][kDSplit]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  // The warp's row block and, in a pair, its side: keys [side * kWarpKeys, +kWarpKeys) of each
  // tile in S, head-dim n8 tiles [side * kDTiles, +kDTiles) in O.
  const int rw = warp / T::kDSplit, side = warp % T::kDSplit;
  // The pair's own barrier (ids from 1; 0 is __syncthreads).
  auto pair_sync = [&] {
    if constexpr (T::kDSplit > 1) ptx::thread_named_sync(1 + rw, 32 * T::kDSplit);
  };
  // The pair's slots for this thread's fragment row (m-tile mt, row half rr) in sRow: a float
  // each warp of the pair posts (its maximum of a tile, then its part of l) for the other to read.
  [[maybe_unused]] auto pair_slots = [&](int mt, int rr) {
    return sRow + (16 * (rw * T::kMTiles + mt) + g + 8 * rr) * T::kDSplit;
  };
  // One CTA per tile index; under a right bound (causal) the longest tiles come first, so the
  // short ones fill the tail of the grid (src/cuda/tile_scheduler.h).
  int m_block, h, b;
  sched.tile(int(blockIdx.x), &m_block, &h, &b);

  int64_t q0 = 0, k0 = 0, sq = p.seqlen_q, sk = p.seqlen_k;
  if (p.cu_seqlens_q != nullptr) {
    q0 = p.cu_seqlens_q[b];
    sq = p.cu_seqlens_q[b + 1] - q0;
    k0 = p.cu_seqlens_k[b];
    sk = p.cu_seqlens_k[b + 1] - k0;
  }
  const int64_t r0 = int64_t(m_block) * T::kBlockM;
  if (r0 >= sq) return;
  const int rows_valid = int(sq - r0 < T::kBlockM ? sq - r0 : T::kBlockM);
  const int hk = int(h / (p.heads_q / p.heads_kv));
  const int chunks_valid = int(p.head_dim / 8);
  const core::MaskSpec mask{sq, sk, p.window_left, p.window_right};
  const core::TileRange tiles = core::tile_range(mask, r0, r0 + rows_valid, T::kBlockN);

  const E* q = static_cast<const E*>(p.q) + p.q_s.offset(b, q0 + r0, h);
  const E* k = static_cast<const E*>(p.k) + p.k_s.offset(b, k0, hk);
  const E* v = static_cast<const E*>(p.v) + p.v_s.offset(b, k0, hk);

  // Scores enter exp2 as fma(u, c, -base): u is the raw q.k (or tanh of it under softcap) and c
  // folds the softmax scale (and softcap) with log2(e), so the max is taken on u and the exponent
  // costs one FMA. c > 0 is guaranteed by validation.
  const float c = float(core::kLog2e) * (kSoftcap ? p.softcap : p.scale);
  const float tanh_scale = kSoftcap ? p.scale / p.softcap : 0.f;

  float acc_o[T::kMTiles][T::kDTiles][4];
  float row_max[T::kMTiles][2], row_sum[T::kMTiles][2];  // exp2-domain max; thread-partial sum
#pragma unroll
  for (int mt = 0; mt < T::kMTiles; ++mt) {
#pragma unroll
    for (int j = 0; j < T::kDTiles; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc_o[mt][j][i] = 0.f;
    row_max[mt][0] = row_max[mt][1] = core::neg_inf<float>();
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }

  // Lane address plans (see LaneRows): Q A-fragments (rows lane % 16, chunk bit lane / 16), K
  // B-fragments (two n8 tiles: rows 8 * (mi / 2) + lane % 8, chunk bit mi % 2) and V^T B-fragments
  // (rows 8 * (mi % 2) + lane % 8, chunk bit mi / 2), with mi = lane / 8 the ldmatrix matrix index.
  const int mi = lane >> 3;
  const LaneRows<T::kChunks> q_rows(16 * rw * T::kMTiles + (lane & 15), lane >> 4);
  const LaneRows<T::kChunks> k_rows(side * T::kWarpKeys + 8 * (mi >> 1) + (lane & 7), mi & 1);
  const LaneRows<T::kChunks> v_rows(8 * (mi & 1) + (lane & 7), mi >> 1);
  // This warp's head-dim columns in P V start at a whole swizzle period (T's static_assert), so
  // they are an offset past v_rows' addresses.
  const int v_col0 = 8 * side * T::kDTiles;
  // kDSplit > 1: P's A fragments (rows as Q's, chunks of 8 keys) and the lanes' P stores, whose
  // half of the keys (chunk bit 2) is folded into the lane's swizzle bits.
  [[maybe_unused]] const LaneRows<T::kBlockN / 8> p_rows(16 * rw * T::kMTiles + (lane & 15), lane >> 4);
  [[maybe_unused]] const LaneRows<T::kBlockN / 8> p_store(16 * rw * T::kMTiles + g, side * (T::kWarpKeys / 8));

  if (!tiles.empty()) {
    block_load_tile<T, T::kBlockM>(sQ, q, p.q_s.row, rows_valid, chunks_valid);
    // Key tile n of K (or V) into a stage of sK (or sV).
    auto load_keys = [&](E* dst, const E* src, int64_t row_stride, int64_t n, int stage) {
      int64_t key0 = n * T::kBlockN;
      int keys = int(sk - key0 < T::kBlockN ? sk - key0 : T::kBlockN);
      block_load_tile<T, T::kBlockN>(dst + stage * T::kTileKV, src + key0 * row_stride, row_stride, keys, chunks_valid);
    };
    auto load_k = [&](int64_t n, int stage) { load_keys(sK, k, p.k_s.row, n, stage); };
    auto load_v = [&](int64_t n, int stage) { load_keys(sV, v, p.v_s.row, n, stage); };
    if constexpr (T::kSplitKV) {
      // Prologue: Q and the first K tile form one group.
      load_k(tiles.n_begin, 0);
      ptx::thread_cp_async_commit();
    } else {
      // Prologue: Q joins the first group; every stage's group is committed (empty past the end)
      // so that "wait until kStages - 1 groups pend" always means "tile `it` has landed".
#pragma unroll
      for (int s = 0; s < T::kStages; ++s) {
        if (tiles.n_begin + s < tiles.n_end) {
          load_k(tiles.n_begin + s, s);
          load_v(tiles.n_begin + s, s);
        }
        ptx::thread_cp_async_commit();
      }
    }

    uint32_t q_frag[T::kQInRegs ? T::kMTiles : 1][T::kQInRegs ? T::kKSteps : 1][4];
    // One K/V tile: S = Q K^T, softmax, O += P V, then refill the stage.
    auto step = [&](int64_t n, int64_t it, auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      if constexpr (T::kSplitKV) {
        ptx::thread_cp_async_wait<0>();  // K(n) (and Q) landed, for this thread's copies
        __syncthreads();                 // ...and everyone's; every warp is also done with V(n-1)
        load_v(n, 0);                    // in flight under S = Q K^T and the softmax
        ptx::thread_cp_async_commit();
      } else {
        ptx::thread_cp_async_wait<T::kStages - 1>();
        __syncthreads();
      }
      const int stage = int(it % T::kStages);
      const E* sKs = sK + stage * T::kTileKV;
      const E* sVs = sV + stage * T::kTileKV;
      if constexpr (T::kQInRegs) {
        if (it == 0) {
#pragma unroll
          for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
            for (int ks = 0; ks < T::kKSteps; ++ks) ptx::warp_ldmatrix_x4(q_frag[mt][ks], sQ + q_rows.at(16 * mt, 2 * ks));
        }
      }

      // S = Q K^T for this warp's rows: B fragments of two n8 tiles per ldmatrix.x4, reused by
      // every m-tile.
      float acc_s[T::kMTiles][T::kNTiles][4];
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < T::kNTiles; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc_s[mt][j][i] = 0.f;
#pragma unroll
      for (int ks = 0; ks < T::kKSteps; ++ks) {
        uint32_t a_smem[T::kQInRegs ? 1 : T::kMTiles][4];
        if constexpr (!T::kQInRegs) {
#pragma unroll
          for (int mt = 0; mt < T::kMTiles; ++mt) ptx::warp_ldmatrix_x4(a_smem[mt], sQ + q_rows.at(16 * mt, 2 * ks));
        }
#pragma unroll
        for (int jn = 0; jn < T::kNTiles; jn += 2) {
          uint32_t bk[4];
          ptx::warp_ldmatrix_x4(bk, sKs + k_rows.at(8 * jn, 2 * ks));
#pragma unroll
          for (int mt = 0; mt < T::kMTiles; ++mt) {
            const uint32_t(&a)[4] = T::kQInRegs ? q_frag[T::kQInRegs ? mt : 0][T::kQInRegs ? ks : 0]
                                                : a_smem[T::kQInRegs ? 0 : mt];
            Mma::warp_m16n8k16(acc_s[mt][jn], a, bk[0], bk[1]);
            Mma::warp_m16n8k16(acc_s[mt][jn + 1], a, bk[2], bk[3]);
          }
        }
      }

      // Softcap and the boundary mask in their own passes: both are uniform across the CTA, and
      // keeping their tests out of the softmax loop matters where per-element work binds (d = 64).
      if constexpr (kSoftcap) {
#pragma unroll
        for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
          for (int j = 0; j < T::kNTiles; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc_s[mt][j][i] = ptx::thread_tanh(acc_s[mt][j][i] * tanh_scale);
      }
      if constexpr (kMasked) {
#pragma unroll
        for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
          for (int rr = 0; rr < 2; ++rr) {
            // This row's visible keys relative to the warp's first key, clamped to [0, kWarpKeys].
            int64_t row = r0 + 16 * (rw * T::kMTiles + mt) + g + 8 * rr, key0 = n * T::kBlockN + side * T::kWarpKeys;
            int lo = int(max(min(mask.lo(row) - key0, int64_t(T::kWarpKeys)), int64_t(0)));
            int hi = int(max(min(mask.hi(row) - key0, int64_t(T::kWarpKeys)), int64_t(0)));
#pragma unroll
            for (int j = 0; j < T::kNTiles; ++j)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                int col = 8 * j + 2 * t + e;
                if (col < lo || col >= hi) acc_s[mt][j][2 * rr + e] = core::neg_inf<float>();
              }
          }
      }

      // Online softmax (src/core/softmax_state.h): new (lazy) max per row, then rescale O and l only
      // when some row of the warp moved its max, then P = exp2(u*c - base).
      float factor[T::kMTiles][2];
      bool moved = false;
      auto update_max = [&](int mt, int rr, float mx) {
        float m_new = core::lazy_max(row_max[mt][rr], mx * c);
        factor[mt][rr] = core::rescale_factor(row_max[mt][rr], m_new);
        row_max[mt][rr] = m_new;
        row_sum[mt][rr] *= factor[mt][rr];
        moved |= factor[mt][rr] != 1.f;
      };
      [[maybe_unused]] float side_max[T::kMTiles][2];
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          float mx = core::neg_inf<float>();
#pragma unroll
          for (int j = 0; j < T::kNTiles; ++j) mx = fmaxf(mx, fmaxf(acc_s[mt][j][2 * rr], acc_s[mt][j][2 * rr + 1]));
          mx = ptx::quad_max(mx);
          if constexpr (T::kDSplit > 1) {
            // A pair's warps post their halves' maxima and take the larger after the barrier below
            // (both then update from the same values, so their states stay equal).
            if (t == 0) pair_slots(mt, rr)[side] = mx;
            side_max[mt][rr] = mx;
          } else {
            update_max(mt, rr, mx);
          }
        }
      if constexpr (T::kDSplit > 1) {
        pair_sync();
#pragma unroll
        for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
          for (int rr = 0; rr < 2; ++rr)
            update_max(mt, rr, fmaxf(side_max[mt][rr], pair_slots(mt, rr)[side ^ 1]));
      }
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
          for (int j = 0; j < T::kDTiles; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc_o[mt][j][i] *= factor[mt][i >> 1];
      }
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const float base = core::exponent_base(row_max[mt][rr]);
#pragma unroll
          for (int j = 0; j < T::kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& s = acc_s[mt][j][2 * rr + e];
              s = ptx::thread_exp2(fmaf(s, c, -base));
              row_sum[mt][rr] += s;
            }
        }

      // P to 16 bits right away (half the registers of S): two S n8 tiles form one k16 A fragment.
      // In a pair, each warp's half goes to shared memory, read back whole after the next barrier
      // (the CTA's before P V on one-stage tiles; the pair's otherwise).
      uint32_t p_frag[T::kMTiles][T::kWarpKeys / 16][4];
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
        for (int kk = 0; kk < T::kWarpKeys / 16; ++kk) {
          p_frag[mt][kk][0] = ptx::thread_pack2<E>(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
          p_frag[mt][kk][1] = ptx::thread_pack2<E>(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
          p_frag[mt][kk][2] = ptx::thread_pack2<E>(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
          p_frag[mt][kk][3] = ptx::thread_pack2<E>(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
        }
      if constexpr (T::kDSplit > 1) {
        // A fragment register r: rows g + 8 (r & 1), keys 8 (2 kk + (r >> 1)) + 2t of the warp's half.
#pragma unroll
        for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
          for (int kk = 0; kk < T::kWarpKeys / 16; ++kk)
#pragma unroll
            for (int r = 0; r < 4; ++r)
              *reinterpret_cast<uint32_t*>(
                  sP + p_store.at(16 * mt + 8 * (r & 1), 2 * kk + (r >> 1)) + 2 * t) =
                  p_frag[mt][kk][r];
        if constexpr (!T::kSplitKV) pair_sync();
      }

      if constexpr (T::kSplitKV) {
        ptx::thread_cp_async_wait<0>();  // V(n) landed
        __syncthreads();                 // every warp is done with K(n): load K(n+1) under P V
        if (n + 1 < tiles.n_end) load_k(n + 1, 0);
        ptx::thread_cp_async_commit();
      }

      // O += P V, V^T fragments via ldmatrix.trans, each reused by every m-tile; a pair's warps over
      // all the tile's keys (P from shared memory), each for its half of the head dim.
#pragma unroll
      for (int kk = 0; kk < T::kBlockN / 16; ++kk) {
        [[maybe_unused]] uint32_t p_smem[T::kDSplit > 1 ? T::kMTiles : 1][4];
        if constexpr (T::kDSplit > 1) {
#pragma unroll
          for (int mt = 0; mt < T::kMTiles; ++mt) ptx::warp_ldmatrix_x4(p_smem[mt], sP + p_rows.at(16 * mt, 2 * kk));
        }
#pragma unroll
        for (int jd = 0; jd < T::kDTiles; jd += 2) {
          uint32_t bv[4];
          ptx::warp_ldmatrix_x4_trans(bv, sVs + v_col0 + v_rows.at(16 * kk, jd));
#pragma unroll
          for (int mt = 0; mt < T::kMTiles; ++mt) {
            const uint32_t(&a)[4] =
                T::kDSplit > 1 ? p_smem[T::kDSplit > 1 ? mt : 0] : p_frag[mt][T::kDSplit > 1 ? 0 : kk];
            Mma::warp_m16n8k16(acc_o[mt][jd], a, bv[0], bv[1]);
            Mma::warp_m16n8k16(acc_o[mt][jd + 1], a, bv[2], bv[3]);
          }
        }
      }

      if constexpr (!T::kSplitKV) {
        // Every warp is done with this stage before it is refilled.
        __syncthreads();
        if (n + T::kStages < tiles.n_end) {
          load_k(n + T::kStages, stage);
          load_v(n + T::kStages, stage);
        }
        ptx::thread_cp_async_commit();
      }
    };
    for (int64_t n = tiles.n_begin, it = 0; n < tiles.n_end; ++n, ++it) {
      if (tiles.needs_mask(n))
        step(n, it, std::true_type{});
      else
        step(n, it, std::false_type{});
    }
  }

  // Epilogue: O = o~ / l and lse = m + log l (rows that saw nothing: 0 and -inf), written once. A
  // pair's l is the sum of its halves' (posted as the maxima were; the slots' last readers passed a
  // barrier since), the same in both warps, whose maxima are equal.
  [[maybe_unused]] float pair_l[T::kMTiles][2];
  if constexpr (T::kDSplit > 1) {
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        pair_l[mt][rr] = ptx::quad_sum(row_sum[mt][rr]);
        if (t == 0) pair_slots(mt, rr)[side] = pair_l[mt][rr];
      }
    pair_sync();
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) pair_l[mt][rr] += pair_slots(mt, rr)[side ^ 1];
  }
  // O = o~ / l, from the accumulators (4-byte pairs of each quad's rows), or with kStageO through
  // the Q tile's shared memory (free once every warp is past its last step) in whole 16-byte chunks
  // of rows.
  E* o = static_cast<E*>(p.out) + p.o_s.offset(b, q0 + r0, h);
  float* lse = static_cast<float*>(p.lse);
  if constexpr (T::kStageO) __syncthreads();
#pragma unroll
  for (int mt = 0; mt < T::kMTiles; ++mt) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float l = T::kDSplit > 1 ? pair_l[mt][rr] : ptx::quad_sum(row_sum[mt][rr]);
      int row = 16 * (rw * T::kMTiles + mt) + g + 8 * rr;
      float inv = core::finalize_scale(l);
      if (lse != nullptr && t == 0 && side == 0 && row < rows_valid)
        lse[p.lse_s.offset(b, q0 + r0 + row, h)] = core::finalize_lse(row_max[mt][rr], l);
      if (!T::kStageO && row >= rows_valid) continue;
      E* orow = o + int64_t(row) * p.o_s.row;
#pragma unroll
      for (int j = 0; j < T::kDTiles; ++j) {
        const uint32_t pair = ptx::thread_pack2<E>(acc_o[mt][j][2 * rr] * inv, acc_o[mt][j][2 * rr + 1] * inv);
        const int col = v_col0 + 8 * j + 2 * t;
        if constexpr (T::kStageO)
          *reinterpret_cast<uint32_t*>(sQ + Swizzle<T::kChunks>::offset(row, side * T::kDTiles + j) + 2 * t) = pair;
        else if (col < p.head_dim)
          *reinterpret_cast<uint32_t*>(orow + col) = pair;
      }
    }
  }
  if constexpr (T::kStageO) {
    __syncthreads();
    const bool vec = (reinterpret_cast<uintptr_t>(o) | uintptr_t(p.o_s.row * int64_t(sizeof(E)))) % 16 == 0;
    block_store_tile<T, T::kBlockM>(o, p.o_s.row, sQ, rows_valid, chunks_valid, vec);
  }
}

}  // namespace flashattn::cuda::sm80

// The Hopper forward kernel (sm_90a): FlashAttention-3's design in our own CUDA C++.
//
// A persistent grid (src/cuda/tile_scheduler.h) whose CTAs walk (query tile, head, batch)
// work tiles (or, in a stream-K tail, a tile's share of key tiles, the two shares of a cut tile
// merged by whichever finishes last), with warp specialization:
//   * warpgroup 0 is the producer: one elected thread issues TMA loads of the Q tile (once per work
//     tile) and of K and V tiles into a ring of shared-memory stages, each completing on an
//     mbarrier ("full"); it waits on the matching "empty" barrier before refilling a stage. It
//     gives its registers to the consumers (setmaxnreg).
//   * warpgroups 1.. are consumers, 64 query rows each: S = Q K^T on wgmma with both operands in
//     shared memory, the online softmax in registers (src/core/softmax_state.h, exp2 domain, lazy
//     rescale), O += P V on wgmma with P from registers (the S accumulator re-packed, never stored)
//     and V read MN-major from shared memory.
//   * intra-warpgroup overlap: step i issues S_i = Q K_i^T and then O += P_{i-1} V_{i-1}; the
//     softmax of S_i runs while the P V product is still on the tensor cores (in the machine code
//     too where the tile table says so: kSoftmaxUnderPv), and O is rescaled after that product
//     lands. Key tiles are visited from the last to the first, so the masked (diagonal) tiles of
//     a causal row come first and the mask test is a uniform branch per tile.
//   * each consumer warpgroup computes only the key tiles its own 64 rows see, and masks only its
//     own boundary tiles; the tiles it skips it just releases (and takes their ping-pong turns).
//   * ping-pong (kPingPong): the consumer warpgroups take turns issuing their GEMMs (named
//     barriers in a ring), so one warpgroup's softmax runs while another's GEMMs hold the tensor
//     cores.
//   * pairs (kPairKV, non-causal): a cluster of two CTAs on adjacent query tiles of one head, each
//     producer loading half of every K and V tile into both CTAs by TMA multicast; a stage is
//     refilled once the consumers of both CTAs have released it.
//   * epilogue: O / l through its own shared-memory buffer (stmatrix into the swizzled layout, so
//     free of bank conflicts) to a TMA store (fixed-length batches) or 16-byte global stores
//     bounded by the sequence (varlen), where the tile table asks for it and it fits (d = 96,
//     128); else (d = 64, 192, 256) straight from the accumulators in 16-byte chunks, a quad's
//     words transposed by shuffles. lse is written once.
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
#include "cuda/sm90/swizzle.cuh"
#include "cuda/tile_scheduler.h"

namespace flashattn::cuda::sm90 {

// Kernel parameters: the plain forward params plus the TMA maps of Q, K and V (passed by value as
// a __grid_constant__, where the copy engine reads them).
struct FwdParams {
  CUtensorMap tq, tk, tv, to;
  core::ForwardParams p;
  TileScheduler sched;
  bool tma_store;  // O leaves through `to` (fixed-length batches); else 16-byte stores
  // Dynamic scheduling (causal): CTAs take their next tile from this zeroed counter, so the
  // uneven tiles balance across SMs; null = static stride.
  int* tile_counter;
  // Stream-K tail (sched.sk_span > 0): per merge slot and consumer warpgroup, the fp32 state of
  // the unit that finished first (float4s, thread-major: o~ in accumulator order, then m and l)
  // and two zeroed words, a ticket and a ready flag.
  float4* sk_state;
  int* sk_flags;
};

template <int kHeadDim_, class Element_, int kBlockN_, int kConsumerWGs_, int kStages_, bool kPingPong_,
          int kQStages_ = 1, bool kOwnTiles_ = true, bool kStageO_ = true, bool kStreamK_ = false, bool kPairKV_ = false,
          bool kSoftmaxUnderPv_ = false>
struct FwdTraits {
  using Element = Element_;
  // kHeadDim is the problem's head dim; shared-memory tiles hold kTileDim columns, whole 64-column
  // swizzle spans (d = 96 runs in d = 128 tiles: TMA zero-fills columns past d on load and clips
  // them on store, S = Q K^T stops at d, and P V computes zero columns that are never stored).
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kTileDim = (kHeadDim + 63) / 64 * 64;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kConsumerWGs = kConsumerWGs_;
  static constexpr int kStages = kStages_;
  static constexpr bool kPingPong = kPingPong_;
  static constexpr int kQStages = kQStages_;  // 2: the next tile's Q loads while this one runs
  // Each consumer warpgroup visits only the key tiles its own rows see (else every tile of the
  // work tile's range).
  static constexpr bool kOwnTiles = kOwnTiles_;
  // The stream-K tail's merge is compiled in (tile_size.h's stream_k): at d = 256 the merge code
  // alone, never run, made ptxas spill 268 bytes where it spilled 36.
  static constexpr bool kStreamK = kStreamK_;
  // The same kernel without the merge, for launches that cut no tile: with it compiled in, ptxas
  // schedules the main loop differently, and d = 128 at 2k ran 1-2% slower (session 27).
  using Unsplit = FwdTraits<kHeadDim_, Element_, kBlockN_, kConsumerWGs_, kStages_, kPingPong_, kQStages_,
                            kOwnTiles_, kStageO_, false, false, kSoftmaxUnderPv_>;
  // K/V shared by a pair of CTAs (a cluster of 2 on adjacent query tiles of one head): each loads
  // half of every K and V tile into both, by TMA multicast, and frees a stage only once both
  // CTAs' consumers are done with it. Half the L2 -> SM traffic of K and V.
  static constexpr bool kPairKV = kPairKV_;
  using Paired = FwdTraits<kHeadDim_, Element_, kBlockN_, kConsumerWGs_, kStages_, kPingPong_, kQStages_,
                           kOwnTiles_, kStageO_, false, true, kSoftmaxUnderPv_>;
  // The main loop's wait for P_{i-1} V_{i-1} after the softmax of S_i in the machine code too
  // (ptx::warpgroup_wait_after; tile_size.h, HopperFwdTile::softmax_under_pv); else ptxas puts it
  // ahead of the softmax, which only the other warpgroups' GEMMs then hide.
  static constexpr bool kSoftmaxUnderPv = kSoftmaxUnderPv_;
  static constexpr int kBlockM = 64 * kConsumerWGs;
  static constexpr int kThreads = 128 * (kConsumerWGs + 1);
  static constexpr int kColBlocks = kTileDim / 64;  // 128-byte swizzle spans per row
  static constexpr int kQBytes = kBlockM * kTileDim * 2;
  static constexpr int kKVBytes = kBlockN * kTileDim * 2;
  // O columns per P V wgmma (N <= 192 in one instruction; 256 in two of 128).
  static constexpr int kPvN = kTileDim <= 192 ? kTileDim : 128;
  static constexpr int kPvParts = kTileDim / kPvN;
  // setmaxnreg budgets (FlashAttention-3's): 128*24 + 256*240 and 128*32 + 384*160 <= 64K.
  static constexpr int kProducerRegs = kConsumerWGs == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kConsumerWGs == 2 ? 240 : 160;
  // Named barrier ids (0 is __syncthreads): turns of the ping-pong ring, then the epilogue's.
  static constexpr int kTurnBarrier = 1;
  static constexpr int kEpilogueBarrier = kTurnBarrier + kConsumerWGs;
  // mbarriers: Q full/empty per Q stage, K and V full/empty per stage, tile-index slots
  // full/empty (2 each); then the 2 tile-index slots, a stream-K ticket per consumer warpgroup and
  // (kSoftmaxUnderPv) a word per consumer warp for ptx::warpgroup_wait_after.
  static constexpr int kBarrierBytes =
      8 * (2 * kQStages + 4 * kStages + 4) + 8 + 4 * kConsumerWGs + (kSoftmaxUnderPv ? 16 * kConsumerWGs : 0);
  // float4s of one consumer thread's stream-K state: o~, then (m, l) of its two rows.
  static constexpr int kSkVecs = kPvParts * kPvN / 8 + 1;
  // Tiles start 1024-byte aligned (the swizzle pattern repeats every 8 rows of 128 bytes and the
  // descriptors assume it starts on such a boundary); the slack covers aligning the dynamic base.
  static constexpr int kSmemNoO = 1024 + kQStages * kQBytes + 2 * kStages * kKVBytes + kBarrierBytes;
  // O's own buffer: where the tile table stages O (stage_o) and it fits beside Q, K and V.
  static constexpr bool kSeparateO = kStageO_ && kSmemNoO + kQBytes <= 227 * 1024;
  static constexpr int kSmemBytes = kSmemNoO + (kSeparateO ? kQBytes : 0);
  static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0 && kBlockN <= 192, "tile shape");
  static_assert(kQStages == 1 || kQStages == 2, "one or two Q stages");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

// One work unit's coordinates and ranges, computed identically by the producer and the consumers.
struct WorkTile {
  int m_block, h, b, hk;
  int64_t q0, k0, r0;  // first row of the sequence (packed tensors), first key, first query row
  int rows_valid;      // query rows of the tile inside the sequence (0: nothing to do)
  core::MaskSpec mask;
  core::TileRange tiles;  // the unit's key tiles (a stream-K unit's share of the tile's)
  int count;              // key tiles to visit
  int split;              // stream-K merge slot, -1 for a whole tile
  bool sk_head;           // a cut tile's unit that holds its last key tile (visited first)
};

template <int BM, int BN, bool kStreamK>
__device__ __forceinline__ WorkTile work_tile(const core::ForwardParams& p, const TileScheduler& sched,
                                              const WorkUnit& u) {
  WorkTile w;
  sched.tile(u.idx, &w.m_block, &w.h, &w.b);
  int64_t sq = p.seqlen_q, sk = p.seqlen_k;
  w.q0 = w.k0 = 0;
  if (p.cu_seqlens_q != nullptr) {
    w.q0 = p.cu_seqlens_q[w.b];
    sq = p.cu_seqlens_q[w.b + 1] - w.q0;
    w.k0 = p.cu_seqlens_k[w.b];
    sk = p.cu_seqlens_k[w.b + 1] - w.k0;
  }
  w.r0 = int64_t(w.m_block) * BM;
  w.rows_valid = w.r0 >= sq ? 0 : int(sq - w.r0 < BM ? sq - w.r0 : BM);
  w.hk = w.h / (int(p.heads_q) / int(p.heads_kv));  // 32-bit: a 64-bit division is a call
  w.mask = core::MaskSpec{sq, sk, p.window_left, p.window_right};
  w.tiles = core::tile_range(w.mask, w.r0, w.r0 + w.rows_valid, BN);
  w.split = kStreamK ? u.split : -1;
  w.sk_head = u.it_begin == 0;
  if (kStreamK && u.split >= 0) {  // key tiles are visited from n_end - 1 down
    const int64_t n_end = w.tiles.n_end;
    w.tiles.n_end = n_end - u.it_begin;
    w.tiles.n_begin = n_end - u.it_end;
  }
  w.count = int(w.tiles.n_end - w.tiles.n_begin);
  return w;
}

template <class T, bool kSoftcap>
__global__ void __launch_bounds__(T::kThreads, 1) forward_kernel(const __grid_constant__ FwdParams P) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using E = typename T::Element;
  constexpr int D = T::kHeadDim, BM = T::kBlockM, BN = T::kBlockN, S = T::kStages;
  const core::ForwardParams& p = P.p;
  const TileScheduler& sched = P.sched;
  // TMA coordinates: varlen tensors are mapped as one packed sequence (batch 1).
  const bool varlen = p.cu_seqlens_q != nullptr;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = ptx::align_shared_1024(smem_raw);
  unsigned char* sQ = smem;
  unsigned char* sK = sQ + T::kQStages * T::kQBytes;
  unsigned char* sV = sK + S * T::kKVBytes;
  // O is staged in its own buffer where shared memory allows; else it goes straight from
  // registers to global memory. Either way Q's space is free for the next tile during the epilogue.
  unsigned char* sO = sV + S * T::kKVBytes;
  uint64_t* bar = reinterpret_cast<uint64_t*>(sV + S * T::kKVBytes + (T::kSeparateO ? T::kQBytes : 0));
  uint64_t* q_full = bar;
  uint64_t* q_empty = bar + T::kQStages;
  uint64_t* k_full = bar + 2 * T::kQStages;
  uint64_t* k_empty = k_full + S;
  uint64_t* v_full = k_empty + S;
  uint64_t* v_empty = v_full + S;
  uint64_t* tile_full = v_empty + S;
  uint64_t* tile_empty = tile_full + 2;
  int* tile_slot = reinterpret_cast<int*>(tile_empty + 2);
  int* sk_ticket = tile_slot + 2;
  float* wait_slot = reinterpret_cast<float*>(sk_ticket + T::kConsumerWGs);
  const bool dynamic = P.tile_counter != nullptr;

  if (threadIdx.x == 0) {
    for (int s = 0; s < T::kQStages; ++s) {
      ptx::thread_mbarrier_init(&q_full[s], 1);
      ptx::thread_mbarrier_init(&q_empty[s], T::kConsumerWGs);
    }
    for (int s = 0; s < S; ++s) {
      ptx::thread_mbarrier_init(&k_full[s], 1);
      ptx::thread_mbarrier_init(&v_full[s], 1);
      // A paired stage is freed by the consumers of both CTAs (either one's producer refills it
      // in both).
      ptx::thread_mbarrier_init(&k_empty[s], T::kConsumerWGs * (T::kPairKV ? 2 : 1));
      ptx::thread_mbarrier_init(&v_empty[s], T::kConsumerWGs * (T::kPairKV ? 2 : 1));
    }
    for (int s = 0; s < 2; ++s) {
      ptx::thread_mbarrier_init(&tile_full[s], 1);
      ptx::thread_mbarrier_init(&tile_empty[s], 128 * T::kConsumerWGs);
    }
    ptx::thread_fence_mbarrier_init();
  }
  // A paired CTA's partner arrives on its barriers and writes into its stages: both must have
  // initialized theirs first.
  if constexpr (T::kPairKV)
    ptx::thread_cluster_sync();
  else
    __syncthreads();
  const uint32_t rank = T::kPairKV ? ptx::thread_cluster_rank() : 0u;

  // Both roles walk the same tiles and count loaded Q tiles (qt) and K/V tiles (it) the same way,
  // so ring stages and barrier phases continue across work tiles. The j-th tile of a CTA is
  // blockIdx.x + j * gridDim.x (static), or, when dynamic, the producer draws it from the counter
  // and hands it to the consumers through a 2-slot ring in shared memory (the mbarrier's
  // arrive/wait order the slot's write and reads).
  const int wg = int(threadIdx.x) / 128;
  if (wg == 0) {
    // ---- producer ----
    ptx::warpgroup_reg_dealloc<T::kProducerRegs>();
    if (threadIdx.x / 32 == 0 && ptx::warp_elect_one()) {
      ptx::thread_prefetch_tensormap(&P.tq);
      ptx::thread_prefetch_tensormap(&P.tk);
      ptx::thread_prefetch_tensormap(&P.tv);
      int it = 0, qt = 0;
      for (int j = 0;; ++j) {
        WorkUnit u;
        if (dynamic) {
          u.idx = j == 0 ? int(blockIdx.x) : int(gridDim.x) + atomicAdd(P.tile_counter, 1);
          ptx::thread_mbarrier_wait(&tile_empty[j % 2], (uint32_t(j / 2) & 1u) ^ 1u);
          tile_slot[j % 2] = u.idx;
          ptx::thread_mbarrier_arrive(&tile_full[j % 2]);
          if (u.idx >= sched.num_tiles()) break;
        } else if (!sched.template unit<T::kStreamK>(int(blockIdx.x), int(gridDim.x), j, &u)) {
          break;
        }
        const WorkTile w = work_tile<BM, BN, T::kStreamK>(p, sched, u);
        if (w.count <= 0) continue;
        const int tma_b = varlen ? 0 : w.b;
        // Q waits until the consumers' GEMMs are done with the previous tile's Q.
        const int qs = qt % T::kQStages;
        ptx::thread_mbarrier_wait(&q_empty[qs], (uint32_t(qt / T::kQStages) & 1u) ^ 1u);
        ptx::thread_mbarrier_arrive_expect_tx(&q_full[qs], T::kQBytes);
        thread_tma_load_tile<BM, T::kColBlocks>(sQ + qs * T::kQBytes, &P.tq, &q_full[qs], int(w.q0 + w.r0), w.h, tma_b);
        ++qt;
        for (int i = 0; i < w.count; ++i, ++it) {
          const int stage = it % S;
          const uint32_t phase = uint32_t(it / S) & 1u;
          const int key0 = int(w.k0 + (w.tiles.n_end - 1 - i) * BN);
          // The whole tile, or paired, this CTA's half of it into both CTAs.
          auto load_kv = [&](unsigned char* dst, const CUtensorMap* map, uint64_t* full) {
            if constexpr (T::kPairKV)
              thread_tma_load_tile_pair<BN, T::kColBlocks>(dst, map, full, key0, w.hk, tma_b, int(rank));
            else
              thread_tma_load_tile<BN, T::kColBlocks>(dst, map, full, key0, w.hk, tma_b);
          };
          ptx::thread_mbarrier_wait(&k_empty[stage], phase ^ 1u);
          ptx::thread_mbarrier_arrive_expect_tx(&k_full[stage], T::kKVBytes);
          load_kv(sK + stage * T::kKVBytes, &P.tk, &k_full[stage]);
          ptx::thread_mbarrier_wait(&v_empty[stage], phase ^ 1u);
          ptx::thread_mbarrier_arrive_expect_tx(&v_full[stage], T::kKVBytes);
          load_kv(sV + stage * T::kKVBytes, &P.tv, &v_full[stage]);
        }
      }
    }
    return;
  }

  // ---- consumers ----
  ptx::warpgroup_reg_alloc<T::kConsumerRegs>();
  const int cwg = wg - 1;                  // consumer warpgroup: rows [64 cwg, 64 cwg + 64)
  const int tid = int(threadIdx.x) % 128;  // thread in the warpgroup
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row_a = 64 * cwg + 16 * warp + g;  // this thread's rows in the tile: row_a, row_a + 8

  // Scores enter exp2 as fma(u, c, -base) with u the raw q.k (or tanh of it under softcap).
  const float c_log2 = float(core::kLog2e) * (kSoftcap ? p.softcap : p.scale);
  const float tanh_scale = kSoftcap ? p.scale / p.softcap : 0.f;
  const bool tma_store = P.tma_store;

  // Descriptors are built once and stepped by adding constant byte offsets / 16 to the
  // start-address field (shared addresses stay below 256 KB, so the field never carries), which
  // keeps the compiler from holding one 64-bit descriptor per k-step in registers.
  const uint64_t q_desc0 = ptx::make_smem_desc_sw128(sQ + cwg * 64 * 128, 16, 1024);

  // Ping-pong turns: wait for this warpgroup's turn before issuing GEMMs, hand the turn to the
  // next warpgroup of the ring after issuing. Every warpgroup takes count + 1 turns per work tile,
  // so the ring runs on across tiles: the last warpgroup opens it once, the first absorbs the last
  // hand-over after the final tile, and a warpgroup's epilogue runs while the next one already
  // issues the next tile's first GEMMs. The opening and the absorbing barrier are predicated
  // instructions, not branches: a branch on the warpgroup there made ptxas serialize the wgmmas.
  auto turn_wait = [&] {
    if constexpr (T::kPingPong) ptx::thread_named_sync(T::kTurnBarrier + cwg, 256);
  };
  auto turn_pass = [&] {
    if constexpr (T::kPingPong) ptx::thread_named_arrive(T::kTurnBarrier + (cwg + 1) % T::kConsumerWGs, 256);
  };
  if constexpr (T::kPingPong)
    ptx::thread_named_arrive_if(cwg == T::kConsumerWGs - 1, T::kTurnBarrier, 256);

  int it = 0, qt = 0;
  for (int j = 0;; ++j) {
    WorkUnit u;
    if (dynamic) {
      ptx::thread_mbarrier_wait(&tile_full[j % 2], uint32_t(j / 2) & 1u);
      // Broadcast from lane 0 so the compiler sees a warp-uniform index: branches on it then
      // stay uniform, and ptxas keeps the wgmmas in them asynchronous.
      u.idx = __shfl_sync(0xffffffffu, tile_slot[j % 2], 0);
      ptx::thread_mbarrier_arrive(&tile_empty[j % 2]);
      if (u.idx >= sched.num_tiles()) break;
    } else if (!sched.template unit<T::kStreamK>(int(blockIdx.x), int(gridDim.x), j, &u)) {
      break;
    }
    const WorkTile w = work_tile<BM, BN, T::kStreamK>(p, sched, u);
    if (w.rows_valid == 0) continue;
    const int count = w.count;
    const int qs = qt % T::kQStages;
    const uint64_t q_desc = q_desc0 + uint64_t((qs * T::kQBytes) >> 4);

    // The mask in 32-bit registers (sequence lengths fit int32, as cu_seqlens do): each row's
    // visible keys [key_lo, key_hi).
    int key_lo[2], key_hi[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      key_lo[rr] = int(w.mask.lo(w.r0 + row_a + 8 * rr));
      key_hi[rr] = int(w.mask.hi(w.r0 + row_a + 8 * rr));
    }
    // This warpgroup's own key tiles: its 64 rows may see fewer keys than the tile's rows together
    // (under a causal mask the first warpgroups of a 192-row tile stop up to a key tile short of
    // the last), so it computes only those, and only its own boundary tiles take the mask. Its
    // tiles are consecutive in the producer's order (last key tile first): it skips the first
    // own_first and those after own_first + own_count. Broadcast from lane 0, so the compiler sees
    // warp-uniform loop bounds around the wgmmas (else ptxas serializes them).
    int own_first = 0, own_count = count;
    int nomask_begin = int(w.tiles.n_nomask_begin), nomask_end = int(w.tiles.n_nomask_end);
    if constexpr (T::kOwnTiles) {
      own_first = count;
      own_count = 0;
      const int rows_end = min(64 * cwg + 64, w.rows_valid);
      if (rows_end > 64 * cwg) {
        const core::TileRange own = core::tile_range(w.mask, w.r0 + 64 * cwg, w.r0 + rows_end, BN);
        // Within the unit's key tiles (a stream-K unit has only part of the tile's).
        const int64_t own_end = T::kStreamK ? min(own.n_end, w.tiles.n_end) : own.n_end;
        const int64_t own_begin = T::kStreamK ? max(own.n_begin, w.tiles.n_begin) : own.n_begin;
        if (!own.empty() && own_end > own_begin) {
          own_first = int(w.tiles.n_end - own_end);
          own_count = int(own_end - own_begin);
          nomask_begin = int(own.n_nomask_begin);
          nomask_end = int(own.n_nomask_end);
        }
      }
      own_first = __shfl_sync(0xffffffffu, own_first, 0);
      own_count = __shfl_sync(0xffffffffu, own_count, 0);
    }
    const int n_last = int(w.tiles.n_end) - 1 - own_first;  // this warpgroup's first key tile

    float o[T::kPvParts][T::kPvN / 2];
#pragma unroll
    for (int part = 0; part < T::kPvParts; ++part)
#pragma unroll
      for (int i = 0; i < T::kPvN / 2; ++i) o[part][i] = 0.f;
    float row_max[2] = {core::neg_inf<float>(), core::neg_inf<float>()};
    float row_sum[2] = {0.f, 0.f};  // thread-partial, quad-reduced at the end
    uint32_t pf[BN / 4];            // P as 16-bit pairs: the A fragments of P V

    // S = Q K^T: both operands K-major in shared memory; k16 steps walk 32 bytes inside a
    // 128-byte row, then jump to the next column block. (Q's fragments held in registers instead,
    // loaded once per work tile, ran 0.93-1.02x at d=128 and 0.68-0.90x at d=64, where they spill:
    // bench/results/h200_session24_2026-12-03.txt, call 5.)
    auto issue_s = [&](float(&s)[BN / 2], int stage) {
      const uint64_t k_desc = ptx::make_smem_desc_sw128(sK + stage * T::kKVBytes, 16, 1024);
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        const int cb = ks / 4, kk = ks % 4;
        ptx::Wgmma<E, BN>::template ss<0>(s, q_desc + uint64_t((cb * BM * 128 + kk * 32) >> 4),
                                          k_desc + uint64_t((cb * BN * 128 + kk * 32) >> 4), ks > 0 ? 1 : 0);
      }
    };
    // O += P V: V is [key][d], i.e. MN-major for B; a k16 step is 16 key rows (2048 bytes), and
    // the next 64-column block of d sits BN * 128 bytes further (the descriptor's leading offset).
    auto issue_pv = [&](int stage) {
      const uint64_t v_desc = ptx::make_smem_desc_sw128(sV + stage * T::kKVBytes, BN * 128, 1024);
#pragma unroll
      for (int kt = 0; kt < BN / 16; ++kt) {
        const uint32_t(&a)[4] = *reinterpret_cast<const uint32_t(*)[4]>(&pf[4 * kt]);
#pragma unroll
        for (int part = 0; part < T::kPvParts; ++part)
          ptx::Wgmma<E, T::kPvN>::template rs<1>(
              o[part], a, v_desc + uint64_t((part * (T::kPvN / 64) * BN * 128 + kt * 2048) >> 4), 1);
      }
    };
    // Softcap, mask, new (lazy) max, P = exp2(u*c - base) into s, row sums; returns the factors
    // the old O and l must be multiplied by.
    auto softmax = [&](float(&s)[BN / 2], int n, float(&factor)[2]) {
      if constexpr (kSoftcap) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) s[i] = ptx::thread_tanh(s[i] * tanh_scale);
      }
      if (n < nomask_begin || n >= nomask_end) {
        const int key0 = n * BN;
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int lo = max(min(key_lo[rr] - key0, BN), 0);
          const int hi = max(min(key_hi[rr] - key0, BN), 0);
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
    // Registers a wgmma reads or accumulates into must be written before the warpgroup fence that
    // precedes it; pinning them there keeps the compiler from sinking those writes past the fence
    // (ptxas would then insert its own fence and serialize the wgmmas).
    auto fence_operands = [&] {
#pragma unroll
      for (int part = 0; part < T::kPvParts; ++part) ptx::thread_pin(o[part]);
      ptx::thread_pin(pf);
      ptx::warpgroup_fence();
    };
    // One thread per consumer warpgroup releases a stage once the warpgroup's wgmmas on it are
    // done (wgmma.wait_group covers the whole warpgroup's operations).
    auto release = [&](uint64_t* empty) {
      if (tid == 0) ptx::thread_mbarrier_arrive(empty);
    };
    // A K or V stage; paired, the partner CTA's copy of it too (a thread of another warp arrives
    // there, so the two arrivals issue side by side).
    auto release_kv = [&](uint64_t* empty) {
      release(empty);
      if constexpr (T::kPairKV)
        if (tid == 32) ptx::thread_mbarrier_arrive_cluster(empty, rank ^ 1u);
    };
    // A key tile this warpgroup skips: it still takes its ping-pong turn (every warpgroup takes
    // count + 1 per work tile, so the ring stays in step) and releases the tile's stages. It waits
    // for the loads first: an arrival before the producer refilled the stage would count towards
    // the stage's previous use, which the other warpgroups may still be reading.
    auto skip = [&](int k) {  // k: the tile's position in the ring
      turn_wait();
      turn_pass();
      const int stage = k % S;
      const uint32_t phase = uint32_t(k / S) & 1u;
      ptx::thread_mbarrier_wait(&k_full[stage], phase);
      release_kv(&k_empty[stage]);
      ptx::thread_mbarrier_wait(&v_full[stage], phase);
      release_kv(&v_empty[stage]);
    };

    if (count > 0) {
      // Every warpgroup waits for Q, also one that computes nothing: its release of Q must count
      // towards this tile's load.
      ptx::thread_mbarrier_wait(&q_full[qs], uint32_t(qt / T::kQStages) & 1u);
#pragma unroll 1
      for (int i = 0; i < own_first; ++i) skip(it + i);
      const int first = it + own_first;  // ring position of this warpgroup's first key tile
      if (own_count == 0) {
        turn_wait();  // the turn of the final P V
        turn_pass();
      } else {
        {
          // Prologue: the first (last-in-order) key tile's scores and softmax; O is still empty.
          const int stage = first % S;
          float s[BN / 2];
          ptx::thread_mbarrier_wait(&k_full[stage], uint32_t(first / S) & 1u);
          turn_wait();
          fence_operands();
          issue_s(s, stage);
          ptx::warpgroup_commit();
          turn_pass();
          ptx::warpgroup_wait<0>();
          ptx::thread_pin(s);
          release_kv(&k_empty[stage]);
          float factor[2];
          softmax(s, n_last, factor);
          pack_p(s);
        }
        for (int i = 1; i < own_count; ++i) {
          const int cur = first + i, prev = first + i - 1;
          float s[BN / 2];
          ptx::thread_mbarrier_wait(&k_full[cur % S], uint32_t(cur / S) & 1u);
          turn_wait();
          fence_operands();
          issue_s(s, cur % S);
          ptx::warpgroup_commit();
          // V is awaited only now, so S issues as soon as K is in. ptxas then puts a warpgroup
          // fence of its own before P V; waiting for V before the fence instead avoids it but
          // measured 0.97-1.015x (bench/results/h200_session22_2026-12-03.txt, call 2).
          ptx::thread_mbarrier_wait(&v_full[prev % S], uint32_t(prev / S) & 1u);
          issue_pv(prev % S);
          ptx::warpgroup_commit();
          turn_pass();
          ptx::warpgroup_wait<1>();  // S_i landed; P_{i-1} V_{i-1} may still run
          ptx::thread_pin(s);
          release_kv(&k_empty[cur % S]);
          float factor[2];
          softmax(s, n_last - i, factor);
          // The row sums depend on every exp.
          if constexpr (T::kSoftmaxUnderPv)
            ptx::warpgroup_wait_after<0>(row_sum[0] + row_sum[1], wait_slot + 4 * cwg + tid / 32);
          else
            ptx::warpgroup_wait<0>();
          ptx::thread_pin(pf);
#pragma unroll
          for (int part = 0; part < T::kPvParts; ++part) ptx::thread_pin(o[part]);
          release_kv(&v_empty[prev % S]);
          rescale_o(factor);
          pack_p(s);
        }
        {
          const int last = first + own_count - 1;
          ptx::thread_mbarrier_wait(&v_full[last % S], uint32_t(last / S) & 1u);
          turn_wait();
          fence_operands();
          issue_pv(last % S);
          ptx::warpgroup_commit();
          turn_pass();
          ptx::warpgroup_wait<0>();
          ptx::thread_pin(pf);
#pragma unroll
          for (int part = 0; part < T::kPvParts; ++part) ptx::thread_pin(o[part]);
          release_kv(&v_empty[last % S]);
        }
      }
#pragma unroll 1
      for (int k = first + own_count; k < it + count; ++k) skip(k);
      it += count;
      ++qt;
      release(&q_empty[qs]);  // this warpgroup's GEMMs are done with Q
    }

    // ---- stream-K: the two units of a cut tile meet here, each warpgroup on its own rows. The
    // first to arrive leaves its state (o~, m, l) in the merge slot and raises the flag; the last
    // merges the two (core::rescale_factor onto the larger max: the online softmax's own step, so
    // an empty state weighs 0) and writes O and lse for both. The first skips its epilogue, so it
    // never waits; the last waits only for the first's stores, already under way. Both read the
    // ticket after one barrier, and pass another before its slot is written again.
    if (T::kStreamK && w.split >= 0) {
      float4* slot = P.sk_state + (int64_t(w.split) * T::kConsumerWGs + cwg) * (T::kSkVecs * 128) + tid;
      auto vec = [&](int v) { return slot + v * 128; };  // this thread's v-th float4 (thread-major)
      constexpr int kMl = T::kSkVecs - 1;                   // the (m, l) float4, after o~
      int* flags = P.sk_flags + 2 * (w.split * T::kConsumerWGs + cwg);  // ticket, ready
      if (tid == 0) sk_ticket[cwg] = atomicAdd(flags, 1);
      ptx::thread_named_sync(T::kEpilogueBarrier + cwg, 128);
      // Broadcast from lane 0: a branch the compiler cannot see is warp-uniform makes ptxas
      // serialize every wgmma of the kernel.
      if (__shfl_sync(0xffffffffu, sk_ticket[cwg], 0) == 0) {
#pragma unroll
        for (int part = 0; part < T::kPvParts; ++part)
#pragma unroll
          for (int q = 0; q < T::kPvN / 8; ++q)
            __stcg(vec(part * (T::kPvN / 8) + q),
                   make_float4(o[part][4 * q], o[part][4 * q + 1], o[part][4 * q + 2], o[part][4 * q + 3]));
        __stcg(vec(kMl), make_float4(row_max[0], row_max[1], row_sum[0], row_sum[1]));
        ptx::thread_named_sync(T::kEpilogueBarrier + cwg, 128);
        if (tid == 0) ptx::thread_pass_turn(flags + 1);
        continue;
      }
      if (tid == 0) ptx::thread_wait_turn(flags + 1, 1, ptx::thread_load_turn(flags + 1));
      ptx::thread_named_sync(T::kEpilogueBarrier + cwg, 128);
      // The two states enter in a fixed order, the head unit's (the one holding the tile's last
      // key tile) first, whichever finished first: the result is bitwise the same on every run.
      const bool head = w.sk_head;
      const float4 ml = __ldcg(vec(kMl));
      const float other_m[2] = {ml.x, ml.y}, other_l[2] = {ml.z, ml.w};
      float fh[2], ft[2];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const float mh = head ? row_max[rr] : other_m[rr], mt = head ? other_m[rr] : row_max[rr];
        const float lh = head ? row_sum[rr] : other_l[rr], lt = head ? other_l[rr] : row_sum[rr];
        const float m = fmaxf(mh, mt);
        fh[rr] = core::rescale_factor(mh, m);
        ft[rr] = core::rescale_factor(mt, m);
        row_sum[rr] = lh * fh[rr] + lt * ft[rr];
        row_max[rr] = m;
      }
#pragma unroll
      for (int part = 0; part < T::kPvParts; ++part)
#pragma unroll
        for (int q = 0; q < T::kPvN / 8; ++q) {
          const float4 v = __ldcg(vec(part * (T::kPvN / 8) + q));
          const float ov[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int i = 4 * q + k, rr = (i >> 1) & 1;
            const float oh = head ? o[part][i] : ov[k], ot = head ? ov[k] : o[part][i];
            o[part][i] = oh * fh[rr] + ot * ft[rr];
          }
        }
    }

    // ---- epilogue: O = o~ / l (0 for rows that saw nothing) and lse, written once.
    float inv[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const float l = ptx::quad_sum(row_sum[rr]);
      inv[rr] = core::finalize_scale(l);
      const int row = row_a + 8 * rr;
      if (p.lse != nullptr && t == 0 && row < w.rows_valid)
        static_cast<float*>(p.lse)[p.lse_s.offset(w.b, w.q0 + w.r0 + row, w.h)] = core::finalize_lse(row_max[rr], l);
    }
    E* out = static_cast<E*>(p.out);
    if constexpr (!T::kSeparateO) {
      // Whole 16-byte chunks straight from the accumulators: a quad holds 4 bytes of each of four
      // 8-column blocks of a row, and transposed across the quad lane t holds all of block t, so a
      // store writes 16 bytes where 4-byte pairs took four.
      static_assert(T::kTileDim == D && T::kPvN % 32 == 0, "whole 32-column groups");
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int row = row_a + 8 * rr;
        E* orow = out + p.o_s.offset(w.b, w.q0 + w.r0 + row, w.h) + 8 * t;
#pragma unroll
        for (int part = 0; part < T::kPvParts; ++part)
#pragma unroll
          for (int jq = 0; jq < T::kPvN / 32; ++jq) {
            uint32_t a[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const int i = 4 * (4 * jq + k) + 2 * rr;
              a[k] = ptx::thread_pack2<E>(o[part][i] * inv[rr], o[part][i + 1] * inv[rr]);
            }
            ptx::warp_quad_transpose(a, t);
            if (row < w.rows_valid)
              *reinterpret_cast<uint4*>(orow + part * T::kPvN + 32 * jq) = uint4{a[0], a[1], a[2], a[3]};
          }
      }
      continue;
    }
    // Staged through shared memory in the swizzled layout (bank-conflict free, and what a TMA
    // store reads); the previous tile's store must have finished reading it first.
    if (tid == 0) ptx::thread_bulk_wait_read_all();
    ptx::thread_named_sync(T::kEpilogueBarrier + cwg, 128);
    {
      // By stmatrix, 16 columns of the warp's 16 rows per instruction (8 at d=128, where 4-byte
      // pairs took 32 stores). o[part][8q .. 8q+7] are the four 8 x 8 blocks of columns 16q..16q+15
      // in accumulator layout: rows g and g + 8 of column block 2q, then of 2q + 1. Lane L
      // addresses row L & 7 of block L >> 3.
      const int mat = lane >> 3;
      const int st_row = 64 * cwg + 16 * warp + 8 * (mat & 1) + (lane & 7);
#pragma unroll
      for (int part = 0; part < T::kPvParts; ++part)
#pragma unroll
        for (int q = 0; q < T::kPvN / 16; ++q) {
          uint32_t r[4];
#pragma unroll
          for (int k = 0; k < 4; ++k)
            r[k] = ptx::thread_pack2<E>(o[part][8 * q + 2 * k] * inv[k & 1], o[part][8 * q + 2 * k + 1] * inv[k & 1]);
          ptx::warp_stmatrix_x4(r, sO + swizzled_offset<BM>(st_row, part * T::kPvN + 16 * q + 8 * (mat >> 1)));
        }
    }
    if (tma_store) ptx::thread_fence_proxy_async_smem();
    ptx::thread_named_sync(T::kEpilogueBarrier + cwg, 128);
    if (tma_store) {
      // Rows past the sequence fall outside the tensor map (fixed-length batches only) and are
      // not written.
      if (tid == 0) {
#pragma unroll
        for (int c = 0; c < T::kColBlocks; ++c)
          ptx::thread_tma_store_4d(&P.to, sO + c * BM * 128 + cwg * 64 * 128, 64 * c, int(w.r0) + 64 * cwg, w.h, w.b);
        ptx::thread_bulk_commit();
      }
    } else {
      constexpr int kChunksPerRow = D / 8;
#pragma unroll 4
      for (int j = tid; j < 64 * kChunksPerRow; j += 128) {
        const int row = 64 * cwg + j / kChunksPerRow, chunk = j % kChunksPerRow;
        if (row >= w.rows_valid) continue;
        const uint4 v = *reinterpret_cast<const uint4*>(sO + swizzled_offset<BM>(row, chunk * 8));
        *reinterpret_cast<uint4*>(out + p.o_s.offset(w.b, w.q0 + w.r0 + row, w.h) + chunk * 8) = v;
      }
    }
  }
  if constexpr (T::kPingPong) ptx::thread_named_sync_if(cwg == 0, T::kTurnBarrier, 256);
  // Shared memory must outlive the bulk stores that read it, and, paired, the partner's last
  // loads into it and arrivals on its barriers (the producers have exited: the cluster barrier
  // waits only for threads still running).
  if (T::kSeparateO && tid == 0) ptx::thread_bulk_wait_all();
  if constexpr (T::kPairKV) ptx::thread_cluster_sync();
#endif
}

}  // namespace flashattn::cuda::sm90

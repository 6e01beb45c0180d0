// The Hopper backward's schedule and producer, shared by its two kernels (bwd_kernel.cuh,
// bwd_wide_kernel.cuh; the former's header describes the design): which work tiles a CTA visits,
// the query steps of a key tile and their order in deterministic mode, the ring of shared-memory
// stages the producer fills, and the producer's loads (the d = 256 kernel's producer loads its one
// stage itself, dO before Q).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/block_range.h"
#include "core/params.h"
#include "cuda/bwd_common.cuh"
#include "cuda/ptx/sm90.cuh"
#include "cuda/sm90/swizzle.cuh"
#include "cuda/tile_scheduler.h"

namespace flashattn::cuda::sm90 {

// Which work tiles (key tile, KV head, batch entry) a CTA visits, in the same sequence for every
// role (bwd_launch.cuh picks the order): a 1-D grid over the indices of `order` (its num_m_blocks
// counts key tiles, its heads KV heads; under a right bound longest first, which for key tiles is
// the first one, n = 0): CTA x takes index x, then x + gridDim.x, ... (static), or, when `counter`
// is set, the next index the producer draws from it (dynamic: tiles differ in length, causal ones
// by up to the whole query length, and each CTA drawing its next one balances them across SMs).
struct BwdSchedule {
  TileScheduler order;
  int* counter = nullptr;  // zeroed; dynamic index = gridDim.x + the count drawn before
  TurnOrder turns = TurnOrder::down;
  // In the `up` order a key tile waits only for the later key tiles of its head, so those come
  // first in launch order (index order, the order the hardware starts CTAs in), and a waiting CTA
  // never waits for one not started.
  __device__ __forceinline__ bool keys_descending() const { return turns == TurnOrder::up; }
};

struct BwdParams {
  CUtensorMap tq, tk, tv, tdo;
  core::BackwardParams p;
  BwdWorkspace ws;
  BwdSchedule sched;
};

// The query steps of one key tile: query tiles [m_begin, m_begin + m_tiles) of each of the group's
// query heads. Computed identically by every role. Default order: head-major, query tiles upward.
// Ordered deterministic mode (kOrdered): the group's heads innermost, and the key tiles visiting a
// dQ tile add into it one after another, in a turn order chosen so that each reaches the tile no
// earlier than the one before it (else it waits for it, idle):
//   * `down`: query tiles from the last down, turns in key-tile order. Key tile n's last query tile
//     is nondecreasing in n, and it reaches m after m_last(n) - m steps. But all key tiles of an
//     unbounded mask start at the last query tile, and key tile n waits n turns there.
//   * `up` (under a right bound: causal, windows; bwd_layout.h says when): query tiles from the
//     first up, turns from the last key tile down. Key tile n's first query tile is nondecreasing
//     in n, and it reaches m after m - m_first(n) steps, so every key tile starts at its diagonal
//     with the first turn there and finds each later tile's earlier turns one step or more ahead
//     of it.
//   * `around` (no mask, and few enough key tiles per sequence that all of them run at once;
//     bwd_layout.h): every key tile starts at its diagonal, walks up and wraps round
//     (core::around_turn), so in self-attention no key tile waits at all. A key tile may wait for
//     a higher one, which must then be running: hence hopper_turn_order's bound.
template <bool kOrdered>
struct KeySteps {
  int64_t m_begin, m_tiles;
  int steps, group;
  bool up;          // ordered mode: the walk goes up (`up`, `around`), else down
  int64_t m_first;  // ordered mode: the walk's first query tile
  int wrap;         // ordered mode: steps (per head) before an upward walk wraps round
  // Query head (within the group) and query tile of step s.
  __device__ __forceinline__ int head(int s) const { return kOrdered ? s % group : int(s / m_tiles); }
  __device__ __forceinline__ int64_t m_of(int s) const {
    if constexpr (kOrdered) {
      // An upward walk wraps round past the last query tile (only `around`'s ever does). Held as
      // the first tile and the steps to the wrap: the ordered kernels spill least that way.
      const int i = s / group;
      return up ? (i < wrap ? m_first + i : m_first + i - m_tiles) : m_first - i;
    }
    return m_begin + s % m_tiles;
  }
};

template <int BM, int BN, bool kOrdered = false>
__device__ __forceinline__ KeySteps<kOrdered> key_steps(const core::MaskSpec& mask, int64_t n, int group,
                                                        TurnOrder turns = TurnOrder::down) {
  const int64_t key0 = n * BN, key1 = mask.seqlen_k < key0 + BN ? mask.seqlen_k : key0 + BN;
  const core::QueryTiles q = core::query_tiles_seeing(mask, key0, key1, BM);
  KeySteps<kOrdered> k;
  k.m_begin = q.m_begin;
  k.m_tiles = q.m_end - q.m_begin;
  k.steps = int(k.m_tiles * group);
  k.group = group;
  k.up = kOrdered && turns != TurnOrder::down;
  k.m_first = k.up ? k.m_begin : k.m_begin + k.m_tiles - 1;
  k.wrap = int(k.m_tiles);
  // Without a mask every key tile visits every query tile: m_begin = 0, m_tiles = all of them.
  if (kOrdered && turns == TurnOrder::around && k.m_tiles > 0) {
    k.m_first = core::around_first_query_tile(int(n), int(key_tile_count<BN>(mask)), int(k.m_tiles));
    k.wrap = int(k.m_tiles - k.m_first);
  }
  return k;
}

// One work tile: key tile n of (KV head hk, batch entry b).
struct BwdTile {
  int64_t n;
  int hk, b;
};

// The work tile's KV head, batch entry and sequences, computed identically by every role.
struct BwdCta {
  int hk, b, group;
  int64_t q0, k0, sq, sk;   // first query / key row (packed varlen tensors), sequence lengths
  int64_t n_blocks, tile0;  // key tiles; the batch entry's first workspace tile
  core::MaskSpec mask;
  bool varlen;
};

// The workspace dQ tile of step s of a key tile's walk: its query head's query tile ks.m_of(s).
template <bool kOrdered>
__device__ __forceinline__ int64_t dq_tile(const BwdWorkspace& ws, const BwdCta& c, const KeySteps<kOrdered>& ks, int s) {
  return int64_t(c.hk * c.group + ks.head(s)) * ws.tiles_per_head + c.tile0 + ks.m_of(s);
}

// What the producer fills and the consumers drain: K and V (once per key tile), and per query
// step a stage of Q, dO and the tile's lse2 / delta rows, with their mbarriers.
struct BwdRing {
  unsigned char *k, *v, *q, *dout;  // q, dout: kStages tiles each
  float *lse, *delta;               // [kStages][kBlockM]
  uint64_t *kv_full, *kv_empty, *q_full, *do_full, *qdo_empty;
  uint64_t *tile_full, *tile_empty;  // [2] each: the dynamic schedule's handoff
  int* tile_slot;                    // [2]
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
template <int BM, int BN>
__device__ __forceinline__ BwdCta bwd_cta(const core::BackwardParams& p, int hk, int b) {
  BwdCta c;
  c.hk = hk;
  c.b = b;
  c.group = int(p.heads_q / p.heads_kv);
  c.q0 = c.k0 = 0;
  c.sq = p.seqlen_q;
  c.sk = p.seqlen_k;
  c.varlen = p.cu_seqlens_q != nullptr;
  if (c.varlen) {
    c.q0 = p.cu_seqlens_q[c.b];
    c.sq = p.cu_seqlens_q[c.b + 1] - c.q0;
    c.k0 = p.cu_seqlens_k[c.b];
    c.sk = p.cu_seqlens_k[c.b + 1] - c.k0;
  }
  c.mask = core::MaskSpec{c.sq, c.sk, p.window_left, p.window_right};
  c.n_blocks = key_tile_count<BN>(c.mask);
  c.tile0 = tile_base(p, BM, c.b);
  return c;
}

// Carves the ring out of shared memory at `at` (tile order: K, V, Q stages, dO stages; then the
// rows and the barriers at `rows`), and initializes the barriers (thread 0; the caller syncs).
template <class T>
__device__ __forceinline__ BwdRing bwd_ring(unsigned char* at, float* rows) {
  BwdRing r;
  r.k = at;
  r.v = r.k + T::kKVBytes;
  r.q = r.v + T::kKVBytes;
  r.dout = r.q + T::kStages * T::kQBytes;
  r.lse = rows;
  r.delta = r.lse + T::kStages * T::kBlockM;
  r.kv_full = reinterpret_cast<uint64_t*>(r.delta + T::kStages * T::kBlockM);
  r.kv_empty = r.kv_full + 1;
  r.q_full = r.kv_empty + 1;
  r.do_full = r.q_full + T::kStages;
  r.qdo_empty = r.do_full + T::kStages;
  // The tile handoff, in kernels that draw their tiles (T::kTileReaders > 0).
  r.tile_full = r.qdo_empty + T::kStages;
  r.tile_empty = r.tile_full + 2;
  r.tile_slot = reinterpret_cast<int*>(r.tile_empty + 2);
  if (threadIdx.x == 0) {
    ptx::thread_mbarrier_init(r.kv_full, 1);
    ptx::thread_mbarrier_init(r.kv_empty, 2);  // one thread per consumer warpgroup
    for (int s = 0; s < T::kStages; ++s) {
      ptx::thread_mbarrier_init(&r.q_full[s], 1);
      ptx::thread_mbarrier_init(&r.do_full[s], 1);
      ptx::thread_mbarrier_init(&r.qdo_empty[s], 256);  // every consumer thread
    }
    if constexpr (T::kTileReaders > 0)
      for (int s = 0; s < 2; ++s) {
        ptx::thread_mbarrier_init(&r.tile_full[s], 1);
        ptx::thread_mbarrier_init(&r.tile_empty[s], T::kTileReaders);
      }
    ptx::thread_fence_mbarrier_init();
  }
  return r;
}

// Index of the CTA's j-th work tile (prev: the (j-1)-th). Dynamic schedule: the producer thread
// (draw) takes it from the counter and publishes it in slot (j - 1) % 2; the other roles (every
// thread of them) read it there, broadcast from lane 0 so the compiler sees a warp-uniform index.
// The producer publishes every index it draws, the last (past the end) too, so all roles stop
// together.
__device__ __forceinline__ int next_tile_index(const BwdSchedule& s, const BwdRing& r, int j, int prev, bool draw) {
  if (j == 0) return int(blockIdx.x);
  if (s.counter == nullptr) return prev + int(gridDim.x);
  const int k = j - 1, slot = k % 2;
  const uint32_t phase = uint32_t(k / 2) & 1u;
  int idx;
  if (draw) {
    idx = int(gridDim.x) + atomicAdd(s.counter, 1);
    ptx::thread_mbarrier_wait(&r.tile_empty[slot], phase ^ 1u);
    r.tile_slot[slot] = idx;
    ptx::thread_mbarrier_arrive(&r.tile_full[slot]);
  } else {
    ptx::thread_mbarrier_wait(&r.tile_full[slot], phase);
    idx = __shfl_sync(0xffffffffu, r.tile_slot[slot], 0);
    ptx::thread_mbarrier_arrive(&r.tile_empty[slot]);
  }
  return idx;
}

// The work tile of schedule index idx; false past the last one.
template <bool kOrdered>
__device__ __forceinline__ bool tile_at(const BwdSchedule& s, int idx, BwdTile* t) {
  if (idx >= s.order.num_tiles()) return false;
  int m;
  s.order.tile(idx, &m, &t->hk, &t->b);
  const bool descending = kOrdered ? s.keys_descending() : s.order.longest_first;
  t->n = descending ? s.order.num_m_blocks - 1 - m : m;
  return true;
}

// The j-th work tile of a role that reads the schedule (the consumers, the dQ writer; idx: the
// previous index in, this one out) and its sequences; false past the last tile.
template <int BM, int BN, bool kOrdered>
__device__ __forceinline__ bool read_work_tile(const BwdParams& P, const BwdRing& r, int j, int& idx, BwdTile* tl,
                                               BwdCta* cta) {
  idx = next_tile_index(P.sched, r, j, idx, false);
  if (!tile_at<kOrdered>(P.sched, idx, tl)) return false;
  *cta = bwd_cta<BM, BN>(P.p, tl->hk, tl->b);
  return true;
}

// The producer's loads of one work tile (one elected thread): TMA loads of K and V, and per query
// step of Q and dO plus bulk copies of that tile's lse2 and delta rows (the tiled workspace layout
// of src/cuda/bwd_layout.h), each stage refilled once every consumer thread released it. kt and
// it count the K/V tiles and the steps loaded so far (ring phases); `turns`, the walk's order.
template <class T, bool kOrdered>
__device__ __forceinline__ void thread_load_tile(const BwdParams& P, const BwdCta& c, const BwdRing& r, int64_t n,
                                                 int& kt, int& it, TurnOrder turns) {
  constexpr int BM = T::kBlockM, BN = T::kBlockN, S = T::kStages;
  const BwdWorkspace& ws = P.ws;
  const int tma_b = c.varlen ? 0 : c.b;
  const auto ks = key_steps<BM, BN, kOrdered>(c.mask, n, c.group, turns);
  if (ks.steps == 0) return;
  const int key0 = int(c.k0 + n * BN);
  ptx::thread_mbarrier_wait(r.kv_empty, (uint32_t(kt) & 1u) ^ 1u);
  ptx::thread_mbarrier_arrive_expect_tx(r.kv_full, 2 * T::kKVBytes);
  thread_tma_load_tile<BN, T::kColBlocks>(r.k, &P.tk, r.kv_full, key0, c.hk, tma_b);
  thread_tma_load_tile<BN, T::kColBlocks>(r.v, &P.tv, r.kv_full, key0, c.hk, tma_b);
  ++kt;
  for (int s = 0; s < ks.steps; ++s, ++it) {
    const int h = c.hk * c.group + ks.head(s);
    const int64_t m = ks.m_of(s);
    const int stage = it % S;
    const int row = int(c.q0 + m * BM);
    const int64_t w = (int64_t(h) * ws.tiles_per_head + c.tile0 + m) * BM;
    ptx::thread_mbarrier_wait(&r.qdo_empty[stage], (uint32_t(it / S) & 1u) ^ 1u);
    ptx::thread_mbarrier_arrive_expect_tx(&r.q_full[stage], T::kQBytes + BM * 4);
    thread_tma_load_tile<BM, T::kColBlocks>(r.q + stage * T::kQBytes, &P.tq, &r.q_full[stage], row, h, tma_b);
    ptx::thread_bulk_load(r.lse + stage * BM, ws.lse2 + w, BM * 4, &r.q_full[stage]);
    ptx::thread_mbarrier_arrive_expect_tx(&r.do_full[stage], T::kQBytes + BM * 4);
    thread_tma_load_tile<BM, T::kColBlocks>(r.dout + stage * T::kQBytes, &P.tdo, &r.do_full[stage], row, h, tma_b);
    ptx::thread_bulk_load(r.delta + stage * BM, ws.delta + w, BM * 4, &r.do_full[stage]);
  }
}

__device__ __forceinline__ void thread_prefetch_maps(const BwdParams& P) {
  ptx::thread_prefetch_tensormap(&P.tq);
  ptx::thread_prefetch_tensormap(&P.tk);
  ptx::thread_prefetch_tensormap(&P.tv);
  ptx::thread_prefetch_tensormap(&P.tdo);
}

// The producer (one elected thread) over the CTA's work tiles: the schedule's walk
// (next_tile_index, tile_at).
template <class T, bool kOrdered>
__device__ __forceinline__ void thread_load_walk(const BwdParams& P, const BwdRing& r) {
  thread_prefetch_maps(P);
  int kt = 0, it = 0;
  for (int j = 0, idx = 0;; ++j) {
    idx = next_tile_index(P.sched, r, j, idx, true);
    BwdTile tl;
    if (!tile_at<kOrdered>(P.sched, idx, &tl)) break;
    const BwdCta c = bwd_cta<T::kBlockM, T::kBlockN>(P.p, tl.hk, tl.b);
    if (tl.n < c.n_blocks) thread_load_tile<T, kOrdered>(P, c, r, tl.n, kt, it, P.sched.turns);
  }
}

#endif

}  // namespace flashattn::cuda::sm90

// The split-KV decode kernel (sm80+, mma.sync): a few query rows against a long, possibly paged,
// KV range. It is bound by HBM bandwidth, so the design is about bytes in flight and reading each
// K/V byte once, not about FLOPs:
//   * rows: the query heads sharing one KV head times the new tokens form the M dimension (padded
//     to 16 per warp row; the padding costs tensor-core work, which is idle anyway, never memory);
//   * warps: 4 per CTA, arranged kWarpsM x kWarpsN. kWarpsM warps own 16 rows each, kWarpsN warps
//     split every 64-key tile between them, each with its own online-softmax state, merged once
//     in shared memory at the end. With one m16 tile of rows (the usual decode) all four warps
//     work on different keys, so the tensor cores see four independent streams;
//   * memory: K and V tiles are separate "half-tiles" in one ring of slots (a K half feeds
//     S = Q K^T, the next V half feeds O += P V), so a ring of any depth fits the shared memory
//     budget even at head dim 256. Two loaders fill it: on sm90, TMA boxes (the copy engine, on
//     mbarriers), each warp loading the rows it reads, the whole ring in flight; on sm80, cp.async
//     by all threads with a CTA barrier per half-tile, kSlots - 1 half-tiles in flight;
//   * paging: a key row is found through the block table (pages of any size, scattered) ahead of
//     its copy; keys past the cached length come straight from k_new/v_new (the CTA that appends
//     them to the cache runs concurrently), so appending needs no separate pass;
//   * splits: with several, each CTA writes a fp32 partial (o, lse) and the last CTA of its
//     (sequence, KV head, row tile) to finish merges them all, in the same launch;
//   * guards: the run path trusts no index. A length outside [0, plan max] or past the capacity,
//     or a page id outside [0, num_pages), is never dereferenced; the CTA records a fault in the
//     workspace and writes NaN rows (or a poisoned partial that the merge turns into NaN).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/block_range.h"
#include "core/params.h"
#include "core/softmax_state.h"
#include "cuda/decode/decode.h"
#include "cuda/decode/decode_combine.cuh"
#include "cuda/ptx/sm80.cuh"
#include "cuda/ptx/sm90.cuh"
#include "cuda/sm80/smem_tile.cuh"  // Swizzle, LaneRows: the portable kernels' shared-tile layout
#include "cuda/sm90/swizzle.cuh"    // swizzled_offset: the TMA tile layout

namespace flashattn::cuda::decode {

// Half-tile slots of the K/V ring. A half-tile is 64 keys x d x 2 bytes (8 KB at d = 64, 16 KB at
// 128, 32 KB at 256; TMA rounds d up to 64-column blocks). Shared memory budget per CTA:
//   sm90: 112 KB, so two CTAs share an SM (228 KB) and their loads overlap each other's compute;
//   sm80: 96 KB, within the 99 KB per block of sm86/sm89 (the sm80 build also runs there).
// cp.async (sm80): the budget holds the ring plus the largest Q tile (64 rows), at most 8 slots
// (past that cp.async issue, not bytes in flight, limits the rate). TMA (sm90): the ring plus
// this layout's own Q tile, the ring's mbarriers and 1 KB to align the tiles, each slot budgeted
// at (d + 63) * 128 bytes, more than its 64 * round64(d) * 2 (d = 128: 4 slots where 6 would fit).
// That is the measured choice: the deepest ring that fits ran paged caches (pages of 16) 8-9%
// behind contiguous instead of 2-3%, contiguous within 3% either way (H200,
// bench/results/h200_decode_deep_ring_2026-11-29.txt against h200_decode_tma_2026-11-29.txt).
// At least 2 slots (d = 256 with 64 query rows).
template <int kArch>
constexpr int decode_kv_slots(int head_dim, int block_m, int warps_n) {
  if (kArch >= 90) {
    const int slot_budget = (head_dim + 63) * 128, q_tile = block_m * head_dim * 2;
    const int slots = (112 * 1024 - 1024 - q_tile) / (slot_budget + 2 * 8 * warps_n);
    return slots < 2 ? 2 : slots;
  }
  const int half_tile = 64 * head_dim * 2;
  const int slots = 96 * 1024 / half_tile - 1;  // one half-tile's worth for Q
  return slots > 8 ? 8 : slots;
}

// The TMA loader's K/V slot layout: 64 key rows in groups of 16, each group its kColBlocks
// 64-column blocks one after another, a block 16 rows of 128 bytes whose 16-byte chunks are
// XOR-swizzled with row % 8 (TMA's SWIZZLE_128B, sm90::swizzled_offset). A group is what one warp
// loads, so one 5-D box (decode.h, box_blocks) fills all of its blocks.
template <int kColBlocks>
struct KvSlot {
  static constexpr int kGroupShift = 4, kGroupRows = 1 << kGroupShift;
  static constexpr int kBlockBytes = kGroupRows * 128;  // one column block of a group
  static constexpr int kGroupBytes = kColBlocks * kBlockBytes;
  // Byte offset of element (row, col).
  static __device__ __forceinline__ uint32_t offset(int row, int col) {
    const int slot_group = row >> kGroupShift, row_in_group = row & (kGroupRows - 1);
    return uint32_t(slot_group * kGroupBytes) + sm90::swizzled_offset<kGroupRows>(row_in_group, col);
  }
};

// The lane addresses of an ldmatrix sweep over a KvSlot: same interface and cost as
// sm80::LaneRows (in elements): row `row + row_hi`, row_hi a multiple of 16 (a whole group),
// chunk `chunk + bit` (chunk even, a constant).
template <int kColBlocks>
struct Sw128LaneRows {
  using Slot = KvSlot<kColBlocks>;
  static constexpr int kGroup = Slot::kGroupBytes / 2, kBlock = Slot::kBlockBytes / 2;  // in elements
  int base, x;
  __device__ __forceinline__ Sw128LaneRows(int row, int bit)
      : base((row >> Slot::kGroupShift) * kGroup + (row & (Slot::kGroupRows - 1)) * 64), x((row & 7) ^ bit) {}
  __device__ __forceinline__ int at(int row_hi, int chunk) const {
    return (row_hi >> Slot::kGroupShift) * kGroup + (chunk >> 3) * kBlock + base + (((chunk & 7) ^ x) << 3);
  }
};

template <int kHeadDim_, class Element_, int kWarpsM_, int kArch_>
struct DecodeTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpsN = kWarps / kWarpsM;
  static constexpr int kBlockM = 16 * kWarpsM;
  static constexpr int kBlockN = 64;
  static constexpr int kWarpKeys = kBlockN / kWarpsN;  // 16, 32 or 64 keys per warp per tile
  static constexpr int kChunks = kHeadDim / 8;         // 16-byte chunks per row
  // sm90: K/V arrive by TMA (the copy engine, completing on mbarriers), issued by the warps that
  // read the rows; sm80: cp.async, 16 bytes per thread and instruction.
  static constexpr bool kBulk = kArch_ >= 90;
  static constexpr int kSlots = decode_kv_slots<kArch_>(kHeadDim, kBlockM, kWarpsN);
  // K/V slot layout: KvSlot (TMA's swizzled blocks), or the portable kernels' swizzled rows.
  static constexpr int kColBlocks = (kHeadDim + 63) / 64;
  using KvRows = std::conditional_t<kBulk, Sw128LaneRows<kColBlocks>, sm80::LaneRows<kChunks>>;
  // cp.async loader: threads take a fixed chunk column and walk rows; head dims 96 and 192 round
  // their chunk count up to a power of two and leave those threads idle (the loads are what matter).
  static constexpr int kChunkSlots = kChunks <= 4 ? 4 : kChunks <= 8 ? 8 : kChunks <= 16 ? 16 : 32;
  static constexpr int kRowsPerPass = kThreads / kChunkSlots;
  static constexpr int kPasses = kBlockN / kRowsPerPass;
  static constexpr int kKSteps = kHeadDim / 16;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kNTiles = kWarpKeys / 8;
  // Q fragments stay in registers up to d = 128 (d/4 registers); at d = 256, O alone takes 128
  // registers per thread and re-reading Q from shared memory is cheaper than spilling.
  static constexpr bool kQInRegs = kHeadDim <= 128;
  static constexpr int kTileQ = kBlockM * kHeadDim;
  static constexpr int kTileKV = kBulk ? kColBlocks * kBlockN * 64 : kBlockN * kHeadDim;
  static constexpr int kLoopSmem = (kTileQ + kSlots * kTileKV) * int(sizeof(Element));
  // cp.async: row tables (a K and a V pointer per key row) of the tiles in flight: the first
  // ceil(kSlots / 2) tiles are issued by the prologue, and a table is rewritten two steps after
  // its last reader at the earliest, so that many slots (and at least two) suffice.
  // TMA: block-table entries are held this many tiles ahead (more than the ring at d = 64 would
  // take registers past the budget of the 64-row layout for no gain: a load's latency is ~1 us).
  static constexpr int kFirstTiles = (kSlots + 1) / 2;
  static constexpr int kRowSlots = kFirstTiles > 2 ? kFirstTiles : 2;
  static constexpr int kIdsAhead = kFirstTiles < 4 ? kFirstTiles : 4;
  static constexpr int kRowTableBytes = kBulk ? 0 : kRowSlots * kBlockN * 2 * int(sizeof(void*));
  // The cross-warp merge reuses the same memory: o of every (warp column, row) with a row stride
  // of d + 4 floats (rows then start 4 banks apart: the fragment stores are conflict-free), then m
  // and l.
  static constexpr int kRedStride = kHeadDim + 4;
  static constexpr int kReduceSmem = (kWarpsN * kBlockM * kRedStride + 2 * kWarpsN * kBlockM) * 4;
  static constexpr int kDataSmem = kLoopSmem > kReduceSmem ? kLoopSmem : kReduceSmem;
  // Bulk copies: a full and an empty mbarrier per (slot, warp column), past everything the
  // epilogue reuses (an mbarrier's memory serves no other purpose while the CTA runs).
  static constexpr int kBarrierBytes = kBulk ? 2 * kSlots * kWarpsN * 8 : 0;
  // TMA: the dynamic shared memory is realigned to 1024 bytes (the swizzle pattern's period).
  static constexpr int kSmemBytes = kDataSmem + kRowTableBytes + kBarrierBytes + (kBulk ? 1024 : 0);
  // What the combine may stage its partials in: everything but the mbarriers.
  static constexpr int kStageBytes = kDataSmem + kRowTableBytes;
  static_assert(kSlots >= 2, "the ring needs one half-tile in flight while another is consumed");
  static_assert(kWarpKeys % 16 == 0, "P V takes k16 steps within a warp's keys");
  static_assert(kBlockN % kRowsPerPass == 0, "every pass loads whole rows");
  static_assert(kBlockN / kWarpsN / kWarpsM == 16, "the TMA loader: every warp copies 16 of its column's rows");
  static_assert(!kBulk || (kTileQ * int(sizeof(Element))) % 1024 == 0, "TMA slots start 1024-byte aligned");
};

// Where the cache row of key `key` of sequence b lives: (page, slot within page). False when the
// block table names no page of the cache (the caller must not read or write it). `table` is the
// sequence's block-table row. Keys are below 2^31 + seqlen_new (lengths are i32) and pages hold at
// most 1024 tokens, so 32-bit division is exact (and far cheaper than 64-bit).
__device__ __forceinline__ bool cache_slot(const core::DecodeParams& p, const int32_t* table, int64_t b,
                                           int64_t key, int64_t& page, int64_t& slot) {
  if (!p.paged) {
    page = b;
    slot = key;
    return true;
  }
  const uint32_t k = uint32_t(key), size = uint32_t(p.page_size), index = k / size;
  const int32_t id = table[int64_t(index) * p.block_table_col_stride];
  page = id;
  slot = k - index * size;
  return id >= 0 && id < p.num_pages;
}

// No minimum of CTAs per SM: at d = 128 the 16-row layout takes 240 registers, two CTAs per SM.
// Capped for three (168 registers, about 70 KB of shared memory each) it ran 1.00-1.20x slower at
// every anchor row, 1.06x even where the grid holds one CTA per SM
// (bench/results/h200_session24_2026-12-03.txt, call 4).
template <class T>
__global__ void __launch_bounds__(T::kThreads) decode_kernel(const __grid_constant__ DecodeLaunch L) {
  using E = typename T::Element;
  using Mma = ptx::Mma<E>;
  using Sw = sm80::Swizzle<T::kChunks>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = T::kBulk ? ptx::align_shared_1024(smem_raw) : smem_raw;
  E* sQ = reinterpret_cast<E*>(smem);
  E* sKV = sQ + T::kTileQ;
  const core::DecodeParams& p = L.p;

  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int wm = warp / T::kWarpsN, wn = warp % T::kWarpsN;
  // blockIdx.x = ((b * heads_kv + hk) * splits + split) * row_tiles + row_tile: the row tiles of
  // one key range are neighbours, so their repeated K/V reads meet in L2.
  // Index arithmetic is 32-bit wherever the launcher bounded it (decode_launch.cuh): a 64-bit
  // division is a call of about a hundred instructions, and with one warp per scheduler such
  // chains, not the loads, set the length of the prologue and of the combine.
  uint32_t idx = blockIdx.x;
  const int row_tile = int(idx % uint32_t(L.row_tiles));
  idx /= uint32_t(L.row_tiles);
  const int split = int(idx % uint32_t(L.splits));
  idx /= uint32_t(L.splits);
  const int64_t hk = idx % uint32_t(p.heads_kv), b = idx / uint32_t(p.heads_kv);
  const int group = L.group;
  const int rows = L.group * int(p.seqlen_new);
  const int r0 = row_tile * T::kBlockM;
  const int rows_valid = rows - r0 < T::kBlockM ? rows - r0 : T::kBlockM;
  const int chunks_valid = int(p.head_dim / 8);  // smaller head dims run on a larger kernel
  const E* k_cache = static_cast<const E*>(p.k_cache);
  const E* v_cache = static_cast<const E*>(p.v_cache);

  // The one length read from the device, issued first and checked before it sizes anything: the Q
  // copies and the TMA loader's set-up below do not wait for it. (Against the checks above the
  // set-up this read 0.994-1.007x the time on the anchor rows, H200, session 55: the load's
  // latency is mostly elsewhere, but nothing waits for it needlessly.)
  const int64_t len = p.cache_seqlens[b * p.cache_seqlens_stride];

  // Q rows: they do not depend on the length. Row r is token r / group of query head
  // hk * group + r % group; rows past the last and columns past head_dim are zero-filled. (cp.async
  // loader: committed with the first K half-tile; bulk loader: waited for once the first copies are
  // issued; with no keys: before the shared memory is reused.)
  {
    const E* q = static_cast<const E*>(p.q);
    for (int i = tid; i < T::kBlockM * T::kChunks; i += T::kThreads) {
      const int row = i / T::kChunks, ch = i % T::kChunks;
      const int r = r0 + row;
      const bool valid = row < rows_valid && ch < chunks_valid;
      const E* src = valid ? q + p.q_s.offset(b, r / group, hk * group + r % group) + 8 * ch : q;
      ptx::thread_cp_async_16(sQ + Sw::offset(row, ch), src, valid);
    }
  }

  if constexpr (T::kBulk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // The TMA loader's barriers (see the main loop), published by the __syncthreads before use.
    // full: one arrival (with the expected bytes) per warp that loads a share of the slot's rows;
    // empty: one per thread that reads them.
    if (tid == 0) {
      uint64_t* bars = reinterpret_cast<uint64_t*>(smem + T::kDataSmem);
      for (int i = 0; i < T::kSlots * T::kWarpsN; ++i) {
        ptx::thread_mbarrier_init(&bars[i], T::kWarpsM);
        ptx::thread_mbarrier_init(&bars[T::kSlots * T::kWarpsN + i], 32 * T::kWarpsM);
      }
      ptx::thread_fence_mbarrier_init();
      ptx::thread_prefetch_tensormap(&L.k_map);
      ptx::thread_prefetch_tensormap(&L.v_map);
    }
    // Column blocks past head_dim (a head dim 64 or more below the kernel's) are never copied:
    // zero in every slot, as Q is there. Per slot and 16-row group they are the group's last
    // blocks (KvSlot).
    using Slot = KvSlot<T::kColBlocks>;
    const int col_blocks = (chunks_valid + 7) / 8;  // 64-column blocks holding head_dim columns
    const int pad_bytes = (T::kColBlocks - col_blocks) * Slot::kBlockBytes;  // per 16-row group
    constexpr int kGroups = T::kSlots * (T::kBlockN / Slot::kGroupRows);     // 16-row groups in the ring
    for (int i = tid; i < kGroups * pad_bytes / 16; i += T::kThreads) {
      const int slot_group = i / (pad_bytes / 16), j = i % (pad_bytes / 16);
      unsigned char* pad = reinterpret_cast<unsigned char*>(sKV) + slot_group * Slot::kGroupBytes +
                           col_blocks * Slot::kBlockBytes;
      reinterpret_cast<uint4*>(pad)[j] = make_uint4(0, 0, 0, 0);
    }
    __syncthreads();  // the mbarriers are initialized and the padding blocks zeroed
#endif
  }

  const int64_t extra = p.append ? p.seqlen_new : 0;
  const bool bad_len = len < 0 || len > L.max_cache_seqlen || len + extra > L.capacity;
  const int64_t keys = bad_len ? 0 : len + extra;
  bool fault = bad_len;  // this thread's view; OR-ed over the CTA at the end

  const int32_t* table = p.paged ? p.block_table + b * p.block_table_row_stride : nullptr;

  // Append: one CTA per (sequence, KV head) copies the new tokens into the cache. Nothing in this
  // launch reads those slots (keys >= len come from k_new/v_new below), so no ordering is needed.
  if (p.append && split == 0 && row_tile == 0 && !bad_len) {
    for (int i = tid; i < int(p.seqlen_new) * chunks_valid; i += T::kThreads) {
      const int tok = i / chunks_valid, c = i % chunks_valid;
      int64_t page, slot;
      if (!cache_slot(p, table, b, len + tok, page, slot)) {
        fault = true;
        continue;
      }
      const E* kn = static_cast<const E*>(p.k_new) + p.knew_s.offset(b, tok, hk) + 8 * c;
      const E* vn = static_cast<const E*>(p.v_new) + p.vnew_s.offset(b, tok, hk) + 8 * c;
      E* kc = static_cast<E*>(p.k_cache) + page * p.kc_page + slot * p.kc_row + hk * p.kc_head + 8 * c;
      E* vc = static_cast<E*>(p.v_cache) + page * p.vc_page + slot * p.vc_row + hk * p.vc_head + 8 * c;
      *reinterpret_cast<uint4*>(kc) = *reinterpret_cast<const uint4*>(kn);
      *reinterpret_cast<uint4*>(vc) = *reinterpret_cast<const uint4*>(vn);
    }
  }

  // This CTA's key tiles: the tiles its rows' tokens see (causal/window, bottom-right over `keys`),
  // cut into L.splits equal runs of whole tiles. Lengths come from the device, so the cut is made
  // here and a plan stays valid as sequences grow.
  const core::MaskSpec mask{p.seqlen_new, keys, p.window_left, p.window_right};
  const int tok_first = r0 / group, tok_last = (r0 + rows_valid - 1) / group;
  const core::TileRange tiles = core::tile_range(mask, tok_first, tok_last + 1, T::kBlockN);
  // Tile counts fit 32 bits (keys < 2^31 + 16).
  const int64_t per_split = (uint32_t(tiles.n_end - tiles.n_begin) + uint32_t(L.splits) - 1) / uint32_t(L.splits);
  const int64_t n_begin = min(tiles.n_end, tiles.n_begin + split * per_split);
  const int64_t n_end = min(tiles.n_end, n_begin + per_split);

  // Scores enter exp2 as fma(u, c, -base), u the raw q.k (or its tanh under softcap), c the scale
  // (or softcap) times log2(e): as in the forward kernel.
  const bool softcap = p.softcap > 0.f;
  const float c = float(core::kLog2e) * (softcap ? p.softcap : p.scale);
  const float tanh_scale = softcap ? p.scale / p.softcap : 0.f;

  float acc_o[T::kDTiles][4];
#pragma unroll
  for (int j = 0; j < T::kDTiles; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc_o[j][i] = 0.f;
  float row_max[2] = {core::neg_inf<float>(), core::neg_inf<float>()};  // exp2 domain
  float row_sum[2] = {0.f, 0.f};                                         // thread-partial
  // The tokens of this thread's two fragment rows (for the mask).
  int64_t row_tok[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) row_tok[rr] = (r0 + 16 * wm + g + 8 * rr) / group;

  if (n_end > n_begin) {
    // Where each key row of a tile comes from, for both loaders: an appended token's row of
    // k_new / v_new (the CTA that appends them to the cache runs concurrently), a cached row (its
    // page from the block table when paged), or nullptr past the keys or on a bad page (a fault).
    struct RowSrc {
      const E* k;
      const E* v;
    };
    const int ntiles = int(n_end - n_begin), halves = 2 * ntiles;
    const E* k_head = k_cache + hk * p.kc_head;
    const E* v_head = v_cache + hk * p.vc_head;
    auto fetch_id = [&](int m, int row) -> int32_t {
      const int64_t key = (n_begin + m) * T::kBlockN + row;
      if (!p.paged || key >= len) return 0;
      return table[int64_t(uint32_t(key) / uint32_t(p.page_size)) * p.block_table_col_stride];
    };
    auto row_source = [&](int m, int row, int32_t id) {
      const int64_t key = (n_begin + m) * T::kBlockN + row;
      RowSrc r{nullptr, nullptr};
      if (key < keys && key >= len) {
        r.k = static_cast<const E*>(p.k_new) + p.knew_s.offset(b, key - len, hk);
        r.v = static_cast<const E*>(p.v_new) + p.vnew_s.offset(b, key - len, hk);
      } else if (key < keys) {
        const int64_t page = p.paged ? int64_t(id) : b;
        const int64_t slot = p.paged ? int64_t(uint32_t(key) % uint32_t(p.page_size)) : key;
        if (page >= 0 && page < p.num_pages) {
          r.k = k_head + page * p.kc_page + slot * p.kc_row;
          r.v = v_head + page * p.vc_page + slot * p.vc_row;
        } else {
          fault = true;
        }
      }
      return r;
    };

    // The tiles, with the loader's hooks: acquire(j) returns half-tile j's slot once it has landed
    // for this warp; release(j) says this warp has read it.
    auto run_tiles = [&](auto&& acquire, auto&& release) {
      const int mi = lane >> 3;
      const sm80::LaneRows<T::kChunks> q_rows(16 * wm + (lane & 15), lane >> 4);
      const typename T::KvRows k_rows(wn * T::kWarpKeys + 8 * (mi >> 1) + (lane & 7), mi & 1);
      const typename T::KvRows v_rows(wn * T::kWarpKeys + 8 * (mi & 1) + (lane & 7), mi >> 1);
      uint32_t q_frag[T::kQInRegs ? T::kKSteps : 1][4];
      uint32_t p_frag[T::kWarpKeys / 16][4];

      for (int64_t n = n_begin; n < n_end; ++n) {
        const int j = 2 * int(n - n_begin);
        const E* sK = acquire(j);
        if constexpr (T::kQInRegs) {
          if (j == 0) {
#pragma unroll
            for (int ks = 0; ks < T::kKSteps; ++ks) ptx::warp_ldmatrix_x4(q_frag[ks], sQ + q_rows.at(0, 2 * ks));
          }
        }
        // S = Q K^T over this warp's keys of the tile.
        float acc_s[T::kNTiles][4];
#pragma unroll
        for (int jn = 0; jn < T::kNTiles; ++jn)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc_s[jn][i] = 0.f;
#pragma unroll
        for (int ks = 0; ks < T::kKSteps; ++ks) {
          uint32_t a_smem[4];
          if constexpr (!T::kQInRegs) ptx::warp_ldmatrix_x4(a_smem, sQ + q_rows.at(0, 2 * ks));
          const uint32_t(&a)[4] = T::kQInRegs ? q_frag[T::kQInRegs ? ks : 0] : a_smem;
#pragma unroll
          for (int jn = 0; jn < T::kNTiles; jn += 2) {
            uint32_t bk[4];
            ptx::warp_ldmatrix_x4(bk, sK + k_rows.at(8 * jn, 2 * ks));
            Mma::warp_m16n8k16(acc_s[jn], a, bk[0], bk[1]);
            Mma::warp_m16n8k16(acc_s[jn + 1], a, bk[2], bk[3]);
          }
        }
        release(j);
        // Softcap and mask are uniform over the CTA; here, unlike in the compute-bound forward,
        // run-time branches cost nothing measurable next to the loads.
        if (softcap) {
#pragma unroll
          for (int jn = 0; jn < T::kNTiles; ++jn)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc_s[jn][i] = ptx::thread_tanh(acc_s[jn][i] * tanh_scale);
        }
        if (tiles.needs_mask(n)) {
          const int64_t key0 = n * T::kBlockN + wn * T::kWarpKeys;
#pragma unroll
          for (int rr = 0; rr < 2; ++rr) {
            // This row's visible keys relative to the warp's first key, clamped to [0, kWarpKeys].
            const int64_t lo = max(min(mask.lo(row_tok[rr]) - key0, int64_t(T::kWarpKeys)), int64_t(0));
            const int64_t hi = max(min(mask.hi(row_tok[rr]) - key0, int64_t(T::kWarpKeys)), int64_t(0));
#pragma unroll
            for (int jn = 0; jn < T::kNTiles; ++jn)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int col = 8 * jn + 2 * t + e;
                if (col < lo || col >= hi) acc_s[jn][2 * rr + e] = core::neg_inf<float>();
              }
          }
        }
        // Online softmax with the lazy max (src/core/softmax_state.h), then P in 16 bits.
        float factor[2];
        bool moved = false;
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          float mx = core::neg_inf<float>();
#pragma unroll
          for (int jn = 0; jn < T::kNTiles; ++jn) mx = fmaxf(mx, fmaxf(acc_s[jn][2 * rr], acc_s[jn][2 * rr + 1]));
          mx = ptx::quad_max(mx);
          const float m_new = core::lazy_max(row_max[rr], mx * c);
          factor[rr] = core::rescale_factor(row_max[rr], m_new);
          row_max[rr] = m_new;
          row_sum[rr] *= factor[rr];
          moved |= factor[rr] != 1.f;
        }
        if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
          for (int jd = 0; jd < T::kDTiles; ++jd)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc_o[jd][i] *= factor[i >> 1];
        }
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const float base = core::exponent_base(row_max[rr]);
#pragma unroll
          for (int jn = 0; jn < T::kNTiles; ++jn)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& s = acc_s[jn][2 * rr + e];
              s = ptx::thread_exp2(fmaf(s, c, -base));
              row_sum[rr] += s;
            }
        }
#pragma unroll
        for (int kk = 0; kk < T::kWarpKeys / 16; ++kk) {
          p_frag[kk][0] = ptx::thread_pack2<E>(acc_s[2 * kk][0], acc_s[2 * kk][1]);
          p_frag[kk][1] = ptx::thread_pack2<E>(acc_s[2 * kk][2], acc_s[2 * kk][3]);
          p_frag[kk][2] = ptx::thread_pack2<E>(acc_s[2 * kk + 1][0], acc_s[2 * kk + 1][1]);
          p_frag[kk][3] = ptx::thread_pack2<E>(acc_s[2 * kk + 1][2], acc_s[2 * kk + 1][3]);
        }

        // O += P V over the same keys (the next half-tile of the ring).
        const E* sV = acquire(j + 1);
#pragma unroll
        for (int kk = 0; kk < T::kWarpKeys / 16; ++kk)
#pragma unroll
          for (int jd = 0; jd < T::kDTiles; jd += 2) {
            uint32_t bv[4];
            ptx::warp_ldmatrix_x4_trans(bv, sV + v_rows.at(16 * kk, jd));
            Mma::warp_m16n8k16(acc_o[jd], p_frag[kk], bv[0], bv[1]);
            Mma::warp_m16n8k16(acc_o[jd + 1], p_frag[kk], bv[2], bv[3]);
          }
        release(j + 1);
      }
    };

    if constexpr (T::kBulk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      // TMA: every warp loads the 16 key rows of each half-tile that it reads itself (its warp
      // column's rows, split between the column's row warps) as tensor boxes of L.box_rows rows
      // (16, or fewer so that a box never leaves a page) into its group of the slot (KvSlot): one
      // 5-D box of every 64-column block when the rows are whole groups and the head dim a multiple
      // of 64, else a box per block; completing on the (slot, column) full barrier; the column's
      // readers release the slot on its empty barrier. No CTA-wide barrier in the loop: a warp
      // waits only for its own rows and, to refill a slot, for the warps that share them. A box is
      // one request to the copy engine (a bulk copy per 256-byte row was slower than cp.async on
      // the H200: b=64 kv=4k 3728 against 4177 GB/s), and paged caches cost little more than
      // contiguous ones: the block table is the only difference. (The loads are not what bounds a
      // CTA: with boxes, as with cp.async, one CTA of 4 warps streamed ~25 GB/s; the tile math of
      // one warp per scheduler, its latencies exposed, is.) Rows a box cannot serve (at and past
      // the cached length: appended tokens, the tail past the keys; or on a bad page) are written
      // by the warp's lanes instead. Block-table entries are read kIdsAhead tiles ahead of their
      // copies, in registers, so paging adds no latency.
      uint64_t* full = reinterpret_cast<uint64_t*>(smem + T::kDataSmem);  // [slot][warp column]
      uint64_t* empty = full + T::kSlots * T::kWarpsN;
      const int row0 = wn * T::kWarpKeys + wm * 16;  // this warp's rows of every half-tile
      const int box = L.box_rows, boxes = 16 / box;  // lane i < boxes copies box i
      const bool boxer = lane < boxes;
      const int col_blocks = (chunks_valid + 7) / 8;  // 64-column blocks holding head_dim columns
      const uint32_t box_bytes = uint32_t(box) * 128 * uint32_t(col_blocks);
      const uint64_t stream_policy = ptx::thread_l2_policy_evict_first();
      auto fetch_ahead = [&](int m) { return boxer && m < ntiles ? fetch_id(m, row0 + lane * box) : 0; };
      int32_t ids[T::kIdsAhead];  // ids[i]: the page of this lane's box in the tile i issues ahead
#pragma unroll
      for (int i = 0; i < T::kIdsAhead; ++i) ids[i] = fetch_ahead(i);
      // This lane's box in the tile being issued (set at its K half, reused by its V half): page
      // (the sequence when contiguous), row within it, and whether TMA copies it.
      int32_t box_page = 0, box_row = 0;
      bool box_tma = false;
      // The rows of half-tile h whose box TMA does not copy: lanes l and l + 16 write row l's
      // chunks (even and odd) with ordinary loads and stores: the cached row (key < len), the
      // appended token (len <= key < keys), else zeros, so that P V adds 0 (never NaN).
      auto fill_rows = [&](int h, unsigned char* dst) {
        const int r = lane & 15, i = r / box;
        const bool tma = __shfl_sync(0xffffffffu, box_tma, i);
        const int64_t page = __shfl_sync(0xffffffffu, box_page, i);
        const int64_t row = __shfl_sync(0xffffffffu, box_row, i) + r % box;
        if (tma) return;
        const int64_t key = (n_begin + (h >> 1)) * T::kBlockN + row0 + r;
        const bool v = h & 1;
        const E* src = nullptr;
        if (key < len) {
          if (page >= 0 && page < p.num_pages)
            src = v ? v_head + page * p.vc_page + row * p.vc_row : k_head + page * p.kc_page + row * p.kc_row;
        } else if (key < keys) {
          src = v ? static_cast<const E*>(p.v_new) + p.vnew_s.offset(b, key - len, hk)
                  : static_cast<const E*>(p.k_new) + p.knew_s.offset(b, key - len, hk);
        }
#pragma unroll
        for (int k = 0; k < T::kChunks / 2; ++k) {
          const int c = 2 * k + (lane >> 4);
          const uint4 x = src != nullptr && c < chunks_valid ? *reinterpret_cast<const uint4*>(src + 8 * c)
                                                             : make_uint4(0, 0, 0, 0);
          *reinterpret_cast<uint4*>(dst + KvSlot<T::kColBlocks>::offset(row0 + r, 8 * c)) = x;
        }
        // These stores come before the copy engine's next write to the rows.
        ptx::thread_fence_proxy_async_smem();
      };
      // Half-tile h (K when even, V when odd, of tile h / 2) into slot h % kSlots, once the
      // column's readers released what the slot held (half h - kSlots).
      auto issue = [&](int h) {
        const int slot = h % T::kSlots;
        if ((h & 1) == 0) {
          const int64_t key = (n_begin + (h >> 1)) * T::kBlockN + row0 + lane * box;
          const int64_t page = p.paged ? int64_t(ids[0]) : b;
          const bool page_ok = page >= 0 && page < p.num_pages;
          if (boxer && key < len && !page_ok) fault = true;
          box_page = int32_t(page);
          box_row = p.paged ? int32_t(uint32_t(key) % uint32_t(p.page_size)) : int32_t(key);
          box_tma = boxer && page_ok && key + box <= len;
#pragma unroll
          for (int i = 0; i + 1 < T::kIdsAhead; ++i) ids[i] = ids[i + 1];
          ids[T::kIdsAhead - 1] = fetch_ahead((h >> 1) + T::kIdsAhead);
        }
        if (h >= T::kSlots) ptx::thread_mbarrier_wait(&empty[slot * T::kWarpsN + wn], uint32_t(h / T::kSlots - 1) & 1);
        unsigned char* dst = reinterpret_cast<unsigned char*>(sKV + slot * T::kTileKV);
        uint64_t* bar = &full[slot * T::kWarpsN + wn];
        const uint32_t copies = __popc(__ballot_sync(0xffffffffu, box_tma));
        if (copies < uint32_t(boxes)) fill_rows(h, dst);
        // The filled rows are written before the arrival publishes them: __syncwarp orders the lanes'
        // stores before lane 0's arrive, a release that the readers' wait acquires. racecheck still
        // reports these stores against other warps' ldmatrix of the slot; it does not appear to follow
        // a release made by one lane for its warp (bench/results/h100_session54_2026-12-06.txt).
        __syncwarp();
        if (lane == 0) ptx::thread_mbarrier_arrive_expect_tx(bar, copies * box_bytes);
        __syncwarp();
        if (box_tma) {
          const void* map = (h & 1) ? &L.v_map : &L.k_map;
          using Slot = KvSlot<T::kColBlocks>;
          unsigned char* box_dst = dst + (row0 >> Slot::kGroupShift) * Slot::kGroupBytes + lane * box * 128;
          // The plan picks the L2 policy: evict_first pays only where splits are short (split_plan.h).
          if (L.box_blocks > 1) {
            // One 5-D box: the group's 16 rows, every column block.
            if (L.evict_first)
              ptx::thread_tma_load_5d_hint(box_dst, map, bar, 0, box_row, 0, int(hk), box_page, stream_policy);
            else
              ptx::thread_tma_load_5d(box_dst, map, bar, 0, box_row, 0, int(hk), box_page);
          } else {
            for (int cb = 0; cb < col_blocks; ++cb) {
              unsigned char* block_dst = box_dst + cb * Slot::kBlockBytes;
              if (L.evict_first)
                ptx::thread_tma_load_4d_hint(block_dst, map, bar, 64 * cb, box_row, int(hk), box_page, stream_policy);
              else
                ptx::thread_tma_load_4d(block_dst, map, bar, 64 * cb, box_row, int(hk), box_page);
            }
          }
        }
      };
      for (int h = 0; h < min(T::kSlots, halves); ++h) issue(h);
      // Q, issued first, has long landed: its copies close one group (a wait counts committed
      // groups only), then the barrier publishes it to every warp.
      ptx::thread_cp_async_commit();
      ptx::thread_cp_async_wait<0>();
      __syncthreads();
      auto acquire = [&](int h) {
        const int slot = h % T::kSlots;
        ptx::thread_mbarrier_wait(&full[slot * T::kWarpsN + wn], uint32_t(h / T::kSlots) & 1);
        return sKV + slot * T::kTileKV;
      };
      // Every reading thread arrives (an arrive releases the arriving thread's own reads). No proxy
      // fence before it: the slot's reads are ldmatrix results that the MMAs issued before the
      // arrive have consumed, so they are complete before the copy engine can be told to overwrite
      // the slot (CUTLASS's consumer release is the bare arrive too). A fence.proxy.async here cost
      // 0.1-0.5% of every anchor row (H100, bench/results/h100_session45_2026-12-06.txt).
      auto release = [&](int h) {
        ptx::thread_mbarrier_arrive(&empty[(h % T::kSlots) * T::kWarpsN + wn]);
        if (h + T::kSlots < halves) issue(h + T::kSlots);
      };
      run_tiles(acquire, release);
#endif
    } else {
      // cp.async: the sources of each tile's 64 key rows are worked out once per tile by threads
      // 0..63 (one row each) into a small ring of row tables, then read by every copy of that
      // tile's K and V halves: a copy costs one shared load and the cp.async, instead of per-row
      // key, page and stride arithmetic. (ncu on an H200, bf16 d=128 GQA 32/8, b=8 kv=32k:
      // computing each row's source at copy time kept the kernel issue-bound at 51% of DRAM
      // bandwidth, 443 us; with the row tables it reads at 90%, 249 us.) A paged row's block-table
      // entry is read a step before its row is written (fetch_id / store_rows), so the load's
      // latency hides behind that step's work.
      RowSrc* s_rows = reinterpret_cast<RowSrc*>(smem + T::kLoopSmem);
      auto store_rows = [&](int m, int32_t id) {
        s_rows[(m % T::kRowSlots) * T::kBlockN + tid] = row_source(m, tid, id);
      };

      // Half-tile j: K (even j) or V (odd j) of tile j / 2, into ring slot j % kSlots. Threads keep
      // one chunk column and walk rows; head dims 96 and 192 leave the padding columns idle.
      const int ch = tid % T::kChunkSlots, row0 = tid / T::kChunkSlots;
      auto load_half = [&](int j) {
        if (ch >= T::kChunks) return;
        const RowSrc* rows = s_rows + ((j >> 1) % T::kRowSlots) * T::kBlockN;
        const E* const* column = (j & 1) ? &rows[0].v : &rows[0].k;  // this half's pointer of each row
        E* dst = sKV + (j % T::kSlots) * T::kTileKV;
        // Partly unrolled: a full unroll (16 rows at d = 256) keeps every row's pointer live at once
        // and spills next to the registers of O.
#pragma unroll 4
        for (int pass = 0; pass < T::kPasses; ++pass) {
          const int row = row0 + pass * T::kRowsPerPass;
          const E* src = column[2 * row];
          const bool valid = src != nullptr && ch < chunks_valid;
          ptx::thread_cp_async_16(dst + Sw::offset(row, ch), valid ? src + 8 * ch : k_cache, valid);
        }
      };
      // Prologue: the row tables of the tiles the first halves need (their latency paid once), then
      // Q and those halves. Every slot's group is committed (empty past the end), so "at most
      // kSlots - 2 groups pending" always means "half-tile j has landed".
      if (tid < T::kBlockN)
        for (int m = 0; m < min(T::kFirstTiles, ntiles); ++m) store_rows(m, fetch_id(m, tid));
      __syncthreads();
#pragma unroll 1
      for (int s = 0; s < T::kSlots - 1; ++s) {
        if (s < halves) load_half(s);
        ptx::thread_cp_async_commit();
      }
      // Before consuming half-tile j: it has landed for every thread, every warp is done with j - 1,
      // and that slot is refilled with half-tile j + kSlots - 1. When the half issued at the next
      // step (j + kSlots) starts a tile, its block-table entries are read now and its row table is
      // written at the next step, before the barrier that publishes it.
      int pending_tile = -1;
      int32_t pending_id = 0;
      auto begin_half = [&](int j) {
        ptx::thread_cp_async_wait<T::kSlots - 2>();
        if (pending_tile >= 0) store_rows(pending_tile, pending_id);
        pending_tile = -1;
        __syncthreads();
        if (j + T::kSlots - 1 < halves) load_half(j + T::kSlots - 1);
        ptx::thread_cp_async_commit();
        const int next = j + T::kSlots;
        if ((next & 1) == 0 && next < halves && tid < T::kBlockN) {
          pending_tile = next >> 1;
          pending_id = fetch_id(pending_tile, tid);
        }
        return sKV + (j % T::kSlots) * T::kTileKV;
      };

      run_tiles(begin_half, [](int) {});
    }
  }
  // Every copy (Q's too, when the CTA had no keys) lands before the shared memory is reused.
  ptx::thread_cp_async_commit();
  ptx::thread_cp_async_wait<0>();

  // Cross-warp merge in shared memory (the ring is free once every warp passed this barrier): the
  // kWarpsN states of a row are moved onto their common max (core::rescale_factor), summed, and
  // finalized once.
  fault = __syncthreads_or(fault) != 0;
  // With splits, every warp's loop is done: this CTA counts itself in on the unit's `done`
  // counter now, so that the atomic's round trip runs under the merge below; the CTA that brings
  // it to `splits` combines (see the combine below).
  const int64_t unit = (b * p.heads_kv + hk) * L.row_tiles + row_tile;
  uint32_t done_before = 0;
  if (L.splits > 1 && tid == 0) done_before = atomicAdd(&L.arrivals[unit], 1u);
  float* red_o = reinterpret_cast<float*>(smem);
  float* red_m = red_o + T::kWarpsN * T::kBlockM * T::kRedStride;
  float* red_l = red_m + T::kWarpsN * T::kBlockM;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int row = 16 * wm + g + 8 * rr, at = wn * T::kBlockM + row;
    const float l = ptx::quad_sum(row_sum[rr]);
    if (t == 0) {
      red_m[at] = row_max[rr];
      red_l[at] = l;
    }
#pragma unroll
    for (int jd = 0; jd < T::kDTiles; ++jd)
      *reinterpret_cast<float2*>(red_o + at * T::kRedStride + 8 * jd + 2 * t) =
          make_float2(acc_o[jd][2 * rr], acc_o[jd][2 * rr + 1]);
  }
  __syncthreads();

  if (fault && tid == 0) {
    atomicOr(&L.status[0], bad_len ? kDecodeFaultLength : kDecodeFaultPage);
    atomicMax(&L.status[1], ~uint32_t(b));  // the largest ~b is the smallest faulty b
  }
  const float nan = __int_as_float(0x7fffffff);
  // This CTA's row `row`: its token and query head.
  struct RowId {
    int64_t tok, h;
  };
  auto row_id = [&](int row) {
    const int r = r0 + row;
    return RowId{r / group, hk * group + r % group};
  };
  // Output row `id`, columns col..col+3 (already normalized), and its lse.
  auto store_out = [&](RowId id, int col, const float (&o)[4], float lse) {
    E* out = static_cast<E*>(p.out) + p.o_s.offset(b, id.tok, id.h) + col;
    reinterpret_cast<uint32_t*>(out)[0] = ptx::thread_pack2<E>(o[0], o[1]);
    reinterpret_cast<uint32_t*>(out)[1] = ptx::thread_pack2<E>(o[2], o[3]);
    if (col == 0 && p.lse != nullptr) static_cast<float*>(p.lse)[p.lse_s.offset(b, id.tok, id.h)] = lse;
  };
  // Row (split s, row id) of the partial o [split, batch, token, head, d]: part_row(0, id) + s * stride.
  const int64_t part_stride = p.batch * p.seqlen_new * p.heads_q;
  auto part_row = [&](int64_t s, RowId id) { return s * part_stride + (b * p.seqlen_new + id.tok) * p.heads_q + id.h; };
  // The partial lse are [split, batch, heads_kv, row tile, kBlockM]: a CTA's rows are one aligned
  // block, which the combine copies 16 bytes at a time.
  const int64_t lse_step = p.batch * p.heads_kv * L.row_tiles * T::kBlockM;
  const int64_t lse_base = ((b * p.heads_kv + hk) * L.row_tiles + row_tile) * T::kBlockM;
  constexpr int kQuads = T::kHeadDim / 4;
  for (int i = tid; i < T::kBlockM * kQuads; i += T::kThreads) {
    const int row = i / kQuads, col = 4 * (i % kQuads);
    if (row >= rows_valid || col >= p.head_dim) continue;
    float m = core::neg_inf<float>();
#pragma unroll
    for (int w = 0; w < T::kWarpsN; ++w) m = fmaxf(m, red_m[w * T::kBlockM + row]);
    float l = 0.f, o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < T::kWarpsN; ++w) {
      const int at = w * T::kBlockM + row;
      const float f = core::rescale_factor(red_m[at], m);
      l += f * red_l[at];
      const float4 ow = *reinterpret_cast<const float4*>(red_o + at * T::kRedStride + col);
      o[0] += f * ow.x;
      o[1] += f * ow.y;
      o[2] += f * ow.z;
      o[3] += f * ow.w;
    }
    const float inv = fault ? nan : core::finalize_scale(l);
#pragma unroll
    for (int e = 0; e < 4; ++e) o[e] *= inv;
    if (L.splits == 1) {
      store_out(row_id(row), col, o, fault ? nan : core::finalize_lse(m, l));
    } else {
      // A poisoned partial has lse = +inf, which the merge turns into a NaN row whatever the
      // other splits hold (exp(inf - inf) is NaN).
      const int64_t prow = part_row(split, row_id(row));
      *reinterpret_cast<float4*>(L.part_o + prow * p.head_dim + col) = make_float4(o[0], o[1], o[2], o[3]);
      if (col == 0)
        L.part_lse[split * lse_step + lse_base + row] = fault ? __int_as_float(0x7f800000) : core::finalize_lse(m, l);
    }
  }
  if (L.splits == 1) return;

  // The combine, in this launch: the last CTA of this (sequence, KV head, row tile) to finish its
  // loop (the `done` count above) merges every split's partial (merge_row.cuh, the merge_states
  // rules). A second kernel would cost a launch and a drain of the whole grid, which at b = 1 is a
  // large part of a step. The others publish: a gpu-scope release (thread_pass_turn, after the
  // barrier that orders every thread's partial writes before it) on the unit's `published`
  // counter, which the combining CTA acquires once it reads splits - 1. Its own partial needs no
  // GPU-wide fence: the barrier orders it before the CTA's own reads. Counting in before the
  // partial is written takes a fence and an atomic round trip off the step's last CTA (H100,
  // bench/results/h100_session51_2026-12-06.txt: 0.989-0.998x the time at b=1). The counters are
  // zeroed with the status at the start of every run (decode.cpp), so a run (or a graph replay)
  // never sees a stale count.
  __syncthreads();
  bool last = false;
  if (tid == 0) {
    int* published = reinterpret_cast<int*>(L.arrivals + p.batch * p.heads_kv * L.row_tiles + unit);
    last = done_before == uint32_t(L.splits - 1);
    if (last)
      ptx::thread_wait_turn(published, L.splits - 1, ptx::thread_load_turn(published));
    else
      ptx::thread_pass_turn(published);
  }
  if (!__syncthreads_or(last)) return;
  block_combine_splits<T>(L, smem, rows_valid, part_stride, lse_step, lse_base, row_id, part_row, store_out);
}

}  // namespace flashattn::cuda::decode

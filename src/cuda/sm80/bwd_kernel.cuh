// The portable backward (sm80+): FlashAttention-2's recomputation in our own CUDA C++.
//
// Three kernels per call:
//   1. preprocess (src/cuda/bwd_common.cuh): per query row, D = rowsum(dO o O) and
//      lse2 = lse * log2(e) (fp32, +inf for rows that saw nothing, src/core/softmax_state.h), into
//      a workspace with dense rows;
//   2. main: one CTA per (key tile, KV head, batch) keeps K_j, V_j and the fp32 dK_j, dV_j
//      accumulators on chip and streams the query tiles of every query head that shares the KV
//      head (so GQA needs no reduction afterwards): recompute S^T = K Q^T and P^T = exp2(S^T c -
//      lse2), dP^T = V dO^T, dS^T = P^T o (dP^T - D) (times the softcap derivative), dV += P^T dO,
//      dK += dS^T Q, and dQ += dS K into an fp32 accumulator in global memory; the softmax scale
//      of dS is applied once to dK when it is written and to dQ by the convert kernel;
//   3. convert: dq = scale * dq_accum in the input dtype.
// dQ accumulation: each thread adds its dQ fragments to global memory from registers with relaxed
// atomics, so the order of additions varies between runs. Where the tile table says
// (fragment_dq, the sm90 builds), the accumulator is laid out in the fragments' own order
// (FragmentDq below), so that each warp's 16-byte reductions (red.global.add.v4.f32) cover 512
// contiguous bytes, and the convert kernel puts the elements back in place; else it has the
// rows of dQ, and each reduction adds a lane's two columns of a row.
// In deterministic mode the key tiles visiting a query tile take turns (a counter per dQ tile in
// the workspace, as on the Hopper path): each warp adds its part once the counter shows this key
// tile's turn (ordered_turn), and thread 0 passes the turn at the next step's middle barrier, by
// when the step's additions have long been issued, so its fence seldom waits. The key tiles walk
// their query tiles in the direction of the turn order (Walk below; bwd_layout.h says which order
// and why), so that each reaches a query tile after the key tiles before it.
//
// Warp layouts (tile_size.h picks them): phase 1 (S^T, dP^T) puts kKeyWarpsS warps along the keys
// and the rest along the queries, phase 2 (dV, dK) kKeyWarpsKV along the keys and the rest along
// the head dim, phase 3 (dQ) kRowWarpsQ along the kBlockM query rows and the rest along the head dim. A
// warp owning 32 rows (two m16 tiles) reuses each B fragment it reads from shared memory twice,
// which is what bounds this kernel (ncu on the H200, d=128: shared memory 66% busy, tensor pipe
// 31%). P^T and dS^T pass between phases through shared memory as 16-bit values, as
// FlashAttention-2 does.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/block_range.h"
#include "core/params.h"
#include "core/softmax_state.h"
#include "cuda/bwd_common.cuh"
#include "cuda/ptx/sm80.cuh"
#include "cuda/ptx/sm90.cuh"  // stmatrix (sm90 builds)
#include "cuda/sm80/smem_tile.cuh"
#include "cuda/tile_scheduler.h"
#include "cuda/tile_size.h"

namespace flashattn::cuda::sm80 {

template <int kHeadDim_, class Element_, int kBlockN_, int kWarps_, int kStages_, int kKeyWarpsS_, int kKeyWarpsKV_,
          int kRowWarpsQ_, int kMinCtas_, int kBlockM_ = 64, bool kFragmentDq_ = false, bool kStMatrixPs_ = false>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;  // keys per CTA
  static constexpr int kWarps = kWarps_;
  static constexpr int kStages = kStages_;  // Q/dO tiles in flight
  static constexpr int kMinCtas = kMinCtas_;  // CTAs per SM the registers are capped for
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockM = kBlockM_;  // query rows per step
  static constexpr bool kStMatrixPs = kStMatrixPs_;  // P^T, dS^T stored by stmatrix (sm90)
  static constexpr int kKeyWarpsS = kKeyWarpsS_, kKeyWarpsKV = kKeyWarpsKV_, kRowWarpsQ = kRowWarpsQ_;
  static constexpr int kRowsS = kBlockN / kKeyWarpsS;                 // keys of S^T per warp
  static constexpr int kColsS = kBlockM / (kWarps / kKeyWarpsS);      // queries of S^T per warp
  static constexpr int kRowsKV = kBlockN / kKeyWarpsKV;               // keys of dK, dV per warp
  static constexpr int kColsKV = kHeadDim / (kWarps / kKeyWarpsKV);   // head-dim columns of dK, dV
  static constexpr int kRowsQ = kBlockM / kRowWarpsQ;                 // query rows of dQ per warp
  static constexpr int kColsQ = kHeadDim / (kWarps / kRowWarpsQ);     // head-dim columns of dQ
  static constexpr int kTilesS = kRowsS / 16, kTilesKV = kRowsKV / 16, kTilesQ = kRowsQ / 16;  // m16 tiles
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kChunksP = kBlockM / 8;
  static constexpr bool kFragmentDq = kFragmentDq_;  // the dQ accumulator in fragment order
  static constexpr int kTileQ = kBlockM * kHeadDim;
  static constexpr int kTileKV = kBlockN * kHeadDim;
  static constexpr int kTileP = kBlockN * kBlockM;
  static constexpr int kSmemBytes =
      (2 * kTileKV + 2 * kStages * kTileQ + 2 * kTileP) * int(sizeof(Element)) + 2 * kStages * kBlockM * 4;
  static_assert(kWarps % kKeyWarpsS == 0 && kWarps % kKeyWarpsKV == 0 && kWarps % kRowWarpsQ == 0,
                "warp layouts must tile the CTA");
  static_assert(kRowsS % 16 == 0 && kRowsKV % 16 == 0 && kRowsQ % 16 == 0, "warps own whole m16 tiles");
  static_assert(kBlockM <= kThreads, "one thread per query row loads the step's lse and delta");
  static_assert(kColsS % 16 == 0 && kColsKV % 16 == 0 && kColsQ % 16 == 0, "ldmatrix.x4 covers two n8 tiles");
};

// The dQ accumulator in fragment order (kFragmentDq): one block of kBlockM x kHeadDim floats
// per (query head, query tile), numbered as the tiled layout numbers them (bwd_layout.h), so that
// sequences never share a block. Within a block, warp w's kRowsQ x kColsQ part is contiguous, and
// its accumulators go out as float4 groups: group k = (m16 tile i, n8 tile j) of lane l at float
// 4 (32 k + l), holding rows g and g + 8 (g = l / 4) by columns 2t, 2t + 1 (t = l % 4) of that
// tile. A warp's reduction of one group covers 512 contiguous bytes. Builds without vector
// reductions (sm80) add a group as four scalar ones, so there element e of the float4 sits at float
// 128 k + 32 e + l instead: each of a warp's scalar reductions then covers 128 contiguous bytes, a
// whole line, as FlashAttention-2's do (its rows and columns as above).
template <class T>
struct FragmentDq {
  static constexpr int kWarpFloats = T::kRowsQ * T::kColsQ;
  static constexpr int kBlockFloats = T::kBlockM * T::kHeadDim;
  // The block of (query head h, query tile m of sequence b).
  __host__ __device__ static int64_t block(const core::AttnShape& p, int64_t tiles_per_head, int h, int64_t b,
                                           int64_t m) {
    return ((int64_t(h) * tiles_per_head + tile_base(p, T::kBlockM, b) + m) * kBlockFloats);
  }
  // Where float4 number f of a block belongs: rows (row, row + 8), columns (col, col + 1).
  __host__ __device__ static void place(int f, int* row, int* col) {
    const int w = f / (kWarpFloats / 4), within = f % (kWarpFloats / 4);
    const int k = within / 32, lane = within % 32;
    const int i = k / (T::kColsQ / 8), j = k % (T::kColsQ / 8);
    *row = T::kRowsQ * (w % T::kRowWarpsQ) + 16 * i + lane / 4;
    *col = T::kColsQ * (w / T::kRowWarpsQ) + 8 * j + 2 * (lane % 4);
  }
};

// ---- 3. convert ---------------------------------------------------------------------------------

// One thread per 8 head-dim columns of one (row, head); applies the softmax scale, which the main
// kernel leaves out of dS (as for dK, scaled once when written: one multiply per element per key
// tile instead of one per element per step).
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
  const float* acc = ws.dq_accum + ((workspace_row0(p, b) + row) * p.heads_q + h) * p.head_dim + x;
  float v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = acc[i];
  E* dq = static_cast<E*>(p.dq) + p.dq_s.offset(b, q0 + row, h) + x;
#pragma unroll
  for (int i = 0; i < 8; i += 2)
    *reinterpret_cast<uint32_t*>(dq + i) = ptx::thread_pack2<E>(v[i] * p.scale, v[i + 1] * p.scale);
}

// The same from the fragment-ordered accumulator (FragmentDq): one CTA per (query tile, head,
// sequence), reading its block in order (whole lines) and writing each float4 to its two rows.
template <class T>
__global__ void __launch_bounds__(128)
    backward_convert_dq_fragment_kernel(const __grid_constant__ core::BackwardParams p, BwdWorkspace ws) {
  using E = typename T::Element;
  using F = FragmentDq<T>;
  const int h = blockIdx.y, b = blockIdx.z;
  int64_t q0, sq;
  query_rows(p, b, &q0, &sq);
  const int64_t m0 = int64_t(blockIdx.x) * T::kBlockM;
  if (m0 >= sq) return;
  const int rows = int(sq - m0 < T::kBlockM ? sq - m0 : T::kBlockM);
  const float* acc = ws.dq_accum + F::block(p, ws.tiles_per_head, h, b, blockIdx.x);
  for (int f = threadIdx.x; f < F::kBlockFloats / 4; f += 128) {
    int row, col;
    F::place(f, &row, &col);
    if (col >= p.head_dim) continue;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const float4 v = reinterpret_cast<const float4*>(acc)[f];
#else
    // Float4 f = 32 k + l of its warp's part (whose size is a multiple of 128 floats) starts at
    // float 128 k + l of that part: 4 f - 3 l.
    const float* a = acc + 4 * f - 3 * (f % 32);
    const float4 v = make_float4(a[0], a[32], a[64], a[96]);
#endif
    if (row < rows) {
      E* dq = static_cast<E*>(p.dq) + p.dq_s.offset(b, q0 + m0 + row, h) + col;
      *reinterpret_cast<uint32_t*>(dq) = ptx::thread_pack2<E>(v.x * p.scale, v.y * p.scale);
    }
    if (row + 8 < rows) {
      E* dq = static_cast<E*>(p.dq) + p.dq_s.offset(b, q0 + m0 + row + 8, h) + col;
      *reinterpret_cast<uint32_t*>(dq) = ptx::thread_pack2<E>(v.z * p.scale, v.w * p.scale);
    }
  }
}

// ---- 2. main ------------------------------------------------------------------------------------

// A key tile's walk over its m_count query tiles (of each query head, relative to its first):
// upward by default; in deterministic mode in the turn order's direction: `down` from the last,
// `up` from the first, `around` from the key tile's diagonal, wrapping round past the last. (The
// Hopper kernels' KeySteps walks the same orders over absolute tiles, heads innermost; each form is
// the one its kernels spill least with.)
template <bool kDeterministic>
struct Walk {
  int m_count, first = 0, wrap;
  bool down = false;
  __device__ __forceinline__ Walk(int count, int64_t n, int64_t n_tiles, TurnOrder turns) : m_count(count), wrap(count) {
    if constexpr (kDeterministic) {
      down = turns == TurnOrder::down;
      if (turns == TurnOrder::around && count > 0) {
        first = core::around_first_query_tile(int(n), int(n_tiles), count);
        wrap = count - first;
      }
    }
  }
  // The query tile of walk position i.
  __device__ __forceinline__ int tile(int i) const {
    if constexpr (!kDeterministic) return i;
    if (down) return m_count - 1 - i;
    return i < wrap ? first + i : first + i - m_count;
  }
};

// kDeterministic is a template parameter, not a runtime flag, so the default kernel carries none of
// the turns' registers and instructions.
template <class T, bool kSoftcap, bool kDeterministic>
__global__ void __launch_bounds__(T::kThreads, T::kMinCtas)
    backward_kernel(const __grid_constant__ core::BackwardParams p, BwdWorkspace ws, TurnOrder turns,
                    TileScheduler order) {
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
  const int warp_ks = warp % T::kKeyWarpsS, warp_qs = warp / T::kKeyWarpsS;      // phase 1
  const int warp_kkv = warp % T::kKeyWarpsKV, warp_dkv = warp / T::kKeyWarpsKV;  // phase 2
  const int warp_mq = warp % T::kRowWarpsQ, warp_dq = warp / T::kRowWarpsQ;      // phase 3
  // The grid is (key tiles, KV heads, batch). Under a right bound the default mode takes its key
  // tile from `order` instead (tile_scheduler.h: (KV head, batch) pairs in L2 sections, the longest
  // key tiles, the lowest, first within each), so that the launch ends with short key tiles; in the
  // grid's own order the last pair's longest key tile starts in the last wave and runs the tail.
  // With the cut tail (ws.tail_parts > 0, a 1-D grid in the grid's order) the CTAs from
  // ws.tail_dp_tiles on take one piece each of the last, partial wave's key tiles (tail_piece).
  int hk = blockIdx.y, b = blockIdx.z;
  int64_t n_grid = blockIdx.x;
  int tail_piece = -1;
  if constexpr (!kDeterministic) {
    if (order.longest_first) {
      int m, h, bb;
      order.tile(int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)), &m, &h, &bb);
      n_grid = order.num_m_blocks - 1 - m;
      hk = h;
      b = bb;
    } else if (ws.tail_parts > 0) {
      int idx = int(blockIdx.x);
      if (idx >= ws.tail_dp_tiles) {
        tail_piece = idx - ws.tail_dp_tiles;
        idx = ws.tail_dp_tiles + tail_piece / ws.tail_parts;
      }
      int m;
      order.tile(idx, &m, &hk, &b);  // the grid's own order: m is the key tile
      n_grid = m;
    }
  }
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

  // Lane address plans (smem_tile.cuh): A fragments of K, V (phase 1) and of P^T, dS^T (phase 2),
  // this warp's first key row; B fragments of Q, dO (phase 1, non-transposed); transposed B
  // fragments of dO, Q (phase 2) and K (phase 3); transposed A fragments of dS^T (phase 3).
  const LaneRows<T::kChunks> kv_a(T::kRowsS * warp_ks + (lane & 15), lane >> 4);
  const LaneRows<T::kChunksP> p_a(T::kRowsKV * warp_kkv + (lane & 15), lane >> 4);
  const LaneRows<T::kChunks> qdo_b(T::kColsS * warp_qs + 8 * (mi >> 1) + (lane & 7), mi & 1);
  const LaneRows<T::kChunks> trans_b(8 * (mi & 1) + (lane & 7), mi >> 1);
  const LaneRows<T::kChunksP> ds_a_trans(8 * (mi >> 1) + (lane & 7), mi & 1);
  // stmatrix rows of P^T and dS^T (kStMatrixPs): phase 1's A-fragment plan, in P's chunks.
  [[maybe_unused]] const LaneRows<T::kChunksP> ps_st(T::kRowsS * warp_ks + (lane & 15), lane >> 4);
  const int d_chunk_kv = T::kColsKV / 8 * warp_dkv;  // first head-dim chunk of this warp (even)
  const int d_chunk_q = T::kColsQ / 8 * warp_dq;
  // Phase 3's dQ elements of this thread: rows q_row0 + 16 i + 8 rr of a step's tile, columns
  // 8 (d_chunk_q + j) + 2t for j < q_cols_valid (head dims below the kernel's stop early), each row
  // a 32-bit offset of q_row_stride from the thread's first: per-element 64-bit address arithmetic
  // and bounds tests had been a third of phase 3's instructions.
  const int q_row0 = T::kRowsQ * warp_mq + g;
  const int q_cols_valid = chunks_valid - d_chunk_q;
  const int q_row_stride = int(p.heads_q * p.head_dim);

  const int64_t n_blocks = (sk + T::kBlockN - 1) / T::kBlockN;
  // Deterministic mode: key tiles are launched (blockIdx order) so that each waits only for key
  // tiles started before it: descending in the `up` order, whose turns go from the last key tile
  // down, as on the Hopper path; else ascending. (Where all of a sequence's key tiles fit on the
  // GPU at once, ascending `up` launches, longest first, would be safe too: on the H200 descending
  // ran 1.00-1.13x their speed at d=64 and 256 and 0.98-1.00x at d=128,
  // bench/results/h200_portable_bwd_det_turns_2026-12-02.txt, call 2.) With more than one (KV
  // head, batch) pair, the grid's last pair walks `down` instead (as the Hopper d = 256 kernel
  // does, bwd_layout.h): the launch then ends with that pair's shortest key tiles rather than its
  // longest, and its key tiles wait only for its lower ones, launched before them. Deterministic
  // causal, against every pair `up` (H100, bench/ab_compare.py, 2k / 4k / 8k / 16k;
  // bench/results/h100_session41_2026-12-05.txt, call 1): d=64 1.01 / 1.01 / 1.02 / 1.03, d=128
  // 1.00 / 1.02 / 1.02 / 1.04, d=256 1.01 / 1.04 / 1.06 / 1.06.
  if (kDeterministic && turns == TurnOrder::up && gridDim.y * gridDim.z > 1 && blockIdx.y == gridDim.y - 1 &&
      blockIdx.z == gridDim.z - 1)
    turns = TurnOrder::down;
  const int64_t n = kDeterministic && turns == TurnOrder::up ? int64_t(gridDim.x) - 1 - blockIdx.x : n_grid;
  if (n >= n_blocks) return;
  const int64_t key0 = n * T::kBlockN;
  const int keys_valid = int(sk - key0 < T::kBlockN ? sk - key0 : T::kBlockN);
  const core::QueryTiles q_tiles = core::query_tiles_seeing(mask, key0, key0 + keys_valid, T::kBlockM);
  int64_t m_begin = q_tiles.m_begin;
  int m_count = int(q_tiles.m_end - m_begin);  // query tiles per head (one sequence's: 32 bits)
  // A piece of a cut tile walks an equal share of the query tiles (of every query head of the
  // group). As a narrower range of query tiles it costs the step loop nothing: a range of steps
  // kept live through it took ptxas past the registers at d=128 (68-88 bytes of spills).
  if (!kDeterministic && tail_piece >= 0) {
    const int part = tail_piece % ws.tail_parts, lo = part * m_count / ws.tail_parts;
    m_count = (part + 1) * m_count / ws.tail_parts - lo;
    m_begin += lo;
  }
  const int steps = m_count * group;  // (query head, query tile) pairs, tiles fastest
  // The steps on these query tiles need no element-wise mask.
  const core::QueryTiles unmasked = core::query_tiles_unmasked(mask, key0, T::kBlockN, T::kBlockM);
  const Walk<kDeterministic> walk(m_count, n, n_blocks, turns);
  // A step's (query head, walk position) relative to (hk * group, 0), advanced without the
  // divisions that would recover them from the step index (a 64-bit one per use cost the loop
  // about a tenth of its instructions).
  auto advance = [&](int& i, int& h) {
    if (++i == m_count) {
      i = 0;
      ++h;
    }
  };

  float acc_dk[T::kTilesKV][T::kColsKV / 8][4], acc_dv[T::kTilesKV][T::kColsKV / 8][4];
#pragma unroll
  for (int i = 0; i < T::kTilesKV; ++i)
#pragma unroll
    for (int j = 0; j < T::kColsKV / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[i][j][e] = acc_dv[i][j][e] = 0.f;

  const E* kg = static_cast<const E*>(p.k) + p.k_s.offset(b, k0 + key0, hk);
  const E* vg = static_cast<const E*>(p.v) + p.v_s.offset(b, k0 + key0, hk);
  block_load_tile<T, T::kBlockN>(sK, kg, p.k_s.row, keys_valid, chunks_valid);
  block_load_tile<T, T::kBlockN>(sV, vg, p.v_s.row, keys_valid, chunks_valid);

  auto load_step = [&](int step_h, int step_m, int stage) {
    const int h = hk * group + step_h;
    const int64_t m0 = (m_begin + step_m) * T::kBlockM;
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
  // Steps 0 .. kStages-2 ahead (K/V join the first group); each step then commits one group
  // (empty past the end) for step it + kStages - 1, so "kStages - 2 groups pending" at the top of
  // step `it` means "step `it` has landed". (load_i, load_h): the next step to load.
  int load_i = 0, load_h = 0;
#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) {
    if (s < steps) load_step(load_h, walk.tile(load_i), s);
    ptx::thread_cp_async_commit();
    advance(load_i, load_h);
  }
  // Deterministic mode: the dQ turn counters of this sequence's query tiles (of query head 0), and
  // the turn that thread 0 passes at the next barrier after its step's additions.
  int* const seq_turns = kDeterministic ? ws.dq_turn + tile_base(p, T::kBlockM, b) : nullptr;
  int* passing = nullptr;

  auto step_fn = [&](int it, int step_h, int step_m, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    const int stage = it % T::kStages;
    if constexpr (T::kStages == 1) {
      __syncthreads();  // the one stage is free once every warp is done with the previous step
      load_step(step_h, step_m, 0);
      ptx::thread_cp_async_commit();
      ptx::thread_cp_async_wait<0>();
    } else {
      ptx::thread_cp_async_wait<T::kStages - 2>();
    }
    // After this barrier every warp is past the previous step: its P^T, dS^T and Q/dO stage are
    // free, and that stage takes step it + kStages - 1. With two or more stages, two barriers per step.
    __syncthreads();
    if constexpr (T::kStages > 1) {
      const int next = it + T::kStages - 1;
      if (next < steps) load_step(load_h, walk.tile(load_i), next % T::kStages);
      ptx::thread_cp_async_commit();
      advance(load_i, load_h);
    }
    const int h = hk * group + step_h;
    const int64_t m0 = (m_begin + step_m) * T::kBlockM;
    E* sQs = sStage + 2 * stage * T::kTileQ;
    const E* sdOs = sQs + T::kTileQ;
    const float* lse2 = sLse + stage * T::kBlockM;
    const float* delta = sDelta + stage * T::kBlockM;
    float* dq_rows = ws.dq_accum + ((wrow0 + m0) * p.heads_q + h) * p.head_dim;

    // Phase 1: S^T = K Q^T and dP^T = V dO^T for this warp's kRowsS keys x kColsS queries; the
    // K and V fragments of a k-step serve all of the warp's query columns.
    float acc_s[T::kTilesS][T::kColsS / 8][4], acc_dp[T::kTilesS][T::kColsS / 8][4];
#pragma unroll
    for (int i = 0; i < T::kTilesS; ++i)
#pragma unroll
      for (int j = 0; j < T::kColsS / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[i][j][e] = acc_dp[i][j][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < T::kHeadDim / 16; ++ks) {
      uint32_t a_k[T::kTilesS][4], a_v[T::kTilesS][4];
#pragma unroll
      for (int i = 0; i < T::kTilesS; ++i) {
        ptx::warp_ldmatrix_x4(a_k[i], sK + kv_a.at(16 * i, 2 * ks));
        ptx::warp_ldmatrix_x4(a_v[i], sV + kv_a.at(16 * i, 2 * ks));
      }
#pragma unroll
      for (int jn = 0; jn < T::kColsS / 8; jn += 2) {
        uint32_t bq[4], bdo[4];
        ptx::warp_ldmatrix_x4(bq, sQs + qdo_b.at(8 * jn, 2 * ks));
        ptx::warp_ldmatrix_x4(bdo, sdOs + qdo_b.at(8 * jn, 2 * ks));
#pragma unroll
        for (int i = 0; i < T::kTilesS; ++i) {
          Mma::warp_m16n8k16(acc_s[i][jn], a_k[i], bq[0], bq[1]);
          Mma::warp_m16n8k16(acc_s[i][jn + 1], a_k[i], bq[2], bq[3]);
          Mma::warp_m16n8k16(acc_dp[i][jn], a_v[i], bdo[0], bdo[1]);
          Mma::warp_m16n8k16(acc_dp[i][jn + 1], a_v[i], bdo[2], bdo[3]);
        }
      }
    }

    // P^T and dS^T per element (key row r, query column q), stored to shared memory as 16 bits:
    // per lane, or where the tile table says (sm90 only) a 16 x 16 block (two n8 tiles) at a time
    // by stmatrix, one instruction where each lane made four 32-bit stores (the stores and the
    // exponentials share the MIO queue). Masked steps test each element against the mask's band
    // around the tile's corner in 32 bits (core::MaskBand: rows and keys past the sequences, and
    // the window).
    const core::MaskBand band = core::mask_band(mask, m0, key0);
    // The packed P^T and dS^T pairs of (m16 tile i, n8 tile j, row half rr), given the pair's
    // lse2 and D.
    auto p_ds_pair = [&](int i, int j, int rr, float2 l2, float2 dl, uint32_t& pr, uint32_t& dsr) {
      const int row = T::kRowsS * warp_ks + 16 * i + g + 8 * rr;
      const int col = T::kColsS * warp_qs + 8 * j + 2 * t;
      float pv[2], dsv[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float u = acc_s[i][j][2 * rr + e];
        if constexpr (kSoftcap) u = ptx::thread_tanh(u * tanh_scale);
        float pe = ptx::thread_exp2(fmaf(u, c, -(e ? l2.y : l2.x)));
        if constexpr (kMasked)
          if (!band.visible(col + e, row)) pe = 0.f;
        float ds = pe * (acc_dp[i][j][2 * rr + e] - (e ? dl.y : dl.x));
        if constexpr (kSoftcap) ds *= 1.f - u * u;
        pv[e] = pe;
        dsv[e] = ds;
      }
      pr = ptx::thread_pack2<E>(pv[0], pv[1]);
      dsr = ptx::thread_pack2<E>(dsv[0], dsv[1]);
    };
    auto lse_delta = [&](int j, float2& l2, float2& dl) {
      const int col = T::kColsS * warp_qs + 8 * j + 2 * t;
      l2 = *reinterpret_cast<const float2*>(lse2 + col);
      dl = *reinterpret_cast<const float2*>(delta + col);
    };
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (T::kStMatrixPs) {
#pragma unroll
      for (int j = 0; j < T::kColsS / 8; j += 2) {
        float2 l2[2], dl[2];
        lse_delta(j, l2[0], dl[0]);
        lse_delta(j + 1, l2[1], dl[1]);
#pragma unroll
        for (int i = 0; i < T::kTilesS; ++i) {
          // Register 2 jj + rr: rows g + 8 rr, columns 8 (j + jj) + 2t and + 1 (stmatrix's order).
          uint32_t pr[4], dsr[4];
#pragma unroll
          for (int jj = 0; jj < 2; ++jj)
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) p_ds_pair(i, j + jj, rr, l2[jj], dl[jj], pr[2 * jj + rr], dsr[2 * jj + rr]);
          const int chunk = T::kColsS / 8 * warp_qs + j;
          ptx::warp_stmatrix_x4(pr, sP + ps_st.at(16 * i, chunk));
          ptx::warp_stmatrix_x4(dsr, sdS + ps_st.at(16 * i, chunk));
        }
      }
    } else
#endif
    {
#pragma unroll
      for (int j = 0; j < T::kColsS / 8; ++j) {
        float2 l2, dl;
        lse_delta(j, l2, dl);
#pragma unroll
        for (int i = 0; i < T::kTilesS; ++i)
#pragma unroll
          for (int rr = 0; rr < 2; ++rr) {
            const int row = T::kRowsS * warp_ks + 16 * i + g + 8 * rr;
            const int col = T::kColsS * warp_qs + 8 * j + 2 * t;
            const int off = Swizzle<T::kChunksP>::offset(row, col / 8) + (col % 8);
            p_ds_pair(i, j, rr, l2, dl, *reinterpret_cast<uint32_t*>(sP + off),
                      *reinterpret_cast<uint32_t*>(sdS + off));
          }
      }
    }
    __syncthreads();
    // Every warp's additions of the previous step were issued before this step's first barrier.
    if constexpr (kDeterministic)
      if (threadIdx.x == 0 && passing != nullptr) ptx::thread_pass_turn(passing);

    // Phase 2: dV += P^T dO and dK += dS^T Q for this warp's kRowsKV keys x kColsKV columns.
#pragma unroll
    for (int kk = 0; kk < T::kBlockM / 16; ++kk) {
      uint32_t a_p[T::kTilesKV][4], a_ds[T::kTilesKV][4];
#pragma unroll
      for (int i = 0; i < T::kTilesKV; ++i) {
        ptx::warp_ldmatrix_x4(a_p[i], sP + p_a.at(16 * i, 2 * kk));
        ptx::warp_ldmatrix_x4(a_ds[i], sdS + p_a.at(16 * i, 2 * kk));
      }
#pragma unroll
      for (int jd = 0; jd < T::kColsKV / 8; jd += 2) {
        uint32_t bdo[4], bq[4];
        ptx::warp_ldmatrix_x4_trans(bdo, sdOs + trans_b.at(16 * kk, d_chunk_kv + jd));
        ptx::warp_ldmatrix_x4_trans(bq, sQs + trans_b.at(16 * kk, d_chunk_kv + jd));
#pragma unroll
        for (int i = 0; i < T::kTilesKV; ++i) {
          Mma::warp_m16n8k16(acc_dv[i][jd], a_p[i], bdo[0], bdo[1]);
          Mma::warp_m16n8k16(acc_dv[i][jd + 1], a_p[i], bdo[2], bdo[3]);
          Mma::warp_m16n8k16(acc_dk[i][jd], a_ds[i], bq[0], bq[1]);
          Mma::warp_m16n8k16(acc_dk[i][jd + 1], a_ds[i], bq[2], bq[3]);
        }
      }
    }

    // Phase 3: dQ += dS K for this warp's kRowsQ query rows x kColsQ columns, added to fp32
    // global memory with relaxed atomics from the accumulators. In deterministic mode each warp
    // adds once this key tile's turn has come.
    {
      // Deterministic mode: this step's turn counter, read once now, while the MMAs run.
      [[maybe_unused]] int* turn = nullptr;
      [[maybe_unused]] int turn_seen = 0;
      if constexpr (kDeterministic) {
        turn = seq_turns + int64_t(h) * ws.tiles_per_head + m_begin + step_m;
        if (lane == 0) turn_seen = ptx::thread_load_turn(turn);
      }
      float acc_dq[T::kTilesQ][T::kColsQ / 8][4];
      // The row layout's first address (builds without fragment_dq), taken before the MMAs as in
      // the kernels measured (taken after them, ptxas had allocated a d=256 kernel differently).
      [[maybe_unused]] float* dq_thread = dq_rows + int64_t(q_row0) * q_row_stride + 8 * d_chunk_q + 2 * t;
#pragma unroll
      for (int i = 0; i < T::kTilesQ; ++i)
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
          for (int j = 0; j < T::kColsQ / 8; ++j) acc_dq[i][j][2 * rr] = acc_dq[i][j][2 * rr + 1] = 0.f;
#pragma unroll
      for (int kk = 0; kk < T::kBlockN / 16; ++kk) {
        uint32_t a_ds[T::kTilesQ][4];
#pragma unroll
        for (int i = 0; i < T::kTilesQ; ++i)
          ptx::warp_ldmatrix_x4_trans(a_ds[i], sdS + ds_a_trans.at(16 * kk, 2 * (T::kTilesQ * warp_mq + i)));
#pragma unroll
        for (int jd = 0; jd < T::kColsQ / 8; jd += 2) {
          uint32_t bk[4];
          ptx::warp_ldmatrix_x4_trans(bk, sK + trans_b.at(16 * kk, d_chunk_q + jd));
#pragma unroll
          for (int i = 0; i < T::kTilesQ; ++i) {
            Mma::warp_m16n8k16(acc_dq[i][jd], a_ds[i], bk[0], bk[1]);
            Mma::warp_m16n8k16(acc_dq[i][jd + 1], a_ds[i], bk[2], bk[3]);
          }
        }
      }
      // Before the warp's additions (deterministic mode): wait for this key tile's turn.
      if constexpr (kDeterministic) {
        if (lane == 0)
          ptx::thread_wait_turn(turn, ordered_turn<T::kBlockM, T::kBlockN>(mask, n, m_begin + step_m, turns),
                                turn_seen);
        __syncwarp();
        passing = turn;
      }
      if constexpr (T::kFragmentDq) {
        // Every group of the tile, rows and columns past the problem's included: those hold zeros
        // (their Q rows and K columns were zero-filled) and land in the block's unread padding.
        if (q_cols_valid > 0) {
          float* dst = ws.dq_accum + FragmentDq<T>::block(p, ws.tiles_per_head, h, b, m_begin + step_m) +
                       warp * FragmentDq<T>::kWarpFloats;
#pragma unroll
          for (int i = 0; i < T::kTilesQ; ++i)
#pragma unroll
            for (int j = 0; j < T::kColsQ / 8; ++j) {
              const float* v = acc_dq[i][j];
              float* group = dst + 128 * (i * (T::kColsQ / 8) + j);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
              ptx::thread_red_add_f32x4(group + 4 * lane, make_float4(v[0], v[1], v[2], v[3]));
#else
              // Scalar reductions only: the float4 interleaved (FragmentDq), as the convert kernel reads it.
#pragma unroll
              for (int e = 0; e < 4; ++e) ptx::thread_red_add_f32(group + 32 * e + lane, v[e]);
#endif
            }
        }
      } else {
        // Rows past the tile only occur in masked steps (unmasked ones have full tiles).
        const int rows = int(sq - m0 < T::kBlockM ? sq - m0 : T::kBlockM);
        auto row_ok = [&](int i, int rr) { return !kMasked || q_row0 + 16 * i + 8 * rr < rows; };
        if constexpr (T::kHeadDim >= 128) {
          // Unmasked steps at the kernel's own head dim add every element unguarded: ptxas wraps each
          // guarded reduction in a branch region (BSSY, BRA, BSYNC; 60 instructions per step at
          // d=128, 100 at d=256). On the H200 the default mode ran 1.01-1.03x faster at d=128 and
          // 256 (deterministic d=256 1.01-1.04x, d=128 0.97x), but 0.99x at d=64, which keeps the
          // plain loop below (bench/results/h200_portable_bwd_det_turns_2026-12-02.txt, call 8).
          auto add_dq = [&](auto guarded) {
#pragma unroll
            for (int i = 0; i < T::kTilesQ; ++i)
#pragma unroll
              for (int rr = 0; rr < 2; ++rr) {
                const bool ok = row_ok(i, rr);
                float* dst_row = dq_thread + (16 * i + 8 * rr) * q_row_stride;
#pragma unroll
                for (int j = 0; j < T::kColsQ / 8; ++j)
                  if (!decltype(guarded)::value || (ok && j < q_cols_valid))
                    ptx::thread_red_add_f32x2(dst_row + 8 * j, acc_dq[i][j][2 * rr], acc_dq[i][j][2 * rr + 1]);
              }
          };
          if (!kMasked && q_cols_valid >= T::kColsQ / 8)
            add_dq(std::false_type{});
          else
            add_dq(std::true_type{});
        } else {
#pragma unroll
          for (int i = 0; i < T::kTilesQ; ++i)
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
              if (!row_ok(i, rr)) continue;
              float* dst_row = dq_thread + (16 * i + 8 * rr) * q_row_stride;
#pragma unroll
              for (int j = 0; j < T::kColsQ / 8; ++j) {
                if (j >= q_cols_valid) continue;
                ptx::thread_red_add_f32x2(dst_row + 8 * j, acc_dq[i][j][2 * rr], acc_dq[i][j][2 * rr + 1]);
              }
            }
        }
      }
    }
  };

  for (int it = 0, step_i = 0, step_h = 0; it < steps; ++it) {
    const int step_m = walk.tile(step_i);
    const int64_t m = m_begin + step_m;
    if (m < unmasked.m_begin || m >= unmasked.m_end)
      step_fn(it, step_h, step_m, std::true_type{});
    else
      step_fn(it, step_h, step_m, std::false_type{});
    advance(step_i, step_h);
  }
  // Drain the (empty) trailing groups, and let every warp finish the last step before dK and dV
  // leave (and the last step's additions are in before its turn passes).
  ptx::thread_cp_async_wait<0>();
  __syncthreads();
  if constexpr (kDeterministic)
    if (threadIdx.x == 0 && passing != nullptr) ptx::thread_pass_turn(passing);

  // dK, dV of this key tile, written once (all query heads of the group are in); a piece of a cut
  // tile (default mode) writes its fp32 dK and dV to its slot instead, [kBlockN][kHeadDim] each,
  // and backward_tail_merge_kernel adds the tile's pieces up once this kernel is done. (Stored in
  // a block of their own after the loop, the slot's stores took registers from the step loop:
  // ptxas spilled 16-32 bytes more at d=128 and 256. The piece is found again from blockIdx, not
  // from tail_piece, which would then stay live through the loop.)
  float* part = nullptr;
  if constexpr (!kDeterministic)
    if (ws.tail_parts > 0 && int(blockIdx.x) >= ws.tail_dp_tiles)
      part = ws.tail_partial + int64_t(int(blockIdx.x) - ws.tail_dp_tiles) * 2 * T::kBlockN * T::kHeadDim;
#pragma unroll
  for (int i = 0; i < T::kTilesKV; ++i)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int row = T::kRowsKV * warp_kkv + 16 * i + g + 8 * rr;
      if (row >= keys_valid) continue;
      E* dk = static_cast<E*>(p.dk) + p.dk_s.offset(b, k0 + key0 + row, hk);
      E* dv = static_cast<E*>(p.dv) + p.dv_s.offset(b, k0 + key0 + row, hk);
#pragma unroll
      for (int j = 0; j < T::kColsKV / 8; ++j) {
        const int col = 8 * (d_chunk_kv + j) + 2 * t;
        if (col >= p.head_dim) continue;
        if (part != nullptr) {
          float* at = part + row * T::kHeadDim + col;
          *reinterpret_cast<float2*>(at) = make_float2(acc_dk[i][j][2 * rr], acc_dk[i][j][2 * rr + 1]);
          *reinterpret_cast<float2*>(at + T::kBlockN * T::kHeadDim) =
              make_float2(acc_dv[i][j][2 * rr], acc_dv[i][j][2 * rr + 1]);
          continue;
        }
        *reinterpret_cast<uint32_t*>(dk + col) =
            ptx::thread_pack2<E>(acc_dk[i][j][2 * rr] * p.scale, acc_dk[i][j][2 * rr + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(dv + col) =
            ptx::thread_pack2<E>(acc_dv[i][j][2 * rr], acc_dv[i][j][2 * rr + 1]);
      }
    }
}

// The cut tail's merge (backward_kernel's default mode): adds each cut key tile's pieces' fp32 dK
// and dV up in piece order (so repeated runs give the same bits) and writes the tile. Grid: (cut
// tiles, chunks of kMergeThreads float4s of a tile), a float4 of dK and of dV per thread, so that
// the merge's reads spread over the GPU (one CTA per tile read a d=64 tile's 16 pieces, 1 MB, with
// 128 threads).
constexpr int kMergeThreads = 256;
template <class T>
constexpr int tail_merge_chunks() {
  return (T::kBlockN * T::kHeadDim / 4 + kMergeThreads - 1) / kMergeThreads;
}

template <class T>
__global__ void __launch_bounds__(kMergeThreads)
    backward_tail_merge_kernel(const __grid_constant__ core::BackwardParams p, BwdWorkspace ws, TileScheduler order) {
  using E = typename T::Element;
  constexpr int kTile = T::kBlockN * T::kHeadDim;
  const int e = 4 * (int(blockIdx.y) * kMergeThreads + int(threadIdx.x));
  int n, hk, b;
  order.tile(ws.tail_dp_tiles + int(blockIdx.x), &n, &hk, &b);  // the grid's own order, as the kernel's
  const int64_t key0 = int64_t(n) * T::kBlockN;
  const int row = e / T::kHeadDim, col = e % T::kHeadDim;
  if (e >= kTile || key0 + row >= p.seqlen_k || col >= p.head_dim) return;
  const float* slot = ws.tail_partial + int64_t(blockIdx.x) * ws.tail_parts * 2 * kTile + e;
  float4 k = make_float4(0.f, 0.f, 0.f, 0.f), v = k;
  for (int part = 0; part < ws.tail_parts; ++part, slot += 2 * kTile) {
    const float4 pk = *reinterpret_cast<const float4*>(slot), pv = *reinterpret_cast<const float4*>(slot + kTile);
    k.x += pk.x, k.y += pk.y, k.z += pk.z, k.w += pk.w;
    v.x += pv.x, v.y += pv.y, v.z += pv.z, v.w += pv.w;
  }
  // head_dim is a multiple of 8, so the four columns are all in or all out; 32-bit stores, as
  // the user's dK and dV rows are only 4-byte aligned.
  E* dk = static_cast<E*>(p.dk) + p.dk_s.offset(b, key0 + row, hk) + col;
  E* dv = static_cast<E*>(p.dv) + p.dv_s.offset(b, key0 + row, hk) + col;
  reinterpret_cast<uint32_t*>(dk)[0] = ptx::thread_pack2<E>(k.x * p.scale, k.y * p.scale);
  reinterpret_cast<uint32_t*>(dk)[1] = ptx::thread_pack2<E>(k.z * p.scale, k.w * p.scale);
  reinterpret_cast<uint32_t*>(dv)[0] = ptx::thread_pack2<E>(v.x, v.y);
  reinterpret_cast<uint32_t*>(dv)[1] = ptx::thread_pack2<E>(v.z, v.w);
}

}  // namespace flashattn::cuda::sm80

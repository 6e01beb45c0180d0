// What the two backward paths (portable sm80/, Hopper sm90/) share: the fp32 workspace of one call
// and the preprocess kernel that fills its per-row part.
//
// Row layouts of lse2 and delta (and, per path, of the dQ accumulator):
//   * dense (tile_m == 0, the portable path): [heads_q][total_q], rows of a sequence from
//     workspace_row0(b);
//   * tiled (tile_m > 0, the Hopper path): [heads_q][tiles_per_head][tile_m], one aligned block
//     per query tile (src/cuda/bwd_layout.h). Rows of a tile past its sequence are never written;
//     kernels mask them (never multiply by them).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/block_range.h"
#include "core/params.h"
#include "core/softmax_state.h"
#include "cuda/bwd_layout.h"
#include "cuda/common.cuh"

namespace flashattn::cuda {

// Workspace of one backward call (fp32, allocated by the launcher).
struct BwdWorkspace {
  float* lse2 = nullptr;      // lse * log2(e), +inf for rows that saw nothing
  float* delta = nullptr;     // D = rowsum(dO o O)
  float* dq_accum = nullptr;  // in the path's own layout
  // Deterministic mode: per dQ tile (and column half, Hopper d = 256), how many key tiles have
  // added their part; key tiles add in order, each waiting for its turn. Indexed [heads_q][tiles
  // per head] by the tiled layout's tile numbers (bwd_layout.h), on both paths.
  int* dq_turn = nullptr;
  // Portable path, default mode, the cut tail (sm80/bwd_launch.cuh; tail_parts = 0: off): CTAs
  // from tail_dp_tiles on each take one of tail_parts pieces of a key tile of the last, partial
  // wave, and leave its fp32 dK and dV in tail_partial for the merge kernel.
  int tail_dp_tiles = 0, tail_parts = 0;
  float* tail_partial = nullptr;
  int tile_m = 0;             // 0: dense rows; else tiled (see above)
  int64_t tiles_per_head = 0;  // query tiles per head in the tiled layout (and of dq_turn)
};

// Key tiles and query tiles of the mask's sequences (a CTA's key tiles; the `around` order's cycle).
template <int BN>
__device__ __forceinline__ int64_t key_tile_count(const core::MaskSpec& mask) { return (mask.seqlen_k + BN - 1) / BN; }
template <int BM>
__device__ __forceinline__ int64_t query_tile_count(const core::MaskSpec& mask) { return (mask.seqlen_q + BM - 1) / BM; }

// Ordered mode: key tile n's turn at query tile m (how many of the key tiles visiting m add before
// it), in the order `turns` (bwd_layout.h; the walks that go with it: sm90/bwd_schedule.cuh's
// KeySteps, sm80/bwd_kernel.cuh's Walk).
template <int BM, int BN>
__device__ __forceinline__ int ordered_turn(const core::MaskSpec& mask, int64_t n, int64_t m, TurnOrder turns) {
  if (turns == TurnOrder::up) return int(core::last_key_tile_seeing(mask, m, BM, BN) - n);
  if (turns == TurnOrder::around)
    return core::around_turn(int(n), int(m), int(key_tile_count<BN>(mask)), int(query_tile_count<BM>(mask)));
  return int(n - core::first_key_tile_seeing(mask, m, BM, BN));
}

// First query row of sequence b in the (packed, for varlen) tensors and its length.
__device__ __forceinline__ void query_rows(const core::AttnShape& p, int64_t b, int64_t* q0, int64_t* sq) {
  *q0 = 0;
  *sq = p.seqlen_q;
  if (p.cu_seqlens_q != nullptr) {
    *q0 = p.cu_seqlens_q[b];
    *sq = p.cu_seqlens_q[b + 1] - *q0;
  }
}

// Rows [q0, q0 + seqlen) of sequence b in the dense workspace arrays.
__host__ __device__ inline int64_t workspace_row0(const core::AttnShape& p, int64_t b) {
  return p.cu_seqlens_q != nullptr ? int64_t(p.cu_seqlens_q[b]) : b * p.seqlen_q;
}

// The call's workspace memory: stream-ordered (no host synchronization), freed on the stream
// when the launcher returns, after the kernels queued before it.
class WorkspaceMemory {
 public:
  WorkspaceMemory(size_t bytes, cudaStream_t stream) : stream_(stream) {
    check(cudaMallocAsync(&ptr_, bytes, stream), "cudaMallocAsync (backward workspace)");
  }
  ~WorkspaceMemory() { cudaFreeAsync(ptr_, stream_); }
  WorkspaceMemory(const WorkspaceMemory&) = delete;
  WorkspaceMemory& operator=(const WorkspaceMemory&) = delete;
  float* floats() const { return static_cast<float*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

// Index of (query head h, row `row` of sequence b) in lse2 / delta.
__device__ __forceinline__ int64_t workspace_row(const core::AttnShape& p, const BwdWorkspace& ws, int h, int64_t b,
                                                 int64_t row) {
  if (ws.tile_m == 0) return int64_t(h) * p.total_q + workspace_row0(p, b) + row;
  return (int64_t(h) * ws.tiles_per_head + tile_base(p, ws.tile_m, b)) * ws.tile_m + row;
}

// Per query row: D = rowsum(dO o O) and lse2 (src/core/softmax_state.h). 8 threads per row
// (16-byte vectors), 16 rows per 128-thread block. The same grid zeroes the dQ accumulator
// (`zero_bytes` from ws.dq_accum, grid-strided 16-byte stores): one pass over memory instead of a
// memset before this kernel (their sum measured 76-82 us at 16k tokens x 2048 on the H200).
template <class E>
__global__ void __launch_bounds__(128) backward_preprocess_kernel(const __grid_constant__ core::BackwardParams p,
                                                                  BwdWorkspace ws, size_t zero_bytes) {
  const int h = blockIdx.y, b = blockIdx.z;
  {
    const size_t block = (size_t(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    const size_t threads = size_t(gridDim.x) * gridDim.y * gridDim.z * 128;
    float4* acc = reinterpret_cast<float4*>(ws.dq_accum);
    for (size_t i = block * 128 + threadIdx.x; i < zero_bytes / 16; i += threads)
      acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (block == 0 && threadIdx.x < (zero_bytes % 16) / 4) ws.dq_accum[zero_bytes / 16 * 4 + threadIdx.x] = 0.f;
  }
  int64_t q0, sq;
  query_rows(p, b, &q0, &sq);
  const int64_t row = int64_t(blockIdx.x) * 16 + threadIdx.x / 8;
  const int part = threadIdx.x % 8;
  float d = 0.f;
  if (row < sq) {
    const E* o = static_cast<const E*>(p.out) + p.o_s.offset(b, q0 + row, h);
    const E* dout = static_cast<const E*>(p.dout) + p.do_s.offset(b, q0 + row, h);
    for (int x = part * 8; x < p.head_dim; x += 64) {
      uint4 ov = *reinterpret_cast<const uint4*>(o + x), gv = *reinterpret_cast<const uint4*>(dout + x);
      const E* oe = reinterpret_cast<const E*>(&ov);
      const E* ge = reinterpret_cast<const E*>(&gv);
#pragma unroll
      for (int i = 0; i < 8; ++i) d += float(oe[i]) * float(ge[i]);
    }
  }
  d += __shfl_xor_sync(0xffffffffu, d, 1);
  d += __shfl_xor_sync(0xffffffffu, d, 2);
  d += __shfl_xor_sync(0xffffffffu, d, 4);
  if (row < sq && part == 0) {
    const int64_t w = workspace_row(p, ws, h, b, row);
    const float lse = static_cast<const float*>(p.lse)[p.lse_s.offset(b, q0 + row, h)];
    ws.lse2[w] = core::backward_exponent_base(lse);
    ws.delta[w] = d;
  }
}

// Floats before the dQ accumulator in the workspace: lse2 and delta, rounded up to 16 bytes.
inline int64_t accum_offset(int64_t rows) { return (2 * rows + 3) / 4 * 4; }

// Bytes of a workspace for `rows` lse2 / delta entries and a dQ accumulator of accum_bytes.
inline size_t workspace_bytes(int64_t rows, size_t accum_bytes) { return size_t(accum_offset(rows)) * 4 + accum_bytes; }

// Lays out ws in `memory` (lse2 and delta of `rows` entries each, then the dQ accumulator of
// accum_bytes, 16-byte aligned) and queues the preprocess kernel, which also zeroes the
// accumulator.
template <class E>
void start_backward(const core::BackwardParams& p, BwdWorkspace& ws, const WorkspaceMemory& memory, int64_t rows,
                    size_t accum_bytes, cudaStream_t stream) {
  ws.lse2 = memory.floats();
  ws.delta = ws.lse2 + rows;
  ws.dq_accum = ws.lse2 + accum_offset(rows);
  backward_preprocess_kernel<E><<<dim3(unsigned((p.seqlen_q + 15) / 16), unsigned(p.heads_q), unsigned(p.batch)), 128,
                                  0, stream>>>(p, ws, accum_bytes);
  check_launch("flashattn backward preprocess kernel");
}

}  // namespace flashattn::cuda

// The split combine of the decode kernel (decode_kernel.cuh): the last CTA of a (sequence, KV
// head, row tile) to finish merges every split's partial (o, lse) into the output rows, under the
// merge_states rules (merge_row.cuh), in the same launch.
#pragma once

#include <cstdint>

#include "core/softmax_state.h"
#include "cuda/decode/decode.h"
#include "cuda/merge/merge_row.cuh"
#include "cuda/ptx/sm80.cuh"

namespace flashattn::cuda::decode {

// Splits whose partials one thread of the combine loads at once (merge_row.cuh): 16 parts x 4
// floats take 64 registers, which the main loop's O and Q fragments have freed by then.
constexpr int kCombineBatch = 16;

// All threads of the CTA, once the partials of every split of this CTA's rows are visible. The
// partial o are [split, batch, token, head, d] (row part_row(s, id), split stride part_stride
// rows), the partial lse [split, batch, heads_kv, row tile, kBlockM] (this CTA's block at
// lse_base, split stride lse_step). row_id(row) names the token and query head of the CTA's row
// `row`; store_out(id, col, o[4], lse) writes 4 normalized columns of an output row and its lse.
// The shared memory (the ring and the cross-warp reduction are done) stages the partials.
template <class T, class RowIdOf, class PartRow, class StoreOut>
__device__ __forceinline__ void block_combine_splits(const DecodeLaunch& L, unsigned char* smem, int rows_valid,
                                                     int64_t part_stride, int64_t lse_step, int64_t lse_base,
                                                     const RowIdOf& row_id, const PartRow& part_row,
                                                     const StoreOut& store_out) {
  const core::DecodeParams& p = L.p;
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int quads = int(p.head_dim / 4);
  const int64_t o_stride = part_stride * p.head_dim;
  // Staged: every split's lse block and o rows land in shared memory (free again: the ring and the
  // reduction are done) through cp.async from short loops, in two groups. Once the lse group has
  // landed, one warp per row turns the row's lse into the splits' weights (warp_merge_weights, the
  // merge_states rules) while the o rows are still in flight; then each (row, 4 columns) item sums
  // its weighted partials: independent loads and FMAs, where a merge of one row per thread was a
  // chain of dependent steps per split (H200, b=1 kv=8k: 3.7 us at 16 splits, 6.5 us at 32, the
  // tail of the step). Up to 32 splits fit at d = 128 with 4 rows (GQA 4, one token); beyond what
  // fits, the loads go straight to registers (merge_row.cuh), in batches.
  const int64_t staged_floats = int64_t(L.splits) * (rows_valid * (p.head_dim + 1) + T::kBlockM) + 2 * T::kBlockM;
  if (staged_floats <= T::kStageBytes / 4) {
    const int o_part = rows_valid * int(p.head_dim);
    float* s_lse = reinterpret_cast<float*>(smem);  // [split][kBlockM]
    float* s_o = s_lse + L.splits * T::kBlockM;     // [split][rows_valid][head_dim]
    float* s_w = s_o + L.splits * o_part;           // [rows_valid][split]: the weights
    float* s_fin = s_w + L.splits * rows_valid;     // [row]: out_scale, lse
    constexpr int kLseChunks = T::kBlockM / 4;
#pragma unroll 1
    for (int i = tid; i < L.splits * kLseChunks; i += T::kThreads) {
      const int sp = i / kLseChunks, c = 4 * (i % kLseChunks);
      ptx::thread_cp_async_16(s_lse + sp * T::kBlockM + c, L.part_lse + sp * lse_step + lse_base + c, true);
    }
    ptx::thread_cp_async_commit();
    for (int i = tid; i < rows_valid * quads; i += T::kThreads) {
      const int row = i / quads, col = 4 * (i % quads);
      const float* src = L.part_o + part_row(0, row_id(row)) * p.head_dim + col;
      float* dst = s_o + row * int(p.head_dim) + col;
#pragma unroll 4
      for (int sp = 0; sp < L.splits; ++sp) ptx::thread_cp_async_16(dst + sp * o_part, src + sp * o_stride, true);
    }
    ptx::thread_cp_async_commit();
    // The weights need only the lse group: they are worked out while the partial o still land.
    ptx::thread_cp_async_wait<1>();
    __syncthreads();
    for (int row = warp; row < rows_valid; row += T::kWarps) {
      float* w_row = s_w + row * L.splits;
      const core::MergeState<float> ms = warp_merge_weights(
          L.splits, [&](int sp) { return s_lse[sp * T::kBlockM + row]; }, [&](int sp, float w) { w_row[sp] = w; });
      if (lane == 0) {
        s_fin[2 * row] = ms.out_scale();
        s_fin[2 * row + 1] = ms.lse();
      }
    }
    ptx::thread_cp_async_wait<0>();
    __syncthreads();
    for (int i = tid; i < rows_valid * quads; i += T::kThreads) {
      const int row = i / quads, col = 4 * (i % quads);
      const float* w_row = s_w + row * L.splits;
      const float* o_col = s_o + row * int(p.head_dim) + col;
      float o[4] = {0.f, 0.f, 0.f, 0.f};
      // Every load is made (the staged values exist); a part of weight 0 adds exactly 0, even
      // where its o holds NaN.
#pragma unroll 4
      for (int sp = 0; sp < L.splits; ++sp) {
        const float w = w_row[sp];
        const float4 x = *reinterpret_cast<const float4*>(o_col + sp * o_part);
        o[0] += w != 0.f ? w * x.x : 0.f;
        o[1] += w != 0.f ? w * x.y : 0.f;
        o[2] += w != 0.f ? w * x.z : 0.f;
        o[3] += w != 0.f ? w * x.w : 0.f;
      }
      const float scale = s_fin[2 * row];
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] *= scale;
      store_out(row_id(row), col, o, s_fin[2 * row + 1]);
    }
    return;
  }
  for (int i = tid; i < rows_valid * quads; i += T::kThreads) {
    const int row = i / quads, col = 4 * (i % quads);
    const auto id = row_id(row);
    // Loads through L2 (.cg): the partials were written by other SMs during this launch. The
    // addresses step by a constant per split (no index arithmetic between the loads).
    const float* lse_row = L.part_lse + lse_base + row;
    const float* o_row = L.part_o + part_row(0, id) * p.head_dim + col;
    const auto lse_of = [&](int64_t sp) { return __ldcg(lse_row + sp * lse_step); };
    const auto load_o = [&](int64_t sp, float (&v)[4]) {
      const float4 x = __ldcg(reinterpret_cast<const float4*>(o_row + sp * o_stride));
      v[0] = x.x;
      v[1] = x.y;
      v[2] = x.z;
      v[3] = x.w;
    };
    float o[4];
    const float lse = merge_row<4, kCombineBatch>(L.splits, lse_of, load_o, o);
    store_out(id, col, o, lse);
  }
}

}  // namespace flashattn::cuda::decode

// The merge of one output row's partial states, shared by the merge_states kernel (merge.cu) and
// the decode kernel's in-kernel combine (decode_combine.cuh), so both follow the same rules:
//   * weights from core::MergeState, two passes over the parts' lse (max first: nothing overflows);
//   * a part of weight 0 is skipped: an empty part's o may hold anything, NaN included;
//   * a NaN weight is kept and makes the row NaN: a part with lse = +inf (how the decode kernel
//     poisons a row it could not compute) or NaN.
// The parts are usually in L2 and one part's load does not depend on another's, so each pass
// issues the loads of kBatch parts before using any of them: a row costs ceil(parts / kBatch)
// round trips to memory per pass instead of one per part, and with at most kBatch parts one round
// trip in all (the decode combine's usual case: it is the tail of every split-KV step).
#pragma once

#include <cstdint>

#include "core/softmax_state.h"

namespace flashattn::cuda {

// Loads parts i0 .. i0 + kBatch - 1 (those below `parts`; the rest get lse = -inf, o = 0), every
// load issued before any is used.
template <int kCols, int kBatch, class LseOf, class LoadO>
__device__ __forceinline__ void merge_load_batch(int64_t parts, int64_t i0, const LseOf& lse_of, const LoadO& load_o,
                                                 float (&lse)[kBatch], float (&o)[kBatch][kCols]) {
#pragma unroll
  for (int j = 0; j < kBatch; ++j) {
    lse[j] = core::neg_inf<float>();
#pragma unroll
    for (int v = 0; v < kCols; ++v) o[j][v] = 0.f;
    if (i0 + j < parts) {
      lse[j] = lse_of(i0 + j);
      load_o(i0 + j, o[j]);
    }
  }
}

// acc += each loaded part's weight times its o (after every part's lse went through ms.see).
template <int kCols, int kBatch>
__device__ __forceinline__ void merge_add_batch(int64_t parts, int64_t i0, core::MergeState<float>& ms,
                                                const float (&lse)[kBatch], const float (&o)[kBatch][kCols],
                                                float (&acc)[kCols]) {
#pragma unroll
  for (int j = 0; j < kBatch; ++j) {
    if (i0 + j >= parts) continue;
    const float w = ms.add_weight(lse[j]);
    if (w == 0.f) continue;
#pragma unroll
    for (int v = 0; v < kCols; ++v) acc[v] += w * o[j][v];
  }
}

// lse_of(i): part i's lse. load_o(i, v): part i's kCols values of this thread into v. On return
// acc holds the merged values (already scaled); the result is the merged lse. Up to kBatch parts
// take one round trip (lse and o loaded together); more take two passes.
template <int kCols, int kBatch, class LseOf, class LoadO>
__device__ __forceinline__ float merge_row(int64_t parts, const LseOf& lse_of, const LoadO& load_o, float (&acc)[kCols]) {
  core::MergeState<float> ms;
#pragma unroll
  for (int v = 0; v < kCols; ++v) acc[v] = 0.f;
  if (parts <= kBatch) {
    float lse[kBatch], o[kBatch][kCols];
    merge_load_batch<kCols, kBatch>(parts, 0, lse_of, load_o, lse, o);
#pragma unroll
    for (int j = 0; j < kBatch; ++j) ms.see(lse[j]);
    merge_add_batch<kCols, kBatch>(parts, 0, ms, lse, o, acc);
  } else {
    for (int64_t i0 = 0; i0 < parts; i0 += kBatch) {
      float lse[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) lse[j] = i0 + j < parts ? lse_of(i0 + j) : core::neg_inf<float>();
#pragma unroll
      for (int j = 0; j < kBatch; ++j) ms.see(lse[j]);
    }
    for (int64_t i0 = 0; i0 < parts; i0 += kBatch) {
      float lse[kBatch], o[kBatch][kCols];
      merge_load_batch<kCols, kBatch>(parts, i0, lse_of, load_o, lse, o);
      merge_add_batch<kCols, kBatch>(parts, i0, ms, lse, o, acc);
    }
  }
  const float scale = ms.out_scale();
#pragma unroll
  for (int v = 0; v < kCols; ++v) acc[v] *= scale;
  return ms.lse();
}

// The weights of one row's parts, computed by a warp (lane l takes parts l, l + 32, ...) under
// the same MergeState rules as merge_row, its max and sum reduced across the lanes. For parts
// already in shared memory, where a one-thread-per-row merge would be a chain of `parts`
// dependent steps (the decode combine: the tail of every split-KV step). store_w(i, w) receives
// part i's unnormalized weight: 0 means skip the part, NaN makes the row NaN. Returns the state
// whose out_scale() and lse() finish the row, bitwise the same in every lane (xor butterflies).
template <class LseOf, class StoreW>
__device__ __forceinline__ core::MergeState<float> warp_merge_weights(int parts, const LseOf& lse_of,
                                                                      const StoreW& store_w) {
  const int lane = int(threadIdx.x & 31);
  core::MergeState<float> ms;
  for (int i = lane; i < parts; i += 32) ms.see(lse_of(i));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) ms.see(__shfl_xor_sync(0xffffffffu, ms.max_lse, off));
  for (int i = lane; i < parts; i += 32) store_w(i, ms.add_weight(lse_of(i)));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) ms.sum += __shfl_xor_sync(0xffffffffu, ms.sum, off);
  return ms;
}

}  // namespace flashattn::cuda

// The merge of one output row's partial states, shared by the merge_states kernel (merge.cu) and
// the decode kernel's in-kernel combine (decode_kernel.cuh), so both follow the same rules:
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

// The same merge one part at a time (the same weights, in the same order), for parts already in
// shared memory, where there is no load latency to hide: the smallest code, which is what counts
// where the merge runs once per launch from a cold instruction cache (the decode combine).
template <int kCols, class LseOf, class LoadO>
__device__ __forceinline__ float merge_row_serial(int parts, const LseOf& lse_of, const LoadO& load_o,
                                                  float (&acc)[kCols]) {
  core::MergeState<float> ms;
#pragma unroll
  for (int v = 0; v < kCols; ++v) acc[v] = 0.f;
#pragma unroll 1
  for (int i = 0; i < parts; ++i) ms.see(lse_of(i));
#pragma unroll 1
  for (int i = 0; i < parts; ++i) {
    const float w = ms.add_weight(lse_of(i));
    if (w == 0.f) continue;
    float o[kCols];
    load_o(i, o);
#pragma unroll
    for (int v = 0; v < kCols; ++v) acc[v] += w * o[v];
  }
  const float scale = ms.out_scale();
#pragma unroll
  for (int v = 0; v < kCols; ++v) acc[v] *= scale;
  return ms.lse();
}

}  // namespace flashattn::cuda

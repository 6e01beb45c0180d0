// The merge of partial attention states on the GPU, for merge_states. Its per-row rules live in
// merge_row.cuh, which the decode kernel's in-kernel combine of its split-KV partials uses too.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashattn/flashattn.hpp"

namespace flashattn::cuda {

// Rows are (outer, inner, head); merge_states has outer = tokens, inner = 1.
struct MergeLaunch {
  int64_t parts = 0, outer = 0, inner = 0, heads = 0, head_dim = 0;
  DType in_dtype = DType::f32;   // o_parts: f16, bf16 or f32
  DType out_dtype = DType::f32;  // out: f16, bf16 or f32
  const void* o_parts = nullptr;
  int64_t op_part = 0, op_outer = 0, op_inner = 0, op_head = 0;
  const float* lse_parts = nullptr;
  int64_t lp_part = 0, lp_outer = 0, lp_inner = 0, lp_head = 0;
  void* out = nullptr;
  int64_t o_outer = 0, o_inner = 0, o_head = 0;
  float* lse = nullptr;  // optional
  int64_t l_outer = 0, l_inner = 0, l_head = 0;
};

// Queues the merge on `stream`; throws Error(cuda_error) if the launch fails.
void launch_merge(const MergeLaunch& m, cudaStream_t stream);

}  // namespace flashattn::cuda

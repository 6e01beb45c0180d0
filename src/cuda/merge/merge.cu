// The GPU merge of partial states: one warp per output row, the row merge of merge_row.cuh (the
// same rules as the CPU merge, every kernel's epilogue and the decode kernel's combine), fp32
// accumulation. Lanes take consecutive columns, so each part's row is read with coalesced loads
// whatever the head dim; the lse values are the same address for every lane (one broadcast load).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "cuda/common.cuh"
#include "cuda/merge/merge.h"
#include "cuda/merge/merge_row.cuh"

namespace flashattn::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kColsPerLane = 4;  // per pass: a warp covers 128 columns, every head dim <= 128 in one
constexpr int kPartsPerBatch = 8;  // parts whose loads are in flight together (merge_row.cuh)

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <class TIn, class TOut>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) merge_kernel(const __grid_constant__ MergeLaunch m) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= m.outer * m.inner * m.heads) return;
  const int64_t h = row % m.heads, inner = (row / m.heads) % m.inner, outer = row / (m.heads * m.inner);
  const float* lse = m.lse_parts + outer * m.lp_outer + inner * m.lp_inner + h * m.lp_head;
  const TIn* o = static_cast<const TIn*>(m.o_parts) + outer * m.op_outer + inner * m.op_inner + h * m.op_head;
  TOut* out = static_cast<TOut*>(m.out) + outer * m.o_outer + inner * m.o_inner + h * m.o_head;

  // One pass per 128 columns; a row with head_dim 0 still makes one (for its lse).
  for (int64_t x0 = 0; x0 == 0 || x0 < m.head_dim; x0 += 32 * kColsPerLane) {
    const auto lse_of = [&](int64_t i) { return lse[i * m.lp_part]; };
    const auto load_o = [&](int64_t i, float (&v)[kColsPerLane]) {
      const TIn* oi = o + i * m.op_part;
#pragma unroll
      for (int c = 0; c < kColsPerLane; ++c) {
        const int64_t x = x0 + lane + 32 * c;
        if (x < m.head_dim) v[c] = to_float(oi[x]);
      }
    };
    float acc[kColsPerLane];
    const float merged_lse = merge_row<kColsPerLane, kPartsPerBatch>(m.parts, lse_of, load_o, acc);
#pragma unroll
    for (int c = 0; c < kColsPerLane; ++c) {
      const int64_t x = x0 + lane + 32 * c;
      if (x < m.head_dim) out[x] = from_float<TOut>(acc[c]);
    }
    if (x0 == 0 && lane == 0 && m.lse != nullptr) m.lse[outer * m.l_outer + inner * m.l_inner + h * m.l_head] = merged_lse;
  }
}

template <class TIn, class TOut>
void launch(const MergeLaunch& m, cudaStream_t stream) {
  const int64_t rows = m.outer * m.inner * m.heads;
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks == 0) return;  // no rows (zero tokens): nothing to write, and a grid of zero blocks is a launch error
  if (blocks > int64_t(0x7fffffff))
    throw Error(Status::unsupported, "merge_states: " + std::to_string(rows) + " rows exceed one GPU launch");
  merge_kernel<TIn, TOut><<<unsigned(blocks), 32 * kWarpsPerBlock, 0, stream>>>(m);
  check_launch("flashattn merge kernel");
}

}  // namespace

void launch_merge(const MergeLaunch& m, cudaStream_t stream) {
  if (m.outer * m.inner * m.heads == 0) return;
  const DType in = m.in_dtype, out = m.out_dtype;
  if (in == DType::f16 && out == DType::f16) return launch<__half, __half>(m, stream);
  if (in == DType::bf16 && out == DType::bf16) return launch<__nv_bfloat16, __nv_bfloat16>(m, stream);
  if (in == DType::f32 && out == DType::f32) return launch<float, float>(m, stream);
  throw Error(Status::unsupported, std::string("merge_states: no GPU merge from ") + dtype_name(in) + " parts to " +
                                       dtype_name(out) + " output");
}

}  // namespace flashattn::cuda

// The backward of a call where no sequence has a query row (seqlen_q = 0, the longest sequence's):
// no query sees any key, so dK and dV are zero over the sequences' key rows and there is no dQ. This
// kernel writes those zeros; no attention kernel runs, and neither path meets a query extent of
// zero (a grid of zero blocks is a launch error; the GPU fuzzer found the preprocess kernel's).
#include "core/params.h"
#include "cuda/backward.h"
#include "cuda/common.cuh"

namespace flashattn::cuda {
namespace {

constexpr int kRowsPerBlock = 4;  // one warp per key row

// Every element of rows [k0, k0 + sk) of sequence b, for one KV head, in dK and dV. The GPU
// dtypes (f16, bf16) are both 2 bytes, and zero is all-zero bits in both.
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    zero_key_gradients_kernel(const __grid_constant__ core::BackwardParams p) {
  const int64_t b = blockIdx.z, h = blockIdx.y;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  int64_t k0 = 0, sk = p.seqlen_k;
  if (p.cu_seqlens_k != nullptr) {
    k0 = p.cu_seqlens_k[b];
    sk = p.cu_seqlens_k[b + 1] - k0;
  }
  if (row >= sk) return;
  uint16_t* dk = static_cast<uint16_t*>(p.dk) + p.dk_s.offset(b, k0 + row, h);
  uint16_t* dv = static_cast<uint16_t*>(p.dv) + p.dv_s.offset(b, k0 + row, h);
  for (int64_t x = threadIdx.x % 32; x < p.head_dim; x += 32) dk[x] = dv[x] = 0;
}

}  // namespace

void zero_key_gradients(const core::BackwardParams& p, cudaStream_t stream) {
  zero_key_gradients_kernel<<<dim3(unsigned((p.seqlen_k + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(p.heads_kv),
                                   unsigned(p.batch)),
                              32 * kRowsPerBlock, 0, stream>>>(p);
  check_launch("flashattn backward kernel (no query rows: zero dK, dV)");
}

}  // namespace flashattn::cuda

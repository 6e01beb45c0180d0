// Host launcher of the portable backward for one (head dim, dtype, target arch): workspace,
// preprocess, main and convert kernels on the caller's stream. Included only by the generated
// instantiation files (src/cuda/instantiations/).
#pragma once

#include <algorithm>

#include "cuda/backward.h"
#include "cuda/common.cuh"
#include "cuda/sm80/bwd_kernel.cuh"
#include "cuda/tile_size.h"

namespace flashattn::cuda {

template <int kHeadDim, class Element, int kArch>
void run_backward_portable(const core::BackwardParams& p, cudaStream_t stream) {
  constexpr PortableBwdTile tile = portable_bwd_tile<kArch>(kHeadDim);
  using T = sm80::BwdTraits<kHeadDim, Element, tile.block_n, tile.warps, tile.stages>;
  int device = 0, smem_optin = 0, sms = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  if (smem_optin < T::kSmemBytes)
    throw Error(Status::unsupported, "backward: head_dim " + std::to_string(p.head_dim) + " needs " +
                                         std::to_string(T::kSmemBytes / 1024) + " KB of shared memory per block, this GPU offers " +
                                         std::to_string(smem_optin / 1024) + " KB");

  const int64_t n_blocks = (p.seqlen_k + T::kBlockN - 1) / T::kBlockN;
  // Deterministic mode: enough CTAs per (KV head, batch) to fill the GPU twice, each with its own
  // fp32 dQ slice (src/cuda/sm80/bwd_kernel.cuh explains the order).
  BwdWorkspace ws;
  ws.splits = 1;
  if (p.deterministic) {
    int64_t ctas = std::max<int64_t>(1, p.heads_kv * p.batch);
    ws.splits = int(std::clamp<int64_t>((2 * sms + ctas - 1) / ctas, 1, std::max<int64_t>(n_blocks, 1)));
  }
  const int64_t rows = p.total_q * p.heads_q;
  const size_t accum_bytes = size_t(ws.splits) * size_t(rows * p.head_dim) * 4;
  const size_t bytes = size_t(rows) * 8 + accum_bytes;
  const WorkspaceMemory memory(bytes, stream);
  start_backward<Element>(p, ws, memory, rows, accum_bytes, stream);
  const unsigned hq = unsigned(p.heads_q), batch = unsigned(p.batch);

  auto kernel = p.softcap > 0.f ? sm80::backward_kernel<T, true> : sm80::backward_kernel<T, false>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes),
        "cudaFuncSetAttribute(backward, shared memory)");
  unsigned grid_x = unsigned(p.deterministic ? ws.splits : n_blocks);
  if (grid_x > 0) {
    kernel<<<dim3(grid_x, unsigned(p.heads_kv), batch), T::kThreads, T::kSmemBytes, stream>>>(p, ws);
    check_launch("flashattn backward kernel (portable path)");
  }

  const int64_t chunks = p.head_dim / 8;
  sm80::backward_convert_dq_kernel<Element>
      <<<dim3(unsigned((p.seqlen_q * chunks + 127) / 128), hq, batch), 128, 0, stream>>>(p, ws);
  check_launch("flashattn backward dq conversion kernel");
}

}  // namespace flashattn::cuda

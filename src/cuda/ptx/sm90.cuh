// Our typed layer over the sm90 (Hopper) PTX the kernels use beyond sm80: the bulk async copy
// engine's reduce-add and the proxy fence it needs. Compiled only where __CUDA_ARCH__ >= 900;
// tests/gpu/ptx_test.cu checks each wrapper on the GPU.
#pragma once

#include <cstdint>

namespace flashattn::cuda::ptx {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// Shared-memory writes made by ordinary stores become visible to the async proxy (bulk copies,
// TMA, wgmma) only after this fence (then a barrier orders the other threads).
__device__ __forceinline__ void thread_fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// gmem[i] += smem[i] for `bytes` / 4 floats, performed by the copy engine (one instruction instead
// of one atomic per element). Both addresses 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void thread_bulk_reduce_add_f32(float* gmem, const float* smem, uint32_t bytes) {
  uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem), "r"(s),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void thread_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until this thread's committed bulk operations have finished READING shared memory (so it
// may be overwritten); their global writes may still be in flight.
__device__ __forceinline__ void thread_bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// Waits until this thread's committed bulk operations have completed, global writes included.
__device__ __forceinline__ void thread_bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

#endif

}  // namespace flashattn::cuda::ptx

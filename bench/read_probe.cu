// A hand-written CUDA reader for bench/read_probe.py: beside its Triton readers, so that the bare-read
// bound of a decode row does not rest on one compiler's code. Every thread streams 16-byte vectors
// (non-coherent, not kept in L1) over a grid-stride loop, `unroll` loads in flight per thread before
// any is used, and sums the bf16 values in fp32; each CTA writes one sum (read_probe.py checks them on
// a buffer of ones: exactly one count per element). Loaded through ctypes:
//   nvcc -O3 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a bench/read_probe.cu \
//        -o read_probe.so
#include <cuda_runtime.h>

#include <cstdint>

namespace {

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The eight bf16 values of a vector, summed in fp32 (a bf16 is the top half of an fp32).
__device__ __forceinline__ float sum8(uint4 v) {
  float s = 0.f;
  for (uint32_t w : {v.x, v.y, v.z, v.w}) s += __uint_as_float(w << 16) + __uint_as_float(w & 0xffff0000u);
  return s;
}

template <int kUnroll>
__global__ void __launch_bounds__(1024) read_kernel(const uint4* x, int64_t n16, float* out) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  float acc = 0.f;
  for (; i + (kUnroll - 1) * stride < n16; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load_stream(x + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc += sum8(v[u]);
  }
  for (; i < n16; i += stride) acc += sum8(load_stream(x + i));
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  __shared__ float warp_sums[32];
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) s += warp_sums[w];
    out[blockIdx.x] = s;
  }
}

}  // namespace

// One read of n_bytes (a multiple of 16) at x by `blocks` CTAs of `threads` threads, `unroll` (4 or
// 8) loads in flight per thread; out holds one float per CTA. Returns the launch's cudaError_t.
extern "C" int read_probe_launch(const void* x, int64_t n_bytes, float* out, int blocks, int threads, int unroll,
                                 void* stream) {
  const auto* v = static_cast<const uint4*>(x);
  auto s = static_cast<cudaStream_t>(stream);
  if (n_bytes % 16 != 0 || (unroll != 4 && unroll != 8)) return int(cudaErrorInvalidValue);
  if (unroll == 4)
    read_kernel<4><<<blocks, threads, 0, s>>>(v, n_bytes / 16, out);
  else
    read_kernel<8><<<blocks, threads, 0, s>>>(v, n_bytes / 16, out);
  return int(cudaGetLastError());
}

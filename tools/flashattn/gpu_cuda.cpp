// The command's GPU side when CUDA is compiled in (standard attention is in standard_attention.cu).
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cuda/tile_size.h"
#include "flashattn/flashattn.hpp"
#include "gpu.h"

namespace fatool::gpu {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

bool compiled() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error for the command
    return 0;
  }
  return n;
}

void* alloc(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
  return p;
}

void release(void* p) { cudaFree(p); }

void upload(void* dst, const void* src, size_t bytes) { check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy"); }

void download(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
}

void synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

size_t free_bytes() {
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

double time_seconds(const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start), "cudaEventRecord");
  fn();
  check(cudaEventRecord(stop), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0.f;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(ms) * 1e-3;
}

// Mirrors the library's dispatch (src/cuda/dispatch_forward.cpp): the smallest compiled kernel head
// dim that holds d, built for Hopper when the device is one and sm90a kernels are compiled in.
int flash_block_m(int head_dim, bool causal) {
  int major = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), "cudaDeviceGetAttribute");
  const bool hopper = major == 9 && flashattn::build_info().cuda_kernels.find("sm90a") != std::string::npos;
  int kernel_dim = 256;
  for (int k : {32, 64, 96, 128, 192, 256})
    if (k >= head_dim) {
      kernel_dim = k;
      break;
    }
  return hopper ? flashattn::cuda::portable_fwd_tile<90>(kernel_dim, causal).block_m()
                : flashattn::cuda::portable_fwd_tile<80>(kernel_dim, causal).block_m();
}

}  // namespace fatool::gpu

#include "fuzz_device.h"

#include <cstdio>
#include <cstdlib>

#if defined(FLASHATTN_FUZZ_CUDA)
#include <cuda_runtime.h>
#endif

namespace fa_fuzz {

#if defined(FLASHATTN_FUZZ_CUDA)
namespace {

// A failing copy or allocation here is the device's failure (a kernel fault surfaces at the next
// synchronizing call), not something a case could recover from: stop with the runtime's words.
void ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "flashattn fuzz: %s: %s\n", what, cudaGetErrorString(e));
  std::abort();
}

}  // namespace

bool gpu_present() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

void* gpu_alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes) ok(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}

void gpu_upload(void* dst, const void* src, size_t bytes) {
  if (bytes) ok(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}

void gpu_download(void* dst, const void* src, size_t bytes) {
  ok(cudaDeviceSynchronize(), "the call's kernels");
  if (bytes) ok(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy from the device");
}

void gpu_free(void* p) {
  ok(cudaDeviceSynchronize(), "the call's kernels");  // a workspace may still be in use
  ok(cudaFree(p), "cudaFree");
}

#else

bool gpu_present() { return false; }
void* gpu_alloc(size_t) { std::abort(); }
void gpu_upload(void*, const void*, size_t) { std::abort(); }
void gpu_download(void*, const void*, size_t) { std::abort(); }
void gpu_free(void*) { std::abort(); }

#endif

}  // namespace fa_fuzz

// What the two Ptx test files share: ptx_test.cu (the thread- and warp-level wrappers) and
// ptx_tma_wgmma_test.cu (TMA, mbarrier, wgmma, clusters). `Ptx` is defined here, outside an
// anonymous namespace, because GoogleTest wants every test of a suite to use one fixture class,
// and a per-file fixture would be two classes of the same name.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <random>
#include <vector>

#include "gpu_util.h"

namespace fa_test {

class Ptx : public GpuTest {};

template <class T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  cudaMalloc(&d, h.size() * sizeof(T));
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}
template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}

inline std::vector<__nv_bfloat16> random_bf16(size_t count, std::mt19937& rng) {
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<__nv_bfloat16> v(count);
  for (auto& x : v) x = __float2bfloat16(n(rng));
  return v;
}

}  // namespace fa_test

// Times candidate tile shapes of the portable forward kernel on the anchor shapes (bf16, 16k
// tokens, hidden 2048), bypassing dispatch, so src/cuda/tile_size.h entries rest on measurements.
// Build and run on a GPU machine (one head dim per translation unit keeps builds parallel):
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -I include -I src -I <build>/include -DSWEEP_HDIM=128 bench/tile_sweep.cu -o sweep128
//   ./sweep128
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <random>
#include <vector>

#include "core/flops.h"
#include "cuda/sm80/fwd_kernel.cuh"

#ifndef SWEEP_HDIM
#define SWEEP_HDIM 128
#endif

namespace fa = flashattn;
using E = __nv_bfloat16;

#define CHECK(x)                                                                            \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e_));                                  \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

struct Problem {
  int64_t b, h, s, d;
  bool causal;
  E *q, *k, *v, *o;
  float* lse;
};

template <int BN, int W, int MT, int ST, bool QR>
void time_config(const Problem& pr) {
  using T = fa::cuda::sm80::FwdTraits<SWEEP_HDIM, E, BN, W, MT, ST, QR>;
  auto kernel = fa::cuda::sm80::forward_kernel<T, false>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes));
  fa::core::ForwardParams p;
  p.batch = pr.b;
  p.heads_q = p.heads_kv = pr.h;
  p.head_dim = pr.d;
  p.seqlen_q = p.seqlen_k = pr.s;
  p.total_q = p.total_k = pr.b * pr.s;
  p.scale = 1.f / std::sqrt(float(pr.d));
  p.window_right = pr.causal ? 0 : -1;
  p.dtype = fa::DType::bf16;
  p.q = pr.q;
  p.k = pr.k;
  p.v = pr.v;
  p.out = pr.o;
  p.lse = pr.lse;
  fa::core::Strides st{pr.s * pr.h * pr.d, pr.h * pr.d, pr.d};
  p.q_s = p.k_s = p.v_s = p.o_s = st;
  p.lse_s = {pr.h * pr.s, pr.s, 1};
  dim3 grid(unsigned((pr.s + T::kBlockM - 1) / T::kBlockM), unsigned(pr.h), unsigned(pr.b));
  cudaEvent_t a, z;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&z));
  std::vector<float> ms;
  for (int i = 0; i < 30; ++i) {
    CHECK(cudaEventRecord(a));
    kernel<<<grid, T::kThreads, T::kSmemBytes>>>(p);
    CHECK(cudaEventRecord(z));
    CHECK(cudaEventSynchronize(z));
    float t;
    CHECK(cudaEventElapsedTime(&t, a, z));
    if (i >= 5) ms.push_back(t);
  }
  CHECK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  double med = ms[ms.size() / 2];
  double tflops = fa::core::forward_flops(pr.b, pr.h, pr.s, pr.s, pr.d, pr.causal) / (med * 1e-3) / 1e12;
  std::printf("d=%d causal=%d s=%5ld  block_n=%3d warps=%d m_tiles=%d stages=%d q_regs=%d  %7.3f ms  %6.1f TFLOP/s\n",
              SWEEP_HDIM, int(pr.causal), long(pr.s), BN, W, MT, ST, int(QR), med, tflops);
}

template <class F>
void for_shapes(F&& f) {
  const int64_t d = SWEEP_HDIM, h = 2048 / d;
  for (int64_t s : {2048, 8192})
    for (bool causal : {false, true}) {
      int64_t b = 16384 / s;
      size_t n = size_t(b * s * h * d);
      std::vector<E> host(n);
      std::mt19937 rng(1);
      std::normal_distribution<float> nd;
      for (auto& x : host) x = __float2bfloat16(nd(rng));
      Problem pr{b, h, s, d, causal, nullptr, nullptr, nullptr, nullptr, nullptr};
      for (E** p : {&pr.q, &pr.k, &pr.v, &pr.o}) {
        CHECK(cudaMalloc(p, n * sizeof(E)));
        CHECK(cudaMemcpy(*p, host.data(), n * sizeof(E), cudaMemcpyHostToDevice));
      }
      CHECK(cudaMalloc(&pr.lse, size_t(b * h * s) * 4));
      f(pr);
      for (E* p : {pr.q, pr.k, pr.v, pr.o}) cudaFree(p);
      cudaFree(pr.lse);
    }
}

int main() {
  for_shapes([](const Problem& pr) {
#if SWEEP_HDIM == 64
    time_config<64, 4, 2, 2, false>(pr);
    time_config<128, 4, 2, 2, false>(pr);
    time_config<128, 4, 1, 2, true>(pr);
#elif SWEEP_HDIM == 128
    time_config<64, 4, 1, 2, true>(pr);
    time_config<128, 8, 1, 2, false>(pr);
    time_config<64, 4, 2, 2, false>(pr);
    time_config<128, 4, 1, 2, false>(pr);
    time_config<64, 8, 1, 2, true>(pr);
#else
    time_config<64, 8, 1, 2, false>(pr);
    time_config<64, 4, 1, 2, false>(pr);
    time_config<32, 4, 1, 2, false>(pr);
    time_config<128, 8, 1, 2, false>(pr);
#endif
  });
  return 0;
}

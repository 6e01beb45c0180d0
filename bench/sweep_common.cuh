// What the tile sweeps (bench/tile_sweep.cu, hopper_tile_sweep.cu, bwd_tile_sweep.cu) share: error checks, the
// anchor problems (bf16, 16k tokens in total, hidden 2048: batch = 16384 / s, heads = 2048 / d)
// as ready forward params, and a median of CUDA-event timings.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <random>
#include <vector>

#include "core/flops.h"
#include "core/params.h"

namespace sweep {

#define SWEEP_CHECK(x)                                             \
  do {                                                             \
    cudaError_t e_ = (x);                                          \
    if (e_ != cudaSuccess) {                                       \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e_));         \
      std::exit(1);                                                \
    }                                                              \
  } while (0)

using E = __nv_bfloat16;

// Forward params of a dense bf16 self-attention problem [b, s, h, d] (contiguous, as the anchors
// lay it out) on the given device tensors.
inline flashattn::core::ForwardParams dense_params(int64_t b, int64_t s, int64_t h, int64_t d, bool causal, void* q,
                                                   void* k, void* v, void* out, float* lse) {
  flashattn::core::ForwardParams p;
  p.batch = b;
  p.heads_q = p.heads_kv = h;
  p.head_dim = d;
  p.seqlen_q = p.seqlen_k = s;
  p.total_q = p.total_k = b * s;
  p.scale = 1.f / std::sqrt(float(d));
  p.causal = causal;
  p.window_right = causal ? 0 : -1;
  p.dtype = flashattn::DType::bf16;
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.lse = lse;
  const flashattn::core::Strides st{s * h * d, h * d, d};
  p.q_s = p.k_s = p.v_s = p.o_s = st;
  p.lse_s = {h * s, s, 1};
  return p;
}

// Calls f(params, causal) for every anchor shape of head dim d at the given sequence lengths,
// causal and not, on random inputs (q = k = v, which the timing does not care about).
template <class F>
void for_anchor_shapes(int64_t d, std::initializer_list<int64_t> seqlens, F&& f) {
  const int64_t h = 2048 / d;
  for (int64_t s : seqlens)
    for (bool causal : {false, true}) {
      const int64_t b = 16384 / s;
      const size_t n = size_t(b * s * h * d);
      std::vector<E> host(n);
      std::mt19937 rng(1);
      std::normal_distribution<float> nd;
      for (auto& x : host) x = __float2bfloat16(nd(rng));
      E *q, *k, *v, *o;
      float* lse;
      for (E** ptr : {&q, &k, &v, &o}) {
        SWEEP_CHECK(cudaMalloc(ptr, n * sizeof(E)));
        SWEEP_CHECK(cudaMemcpy(*ptr, host.data(), n * sizeof(E), cudaMemcpyHostToDevice));
      }
      SWEEP_CHECK(cudaMalloc(&lse, size_t(b * h * s) * 4));
      f(dense_params(b, s, h, d, causal, q, k, v, o, lse), causal);
      for (E* ptr : {q, k, v, o}) cudaFree(ptr);
      cudaFree(lse);
    }
}

// Median over 20 timings of `launch` run `per_timing` times back to back, after 5 warm-up runs.
template <class F>
double median_ms(F&& launch, int per_timing = 5) {
  cudaEvent_t a, z;
  SWEEP_CHECK(cudaEventCreate(&a));
  SWEEP_CHECK(cudaEventCreate(&z));
  for (int i = 0; i < 5; ++i) launch();
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    SWEEP_CHECK(cudaEventRecord(a));
    for (int r = 0; r < per_timing; ++r) launch();
    SWEEP_CHECK(cudaEventRecord(z));
    SWEEP_CHECK(cudaEventSynchronize(z));
    float t;
    SWEEP_CHECK(cudaEventElapsedTime(&t, a, z));
    ms.push_back(t / float(per_timing));
  }
  SWEEP_CHECK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(z);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

inline double tflops(const flashattn::core::ForwardParams& p, bool causal, double ms) {
  return flashattn::core::forward_flops(p.batch, p.heads_q, p.seqlen_q, p.seqlen_k, p.head_dim, causal) /
         (ms * 1e-3) / 1e12;
}

}  // namespace sweep

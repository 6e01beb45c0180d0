// Times candidate tile shapes of the Hopper forward kernel (src/cuda/sm90/) on the anchor shapes
// (bf16, 16k tokens, hidden 2048, s = 2k and 8k, causal and not), bypassing dispatch, so the
// HopperFwdTile entries of src/cuda/tile_size.h rest on measurements. On a Hopper GPU machine:
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -I include -I src -DSWEEP_HDIM=128 bench/hopper_tile_sweep.cu src/cuda/sm90/tma.cpp -o hsweep128
//   ./hsweep128
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/flops.h"
#include "cuda/sm90/fwd_launch.cuh"

#ifndef SWEEP_HDIM
#define SWEEP_HDIM 128
#endif

namespace fa = flashattn;
using E = __nv_bfloat16;

#define CHECK(x)                                                   \
  do {                                                             \
    cudaError_t e_ = (x);                                          \
    if (e_ != cudaSuccess) {                                       \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e_));         \
      std::exit(1);                                                \
    }                                                              \
  } while (0)

template <int BN, int WG, int ST, bool PP, int QS = 1>
void time_config(const fa::core::ForwardParams& p, bool causal, bool dynamic = false) {
  using T = fa::cuda::sm90::FwdTraits<SWEEP_HDIM, E, BN, WG, ST, PP, QS>;
  auto run = [&] {
    if (!fa::cuda::launch_forward_hopper<T>(p, nullptr, dynamic)) {
      std::printf("TMA map rejected\n");
      std::exit(1);
    }
  };
  cudaEvent_t a, z;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&z));
  for (int i = 0; i < 5; ++i) run();
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    CHECK(cudaEventRecord(a));
    for (int r = 0; r < 5; ++r) run();
    CHECK(cudaEventRecord(z));
    CHECK(cudaEventSynchronize(z));
    float t;
    CHECK(cudaEventElapsedTime(&t, a, z));
    ms.push_back(t / 5);
  }
  CHECK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  const double tflops =
      fa::core::forward_flops(p.batch, p.heads_q, p.seqlen_q, p.seqlen_k, p.head_dim, causal) / (med * 1e-3) / 1e12;
  std::printf("d=%d causal=%d s=%5ld  block_n=%3d wgs=%d stages=%d pingpong=%d dynamic=%d q_stages=%d  %7.3f ms  %6.1f TFLOP/s\n",
              SWEEP_HDIM, int(causal), long(p.seqlen_q), BN, WG, ST, int(PP), int(dynamic), QS, med, tflops);
}

int main() {
  const int64_t d = SWEEP_HDIM, h = 2048 / d;
  for (int64_t s : {2048, 8192, 16384})
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
        CHECK(cudaMalloc(ptr, n * sizeof(E)));
        CHECK(cudaMemcpy(*ptr, host.data(), n * sizeof(E), cudaMemcpyHostToDevice));
      }
      CHECK(cudaMalloc(&lse, size_t(b * h * s) * 4));
      fa::core::ForwardParams p;
      p.batch = b;
      p.heads_q = p.heads_kv = h;
      p.head_dim = d;
      p.seqlen_q = p.seqlen_k = s;
      p.total_q = p.total_k = b * s;
      p.scale = 1.f / std::sqrt(float(d));
      p.window_right = causal ? 0 : -1;
      p.dtype = fa::DType::bf16;
      p.q = q;
      p.k = k;
      p.v = v;
      p.out = o;
      p.lse = lse;
      const fa::core::Strides st{s * h * d, h * d, d};
      p.q_s = p.k_s = p.v_s = p.o_s = st;
      p.lse_s = {h * s, s, 1};
#if SWEEP_HDIM == 64
      time_config<128, 3, 2, true>(p, causal, causal);
      time_config<128, 3, 2, true, 2>(p, causal, causal);
      time_config<128, 3, 2, false, 2>(p, causal, causal);
#elif SWEEP_HDIM == 128
      time_config<128, 2, 2, true>(p, causal, causal);
      time_config<128, 2, 2, true, 2>(p, causal, causal);
#else
      time_config<80, 2, 2, true>(p, causal, causal);
      time_config<80, 2, 2, false>(p, causal, causal);
#endif
      for (E* ptr : {q, k, v, o}) cudaFree(ptr);
      cudaFree(lse);
    }
  return 0;
}

// Times candidate tile shapes of the portable forward kernel on the anchor shapes (bf16, 16k
// tokens, hidden 2048), bypassing dispatch, so src/cuda/tile_size.h entries rest on measurements.
// Build and run on a GPU machine (one head dim per translation unit keeps builds parallel):
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -I include -I src -I <build>/include -DSWEEP_HDIM=128 bench/tile_sweep.cu -o sweep128
//   ./sweep128
#include "sweep_common.cuh"
#include "cuda/sm80/fwd_kernel.cuh"

#ifndef SWEEP_HDIM
#define SWEEP_HDIM 128
#endif

namespace fa = flashattn;

template <int BN, int W, int MT, int ST, bool QR>
void time_config(const fa::core::ForwardParams& p, bool causal) {
  using T = fa::cuda::sm80::FwdTraits<SWEEP_HDIM, sweep::E, BN, W, MT, ST, QR>;
  auto kernel = fa::cuda::sm80::forward_kernel<T, false>;
  SWEEP_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes));
  dim3 grid(unsigned((p.seqlen_q + T::kBlockM - 1) / T::kBlockM), unsigned(p.heads_q), unsigned(p.batch));
  const double med = sweep::median_ms([&] { kernel<<<grid, T::kThreads, T::kSmemBytes>>>(p); }, 1);
  std::printf("d=%d causal=%d s=%5ld  block_n=%3d warps=%d m_tiles=%d stages=%d q_regs=%d  %7.3f ms  %6.1f TFLOP/s\n",
              SWEEP_HDIM, int(causal), long(p.seqlen_q), BN, W, MT, ST, int(QR), med, sweep::tflops(p, causal, med));
}

int main() {
  sweep::for_anchor_shapes(SWEEP_HDIM, {2048, 8192}, [](const fa::core::ForwardParams& pr, bool causal) {
#if SWEEP_HDIM == 64
    time_config<64, 4, 2, 2, false>(pr, causal);
    time_config<128, 4, 2, 2, false>(pr, causal);
    time_config<128, 4, 1, 2, true>(pr, causal);
#elif SWEEP_HDIM == 128
    time_config<64, 4, 1, 2, true>(pr, causal);
    time_config<128, 8, 1, 2, false>(pr, causal);
    time_config<64, 4, 2, 2, false>(pr, causal);
    time_config<128, 4, 1, 2, false>(pr, causal);
    time_config<64, 8, 1, 2, true>(pr, causal);
#else
    time_config<64, 8, 1, 2, false>(pr, causal);
    time_config<64, 4, 1, 2, false>(pr, causal);
    time_config<32, 4, 1, 2, false>(pr, causal);
    time_config<128, 8, 1, 2, false>(pr, causal);
#endif
  });
  return 0;
}

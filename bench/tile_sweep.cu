// Times candidate tile shapes of the portable forward kernel on the anchor shapes (bf16, 16k
// tokens, hidden 2048), bypassing dispatch, so src/cuda/tile_size.h entries rest on measurements.
// (The d=256 entries differ with and without a right bound: the first variant is the causal one.)
// Build and run on a GPU machine (one head dim per translation unit keeps builds parallel):
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -I include -I src -I <build>/include -DSWEEP_HDIM=128 bench/tile_sweep.cu -o sweep128
//   ./sweep128
#include "sweep_common.cuh"
#include "cuda/sm80/fwd_kernel.cuh"
#include "cuda/tile_scheduler.h"

#ifndef SWEEP_HDIM
#define SWEEP_HDIM 128
#endif

namespace fa = flashattn;

// order: 0 = the scheduler's (longest first in L2 sections under a causal mask), 1 = query tiles
// ascending within each head (FlashAttention-2's launch order).
// DS: warps per row block (sm80::FwdTraits::kDSplit; 2 = pairs splitting keys in S, head dim in P V).
template <int BN, int W, int MT, int ST, bool QR, int MC = 1, int DS = 1>
void time_config(const fa::core::ForwardParams& p, bool causal, int order = 0) {
  using T = fa::cuda::sm80::FwdTraits<SWEEP_HDIM, sweep::E, BN, W, MT, ST, QR, MC, DS>;
  auto kernel = fa::cuda::sm80::forward_kernel<T, false>;
  SWEEP_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes));
  int l2 = 0;
  SWEEP_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  fa::cuda::TileScheduler sched = fa::cuda::make_tile_scheduler(p, T::kBlockM, l2);
  if (order == 1) sched.longest_first = false;
  const unsigned grid = unsigned(sched.num_tiles());
  const double med = sweep::median_ms([&] { kernel<<<grid, T::kThreads, T::kSmemBytes>>>(p, sched); }, 1);
  std::printf(
      "d=%d causal=%d s=%5ld  block_n=%3d warps=%d m_tiles=%d stages=%d q_regs=%d min_ctas=%d d_split=%d order=%d  %7.3f "
      "ms  %6.1f TFLOP/s\n",
      SWEEP_HDIM, int(causal), long(p.seqlen_q), BN, W, MT, ST, int(QR), MC, DS, order, med, sweep::tflops(p, causal, med));
}

// Under a causal mask also in ascending order.
template <int BN, int W, int MT, int ST, bool QR>
void time_variants(const fa::core::ForwardParams& p, bool causal) {
  time_config<BN, W, MT, ST, QR>(p, causal);
  if (causal) time_config<BN, W, MT, ST, QR>(p, causal, 1);
}

int main() {
  sweep::for_anchor_shapes(SWEEP_HDIM, {2048, 4096, 8192, 16384}, [](const fa::core::ForwardParams& pr, bool causal) {
#if SWEEP_HDIM == 64
    time_variants<64, 4, 2, 2, false>(pr, causal);
    time_config<64, 4, 2, 3, false>(pr, causal);
    time_config<32, 4, 2, 2, false>(pr, causal);
    time_config<32, 4, 2, 3, false>(pr, causal);
    time_config<128, 4, 2, 2, false>(pr, causal);
    time_config<64, 8, 1, 2, false>(pr, causal);
    time_config<64, 4, 2, 2, true>(pr, causal);
    time_config<64, 4, 2, 1, true>(pr, causal);
    time_config<64, 4, 1, 2, true>(pr, causal);
    time_config<64, 4, 1, 2, true, 4>(pr, causal);
#elif SWEEP_HDIM == 128
    time_variants<64, 4, 2, 1, false>(pr, causal);
    time_config<64, 4, 2, 2, false>(pr, causal);
#else
    time_variants<64, 4, 1, 1, false>(pr, causal);
    time_config<64, 4, 1, 1, true>(pr, causal);
    time_config<64, 8, 1, 2, false>(pr, causal);
    time_config<64, 8, 2, 1, false, 1, 2>(pr, causal);  // the table's entry without a right bound
    time_config<64, 4, 2, 1, false, 1, 2>(pr, causal);
    time_config<64, 8, 2, 2, false, 1, 2>(pr, causal);
#endif
  });
  return 0;
}

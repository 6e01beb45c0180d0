// Times candidate tile shapes of the Hopper forward kernel (src/cuda/sm90/) on the anchor shapes
// (bf16, 16k tokens, hidden 2048, s = 2k, 4k and 8k, causal and not), bypassing dispatch, so the
// HopperFwdTile entries of src/cuda/tile_size.h rest on measurements. On a Hopper GPU machine:
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -I include -I src -DSWEEP_HDIM=128 bench/hopper_tile_sweep.cu src/cuda/sm90/tma.cpp -o hsweep128
//   ./hsweep128
#include "sweep_common.cuh"
#include "cuda/sm90/fwd_launch.cuh"

#ifndef SWEEP_HDIM
#define SWEEP_HDIM 128
#endif

namespace fa = flashattn;

// Own key tiles per warpgroup, the O epilogue and the main loop's wait as the library's table has
// them for this head dim.
template <int BN, int WG, int ST, bool PP, int QS = 1, bool OWN = fa::cuda::hopper_fwd_tile(SWEEP_HDIM, false).own_tiles,
          bool STAGE_O = fa::cuda::hopper_fwd_tile(SWEEP_HDIM, false).stage_o>
void time_config(const fa::core::ForwardParams& p, bool causal, bool dynamic = false) {
  constexpr bool kUnderPv = fa::cuda::hopper_fwd_tile(SWEEP_HDIM, false).softmax_under_pv;
  using T = fa::cuda::sm90::FwdTraits<SWEEP_HDIM, sweep::E, BN, WG, ST, PP, QS, OWN, STAGE_O, false, false, kUnderPv>;
  const double med = sweep::median_ms([&] {
    if (!fa::cuda::launch_forward_hopper<T>(p, nullptr, dynamic)) {
      std::printf("TMA map rejected\n");
      std::exit(1);
    }
  });
  std::printf("d=%d causal=%d s=%5ld  block_n=%3d wgs=%d stages=%d pingpong=%d dynamic=%d q_stages=%d own=%d "
              "o_buffer=%d  %7.3f ms  %6.1f TFLOP/s\n",
              SWEEP_HDIM, int(causal), long(p.seqlen_q), BN, WG, ST, int(PP), int(dynamic), QS, int(OWN),
              int(T::kSeparateO), med,
              sweep::tflops(p, causal, med));
}

int main() {
  sweep::for_anchor_shapes(SWEEP_HDIM, {2048, 4096, 8192}, [](const fa::core::ForwardParams& p, bool causal) {
#if SWEEP_HDIM == 64
    time_config<128, 3, 2, true>(p, causal, causal);
    if (!causal) return;
    time_config<64, 3, 2, true>(p, causal, causal);
    time_config<64, 3, 4, true>(p, causal, causal);
    time_config<128, 3, 3, true>(p, causal, causal);
    time_config<64, 2, 4, true>(p, causal, causal);
    time_config<128, 2, 2, true>(p, causal, causal);
#elif SWEEP_HDIM == 128
    time_config<128, 2, 2, true>(p, causal, causal);
    time_config<64, 2, 4, true>(p, causal, causal);
    time_config<96, 2, 3, true>(p, causal, causal);
    time_config<128, 2, 2, true>(p, causal, !causal);
#else
    if (causal) {
      time_config<80, 2, 2, false>(p, causal, causal);
      time_config<64, 2, 2, false>(p, causal, causal);
    } else {
      time_config<80, 2, 2, true>(p, causal, causal);
      time_config<64, 2, 2, true>(p, causal, causal);
    }
#endif
  });
  return 0;
}

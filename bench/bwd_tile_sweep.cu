// Times candidate shapes of the portable backward (tile size and warp layouts of its three
// phases, src/cuda/tile_size.h) on the anchor shapes (bf16, 16k tokens, hidden 2048), default and
// deterministic mode, bypassing dispatch: the whole backward (workspace, preprocess, main, convert)
// as flashattn::backward runs it. Build and run on a GPU machine, one head dim per binary:
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -I include -I src -I <build>/include -DSWEEP_HDIM=128 bench/bwd_tile_sweep.cu -o bwd_sweep128
//   ./bwd_sweep128
#include "sweep_common.cuh"
#include "cuda/sm80/bwd_launch.cuh"

#ifndef SWEEP_HDIM
#define SWEEP_HDIM 128
#endif

namespace fa = flashattn;

// block_n, warps, stages, key_warps_s, key_warps_kv, row_warps_q, min_ctas, block_m (PortableBwdTile).
template <int BN, int W, int ST, int KS, int KKV, int RQ, int MC, int BM = 64>
void time_config(fa::core::BackwardParams p, bool causal) {
  using T = fa::cuda::sm80::BwdTraits<SWEEP_HDIM, sweep::E, BN, W, ST, KS, KKV, RQ, MC, BM>;
  double ms[2];
  for (int det = 0; det < 2; ++det) {
    p.deterministic = det == 1;
    ms[det] = sweep::median_ms([&] { fa::cuda::launch_backward_portable<T>(p, nullptr); }, 1);
  }
  auto tflops = [&](double t) {
    return fa::core::backward_flops(p.batch, p.heads_q, p.seqlen_q, p.seqlen_k, p.head_dim, causal) / (t * 1e-3) / 1e12;
  };
  std::printf("d=%d causal=%d s=%5ld  block_n=%3d block_m=%3d warps=%d stages=%d layout=%d/%d/%d min_ctas=%d"
              "  %7.3f ms %6.1f TFLOP/s  deterministic %7.3f ms %6.1f\n",
              SWEEP_HDIM, int(causal), long(p.seqlen_q), BN, BM, W, ST, KS, KKV, RQ, MC, ms[0],
              tflops(ms[0]), ms[1], tflops(ms[1]));
}

int main() {
  sweep::for_anchor_shapes(SWEEP_HDIM, {2048, 8192}, [](const fa::core::ForwardParams& fp, bool causal) {
    // Gradients of the same shape as q; lse = 0 and o = q are not a real forward, which timing
    // does not care about.
    fa::core::BackwardParams p;
    static_cast<fa::core::ForwardParams&>(p) = fp;
    const size_t n = size_t(p.batch * p.seqlen_q * p.heads_q * p.head_dim);
    void* grads[4];
    for (void*& g : grads) SWEEP_CHECK(cudaMalloc(&g, n * sizeof(sweep::E)));
    SWEEP_CHECK(cudaMemcpy(grads[0], p.q, n * sizeof(sweep::E), cudaMemcpyDeviceToDevice));
    SWEEP_CHECK(cudaMemset(p.lse, 0, size_t(p.batch * p.heads_q * p.seqlen_q) * 4));
    p.dout = grads[0];
    p.dq = grads[1];
    p.dk = grads[2];
    p.dv = grads[3];
    p.do_s = p.dq_s = p.dk_s = p.dv_s = p.q_s;
#if SWEEP_HDIM == 64
    time_config<128, 8, 2, 4, 4, 2, 1>(p, causal);
    // 128 query rows per step (FlashAttention-2's d=64 backward: 128 x 128 on 8 warps).
    time_config<128, 8, 2, 4, 4, 2, 1, 128>(p, causal);
    time_config<128, 8, 2, 8, 4, 4, 1, 128>(p, causal);
    time_config<128, 8, 1, 4, 4, 2, 1, 128>(p, causal);
#elif SWEEP_HDIM == 128
    time_config<128, 8, 2, 4, 4, 2, 1>(p, causal);
    time_config<128, 8, 2, 8, 8, 4, 1>(p, causal);
    time_config<128, 8, 2, 4, 4, 4, 1>(p, causal);
    time_config<128, 8, 2, 8, 4, 2, 1>(p, causal);
    time_config<64, 4, 2, 2, 2, 2, 2>(p, causal);
#else
    time_config<64, 8, 2, 4, 2, 2, 1>(p, causal);
    time_config<64, 8, 2, 4, 4, 4, 1>(p, causal);
    time_config<64, 8, 2, 2, 2, 2, 1>(p, causal);
    time_config<64, 8, 2, 4, 2, 4, 1>(p, causal);
#endif
    for (void* g : grads) cudaFree(g);
  });
  return 0;
}

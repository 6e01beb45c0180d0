// `flashattn bench --cpu-bar`: the CPU performance bar in one run. The forward pass at b=1, h=16,
// N=4096, d=128, f32, non-causal on all cores, against OpenBLAS SGEMM on a 4096 x 4096 x 128
// product (the shape of one head's Q K^T), both in GFLOP/s: how close the attention engine comes to
// the machine's best plain matrix product.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "commands.h"
#include "core/flops.h"
#include "format.h"
#include "problem.h"
#include "timing.h"

#if defined(FLASHATTN_TOOL_OPENBLAS)
#include <cblas.h>
#endif

namespace fatool {
namespace {

constexpr int64_t kM = 4096, kN = 4096, kK = 128;

#if defined(FLASHATTN_TOOL_OPENBLAS)
// Median seconds of C = A B^T (A: M x K, B: N x K, row-major), like S = Q K^T.
double sgemm_seconds(int runs, int threads) {
  std::vector<unsigned char> a = random_values(DType::f32, kM * kK, 11), b = random_values(DType::f32, kN * kK, 12);
  std::vector<float> c(size_t(kM * kN));
  openblas_set_num_threads(threads);
  auto gemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(kM), int(kN), int(kK), 1.f,
                reinterpret_cast<const float*>(a.data()), int(kK), reinterpret_cast<const float*>(b.data()), int(kK), 0.f,
                c.data(), int(kN));
  };
  return median(time_runs(DeviceType::cpu, 2, runs, gemm));
}
#endif

}  // namespace

std::string openblas_status() {
#if defined(FLASHATTN_TOOL_OPENBLAS)
  return std::string("yes (") + openblas_get_config() + ")";
#else
  return "no (install libopenblas-dev and reconfigure for `flashattn bench --cpu-bar`)";
#endif
}

int run_cpu_bar(int runs, const std::string& json_path) {
  const flashattn::BuildInfo info = flashattn::build_info();
  Shape s;
  s.b = 1;
  s.h = s.h_kv = 16;
  s.s_q = s.s_k = 4096;
  s.d = 128;
  s.dtype = DType::f32;
  s.causal = false;
  std::printf("CPU bar: %d threads, %s kernels, median of %d runs after 2 warm-up runs\n", info.cpu_threads,
              info.cpu_kernel.c_str(), runs);
  Problem prob(s, 1);
  const double fwd_s = median(time_runs(DeviceType::cpu, 2, runs, [&] { flashattn::forward(prob.forward_args()); }));
  const double fwd_gflops = flashattn::core::forward_flops(s.b, s.h, s.s_q, s.s_k, s.d, s.causal) / fwd_s * 1e-9;
  std::printf("  forward  b=1 h=16 N=4096 d=128 f32 non-causal   %10s   %8.1f GFLOP/s (4 b h N^2 d)\n",
              fmt_time(fwd_s).c_str(), fwd_gflops);
  double sgemm_gflops = -1;
#if defined(FLASHATTN_TOOL_OPENBLAS)
  const double gemm_s = sgemm_seconds(runs, info.cpu_threads);
  sgemm_gflops = 2.0 * double(kM) * double(kN) * double(kK) / gemm_s * 1e-9;
  std::printf("  OpenBLAS cblas_sgemm 4096 x 4096 x 128          %10s   %8.1f GFLOP/s (2 M N K)\n",
              fmt_time(gemm_s).c_str(), sgemm_gflops);
  std::printf("  ratio    forward / SGEMM = %.2f\n", fwd_gflops / sgemm_gflops);
#else
  std::printf("  OpenBLAS: not built in; %s\n", openblas_status().c_str());
#endif
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    if (!f) throw std::runtime_error("cannot write '" + json_path + "'");
    f << "{\"threads\": " << info.cpu_threads << ", \"runs\": " << runs << ", \"forward_median_s\": " << fwd_s
      << ", \"forward_gflop_per_s\": " << fwd_gflops << ", \"sgemm_gflop_per_s\": "
      << (sgemm_gflops > 0 ? std::to_string(sgemm_gflops) : "null") << ", \"ratio\": "
      << (sgemm_gflops > 0 ? std::to_string(fwd_gflops / sgemm_gflops) : "null") << "}\n";
  }
  return 0;
}

}  // namespace fatool

// Times candidate shapes of the portable backward (tile size, warp layouts of its three phases,
// Q/dO stages, dQ layout and stmatrix flags: every sm80::BwdTraits parameter, src/cuda/tile_size.h)
// on the anchor shapes (bf16, 16k tokens, hidden 2048), default and deterministic mode, bypassing
// dispatch: the whole backward (workspace, preprocess, main, convert) as flashattn::backward runs
// it. The first variant of each head dim is the tile table's entry exactly.
// Then checks every variant's gradients, both modes, causal and not, at s = 2048 (b = 2, the
// anchor's heads) on random q, k, v, dO with the portable forward's O and lse, against the table
// entry's default-mode gradients (layouts add in different orders: equal within a bf16 tolerance,
// not exactly). The entry itself is checked against the fp64 reference by tests/gpu/backward_test.cpp.
// Build and run on a GPU machine, one head dim per binary:
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -I include -I src -I <build>/include -DSWEEP_HDIM=128 bench/bwd_tile_sweep.cu -o bwd_sweep128
//   ./bwd_sweep128            (SWEEP_ROUNDS=n: timing rounds, default 2; SWEEP_CHECK_ONLY=1: checks only)
#include "sweep_common.cuh"
#include "cuda/sm80/bwd_launch.cuh"
#include "cuda/sm80/fwd_kernel.cuh"
#include "cuda/tile_scheduler.h"

#include <exception>
#include <string>

#ifndef SWEEP_HDIM
#define SWEEP_HDIM 128
#endif

namespace fa = flashattn;
namespace cu = flashattn::cuda;

// block_n, warps, stages, key_warps_s, key_warps_kv, row_warps_q, min_ctas, block_m, fragment_dq,
// stmatrix_ps (PortableBwdTile).
template <int BN, int W, int ST, int KS, int KKV, int RQ, int MC, int BM = 64, bool FDQ = false, bool STM = false>
using Bwd = cu::sm80::BwdTraits<SWEEP_HDIM, sweep::E, BN, W, ST, KS, KKV, RQ, MC, BM, FDQ, STM>;

// The tile table's entry for this head dim on sm90, with its Q/dO stages overridable.
constexpr cu::PortableBwdTile kTable = cu::portable_bwd_tile<90>(SWEEP_HDIM);
template <int ST = kTable.stages>
using TableBwd = Bwd<kTable.block_n, kTable.warps, ST, kTable.key_warps_s, kTable.key_warps_kv, kTable.row_warps_q,
                     kTable.min_ctas, kTable.block_m, kTable.fragment_dq, kTable.stmatrix_ps>;

template <class... Ts>
struct Variants {};
template <class T>
struct Tag {
  using type = T;
};

// The first entry (the table's) is what the gradient checks compare the others with. Every variant
// takes the table's dQ layout and stmatrix flag.
constexpr bool kFdq = kTable.fragment_dq;
constexpr bool kStm = kTable.stmatrix_ps;
#if SWEEP_HDIM == 64
using Sweep = Variants<TableBwd<>, Bwd<128, 8, 2, 4, 4, 2, 1, 64, kFdq, kStm>,
                       Bwd<128, 8, 2, 4, 4, 2, 1, 128, kFdq, kStm>, Bwd<128, 8, 2, 8, 4, 4, 1, 128, kFdq, kStm>,
                       Bwd<128, 8, 1, 4, 4, 2, 1, 128, kFdq, kStm>>;
#elif SWEEP_HDIM == 128
using Sweep = Variants<TableBwd<>, Bwd<128, 8, 2, 4, 4, 2, 1, 64, kFdq, kStm>,
                       Bwd<128, 8, 2, 8, 8, 4, 1, 64, kFdq, kStm>, Bwd<128, 8, 2, 4, 4, 4, 1, 64, kFdq, kStm>,
                       Bwd<128, 8, 2, 8, 4, 2, 1, 64, kFdq, kStm>, Bwd<64, 4, 2, 2, 2, 2, 2, 64, kFdq, kStm>>;
#else
// d=256. 16 warps (512 threads, 128 registers each at min_ctas 1) need key_warps_s = 4 at block_n =
// block_m = 64 (16 keys x 16 queries of S^T per warp; 8 would leave 8 keys, 2 8 queries: not
// whole m16 tiles / ldmatrix pairs), so 8/4/4 cannot compile.
// block_m 32 (8 warps, 4/2/x): dQ 32 fp32 registers per thread instead of 64 beside dK + dV's 128,
// and 3 Q/dO stages in 169 KB; block_m 128 does not fit registers (dQ alone 128 per thread on 8
// warps; 64 + dK, dV 64 on 16) and only one stage fits shared memory (225 KB).
using Sweep = Variants<TableBwd<>,                           // table: 64 x 64, 8 warps, 4/2/2, 2 stages
                       TableBwd<1>,                          // the same on one Q/dO stage (145 KB)
                       Bwd<64, 16, 2, 4, 4, 4, 1, 64, kFdq, kStm>,
                       Bwd<64, 16, 2, 4, 4, 2, 1, 64, kFdq, kStm>,
                       Bwd<64, 16, 2, 4, 2, 4, 1, 64, kFdq, kStm>,
                       Bwd<64, 16, 2, 4, 2, 2, 1, 64, kFdq, kStm>,
                       Bwd<64, 8, 3, 4, 2, 1, 1, 32, kFdq, kStm>,   // dQ 32 rows x 32 cols per warp
                       Bwd<64, 8, 3, 4, 2, 2, 1, 32, kFdq, kStm>>;  // dQ 16 rows x 64 cols per warp
#endif

// One line naming a variant's parameters.
template <class T>
std::string describe() {
  char buf[256];
  std::snprintf(buf, sizeof buf, "bn=%3d bm=%3d w=%2d st=%d L=%d/%d/%d mc=%d fdq=%d stm=%d", T::kBlockN, T::kBlockM,
                T::kWarps, T::kStages, T::kKeyWarpsS, T::kKeyWarpsKV, T::kRowWarpsQ, T::kMinCtas,
                int(T::kFragmentDq), int(T::kStMatrixPs));
  return buf;
}

// Registers, local memory (spills) and shared memory of the default and deterministic kernels.
template <class T>
void print_resources() {
  cudaFuncAttributes a[2];
  SWEEP_CHECK(cudaFuncGetAttributes(&a[0], cu::sm80::backward_kernel<T, false, false>));
  SWEEP_CHECK(cudaFuncGetAttributes(&a[1], cu::sm80::backward_kernel<T, false, true>));
  std::printf("variant %s  smem %6d B  default: %3d regs %4zu B local  deterministic: %3d regs %4zu B local\n",
              describe<T>().c_str(), T::kSmemBytes, a[0].numRegs, a[0].localSizeBytes, a[1].numRegs,
              a[1].localSizeBytes);
}

template <class T>
void time_config(fa::core::BackwardParams p, bool causal, int round) {
  double ms[2];
  try {
    for (int det = 0; det < 2; ++det) {
      p.deterministic = det == 1;
      ms[det] = sweep::median_ms([&] { cu::launch_backward_portable<T>(p, nullptr); }, 1);
    }
  } catch (const std::exception& e) {
    std::printf("d=%d causal=%d s=%5ld  %s  failed: %s\n", SWEEP_HDIM, int(causal), long(p.seqlen_q),
                describe<T>().c_str(), e.what());
    return;
  }
  auto tflops = [&](double t) {
    return fa::core::backward_flops(p.batch, p.heads_q, p.seqlen_q, p.seqlen_k, p.head_dim, causal) / (t * 1e-3) / 1e12;
  };
  std::printf("round=%d d=%d causal=%d s=%5ld  %s  %7.3f ms %6.1f TFLOP/s  deterministic %7.3f ms %6.1f\n", round,
              SWEEP_HDIM, int(causal), long(p.seqlen_q), describe<T>().c_str(), ms[0], tflops(ms[0]), ms[1],
              tflops(ms[1]));
}

// ---- gradient checks ------------------------------------------------------------------------------

struct Grads {
  std::vector<float> g[3];  // dq, dk, dv
};

// A problem with distinct random q, k, v, dO (host-filled, normal), the output, lse and gradients
// on the device, [b, s, h, d] contiguous.
struct Problem {
  fa::core::BackwardParams p;
  size_t n = 0;
  void* buf[8] = {};  // q, k, v, dO, out, dq, dk, dv
  float* lse = nullptr;

  Problem(int64_t b, int64_t s, int64_t h, bool causal) {
    const int64_t d = SWEEP_HDIM;
    n = size_t(b * s * h * d);
    for (int i = 0; i < 8; ++i) SWEEP_CHECK(cudaMalloc(&buf[i], n * sizeof(sweep::E)));
    SWEEP_CHECK(cudaMalloc(&lse, size_t(b * h * s) * 4));
    std::vector<sweep::E> tmp(n);
    for (int i = 0; i < 4; ++i) {
      std::mt19937 rng(101 + i);
      std::normal_distribution<float> nd;
      for (auto& x : tmp) x = __float2bfloat16(nd(rng));
      SWEEP_CHECK(cudaMemcpy(buf[i], tmp.data(), n * sizeof(sweep::E), cudaMemcpyHostToDevice));
    }
    static_cast<fa::core::ForwardParams&>(p) =
        sweep::dense_params(b, s, h, d, causal, buf[0], buf[1], buf[2], buf[4], lse);
    p.dout = buf[3];
    p.dq = buf[5];
    p.dk = buf[6];
    p.dv = buf[7];
    p.do_s = p.dq_s = p.dk_s = p.dv_s = p.q_s;
  }
  ~Problem() {
    for (void* x : buf) cudaFree(x);
    cudaFree(lse);
  }

  // O and lse by the portable forward with the tile table's sm90 shape (as run_forward_portable).
  void forward() {
    constexpr cu::PortableFwdTile ft = cu::portable_fwd_tile<90>(SWEEP_HDIM);
    using F =
        cu::sm80::FwdTraits<SWEEP_HDIM, sweep::E, ft.block_n, ft.warps, ft.m_tiles, ft.stages, ft.q_in_regs, 1, ft.d_split>;
    auto kernel = cu::sm80::forward_kernel<F, false>;
    SWEEP_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, F::kSmemBytes));
    int l2 = 0;
    SWEEP_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    const cu::TileScheduler sched = cu::make_tile_scheduler(p, F::kBlockM, l2);
    kernel<<<unsigned(sched.num_tiles()), F::kThreads, F::kSmemBytes>>>(p, sched);
    SWEEP_CHECK(cudaGetLastError());
    SWEEP_CHECK(cudaDeviceSynchronize());
  }

  // The backward of variant T; gradients start as NaN (0xFFFF) so that unwritten ones show.
  template <class T>
  bool backward(bool deterministic, Grads* g) {
    p.deterministic = deterministic;
    for (int i = 5; i < 8; ++i) SWEEP_CHECK(cudaMemset(buf[i], 0xFF, n * sizeof(sweep::E)));
    try {
      cu::launch_backward_portable<T>(p, nullptr);
    } catch (const std::exception& e) {
      std::printf("  %s failed: %s\n", describe<T>().c_str(), e.what());
      return false;
    }
    SWEEP_CHECK(cudaDeviceSynchronize());
    std::vector<sweep::E> h(n);
    for (int i = 0; i < 3; ++i) {
      SWEEP_CHECK(cudaMemcpy(h.data(), buf[5 + i], n * sizeof(sweep::E), cudaMemcpyDeviceToHost));
      g->g[i].resize(n);
      for (size_t j = 0; j < n; ++j) g->g[i][j] = __bfloat162float(h[j]);
    }
    return true;
  }
};

// Max |a - ref| per gradient, relative to max |ref|; FAIL above 1e-2 (bf16 gradients summed in
// different orders) or on a non-finite value.
bool compare(const std::string& what, const std::string& name, const Grads& a, const Grads& ref) {
  static const char* names[3] = {"dq", "dk", "dv"};
  bool ok = true;
  std::string line;
  for (int k = 0; k < 3; ++k) {
    double diff = 0, mag = 0;
    size_t bad = 0;
    for (size_t i = 0; i < ref.g[k].size(); ++i) {
      const double x = a.g[k][i], r = ref.g[k][i];
      if (!std::isfinite(x)) {
        ++bad;
        continue;
      }
      diff = std::max(diff, std::fabs(x - r));
      mag = std::max(mag, std::fabs(r));
    }
    const double rel = mag > 0 ? diff / mag : diff;
    const bool k_ok = bad == 0 && rel <= 1e-2;
    ok = ok && k_ok;
    char buf[160];
    std::snprintf(buf, sizeof buf, "  %s max|diff| %.3e (max|ref| %.3e, rel %.2e%s)", names[k], diff, mag, rel,
                  bad ? (", " + std::to_string(bad) + " non-finite").c_str() : "");
    line += buf;
  }
  std::printf("check %-34s %s %s%s\n", what.c_str(), name.c_str(), ok ? "PASS" : "FAIL", line.c_str());
  return ok;
}

int g_failures = 0;

// At s = 2048 (b = 2, the anchor's 2048 / d heads), O and lse of the portable forward: each variant,
// both modes, against the table entry's default mode (the table entry's own runs included).
template <class Table, class... Ts>
void check_against_table(Variants<Table, Ts...>) {
  for (bool causal : {false, true}) {
    Problem pr(2, 2048, 2048 / SWEEP_HDIM, causal);
    pr.forward();
    Grads ref;
    if (!pr.backward<Table>(false, &ref)) {
      ++g_failures;
      continue;
    }
    const std::string what = std::string("s=2048 causal=") + (causal ? "1" : "0");
    auto one = [&](auto tag) {
      using T = typename decltype(tag)::type;
      for (bool det : {false, true}) {
        Grads g;
        if (!pr.backward<T>(det, &g)) {
          ++g_failures;
          continue;
        }
        if (!compare(what + (det ? " deterministic" : " default") + " vs table", describe<T>(), g, ref)) ++g_failures;
      }
    };
    one(Tag<Table>{});
    (one(Tag<Ts>{}), ...);
  }
}

template <class... Ts>
void print_all(Variants<Ts...>) {
  (print_resources<Ts>(), ...);
}

template <class... Ts>
void time_all(Variants<Ts...>, const fa::core::BackwardParams& p, bool causal, int round) {
  (time_config<Ts>(p, causal, round), ...);
}

int main() {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* r = std::getenv("SWEEP_ROUNDS");
  const int rounds = r ? std::atoi(r) : 2;
  const bool check_only = std::getenv("SWEEP_CHECK_ONLY") != nullptr;
  print_all(Sweep{});
  for (int round = 0; round < (check_only ? 0 : rounds); ++round)
    sweep::for_anchor_shapes(SWEEP_HDIM, {2048, 8192}, [&](const fa::core::ForwardParams& fp, bool causal) {
      // Gradients of the same shape as q; lse = 0 and o = q = k = v are not a real forward, which
      // timing does not care about (the checks below use real ones).
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
      time_all(Sweep{}, p, causal, round);
      for (void* g : grads) cudaFree(g);
    });
  check_against_table(Sweep{});
  std::printf("checks: %s (%d failed)\n", g_failures ? "FAIL" : "all PASS", g_failures);
  return g_failures ? 1 : 0;
}

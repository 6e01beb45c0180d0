// `flashattn demo`: one problem run with FlashAttention and with standard attention, side by side:
// error against the fp64 reference, time, extra memory, and the seed's memory-traffic model.
#include <cstdio>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"
#include "core/flops.h"
#include "cpu/attn_engine.h"
#include "format.h"
#include "gpu.h"
#include "problem.h"
#include "timing.h"

namespace fatool {
namespace {

const char* kUsage = R"(usage: flashattn demo [options]

Runs one attention problem with FlashAttention (flashattn::forward) and with standard attention
(S = QK^T and P = softmax(S) materialized, N x N per head, in the same dtype) and prints their
error against the fp64 reference, time, extra memory, and the seed's memory-traffic counts.

options:
  --b B            batch size (default 1)
  --h H            heads (default 8)
  --n N            sequence length, queries and keys (default 4096)
  --d D            head dim, a multiple of 8 in [32, 256] (default 64)
  --causal 0|1     causal mask, bottom-right aligned (default 1)
  --dtype T        f16, bf16, f32 or f64 (default: bf16 on a GPU, f32 on the CPU)
  --device D       auto, cpu or cuda (default auto: a GPU when one is present and CUDA is built in)
  --runs R         timed runs per implementation, after one warm-up run (default 3)
  --threads T      CPU threads (default: all cores)
)";

struct Side {
  double seconds = 0;
  int64_t extra_bytes = -1;
};

}  // namespace

int run_demo(const std::vector<std::string>& argv) {
  Args args(argv, {"b", "h", "n", "d", "causal", "dtype", "device", "runs", "threads"}, {"help"});
  if (args.flag("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const std::string dev = args.choices("device", {"auto"}, {"auto", "cpu", "cuda"}).at(0);
  const bool have_gpu = gpu::device_count() > 0;
  if (dev == "cuda" && !have_gpu)
    throw UsageError(gpu::compiled() ? "option '--device' cuda: no GPU found"
                                     : "option '--device' cuda: this flashattn was built without CUDA");
  Shape s;
  s.device = (dev == "cuda" || (dev == "auto" && have_gpu)) ? DeviceType::cuda : DeviceType::cpu;
  s.dtype = parse_dtype(args.choices("dtype", {s.device == DeviceType::cuda ? "bf16" : "f32"}, {"f16", "bf16", "f32", "f64"}).at(0));
  s.b = args.integer("b", 1, 1, 1 << 16);
  s.h = s.h_kv = args.integer("h", 8, 1, 1 << 12);
  s.s_q = s.s_k = args.integer("n", 4096, 1, 1 << 24);
  s.d = args.integer("d", 64, 1, 1 << 12);
  std::vector<bool> causal = args.booleans("causal", {true});
  if (causal.size() != 1) throw UsageError("option '--causal' takes a single value");
  s.causal = causal[0];
  s.threads = int(args.integer("threads", 0, 0, 1 << 12));
  const int runs = int(args.integer("runs", 3, 1, 1000));
  const bool on_gpu = s.device == DeviceType::cuda;

  const flashattn::BuildInfo info = flashattn::build_info();
  std::printf("flashattn %s demo: %s attention, b=%lld h=%lld N=%lld d=%lld, %s on the %s", info.version.c_str(),
              s.causal ? "causal" : "non-causal", (long long)s.b, (long long)s.h, (long long)s.s_q, (long long)s.d,
              flashattn::dtype_name(s.dtype), on_gpu ? "GPU" : "CPU");
  if (on_gpu)
    std::printf(" (%s)\n", info.cuda_device_names.c_str());
  else
    std::printf(" (%d threads, %s kernels)\n", s.threads > 0 ? s.threads : info.cpu_threads, info.cpu_kernel.c_str());
  std::fflush(stdout);

  Problem prob(s, 1);
  auto measure = [&](const std::function<void()>& first, const std::function<void()>& again) {
    Side side;  // the first run is the warm-up; it also allocates, so it is the one whose memory counts
    side.extra_bytes = on_gpu ? gpu_memory_growth(first) : peak_rss_growth(first);
    side.seconds = median(time_runs(s.device, 0, runs, again));
    return side;
  };
  auto flash_run = [&] { flashattn::forward(prob.forward_args()); };
  const Side flash = measure(flash_run, flash_run);

  const int64_t matrix = standard_matrix_bytes(s.b, s.h, s.s_q, s.s_k, s.dtype);
  const int64_t room = on_gpu ? int64_t(gpu::free_bytes()) : host_available_bytes();
  const bool standard_fits = room < 0 || 2 * matrix < room / 10 * 8;
  Side standard;
  if (standard_fits) {
    Buffer S, P;
    auto standard_run = [&] {
      StandardArgs a = prob.standard_args(S.data(), P.data());
      if (on_gpu)
        gpu::standard_attention(a);
      else
        standard_attention_cpu(a);
    };
    standard = measure(
        [&] {
          S = Buffer(s.device, matrix);
          P = Buffer(s.device, matrix);
          standard_run();
        },
        standard_run);
  }
  const Problem::Check check = prob.verify(standard_fits);

  const double flops = flashattn::core::forward_flops(s.b, s.h, s.s_q, s.s_k, s.d, s.causal);
  std::printf("\n%-34s %18s %20s\n", "", "FlashAttention", "standard attention");
  auto row = [&](const char* label, const std::string& a, const std::string& b, const std::string& note) {
    std::printf("%-34s %18s %20s   %s\n", label, a.c_str(), b.c_str(), note.c_str());
  };
  const std::string na = "(does not fit)";
  const std::string time_label = "time (median of " + std::to_string(runs) + ")";
  row(time_label.c_str(), fmt_time(flash.seconds), standard_fits ? fmt_time(standard.seconds) : na,
      standard_fits ? fmt("speed-up %.2fx", standard.seconds / flash.seconds) : "");
  row("throughput (nominal FLOPs)", fmt("%.1f GFLOP/s", flops / flash.seconds * 1e-9),
      standard_fits ? fmt("%.1f GFLOP/s", flops / standard.seconds * 1e-9) : na,
      s.causal ? "4 b h N^2 d / 2 (causal)" : "4 b h N^2 d");
  row(on_gpu ? "device memory left allocated" : "peak memory beyond inputs/outputs", fmt_bytes(double(flash.extra_bytes)),
      standard_fits ? fmt_bytes(double(standard.extra_bytes)) : na,
      "S and P: 2 x " + fmt_bytes(double(matrix)) + (on_gpu ? " (cudaMemGetInfo)" : " (peak RSS growth)"));
  row("max |error| vs fp64 reference", fmt("%.3g", check.flash),
      check.standard >= 0 ? fmt("%.3g", check.standard) : na, "checked on " + check.scope);

  const int64_t block_m = on_gpu ? gpu::flash_block_m(int(s.d), s.causal) : flashattn::cpu::block_rows(s.d);
  const double heads = double(s.b * s.h), esize = double(flashattn::dtype_size(s.dtype));
  const double std_elems = heads * flashattn::core::standard_traffic_elems(s.s_q, s.d);
  const double flash_elems = heads * flashattn::core::flash_traffic_elems(s.s_q, s.d, block_m);
  std::printf("\nmemory traffic, the seed's model (b x h = %lld heads; elements, and bytes of %s):\n", (long long)(s.b * s.h),
              flashattn::dtype_name(s.dtype));
  std::printf("  standard attention  4N^2 + 4Nd             %16.0f  (%s)\n", std_elems, fmt_bytes(std_elems * esize).c_str());
  std::printf("  FlashAttention      2Nd + 2N^2 d / B_m      %16.0f  (%s), B_m = %lld query rows per tile\n", flash_elems,
              fmt_bytes(flash_elems * esize).c_str(), (long long)block_m);
  std::printf("  ratio               %.1fx less traffic%s\n", std_elems / flash_elems,
              s.causal ? " (the model counts every tile; causal skipping visits about half of them)" : "");
  return 0;
}

}  // namespace fatool

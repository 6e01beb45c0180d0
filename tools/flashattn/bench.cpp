// `flashattn bench`: a sweep over shapes, one table row per configuration.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"
#include "core/block_range.h"
#include "core/flops.h"
#include "format.h"
#include "gpu.h"
#include "problem.h"
#include "timing.h"

namespace fatool {
namespace {

const char* kUsage = R"(usage: flashattn bench [options]
       flashattn bench --cpu-bar [--runs R] [--json FILE]

Times every combination of the values given (lists "1,2,4" and ranges "a:b", "a:b:step",
"a:b:xFACTOR" such as 512:8192:x2) and prints one row each: the median time; TFLOP/s (fwd:
4 b h s_q s_k d, halved when causal, windows not discounted; bwd: 2.5x that) or, for decode, GB/s
(bytes of the K and V rows the new tokens can see, per second); and for fwd the speed-up over
standard attention (S and P materialized; skipped where they would not fit in memory). Decode is
planned once (plan_decode) and each timed call is a run of that plan, as in a serving loop.

options:
  --op LIST          fwd, bwd, decode (default fwd)
  --device LIST      cpu, cuda (default cpu)
  --dtype LIST       f16, bf16, f32, f64 (default f32)
  --b LIST           batch (default 1)
  --h LIST           query heads (default 8)
  --h-kv LIST        key/value heads, dividing h (default: h)
  --n LIST           sequence length (default 4096): fwd/bwd use s_q = s_k = n, decode s_k = n
  --s-q LIST         query length (default: n; decode: 1 new token)
  --s-k LIST         key length (default: n; fwd/bwd with --s-q: the same as s_q)
  --d LIST           head dim (default 64)
  --causal LIST      0, 1 (default 0)
  --window-left LIST   sliding window, keys left of the diagonal (default -1 = unbounded)
  --window-right LIST  keys right of the diagonal (default -1 = unbounded)
  --page-size P      decode: a paged KV cache with P tokens per page (default 0 = contiguous)
  --runs R           timed runs per row, after the warm-up (default 20)
  --warmup W         untimed runs first (default 2)
  --threads T        CPU threads (default: all cores)
  --verify           check every result against the fp64 reference and print the max error
                     (a large problem is checked on a subset of heads and rows)
  --no-standard      skip standard attention
  --json FILE        write every figure to FILE
  --cpu-bar          the CPU bar: forward b=1 h=16 N=4096 d=128 f32 against OpenBLAS SGEMM
                     4096x4096x128 (--runs, default 10)
)";

struct Row {
  Shape shape;
  int runs = 0;
  std::vector<double> times;
  double median = 0, rate = 0;  // TFLOP/s, or GB/s for decode
  double standard_median = -1;
  std::string standard_note;
  std::string kernel;  // the GPU kernel that ran (forward/backward on the GPU), e.g. "fwd hopper ..."
  Problem::Check check;
  bool verified = false;
  std::string error;
};

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char code[8];
      std::snprintf(code, sizeof(code), "\\u%04x", unsigned(c));
      out += code;
      continue;
    }
    out += c;
  }
  return out;
}

std::string json_number(double x) { return std::isfinite(x) ? fmt("%.9g", x) : "null"; }

void write_json(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write '" + path + "'");
  f << "[\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const Shape& s = r.shape;
    f << "  {\"op\": \"" << op_name(s.op) << "\", \"device\": \"" << device_name(s.device) << "\", \"dtype\": \""
      << flashattn::dtype_name(s.dtype) << "\", \"b\": " << s.b << ", \"h\": " << s.h << ", \"h_kv\": " << s.h_kv
      << ", \"s_q\": " << s.s_q << ", \"s_k\": " << s.s_k << ", \"d\": " << s.d << ", \"causal\": "
      << (s.causal ? "true" : "false") << ", \"window_left\": " << s.window_left << ", \"window_right\": "
      << s.window_right << ", \"page_size\": " << s.page_size << ", \"runs\": " << r.runs << ", \"times_s\": [";
    for (size_t t = 0; t < r.times.size(); ++t) f << (t ? ", " : "") << json_number(r.times[t]);
    f << "], \"median_s\": " << json_number(r.median) << ", \"" << (s.op == Op::decode ? "gb_per_s" : "tflop_per_s")
      << "\": " << json_number(r.rate) << ", \"standard_median_s\": "
      << (r.standard_median > 0 ? json_number(r.standard_median) : "null") << ", \"speedup_vs_standard\": "
      << (r.standard_median > 0 ? json_number(r.standard_median / r.median) : "null") << ", \"standard_note\": \""
      << json_escape(r.standard_note) << "\", \"kernel\": \"" << json_escape(r.kernel) << "\"";
    if (r.verified)
      f << ", \"max_error\": " << (r.check.flash >= 0 ? json_number(r.check.flash) : "null")
        << ", \"standard_max_error\": " << (r.check.standard >= 0 ? json_number(r.check.standard) : "null")
        << ", \"checked_on\": \"" << json_escape(r.check.scope) << "\"";
    f << ", \"error\": " << (r.error.empty() ? std::string("null") : std::string("\"").append(json_escape(r.error)).append("\"")) << "}"
      << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  f << "]\n";
}

// Keys decode reads per sequence: the union of the new tokens' visible ranges.
int64_t decode_keys_read(const Shape& s) {
  const flashattn::core::MaskSpec m{s.s_q, s.s_k, s.window_left, s.causal ? 0 : s.window_right};
  return std::max<int64_t>(0, m.hi(s.s_q - 1) - m.lo(0));
}

void run_row(Row& r, int warmup, bool with_standard, bool verify) {
  const Shape& s = r.shape;
  Problem prob(s, 1);
  std::function<void()> op;
  // Decode is timed as a serving loop runs it: planned once (host validation, split choice), then
  // each step is a run of the plan on a workspace allocated once, with no host synchronization.
  // decode(args) would add a host copy of the indices and a workspace allocation to every step.
  flashattn::DecodePlan plan;
  Buffer workspace;
  switch (s.op) {
    case Op::fwd: op = [&] { flashattn::forward(prob.forward_args()); }; break;
    case Op::bwd:
      flashattn::forward(prob.forward_args());  // out and lse for the backward
      op = [&] { flashattn::backward(prob.backward_args()); };
      break;
    case Op::decode:
      plan = flashattn::plan_decode(prob.decode_args());
      workspace = Buffer(s.device, s.device == DeviceType::cuda ? plan.workspace_bytes : 0);
      op = [&] { flashattn::decode(prob.decode_args(), plan, workspace.data()); };
      break;
  }
  r.times = time_runs(s.device, warmup, r.runs, op);
  r.median = median(r.times);
  if (s.device == DeviceType::cuda && s.op != Op::decode) r.kernel = flashattn::last_gpu_kernel();
  if (s.op == Op::decode) {
    const double bytes = 2.0 * double(s.b * s.h_kv * decode_keys_read(s) * s.d * flashattn::dtype_size(s.dtype));
    r.rate = bytes / r.median * 1e-9;
  } else {
    const double flops = s.op == Op::fwd ? flashattn::core::forward_flops(s.b, s.h, s.s_q, s.s_k, s.d, s.causal)
                                         : flashattn::core::backward_flops(s.b, s.h, s.s_q, s.s_k, s.d, s.causal);
    r.rate = flops / r.median * 1e-12;
  }
  bool standard_ran = false;
  if (s.op == Op::fwd && with_standard) {
    const bool on_gpu = s.device == DeviceType::cuda;
    const int64_t matrix = standard_matrix_bytes(s.b, s.h, s.s_q, s.s_k, s.dtype);
    const int64_t room = on_gpu ? int64_t(gpu::free_bytes()) : host_available_bytes();
    if (on_gpu && s.dtype == DType::f64) {
      r.standard_note = "no f64 on the GPU";
    } else if (room >= 0 && 2 * matrix >= room / 10 * 8) {
      r.standard_note = "S and P (2 x " + fmt_bytes(double(matrix)) + ") would not fit in memory";
    } else {
      Buffer S(s.device, matrix), P(s.device, matrix);
      const StandardArgs a = prob.standard_args(S.data(), P.data());
      auto standard = [&] { on_gpu ? gpu::standard_attention(a) : standard_attention_cpu(a); };
      r.standard_median = median(time_runs(s.device, warmup, r.runs, standard));
      standard_ran = true;
    }
  }
  if (verify) {
    r.check = prob.verify(standard_ran);
    r.verified = true;
  }
}

void print_header(bool verify) {
  std::printf("%-6s %-4s %-4s %4s %4s %4s %6s %6s %4s %3s %11s %10s %12s %10s %10s", "op", "dev", "type", "b", "h", "hkv",
              "s_q", "s_k", "d", "cau", "window", "median", "rate", "standard", "speed-up");
  if (verify) std::printf(" %10s  %s", "max_err", "checked on");
  std::printf("\n");
}

void print_row(const Row& r, bool verify) {
  const Shape& s = r.shape;
  std::string window = (s.window_left < 0 && s.window_right < 0)
                           ? "-"
                           : std::string("(").append(std::to_string(s.window_left)).append(",").append(
                                 std::to_string(s.window_right)).append(")");
  std::printf("%-6s %-4s %-4s %4lld %4lld %4lld %6lld %6lld %4lld %3s %11s ", op_name(s.op), device_name(s.device),
              flashattn::dtype_name(s.dtype), (long long)s.b, (long long)s.h, (long long)s.h_kv, (long long)s.s_q,
              (long long)s.s_k, (long long)s.d, s.causal ? "yes" : "no", window.c_str());
  if (!r.error.empty()) {
    std::printf("error: %s\n", r.error.c_str());
    return;
  }
  std::string rate = s.op == Op::decode ? fmt("%.2f GB/s", r.rate) : fmt("%.3f TF/s", r.rate);
  std::string standard = r.standard_median > 0 ? fmt_time(r.standard_median) : "-";
  std::string speedup = r.standard_median > 0 ? fmt("%.2fx", r.standard_median / r.median) : "-";
  std::printf("%10s %12s %10s %10s", fmt_time(r.median).c_str(), rate.c_str(), standard.c_str(), speedup.c_str());
  if (verify)
    std::printf(" %10s  %s", r.check.flash >= 0 ? fmt("%.3g", r.check.flash).c_str() : "-", r.check.scope.c_str());
  if (!r.standard_note.empty()) std::printf("  [standard: %s]", r.standard_note.c_str());
  if (!r.kernel.empty()) std::printf("  [%s]", r.kernel.c_str());
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int run_bench(const std::vector<std::string>& argv) {
  Args args(argv,
            {"op", "device", "dtype", "b", "h", "h-kv", "n", "s-q", "s-k", "d", "causal", "window-left", "window-right",
             "page-size", "runs", "warmup", "threads", "json"},
            {"help", "verify", "no-standard", "cpu-bar"});
  if (args.flag("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const std::string json = args.str("json", "");
  if (args.flag("cpu-bar")) return run_cpu_bar(int(args.integer("runs", 10, 1, 100000)), json);

  const auto ops = args.choices("op", {"fwd"}, {"fwd", "bwd", "decode"});
  const auto devices = args.choices("device", {"cpu"}, {"cpu", "cuda"});
  const auto dtypes = args.choices("dtype", {"f32"}, {"f16", "bf16", "f32", "f64"});
  const auto bs = args.integers("b", {1}, 1, 1 << 16);
  const auto hs = args.integers("h", {8}, 1, 1 << 12);
  const auto hkvs = args.integers("h-kv", {}, 1, 1 << 12);
  const auto ns = args.integers("n", {4096}, 1, 1 << 24);
  const auto sqs = args.integers("s-q", {}, 1, 1 << 24);
  const auto sks = args.integers("s-k", {}, 1, 1 << 24);
  const auto ds = args.integers("d", {64}, 1, 1 << 12);
  const auto causals = args.booleans("causal", {false});
  const auto wls = args.integers("window-left", {-1}, -1, 1 << 24);
  const auto wrs = args.integers("window-right", {-1}, -1, 1 << 24);
  const int64_t page = args.integer("page-size", 0, 0, 1 << 20);
  const int runs = int(args.integer("runs", 20, 1, 100000));
  const int warmup = int(args.integer("warmup", 2, 0, 100000));
  const int threads = int(args.integer("threads", 0, 0, 1 << 12));
  const bool verify = args.flag("verify"), with_standard = !args.flag("no-standard");
  for (const std::string& d : devices)
    if (d == "cuda" && gpu::device_count() == 0)
      throw UsageError(gpu::compiled() ? "option '--device' cuda: no GPU found"
                                       : "option '--device' cuda: this flashattn was built without CUDA");

  std::vector<Row> rows;
  for (const std::string& op : ops)
    for (const std::string& dev : devices)
      for (const std::string& dt : dtypes)
        for (int64_t b : bs)
          for (int64_t h : hs)
            for (int64_t hkv : hkvs.empty() ? std::vector<int64_t>{h} : hkvs)
              for (int64_t n : ns)
                for (int64_t sq : sqs.empty() ? std::vector<int64_t>{op == "decode" ? 1 : n} : sqs)
                  for (int64_t sk : sks.empty() ? std::vector<int64_t>{op == "decode" || sqs.empty() ? n : sq} : sks)
                    for (int64_t d : ds)
                      for (bool causal : causals)
                        for (int64_t wl : wls)
                          for (int64_t wr : wrs) {
                            if (h % hkv != 0 || (causal && wr > 0)) continue;  // not a valid problem
                            Row r;
                            r.shape.op = op == "fwd" ? Op::fwd : op == "bwd" ? Op::bwd : Op::decode;
                            r.shape.device = dev == "cuda" ? DeviceType::cuda : DeviceType::cpu;
                            r.shape.dtype = parse_dtype(dt);
                            r.shape.b = b;
                            r.shape.h = h;
                            r.shape.h_kv = hkv;
                            r.shape.s_q = sq;
                            r.shape.s_k = sk;
                            r.shape.d = d;
                            r.shape.causal = causal;
                            r.shape.window_left = wl;
                            r.shape.window_right = wr;
                            r.shape.page_size = r.shape.op == Op::decode ? page : 0;
                            r.shape.threads = threads;
                            r.runs = runs;
                            rows.push_back(r);
                          }
  if (rows.empty()) throw UsageError("no valid configuration: h must be a multiple of h-kv, and causal needs window-right <= 0");

  print_header(verify);
  int failures = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows.size() > 1) {
      std::fprintf(stderr, "bench: [%zu/%zu] %s\n", i + 1, rows.size(), rows[i].shape.describe().c_str());
      std::fflush(stderr);
    }
    try {
      run_row(rows[i], warmup, with_standard, verify);
    } catch (const std::exception& e) {  // one bad configuration (an unsupported dtype, no memory) is one row
      rows[i].error = e.what();
      ++failures;
    }
    print_row(rows[i], verify);
  }
  if (!json.empty()) write_json(json, rows);
  return failures == 0 ? 0 : 1;
}

}  // namespace fatool

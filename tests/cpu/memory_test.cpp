// The forward pass never materializes anything of size N x N: at N = 65,536 one head's scores would
// take 16 GiB, while the engine's extra peak resident memory must stay under 64 MiB.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "test_util.h"

namespace {

using fa_test::HostTensor;
using flashattn::DType;
namespace ref = flashattn::reference;

// A field of /proc/self/status in KiB, or -1.
int64_t status_kib(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  return -1;
}

// Resets the peak resident size (VmHWM) to the current one; false where Linux does not allow it.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return bool(f) && status_kib("VmHWM") >= 0;
}

// Fills a contiguous bf16 tensor with values in [-1, 1), quickly (8M elements per tensor).
void fill_bf16(HostTensor& t, uint32_t seed) {
  uint32_t s = seed;
  auto* p = reinterpret_cast<flashattn::core::bfloat16_t*>(t.storage.data());
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    p[i] = flashattn::core::to_bf16(float(int32_t(s >> 8) - (1 << 23)) / float(1 << 23));
  }
}

TEST(Memory, LongSequenceForwardStaysWithinTileMemory) {
  const int64_t n = 65536, d = 128, window = 255;
  HostTensor q(DType::bf16, {1, n, 1, d}), k(DType::bf16, {1, n, 1, d}), v(DType::bf16, {1, n, 1, d});
  HostTensor out(DType::bf16, {1, n, 1, d}), lse(DType::f32, {1, 1, n});
  fill_bf16(q, 1);
  fill_bf16(k, 2);
  fill_bf16(v, 3);
  out.poison();
  lse.poison();
  flashattn::ForwardArgs a;
  a.q = q.view;
  a.k = k.view;
  a.v = v.view;
  a.out = out.view;
  a.lse = lse.view;
  a.options.causal = true;
  a.options.window_left = window;  // keeps the run to about a second; the sizes are those of N x N

  if (!reset_peak_rss()) GTEST_SKIP() << "peak RSS cannot be reset here (/proc/self/clear_refs not writable)";
  const int64_t before = status_kib("VmRSS");
  flashattn::forward(a);
  const int64_t peak = status_kib("VmHWM");
  const int64_t growth_mib = (peak - before) / 1024;
  RecordProperty("peak_rss_growth_mib", std::to_string(growth_mib));
  EXPECT_LT(peak - before, 64 * 1024) << "peak resident memory grew by " << growth_mib << " MiB";

  // Every element written.
  const auto* o = reinterpret_cast<const uint16_t*>(out.storage.data());
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_LE(o[i] & 0x7fffu, 0x7f80u) << "out element " << i << " is NaN";
  const auto* l = reinterpret_cast<const float*>(lse.storage.data());
  for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(l[i])) << "lse row " << i;

  // A few rows against the reference on the slice they see: row i attends to keys
  // [i - window, i], so a one-query problem over those keys has the same answer.
  for (int64_t i : {int64_t(0), int64_t(1), window, window + 1, int64_t(40000), n - 1}) {
    SCOPED_TRACE("row " + std::to_string(i));
    int64_t k0 = i - window < 0 ? 0 : i - window, len = i - k0 + 1;
    flashattn::ForwardArgs s;
    auto slice = [&](const HostTensor& t, int64_t row0, int64_t rows) {
      flashattn::TensorView view = t.view;
      view.data = const_cast<unsigned char*>(t.storage.data()) + row0 * d * 2;
      view.shape[1] = rows;
      return view;
    };
    HostTensor row_out(DType::bf16, {1, 1, 1, d});
    s.q = slice(q, i, 1);
    s.k = slice(k, k0, len);
    s.v = slice(v, k0, len);
    s.out = row_out.view;
    ref::Output exact = ref::forward(s, ref::Precision::f64);
    ref::Output plain = ref::forward(s, ref::Precision::same_as_input);
    std::vector<double> got(static_cast<size_t>(d));
    for (int64_t x = 0; x < d; ++x) got[size_t(x)] = out.get(i * d + x);
    EXPECT_TRUE(fa_test::within_rule(got, exact.out, plain.out, DType::bf16, 2.0, "out"));
    EXPECT_TRUE(fa_test::within_rule({lse.get(i)}, exact.lse, plain.lse, DType::bf16, 2.0, "lse"));
  }
}

}  // namespace
